"""Backfill operators: plan a backfill from the DAG's form, then run it through spark-submit."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from lakehouse.core import spec as spec_module
from lakehouse.recovery import backfill
from lakehouse_airflow.hooks import KAFKA_CONN_ID, LakehouseHook, connection_environment
from lakehouse_airflow.spark import connection_submit_environment


class BackfillPlanOperator(BaseOperator):
    """Validates the run's params (the backfill form) for pipeline `pipeline` and plans the backfill.

    Fails with a message naming the field (unknown partition, start after end, a range past
    the committed position, a bad or live candidate table). Templated fields: none.
    XCom (return value): the plan, `lakehouse.recovery.backfill.BackfillPlan.to_json()`: target_table,
    ranges, offsets, records, dry_run, notes, job_args.
    """

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Any) -> dict:
        hook = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        request = backfill.parse_request(dict(context["params"]),
                                         backfill.live_tables(spec_module.load_all()))
        planned = backfill.plan(hook.spec, request, hook.platform).to_json()
        self.log.info("backfill plan: %s", planned)
        return planned


class BackfillSparkSubmitOperator(SparkSubmitOperator):
    """Runs the replay job with the arguments of the plan that task `plan_task_id` pushed.

    Skipped for a dry run and for an empty plan. The job inserts only absent rows and records a
    `backfill` event with what it inserted. Kafka settings: the environment's, overridden by
    the Kafka connection `kafka_conn_id` (default `lakehouse_kafka`, if it exists), given to
    the job through its process environment. Templated fields: those of SparkSubmitOperator.
    XCom: none.
    """

    def __init__(self, *, plan_task_id: str = "plan", kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Any) -> None:
        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if planned["dry_run"]:
            raise AirflowSkipException(f"dry run: would write {planned['records']} records to "
                                       f"{planned['target_table']} ({planned['offsets'] or 'no ranges'})")
        if not planned["job_args"]:
            raise AirflowSkipException("nothing to backfill: " + "; ".join(planned["notes"]))
        self.application_args = [*(self.application_args or []), *planned["job_args"]]
        with connection_submit_environment(self, connection_environment(self.kafka_conn_id)):
            super().execute(context)
