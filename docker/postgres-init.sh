#!/usr/bin/env bash
# PostgreSQL's first start (docker-entrypoint-initdb.d, empty data volume only): one database
# per consumer, each owned by its own login role, passwords from the environment (.env):
#
#   airflow   Airflow's metadata (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)          AIRFLOW_DB_PASSWORD
#   registry  Apicurio Registry's SQL storage (schema-registry's APICURIO_DATASOURCE_*)  REGISTRY_DB_PASSWORD
#
# (The Iceberg catalog is the REST catalog's, service iceberg-rest, not a database here.)
# psql runs as POSTGRES_USER on the entrypoint's socket-only server (PGHOST/PGPORT if set).
# psql reads the passwords from its environment (\getenv) and quotes them (:'name'): they
# are never on a command line, in this file or in the server log.
set -eo pipefail

: "${POSTGRES_USER:?POSTGRES_USER is not set}"
: "${AIRFLOW_DB_PASSWORD:?set AIRFLOW_DB_PASSWORD in .env}"
: "${REGISTRY_DB_PASSWORD:?set REGISTRY_DB_PASSWORD in .env}"

psql --no-psqlrc -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<'SQL'
\getenv airflow_password AIRFLOW_DB_PASSWORD
\getenv registry_password REGISTRY_DB_PASSWORD
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE registry LOGIN PASSWORD :'registry_password';
CREATE DATABASE registry OWNER registry;
SQL
