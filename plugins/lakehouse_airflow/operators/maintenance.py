"""MaintenanceOperator: the table maintenance Spark job of one pipeline, its receipt in XCom."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException

from lakehouse.upkeep import maintenance
from lakehouse_airflow.hooks import KAFKA_CONN_ID, LakehouseHook
from lakehouse_airflow.spark import connection_submit_environment


class MaintenanceOperator(SparkSubmitOperator):
    """Submits `spark_jobs/maintenance.py` for pipeline `pipeline` (compaction, manifest rewrite,
    snapshot expiry, orphan removal on every table; see lakehouse.upkeep.maintenance).

    Build it with `lakehouse_airflow.spark.submit_kwargs(spec, "maintenance")`. The receipt is read
    back from the run's `maintenance` events on the ops timeline, matched by a run id passed to the
    job, rather than parsed from the job's output: the timeline holds it whatever the deploy mode
    (in cluster mode the driver's stdout never reaches this task) and however the log is relayed.

    Templated fields: those of SparkSubmitOperator (application, application_args, conf, env_vars, ...).
    XCom: return value = the receipt {"pipeline", "run_id", "ok", "tables": [per-table receipt]};
    when the job fails (a table's maintenance failed), the receipt is pushed under key `receipt`
    and the task fails. Kafka settings: as SupervisedSparkSubmitOperator (`kafka_conn_id`).
    """

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Any) -> dict:
        lakehouse = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        run_id = uuid.uuid4().hex
        since = datetime.now(timezone.utc) - timedelta(minutes=1)
        # appended, not replaced: argparse keeps the last --run-id, so a retried try stays unambiguous
        self.application_args = [*(self.application_args or []), "--run-id", run_id]
        try:
            with connection_submit_environment(self, lakehouse.submit_environment):
                super().execute(context)
        except AirflowException:
            context["ti"].xcom_push(key="receipt", value=self._receipt(lakehouse, run_id, since))
            raise
        receipt = self._receipt(lakehouse, run_id, since)
        if not receipt["tables"]:
            raise AirflowException(f"maintenance run {run_id} of {self.pipeline} exited 0 but recorded no "
                                   f"`maintenance` events on the ops timeline")
        return receipt

    @staticmethod
    def _receipt(lakehouse: LakehouseHook, run_id: str, since: datetime) -> dict:
        return maintenance.receipt_from_events(lakehouse.pipeline, run_id, since=since,
                                               platform=lakehouse.platform, catalog=lakehouse.spec.catalog)
