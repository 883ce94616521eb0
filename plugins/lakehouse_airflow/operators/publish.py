"""PublishOperator: the publish step of write-audit-publish."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from lakehouse.core.spec import PipelineSpec
from lakehouse.ops import verify
from lakehouse.wap import publish, quality
from lakehouse_airflow.hooks import LakehouseHook


def table_asset(spec: PipelineSpec, table: str) -> Asset:
    """The Airflow Asset of one Iceberg table (`iceberg://<catalog>/<namespace>/<table>`)."""
    return Asset(name=spec.qualified(table), uri=f"iceberg://{spec.catalog}/{table.replace('.', '/')}")


def table_assets(spec: PipelineSpec) -> list[Asset]:
    """One Asset per data table, for `outlets=` and for downstream DAGs' `schedule=`."""
    return [table_asset(spec, t) for t in spec.target.tables]


class PublishOperator(BaseOperator):
    """Fast-forward the readers' branch of every data table to the snapshots `quality_task_id` audited.

    Skips when no table holds data yet. Refuses (fails without retry) when there is no
    audit result, when the audit did not pass, when an audited snapshot was not verified exactly
    once by a passing verification (the publish DAG's `verify` task; lakehouse.ops.verify),
    or when an audited snapshot does not descend from the current published head. The
    first publication creates the branch and the readers' view. Records a `publish`
    event. Pass `outlets=table_assets(spec)` so downstream DAGs schedule on the tables.

    :param pipeline: the pipeline name. Templated.
    :param quality_task_id: the QualityOperator task whose ``result`` XCom names the snapshots.

    XCom: ``return_value`` = [{table, snapshot_id, previous_snapshot_id, view}].
    """

    template_fields = ("pipeline", "quality_task_id")
    ui_color = "#d9ead3"

    def __init__(self, *, pipeline: str, quality_task_id: str = "quality", **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.quality_task_id = quality_task_id

    def execute(self, context) -> list[dict]:
        audited = context["ti"].xcom_pull(task_ids=self.quality_task_id, key="result")
        if not audited:
            raise AirflowFailException(f"no audit result from task {self.quality_task_id!r}: nothing to publish")
        if not audited["snapshots"]:
            raise AirflowSkipException(f"{self.pipeline}: no table holds data yet; nothing to publish")
        if not audited["success"]:
            raise AirflowFailException(f"the audit of {self.pipeline} failed; refusing to publish")
        hook = LakehouseHook(self.pipeline)
        try:
            done = publish.publish(hook.spec, audited["snapshots"], hook.platform,
                                   spark_factory=lambda: hook.spark(f"lakehouse-publish-{self.pipeline}"),
                                   require_verified=True)
        except (publish.NotADescendantError, quality.LineageError, verify.UnverifiedError) as exc:
            # auditing (or publishing) again cannot help until someone acts
            raise AirflowFailException(str(exc)) from None
        for p in done:
            self.log.info("%s: %s -> %s%s", p.table, p.previous_snapshot_id, p.snapshot_id,
                          f" (view {p.view})" if p.view else "")
        return [{"table": p.table, "snapshot_id": p.snapshot_id, "previous_snapshot_id": p.previous_snapshot_id,
                 "view": p.view} for p in done]
