"""Who acts through Airflow, and who may: the actor of a DAG run for the audit trail, and the operator
role that the DAGs changing what readers see (publish, backfill, cutover) are restricted to.

`actor_of(context)` is the DAG run's lakehouse.core.events.Actor: the user who triggered it (Airflow
3's `DagRun.triggering_user_name`; `scheduler` for a run nobody triggered), the DAG and run ids and the
run type. Operators pass it to what they call, and to the Spark jobs they submit through
`Actor.environment()`, so every audited event names it.

Restriction, in two layers:

1. Airflow's access control, where the configured auth manager has DAG-level permissions. With the
   FAB auth manager (apache-airflow-providers-fab) the restricted DAGs carry `access_control`
   (`operator_access_control()`): the role named by LAKEHOUSE_OPERATOR_ROLE (default
   `lakehouse_operator`, which must exist) may see, edit (pause) and trigger them; the DAG
   processor syncs it into FAB's permissions when it stores a DAG. It only adds permissions: users
   whose roles grant DAG edit or run creation globally (FAB's `User`, `Op`, `Admin`) still trigger
   every DAG, so everybody else needs roles without them (FAB's `Viewer`). FAB has no per-DAG grant
   for task instances: operators who clear or mark tasks also need `can_create` and `can_edit` on
   `Task Instances` and `DAG Runs` globally, which FAB applies only to the DAGs they may edit.
   Airflow 3 deprecates DAG-level `access_control` (it warns on every parse) and only FAB reads it, so
   it is set only when FAB is the configured auth manager. Airflow's simple auth manager (the
   default, and the compose stack's) has no per-DAG permissions: its roles VIEWER < USER < OP < ADMIN
   apply to every DAG, and USER and above may trigger any DAG.
2. The platform's own check, for any auth manager: LAKEHOUSE_OPERATORS, a comma-separated list of
   Airflow user names. When it is set, a run of a restricted DAG triggered by anyone else is refused by
   its first acting task (`require_operator`), and the refusal is an audited `failed` event; runs
   nobody triggered (scheduled) are not affected. Unset, Airflow's access control alone decides.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from lakehouse.core import events
from lakehouse_airflow.hooks import LakehouseHook

OPERATOR_ROLE_ENV = "LAKEHOUSE_OPERATOR_ROLE"
OPERATORS_ENV = "LAKEHOUSE_OPERATORS"
DEFAULT_OPERATOR_ROLE = "lakehouse_operator"
# the DAG kinds (lakehouse.core.spec.DAG_KINDS) that change what readers see
RESTRICTED_DAG_KINDS = ("publish", "backfill", "cutover")


class NotAnOperatorError(AirflowFailException):
    """The run was triggered by a user who is not a lakehouse operator (LAKEHOUSE_OPERATORS)."""


def actor_of(context: Any) -> events.Actor:
    """The actor of the task's DAG run: its triggering user, or `scheduler` when nobody triggered it."""
    run = context["dag_run"]
    return events.Actor.airflow(run.dag_id, run.run_id, str(getattr(run.run_type, "value", run.run_type)),
                                run.triggering_user_name)


def operator_role() -> str:
    """The Airflow role the restricted DAGs are granted to (LAKEHOUSE_OPERATOR_ROLE)."""
    return os.environ.get(OPERATOR_ROLE_ENV, "").strip() or DEFAULT_OPERATOR_ROLE


def operator_access_control() -> dict[str, dict[str, set[str]]] | None:
    """The `access_control` of a DAG that changes what readers see: the operator role may read and edit
    (pause) the DAG and create (trigger) and read its runs. (FAB grants `DAG Runs` per DAG only
    can_read, can_create, can_delete and menu_access; any other action there makes the DAG processor
    refuse to store the DAG.) None unless the configured auth manager is FAB's, the one that applies
    DAG-level permissions."""
    from airflow.sdk.configuration import conf

    if "FabAuthManager" not in conf.get("core", "auth_manager", fallback=""):
        return None
    return {operator_role(): {"DAGs": {"can_read", "can_edit"}, "DAG Runs": {"can_read", "can_create"}}}


def operators() -> frozenset[str]:
    """The Airflow users allowed to trigger the restricted DAGs (LAKEHOUSE_OPERATORS); empty: not checked."""
    return frozenset(name.strip() for name in os.environ.get(OPERATORS_ENV, "").split(",") if name.strip())


def require_operator(actor: events.Actor, kind: str, parameters: dict, hook: LakehouseHook) -> None:
    """Refuse the action `kind` (an event kind) with `parameters` on `hook`'s pipeline when LAKEHOUSE_OPERATORS
    is set and `actor`, a user who triggered the run, is not on it: record it as a `failed` event naming
    the actor, then raise NotAnOperatorError. Runs nobody triggered (the scheduler's) pass."""
    allowed = operators()
    # Airflow's own record of who triggered the run decides, not the name shown (a user may be called "scheduler")
    if not allowed or actor.origin.get("triggered_by") is None or actor.user in allowed:
        return
    refusal = (f"{actor.user!r} triggered {actor.origin.get('dag_id')} but is not a lakehouse operator: only "
               f"{', '.join(sorted(allowed))} may ({OPERATORS_ENV}). Nothing was changed; ask one of them, or an "
               f"administrator to add you")
    events.record(events.Event(hook.pipeline, kind, "failed", refusal, details={"parameters": parameters},
                               actor=actor), platform=hook.platform, catalog=hook.spec.catalog)
    raise NotAnOperatorError(refusal)
