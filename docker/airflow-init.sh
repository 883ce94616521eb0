#!/usr/bin/env bash
# One-shot service `airflow-init` of docker-compose.yaml, before any other Airflow component:
#   1. `airflow db migrate`: Airflow's metadata database on PostgreSQL
#   2. docker/airflow_init.py: the admin's password file (AIRFLOW_ADMIN_PASSWORD), and a first
#      request to the Iceberg REST catalog (iceberg-rest), which must answer
#   3. `lakehouse topics`: the pipelines' source topics, with their partitions and retention
# Idempotent: every `docker compose up` runs it again.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
airflow db migrate
python "$here/airflow_init.py"
lakehouse topics
