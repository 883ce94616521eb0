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

Both layers are checked when a run is triggered; a task that acts long after (a backfill's job runs
after its plan, a cleared task runs again days later) checks again at that moment
(`require_authority`): the user who triggered the run must still be on LAKEHOUSE_OPERATORS (when set)
and still be allowed by the auth manager to trigger the DAG (`trigger_authority`: FAB's or the simple
auth manager's own `is_authorized_dag` for creating runs of it, the REST API's check of a trigger). An
Airflow 3 worker keeps task code away from the metadata database, where FAB keeps its users and roles,
so there FAB cannot be asked: LAKEHOUSE_OPERATORS must then be set, else the action is refused (it
cannot be confirmed, so it does not happen). A run nobody triggered is refused by `require_authority`:
the DAGs that use it (backfill) act only for a person.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowFailException

from lakehouse.core import events
from lakehouse_airflow.hooks import LakehouseHook

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

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
    _refuse(actor, kind, parameters, hook, _not_listed(actor.user, actor.origin.get("dag_id"), allowed))


def _not_listed(user: str, dag_id: str | None, allowed: frozenset[str]) -> str:
    return (f"{user!r} triggered {dag_id} but is not a lakehouse operator: only {', '.join(sorted(allowed))} may "
            f"({OPERATORS_ENV}). Nothing was changed; ask one of them, or an administrator to add you")


def _refuse(actor: events.Actor, kind: str, parameters: dict, hook: LakehouseHook, refusal: str) -> NoReturn:
    """Record `refusal` of the action as a `failed` event naming `actor`, then raise NotAnOperatorError."""
    events.record(events.Event(hook.pipeline, kind, "failed", refusal, details={"parameters": parameters},
                               actor=actor), platform=hook.platform, catalog=hook.spec.catalog)
    raise NotAnOperatorError(refusal)


# ---------------------------------------------------------------------------- authority where the action happens

TRIGGER = "trigger (create runs of)"


@dataclass(frozen=True)
class Authority:
    """The auth manager's answer to "may this user trigger this DAG now": `allowed` True or False, or None
    when it cannot be asked from this process; `reason` says what grants it or what is missing."""

    allowed: bool | None
    reason: str


def trigger_authority(user: str, dag_id: str) -> Authority:
    """Whether the configured auth manager lets `user` trigger `dag_id` now: its `is_authorized_dag` for
    POST on the DAG's runs (DagAccessEntity.RUN), the check Airflow's REST API applies to a trigger.

    The simple auth manager is answered from its configuration ([core] simple_auth_manager_users, every
    user an admin with simple_auth_manager_all_admins). FAB is answered from its users and roles in the
    metadata database, where this process can reach it (`dag.test()`, `airflow dags test`, `airflow tasks
    test`); an Airflow 3 worker cannot (task code is kept away from the database), nor can any other auth
    manager be asked for a user by name: then `allowed` is None."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.configuration import conf

    try:
        manager = conf.getimport("core", "auth_manager")
    except Exception as exc:  # noqa: BLE001 - an unloadable auth manager cannot vouch for anyone
        return Authority(None, f"the configured auth manager cannot be loaded ({type(exc).__name__}: {exc})")
    if isinstance(manager, type) and issubclass(manager, SimpleAuthManager):
        return _simple_authority(manager, user, dag_id)
    if "FabAuthManager" in {cls.__name__ for cls in getattr(manager, "__mro__", ())}:
        return _fab_authority(manager, user, dag_id)
    return Authority(None, f"the auth manager {getattr(manager, '__module__', '?')}."
                           f"{getattr(manager, '__qualname__', manager)} cannot be asked about a user by name "
                           f"from a task")


def _run_access(dag_id: str) -> dict:
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return {"method": "POST", "access_entity": DagAccessEntity.RUN, "details": DagDetails(id=dag_id)}


def _simple_authority(manager: type[SimpleAuthManager], user: str, dag_id: str) -> Authority:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.configuration import conf

    if conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False):
        return Authority(True, "the simple auth manager makes everyone an admin (simple_auth_manager_all_admins)")
    roles = {u.username: u.role for u in manager.get_users()}
    if user not in roles:
        return Authority(False, f"{user!r} is not a user of the simple auth manager (AIRFLOW__CORE__SIMPLE_AUTH_"
                                f"MANAGER_USERS names {', '.join(sorted(roles)) or 'nobody'})")
    role = (roles[user] or "none").upper()
    try:
        allowed = manager().is_authorized_dag(user=SimpleAuthManagerUser(username=user, role=roles[user]),
                                              **_run_access(dag_id))
    except KeyError:  # a role the simple auth manager does not know: Airflow lets the user do nothing
        allowed = False
    if allowed:
        return Authority(True, f"the simple auth manager gives {user!r} the role {role}")
    return Authority(False, f"the simple auth manager gives {user!r} the role {role}, which may not {TRIGGER} "
                            f"{dag_id} (USER, OP and ADMIN may)")


def _fab_authority(manager: type, user: str, dag_id: str) -> Authority:
    from airflow.configuration import conf

    if conf.get("database", "sql_alchemy_conn", fallback="").startswith("airflow-db-not-allowed"):
        return Authority(None, "the FAB auth manager keeps users and roles in the metadata database, which an "
                               "Airflow 3 worker keeps task code away from")
    try:
        from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

        with get_application_builder() as appbuilder:
            found = appbuilder.sm.find_user(username=user)
            if found is None:
                return Authority(False, f"{user!r} is not a user of the FAB auth manager (any more)")
            if not found.is_active:
                return Authority(False, f"the FAB user {user!r} is deactivated")
            roles = sorted(role.name for role in found.roles)
            if manager().is_authorized_dag(user=found, **_run_access(dag_id)):
                return Authority(True, f"FAB grants {user!r} (roles {', '.join(roles)}) triggering {dag_id}")
            return Authority(False, f"FAB does not let {user!r} (roles {', '.join(roles) or 'none'}) {TRIGGER} "
                                    f"{dag_id}: that takes can_create on DAG Runs and can_edit on the DAG, "
                                    f"which the role {operator_role()} has on it")
    except Exception as exc:  # noqa: BLE001 - an unreachable database cannot vouch for anyone
        return Authority(None, f"the FAB auth manager could not be asked ({type(exc).__name__}: {exc})")


def require_authority(actor: events.Actor, kind: str, parameters: dict, hook: LakehouseHook) -> None:
    """Refuse the action `kind` with `parameters` on `hook`'s pipeline, at the moment it is about to happen,
    unless the user who triggered the run still may: on LAKEHOUSE_OPERATORS when it is set, and allowed by
    the auth manager to trigger the run's DAG (`trigger_authority`). When the auth manager cannot be asked
    from here, LAKEHOUSE_OPERATORS alone decides, and without it the action is refused. A run nobody
    triggered is refused: the actions guarded so happen only for a person. A refusal is a `failed` event
    naming the actor and what is missing; then NotAnOperatorError."""
    dag_id, user = actor.origin.get("dag_id"), actor.origin.get("triggered_by")
    if user is None or dag_id is None:
        _refuse(actor, kind, parameters, hook,
                f"nobody triggered {dag_id} run {actor.origin.get('run_id')} ({actor.origin.get('run_type')}): "
                f"only a person may {kind}, and no user's authority can be checked. Nothing was changed; "
                f"trigger it from the Airflow UI or REST API as a lakehouse operator")
    allowed = operators()
    if allowed and user not in allowed:
        _refuse(actor, kind, parameters, hook, _not_listed(user, dag_id, allowed))
    authority = trigger_authority(user, dag_id)
    if authority.allowed is False:
        _refuse(actor, kind, parameters, hook,
                f"{user!r} triggered {dag_id} but may not {TRIGGER} it now: {authority.reason}. Nothing was "
                f"changed; an operator may trigger it again, or an administrator give {user!r} the permission")
    if authority.allowed is None and not allowed:
        _refuse(actor, kind, parameters, hook,
                f"cannot confirm that {user!r}, who triggered {dag_id}, may still {TRIGGER} it: {authority.reason}. "
                f"Nothing was changed; set {OPERATORS_ENV} (the users who may) in the workers' environment")
