"""PublishOperator: the publish step of write-audit-publish."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from lakehouse.core import config, errors, lineage, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse.wap import publish
from lakehouse_airflow.audit import actor_of, require_operator
from lakehouse_airflow.hooks import LakehouseHook
from lakehouse_airflow.lineage import openlineage_enabled
from lakehouse_airflow.sensors import forced


def table_asset(spec: PipelineSpec, table: str) -> Asset:
    """The Airflow Asset of one Iceberg table (`iceberg://<catalog>/<namespace>/<table>`)."""
    return Asset(name=spec.qualified(table), uri=f"iceberg://{spec.catalog}/{table.replace('.', '/')}")


def table_assets(spec: PipelineSpec) -> list[Asset]:
    """One Asset per data table, for `outlets=` and for downstream DAGs' `schedule=`."""
    return [table_asset(spec, t) for t in spec.target.tables]


class PublishOperator(BaseOperator):
    """Fast-forward the readers' branch of every data table to the snapshots `quality_task_id` audited.

    Skips when no table holds data yet. Refuses (fails without retry) when there is no
    audit result, when the audit did not pass, when no passing verification verified exactly the
    audited snapshots, all together (the publish DAG's `verify` task; lakehouse.wap.publish.require_verification),
    when an audited snapshot does not descend from the current published head, and a run
    triggered by a user who is not a lakehouse operator (lakehouse_airflow.audit.require_operator).
    The first publication creates the branch and the readers' view. Records a `publish`
    event naming the DAG run's actor and whether the run forced publication past the SLO
    gates (its param `force_param`, when given). Pass `outlets=table_assets(spec)` so downstream
    DAGs schedule on the tables. OpenLineage (when configured): the data tables in, the readers'
    views out (a table without a view: the table itself, at the published branch).

    :param pipeline: the pipeline name. Templated.
    :param quality_task_id: the QualityOperator task whose ``result`` XCom names the snapshots.
    :param force_param: the DAG param that forces publication past the SLO gates (None: none).

    XCom: ``return_value`` = [{table, snapshot_id, previous_snapshot_id, view}].
    """

    template_fields = ("pipeline", "quality_task_id")
    ui_color = "#d9ead3"

    def __init__(self, *, pipeline: str, quality_task_id: str = "quality", force_param: str | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.quality_task_id = quality_task_id
        self.force_param = force_param
        self._lineage: tuple[list, list] = ([], [])  # OpenLineage datasets (in, out), gathered when enabled

    def execute(self, context) -> list[dict]:
        hook = LakehouseHook(self.pipeline)
        actor, force = actor_of(context), forced(context, self.force_param)
        require_operator(actor, "publish", {"forced": force}, hook)
        audited = context["ti"].xcom_pull(task_ids=self.quality_task_id, key="result")
        if not audited:
            raise AirflowFailException(f"no audit result from task {self.quality_task_id!r}: nothing to publish")
        if not audited["snapshots"]:
            raise AirflowSkipException(f"{self.pipeline}: no table holds data yet; nothing to publish")
        if not audited["success"]:
            raise AirflowFailException(f"the audit of {self.pipeline} failed; refusing to publish")
        try:
            done = publish.publish(hook.spec, audited["snapshots"], hook.platform,
                                   spark_factory=lambda: hook.spark(f"lakehouse-publish-{self.pipeline}"),
                                   actor=actor, forced=force, require_verified=True)
        except (errors.NotADescendantError, errors.LineageError, errors.UnverifiedError) as exc:
            # auditing (or publishing) again cannot help until someone acts
            raise AirflowFailException(str(exc)) from None
        if openlineage_enabled():
            self._lineage = self.datasets(hook.spec, hook.platform, done)
        for p in done:
            self.log.info("%s: %s -> %s%s", p.table, p.previous_snapshot_id, p.snapshot_id,
                          f" (view {p.view})" if p.view else "")
        return [{"table": p.table, "snapshot_id": p.snapshot_id, "previous_snapshot_id": p.previous_snapshot_id,
                 "view": p.view} for p in done]

    @staticmethod
    def datasets(spec: PipelineSpec, platform: config.PlatformConfig,
                 done: list[publish.PublishedTable]) -> tuple[list, list]:
        """(Each published data table at the published snapshot, what readers read of it there) as
        OpenLineage datasets: the output is the table's readers' view, or, for a table without one (a
        candidate pipeline, `publish.view: null`), the table itself at the published branch
        (`lineage.table_dataset(branch=...)`); either with the table's schema and row count at the
        published snapshot."""
        catalog = open_catalog(platform, spec.catalog)
        inputs, outputs = [], []
        for published in done:
            table = catalog.load_table(published.table)
            snapshot = table.snapshot_by_id(published.snapshot_id)
            inputs.append(lineage.table_dataset(spec, platform, published.table, table,
                                                version=published.snapshot_id))
            if snapshot is None:  # expired since: nothing to say about what readers read
                continue
            rows = offsets.summary_properties(snapshot).get("total-records")
            schema = table.schema() if snapshot.schema_id is None else \
                table.schemas().get(snapshot.schema_id, table.schema())
            at_snapshot: dict[str, Any] = {"output": True, "schema": schema,
                           "version": published.snapshot_id, "rows": None if rows is None else int(rows)}
            if published.view:
                outputs.append(lineage.table_dataset(spec, platform, published.view, view=True, **at_snapshot))
            else:
                outputs.append(lineage.table_dataset(spec, platform, published.table, table,
                                                     branch=spec.publish.branch, **at_snapshot))
        return inputs, outputs

    def get_openlineage_facets_on_complete(self, task_instance):
        """The publication's datasets for Airflow's OpenLineage provider (gathered by `execute`): each
        published data table in, and its readers' view (or, without one, the table at the published
        branch) out."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        inputs, outputs = self._lineage
        return OperatorLineage(inputs=inputs, outputs=outputs)
