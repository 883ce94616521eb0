"""CutoverOperator: move a live pipeline's readers to a candidate, or roll the last cutover back."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

from lakehouse.core import sparkenv
from lakehouse.core import spec as spec_module
from lakehouse.wap import cutover
from lakehouse_airflow import locations
from lakehouse_airflow.audit import actor_of, require_operator
from lakehouse_airflow.hooks import LakehouseHook

ACTIONS = ("cutover", "rollback")


class CutoverOperator(BaseOperator):
    """Cut `pipeline`'s readers' view over to `candidate`, or roll back the newest cutover.

    A cutover happens only when the candidate's lag and freshness are at least as good
    as the live pipeline's and it holds every offset of the overlap window exactly once
    with its quality suite passing (`lakehouse.wap.cutover.compare`); otherwise the task
    fails naming each failed check. A rollback rebuilds the view from the typed sources
    of the cutover event and the specs, never from SQL text in the timeline, and fails
    when that event does not check out. Each run is one `cutover` or `rollback` event in the
    ops timeline of the pipeline's catalog naming the DAG run's actor (the user who triggered
    it), the parameters and the outcome, refusals included; a user who is not a lakehouse
    operator is refused before anything is checked (lakehouse_airflow.audit.require_operator).

    :param pipeline: the live pipeline (owner of `publish.view`). Templated.
    :param candidate: the candidate pipeline (`candidate_for: <pipeline>`); unused for rollback. Templated.
    :param action: ``cutover`` or ``rollback``. Templated.
    :param freshness_tolerance_s: how much older the candidate's last commit may be
        (default: one candidate trigger interval).

    XCom: ``return_value`` = the recorded event details (view, previous and new
    source and query, and for a cutover the full comparison).
    """

    template_fields = ("pipeline", "candidate", "action")
    ui_color = "#d6e4ff"

    def __init__(self, *, pipeline: str, candidate: str = "", action: str = "cutover",
                 freshness_tolerance_s: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.candidate = candidate
        self.action = action
        self.freshness_tolerance_s = freshness_tolerance_s

    def execute(self, context) -> dict:
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {', '.join(ACTIONS)}")
        hook = LakehouseHook(self.pipeline)
        actor = actor_of(context)
        require_operator(actor, self.action, {"candidate": self.candidate} if self.action == "cutover" else {}, hook)
        if self.action == "cutover" and not self.candidate:
            raise ValueError("a cutover needs a candidate pipeline")
        # the candidates' tables may live in other catalogs than the view
        spark = sparkenv.session(hook.platform, cutover.catalogs(hook.spec), f"lakehouse-{self.action}-{self.pipeline}")
        if self.action == "rollback":
            return cutover.rollback(spark, hook.spec, hook.platform, actor=actor)
        candidate = spec_module.load_pipeline(self.candidate, locations.pipelines_dir())
        return cutover.cutover(spark, hook.spec, candidate, hook.platform, self.freshness_tolerance_s, actor=actor)
