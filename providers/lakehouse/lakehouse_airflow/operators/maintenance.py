"""MaintenanceOperator: the table maintenance Spark job of one pipeline, its receipt in XCom."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException

from lakehouse.core import config, lineage
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse.upkeep import maintenance_receipts
from lakehouse_airflow.audit import actor_of
from lakehouse_airflow.hooks import KAFKA_CONN_ID, LakehouseHook
from lakehouse_airflow.lineage import openlineage_enabled
from lakehouse_airflow.spark import connection_submit_environment


class MaintenanceOperator(SparkSubmitOperator):
    """Submits `spark_jobs/maintenance.py` for pipeline `pipeline` (compaction, manifest rewrite,
    snapshot expiry, orphan removal on every table; see lakehouse.upkeep.maintenance).

    Build it with `lakehouse_airflow.spark.submit_kwargs(spec, "maintenance")`. The receipt is read
    back from the run's `maintenance` events on the ops timeline, matched by a run id passed to the
    job, rather than parsed from the job's output: the timeline holds it whatever the deploy mode
    (in cluster mode the driver's stdout never reaches this task) and however the log is relayed.

    Templated fields: those of SparkSubmitOperator (application, application_args, conf, env_vars, ...).
    The job's `maintenance` events name the DAG run's actor (the user who triggered it, or `scheduler`),
    passed to the job in its environment (`Actor.environment()`).

    XCom: return value = the receipt {"pipeline", "run_id", "ok", "tables": [per-table receipt]};
    when the job fails (a table's maintenance failed), the receipt is pushed under key `receipt`
    and the task fails. Kafka settings: as SupervisedSparkSubmitOperator (`kafka_conn_id`).
    OpenLineage (when configured): every table maintained, in and out (compaction rewrites its files),
    with its rows, data files and bytes after maintenance.
    """

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self._lineage: tuple[list, list] = ([], [])  # OpenLineage datasets (in, out), gathered when enabled

    def execute(self, context: Any) -> dict:  # type: ignore[override]  # SparkSubmitOperator.execute is annotated None; Airflow pushes what execute returns as its XCom
        lakehouse = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        run_id = uuid.uuid4().hex
        since = datetime.now(UTC) - timedelta(minutes=1)
        # appended, not replaced: argparse keeps the last --run-id, so a retried try stays unambiguous
        self.application_args = [*(self.application_args or []), "--run-id", run_id]
        self.env_vars = {**(self.env_vars or {}), **actor_of(context).environment()}  # the job's events name it
        try:
            with connection_submit_environment(self, lakehouse.submit_environment):
                super().execute(context)
        except AirflowException:
            context["ti"].xcom_push(key="receipt", value=self._receipt(lakehouse, run_id, since))
            raise
        receipt = self._receipt(lakehouse, run_id, since)
        if openlineage_enabled():
            self._lineage = self.datasets(lakehouse.spec, lakehouse.platform, receipt["tables"])
        if not receipt["tables"]:
            raise AirflowException(f"maintenance run {run_id} of {self.pipeline} exited 0 but recorded no "
                                   f"`maintenance` events on the ops timeline")
        return receipt

    @staticmethod
    def _receipt(lakehouse: LakehouseHook, run_id: str, since: datetime) -> dict:
        return maintenance_receipts.receipt_from_events(lakehouse.pipeline, run_id, since=since,
                                                        platform=lakehouse.platform, catalog=lakehouse.spec.catalog)

    @staticmethod
    def datasets(spec: PipelineSpec, platform: config.PlatformConfig, maintained: list[dict]) -> tuple[list, list]:
        """Each table of receipt tables `maintained` (skipped ones left out), as OpenLineage input and output
        datasets at its current snapshot, the output with its rows, data files and bytes after maintenance."""
        catalog = open_catalog(platform, spec.catalog)
        inputs, outputs = [], []
        for receipt in maintained:
            if receipt["status"] == "skipped":
                continue
            name = receipt["table"].split(".", 1)[1]  # without the catalog
            table = catalog.load_table(name)
            head = table.current_snapshot()
            version = head.snapshot_id if head else None
            inputs.append(lineage.table_dataset(spec, platform, name, table, version=version))
            outputs.append(lineage.table_dataset(spec, platform, name, table, output=True, version=version,
                                                 rows=receipt["rows_after"], files=receipt["data_files_after"],
                                                 size=receipt["bytes_after"]))
        return inputs, outputs

    def get_openlineage_facets_on_complete(self, task_instance):
        """The run's datasets for Airflow's OpenLineage provider (gathered by `execute`): each table
        maintained, in and out (compaction rewrites its files)."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        inputs, outputs = self._lineage
        return OperatorLineage(inputs=inputs, outputs=outputs)
