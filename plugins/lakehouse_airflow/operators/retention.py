"""RetentionAlignmentOperator: the topic's retention against lag + outage budget + replay window."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from lakehouse.upkeep import retention
from lakehouse_airflow.hooks import LakehouseHook


class RetentionAlignmentOperator(BaseOperator):
    """Checks that pipeline `pipeline`'s topic keeps records for its worst observed lag plus
    `retention.outage_budget` plus `retention.replay_window`, reports the snapshot-expiry window
    maintenance uses (the replay window), applies `retention.delete_after` (a Spark DELETE in this
    process, only when set) and records a `retention` event (lakehouse.upkeep.retention.align).

    A topic whose retention is too short fails the task without retries (waiting does not fix a
    configuration) with the explanation and the `kafka-configs --alter ... retention.ms=N` to run.

    Templated fields: pipeline.
    XCom: return value = the report (retention_ms, required_ms, worst_lag_s, observed_batches,
    snapshot_expiry_window_s, status, message, suggestion, deleted_rows, ...); when the task
    fails, the same report under key `report`.
    """

    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def execute(self, context: Any) -> dict:
        lakehouse = LakehouseHook(self.pipeline)
        spec = lakehouse.spec
        spark = lakehouse.spark(f"lakehouse-retention-{spec.name}") if spec.retention.delete_after_s else None
        report = retention.align(spec, lakehouse.platform, spark=spark)
        try:
            report.raise_for_status()
        except retention.RetentionMisalignedError as exc:
            context["ti"].xcom_push(key="report", value=report.to_json())
            raise AirflowFailException(str(exc)) from exc
        return report.to_json()
