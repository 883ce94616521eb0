"""Retention operators: the topic's retention against lag + outage budget + replay window (alignment), and
the retention guard that extends it while the writer is behind."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from lakehouse.core import errors
from lakehouse.upkeep import retention
from lakehouse_airflow.audit import actor_of
from lakehouse_airflow.hooks import KAFKA_CONN_ID, LakehouseHook


class RetentionAlignmentOperator(BaseOperator):
    """Checks that pipeline `pipeline`'s topic keeps records for its worst observed lag plus
    `retention.outage_budget` plus `retention.replay_window`, reports the snapshot-expiry window
    maintenance uses (the replay window), applies `retention.delete_after` (a Spark DELETE in this
    process, only when set) and records a `retention` event (lakehouse.upkeep.retention.align).

    With the DAG run's `dry_run` Param on, the delete is only counted (rows per table in `deleted_rows`)
    and no event is recorded. A topic whose retention is too short fails the task without retries
    (waiting does not fix a configuration) with the explanation and the
    `kafka-configs --alter ... retention.ms=N` to run.

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
        dry_run = bool((context.get("params") or {}).get("dry_run", False))  # the DAG run's `dry_run` Param
        spark = (lakehouse.spark(f"lakehouse-retention-{spec.name}")
                 if spec.retention.delete_after_s and not dry_run else None)
        report = retention.align(spec, lakehouse.platform, spark=spark, dry_run=dry_run)
        try:
            report.raise_for_status()
        except errors.RetentionMisalignedError as exc:
            context["ti"].xcom_push(key="report", value=report.to_json())
            raise AirflowFailException(str(exc)) from exc
        return report.to_json()


class RetentionGuardOperator(BaseOperator):
    """Runs the retention guard of pipeline `pipeline` once (lakehouse.upkeep.retention.guard): when the
    oldest record not yet ingested gets within `retention.guard_threshold` of the topic's retention
    horizon it raises the topic's retention.ms (at most `retention.max_retention`), and restores the
    declared value once the writer has caught up; each change is a `retention_guard` event naming the
    DAG run's actor. With the DAG run's `dry_run` Param on, the report says what it would set and the
    topic and the timeline are left as they are.

    Fails without retries (the alert; waiting for the next run is the retry) when records not yet
    ingested will age out and the guard could not prevent it: no `max_retention`, the cap reached, or
    the broker refused the change (the message names the missing permission, ALTER_CONFIGS on the topic).
    Kafka settings: the environment's, overridden by the Kafka connection `kafka_conn_id` (default
    `lakehouse_kafka`, if it exists): its principal is the one that needs the permission.

    Templated fields: pipeline.
    XCom: return value = the report (retention_ms, declared_ms, threshold_ms, max_retention_ms,
    oldest_age_ms, partitions, action, new_retention_ms, status, message, missing_permission,
    guard_state); when the task fails, the same report under key `report`.
    """

    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Any) -> dict:
        lakehouse = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        report = retention.guard(lakehouse.spec, lakehouse.platform, actor=actor_of(context),
                                 dry_run=bool((context.get("params") or {}).get("dry_run", False)))
        self.log.info("%s: %s", report.action, report.message)
        try:
            report.raise_for_status()
        except (errors.RetentionAtRiskError, errors.RetentionChangeRefusedError) as exc:
            context["ti"].xcom_push(key="report", value=report.to_json())
            raise AirflowFailException(str(exc)) from exc
        return report.to_json()
