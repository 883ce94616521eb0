"""Backfill, one DAG per pipeline: re-ingest an offset range or a time window, from the UI.

Trigger it with the form: `mode` offsets (per partition, `0:100-200,1:0-50`, end exclusive)
or time (`start_time`/`end_time`, Kafka timestamps); `target` in_place (the pipeline's own
tables) or candidate (`candidate_table`, created from the contract if missing). The
`plan` task validates the request and shows in its XCom what would be written; a dry run
(the default) stops there. Otherwise the replay job inserts only rows whose source
coordinates are absent, so running a backfill twice writes nothing the second time, and it
never moves the live pipeline's positions. Each run records a `backfill` event.

The `backfill` task checks again when it is about to write (a cleared task may run days later): the
user who triggered the run must still be a lakehouse operator allowed to trigger this DAG, and the plan
in XCom must be what the run's request plans now; otherwise it writes nothing and fails, naming the
user and the missing permission, or what differs. A run nobody triggered writes nothing.
"""

from __future__ import annotations

from airflow.sdk import Param

from lakehouse.core.spec import TABLE_NAME_FORM_PATTERN
from lakehouse_airflow.dag_defaults import pipeline_dag, pipelines
from lakehouse_airflow.operators.backfill import BackfillPlanOperator, BackfillSparkSubmitOperator
from lakehouse_airflow.spark import submit_kwargs

for _spec in pipelines().values():
    with pipeline_dag(
        _spec, "backfill",
        schedule=None,
        retries=0,
        doc=__doc__,
        params={
            "mode": Param("offsets", type="string", enum=["offsets", "time"],
                          description="offsets: explicit per-partition ranges; time: a window of Kafka timestamps"),
            "offsets": Param("", type="string", pattern=r"^[0-9:,\s-]*$",
                             description="mode offsets: PARTITION:START-END[,...], end exclusive, "
                                         "e.g. 0:100-200,1:0-50"),
            "start_time": Param(None, type=["null", "string"], format="date-time",
                                description="mode time: start of the window (ISO-8601 with offset)"),
            "end_time": Param(None, type=["null", "string"], format="date-time",
                              description="mode time: end of the window; empty = up to the committed position"),
            "target": Param("in_place", type="string", enum=["in_place", "candidate"],
                            description="in_place: the pipeline's tables; candidate: a separate table"),
            "candidate_table": Param(None, type=["null", "string"], pattern=TABLE_NAME_FORM_PATTERN,
                                     description="target candidate: namespace.table to fill (not a live table)"),
            "dry_run": Param(True, type="boolean", description="only plan: show what would be written"),
        },
    ):
        BackfillPlanOperator(task_id="plan", pipeline=_spec.name) >> BackfillSparkSubmitOperator(
            task_id="backfill", pipeline=_spec.name, plan_task_id="plan", **submit_kwargs(_spec, "replay"))
