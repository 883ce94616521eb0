"""Candidate cutover and rollback, one DAG per pipeline that serves readers through a view.

Triggered by hand: choose the candidate pipeline (a spec with `candidate_for: <pipeline>`)
and the action. A cutover moves the readers' view to the candidate's published branch
only when the candidate is at least as fresh and caught up as the live pipeline and its
quality holds over the overlap window; a rollback restores the view as it was before the
newest cutover. Both are recorded in `ops.pipeline_events`.
"""

from __future__ import annotations

from airflow.sdk import Param

from lakehouse_airflow.dag_defaults import pipeline_dag, pipelines
from lakehouse_airflow.operators.cutover import ACTIONS, CutoverOperator

_specs = pipelines()
for _spec in _specs.values():
    if "cutover" not in _spec.dag_kinds or _spec.publish.view is None:  # no view to serve, or itself a candidate
        continue
    _candidates = sorted(s.name for s in _specs.values() if s.candidate_for == _spec.name)
    _candidate_param = (Param(_candidates[0], type="string", enum=_candidates,
                              description="candidate pipeline to cut readers over to")
                        if _candidates else
                        Param("", type="string", description="no candidate pipeline is declared yet: add a spec "
                                                             f"with `candidate_for: {_spec.name}`"))
    with pipeline_dag(
        _spec, "cutover",
        schedule=None,
        retries=0,
        doc=__doc__ + f"\nReaders' view: `{_spec.qualified(_spec.publish.view)}`; "
        f"candidates: {', '.join(_candidates) or 'none yet'}.\n",
        params={
            "candidate": _candidate_param,
            "action": Param("cutover", type="string", enum=list(ACTIONS),
                            description="cutover: move readers to the candidate; rollback: undo the newest cutover"),
        },
    ):
        CutoverOperator(task_id="cutover_or_rollback", pipeline=_spec.name,
                        candidate="{{ params.candidate }}", action="{{ params.action }}")
