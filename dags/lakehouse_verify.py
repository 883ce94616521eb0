"""Exactly-once verification, one DAG per pipeline, on `verify.schedule`.

`verify` checks the snapshots every table of the pipeline (data tables, fan-out included, and
the dead-letter table) committed since the last passing verification: every offset Kafka still
holds in their window is in exactly one table, and no row is foreign (another topic, past the
committed position, in a recorded gap, or at an offset Kafka holds no record at); for upsert
tables, each key's row is its newest record (lakehouse.audit.verify). It runs in the task, or as a
Spark job on the platform's master when the window is large. Each run is a `verify` event on the
ops timeline; a failed run lists the missing, duplicated, foreign and stale coordinates and fails
the task without retry. The publish DAG verifies the snapshots it publishes the same way and
refuses to publish unverified ones.
"""

from __future__ import annotations

from lakehouse_airflow.dag_defaults import pipeline_dag, pipelines
from lakehouse_airflow.operators.verify import VerifyOperator

for _spec in pipelines().values():
    with pipeline_dag(_spec, "verify", schedule=_spec.verify.schedule, extra_tags=("exactly-once",), doc=__doc__):
        VerifyOperator(task_id="verify", pipeline=_spec.name)
