#!/usr/bin/env bash
# PostgreSQL's first start (docker-entrypoint-initdb.d, empty data volume only): one database
# per consumer, each owned by its own login role, passwords from the environment (.env):
#
#   iceberg   the Iceberg JDBC catalog (LAKEHOUSE_CATALOG_URI)          ICEBERG_DB_PASSWORD
#   airflow   Airflow's metadata (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)  AIRFLOW_DB_PASSWORD
#
# psql runs as POSTGRES_USER on the entrypoint's socket-only server (PGHOST/PGPORT if set).
# psql reads the passwords from its environment (\getenv) and quotes them (:'name'): they
# are never on a command line, in this file or in the server log.
set -eo pipefail

: "${POSTGRES_USER:?POSTGRES_USER is not set}"
: "${ICEBERG_DB_PASSWORD:?set ICEBERG_DB_PASSWORD in .env}"
: "${AIRFLOW_DB_PASSWORD:?set AIRFLOW_DB_PASSWORD in .env}"

psql --no-psqlrc -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<'SQL'
\getenv iceberg_password ICEBERG_DB_PASSWORD
\getenv airflow_password AIRFLOW_DB_PASSWORD
CREATE ROLE iceberg LOGIN PASSWORD :'iceberg_password';
CREATE DATABASE iceberg OWNER iceberg;
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
SQL
