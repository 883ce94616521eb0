"""Ingestion, one DAG per pipeline: Kafka -> Iceberg exactly once.

`trigger.mode: continuous` runs one long-lived job (`@continuous`, one run at a time):
the task submits it and supervises it, killing and restarting it with exponential
backoff when it dies or hangs (no commit for `supervision.hung_after_triggers`
triggers while lag grows); restarts and hangs appear in `ops.pipeline_events`.
Stopping the job gracefully (SIGTERM to its driver: it finishes its batch) ends the
run successfully; marking the task failed stops the job.

`trigger.mode: scheduled` runs micro-batches instead: on `trigger.schedule`, a job
catches up to the end of the log (`--once`) and exits.
"""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from lakehouse_airflow.dag_defaults import pipeline_dag, pipelines
from lakehouse_airflow.operators.supervision import SupervisedSparkSubmitOperator
from lakehouse_airflow.spark import submit_kwargs

for _spec in pipelines().values():
    _continuous = _spec.trigger.mode == "continuous"
    with pipeline_dag(
        _spec, "ingest",
        schedule="@continuous" if _continuous else _spec.trigger.schedule,
        extra_tags=(_spec.trigger.mode,),
        doc=__doc__ + (
            f"\n- trigger: {_spec.trigger.mode}, every {_spec.trigger.interval_s:g}s; restarts: at most "
            f"{_spec.supervision.max_restarts}, backoff from {_spec.supervision.restart_backoff_s:g}s\n"
            if _continuous else f"\n- trigger: scheduled `{_spec.trigger.schedule}`, `--once` per run\n"),
    ):
        if _continuous:
            SupervisedSparkSubmitOperator(task_id="ingest_continuous", pipeline=_spec.name,
                                          **submit_kwargs(_spec, "ingest", "--json"))
        else:
            SparkSubmitOperator(task_id="ingest_once", **submit_kwargs(_spec, "ingest", "--once", "--json"))
