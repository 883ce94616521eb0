"""VerifyOperator: prove the pipeline's tables hold every offset exactly once (lakehouse.audit.verify)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from lakehouse.audit import verify
from lakehouse.wap import publish
from lakehouse_airflow.hooks import LakehouseHook


class VerificationFailed(AirflowFailException):
    """Offsets are missing, duplicated, foreign or stale. Not retried: the tables stay so until fixed."""


class VerifyOperator(BaseOperator):
    """Verify the snapshots committed since the last passing verification (incremental), in this
    process or, for a window above `verify.SPARK_ABOVE_OFFSETS` offsets, as a Spark job on the
    platform's master. Records a `verify` event; the next run starts after the snapshots it verified.

    With `snapshots_task_id` (the publish DAG's `quality` task), the data tables are verified up to
    exactly the snapshots that task audited (its ``result`` XCom), so that `publish` can require a
    passing verification of exactly the snapshots it publishes (lakehouse.wap.publish.require_verification);
    skipped when nothing was audited. When every audited snapshot was verified before, but never all
    together (each table alongside other snapshots of the others), the incremental run has nothing new
    to check; their combination is then verified in full.

    :param pipeline: the pipeline name. Templated.
    :param snapshots_task_id: the QualityOperator task whose audited snapshots to verify, or None
        for every table's head.

    XCom: ``return_value`` = the verification (lakehouse.audit.verify_model.Verification.to_json): ok, status,
    mode, snapshots {table: snapshot verified}, window, offsets, rows, counts, missing, problems
    [{kind, partition, offset, tables, detail, topic, key}], seconds, offsets_per_s. When it fails
    (problems found) the same dict is pushed under ``result`` and the task fails without retry.
    """

    template_fields = ("pipeline", "snapshots_task_id")
    ui_color = "#d0e0e3"

    def __init__(self, *, pipeline: str, snapshots_task_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.snapshots_task_id = snapshots_task_id

    def execute(self, context) -> dict:
        upto = None
        if self.snapshots_task_id:
            audited = context["ti"].xcom_pull(task_ids=self.snapshots_task_id, key="result")
            if not audited or not audited.get("snapshots"):
                raise AirflowSkipException(f"{self.pipeline}: task {self.snapshots_task_id!r} audited no snapshot; "
                                           f"nothing to verify")
            upto = {table: int(snapshot) for table, snapshot in audited["snapshots"].items()}
        hook = LakehouseHook(self.pipeline)

        def spark():
            return hook.spark(f"lakehouse-verify-{self.pipeline}")

        result = verify.verify(hook.spec, hook.platform, upto=upto, progress=self.log.info, spark_factory=spark)
        if upto and result.nothing_new and publish.verification_of(hook.spec, upto, hook.platform) is None:
            self.log.info("every audited snapshot was verified, but not all together: verifying them in full")
            result = verify.verify(hook.spec, hook.platform, upto=upto, full=True, progress=self.log.info,
                                   spark_factory=spark)
        payload = result.to_json()
        if not result.ok:
            context["ti"].xcom_push(key="result", value=payload)
            raise VerificationFailed(result.summary())
        return payload
