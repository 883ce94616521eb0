"""Write-audit-publish, one DAG per pipeline: new data reaches readers only after it passed.

`quality` validates the rows `main` gained since the last publication (ingested, replayed
or backfilled: every snapshot after the published head) with the pipeline's expectation
suite (a failure stops here: `main` keeps the rows, readers keep the published branch;
Data Docs and the offending offsets are in the task log and the `quality` event).
`verify` proves the audited snapshots hold every offset exactly once (incrementally, since the
last verification; a failure lists the missing, duplicated and foreign coordinates and stops
here, and `publish` refuses unless one passing verification verified exactly the snapshots it
publishes, all together). `freshness` and `lag` wait (deferred) until the pipeline is inside
its SLOs. `publish` fast-forwards the readers' branch to exactly the audited snapshots and
emits an asset event per table, which downstream DAGs can schedule on.

A failed audit blocks every later publication too (each audit covers everything since the
last publication): fix or delete the offending rows on `main` (the `quality` event names
their topic, partition and offset) and the next run audits and publishes again.

Forced publication: trigger a run with `force` true to publish past the freshness and lag
gates (they measure, log and pass at once); the audit still decides. The `publish` event
records the run as forced and who triggered it.
"""

from __future__ import annotations

from airflow.sdk import Param

from lakehouse_airflow.dag_defaults import pipeline_dag, pipelines
from lakehouse_airflow.operators.publish import PublishOperator, table_assets
from lakehouse_airflow.operators.quality import QualityOperator
from lakehouse_airflow.operators.verify import VerifyOperator
from lakehouse_airflow.sensors import FreshnessSensor, LagSensor

for _spec in pipelines().values():
    with pipeline_dag(
        _spec, "publish",
        schedule=_spec.publish.schedule,
        extra_tags=("quality",),
        doc=__doc__ + f"\n- readers' branch `{_spec.publish.branch}`"
        + (f", view `{_spec.qualified(_spec.publish.view)}`" if _spec.publish.view else "")
        + f"; suite `{_spec.publish.suite or _spec.name}.json` of the expectations folder\n",
        params={"force": Param(False, type="boolean",
                               description="publish past the freshness and lag gates (the audit still decides); "
                                           "recorded as a forced publication")},
    ):
        _audit = QualityOperator(task_id="quality", pipeline=_spec.name)
        _verify = VerifyOperator(task_id="verify", pipeline=_spec.name, snapshots_task_id="quality")
        # wait up to 5 minutes for the SLOs; a miss fails this run and the next scheduled run retries
        _gates = [Sensor(task_id=kind, pipeline=_spec.name, poke_interval=10, timeout=300, retries=0,
                         force_param="force")
                  for kind, Sensor in (("freshness", FreshnessSensor), ("lag", LagSensor))]
        _publish = PublishOperator(task_id="publish", pipeline=_spec.name, quality_task_id="quality",
                                   force_param="force", outlets=table_assets(_spec))
        _audit >> _verify >> _gates >> _publish
