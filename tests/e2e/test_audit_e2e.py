"""Operator actions are audited and restricted.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/provider/test_audit.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from tests.conftest import forget_auth_manager
from confluent_kafka import Producer

from e2e import pipeline, run_cli, send, task_states, xcom  # noqa: F401 (fixture)
from lakehouse.core import config, events
from tests.unit.provider.test_audit import (  # noqa: F401 - fixtures among them
    OS_USER,
    RESTRICTED,
    actions,
)


FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"


# In a throwaway Airflow with the FAB auth manager, as an administrator would set it up (`airflow sync-perm`,
# `airflow roles create`, `airflow users create`) and as the DAG processor stores DAGs (parse, store, sync each
# DAG's access_control into FAB's permissions), what each user may do to each DAG, per FAB's own
# `is_authorized_dag`, the check behind the REST API (triggering is POST .../dagRuns: DagAccessEntity.RUN).
FAB_SETUP = """
import json, sys
from sqlalchemy import select
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.configuration import conf
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
from airflow.models.errors import ParseImportError
from airflow.models.serialized_dag import SerializedDagModel
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager
from airflow.utils.session import create_session

found, role = sys.argv[1], sys.argv[2]
with get_application_builder() as appbuilder:
    sm = appbuilder.sm
    appbuilder.add_permissions(update_perms=True)
    sm.sync_roles()
    operators = sm.add_role(role)
    for resource in ("Task Instances", "DAG Runs"):  # clearing tasks has no per-DAG grant in FAB
        for action in ("can_create", "can_edit"):
            sm.add_permission_to_role(operators, sm.create_permission(action, resource))
    for name, roles in (("alice", ["Viewer", role]), ("bob", ["Viewer"]), ("carol", ["User"])):
        sm.add_user(name, name, "test", f"{name}@example.com", [sm.find_role(r) for r in roles], password="-")
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(conf.get("core", "dags_folder"))
    with create_session() as session:
        sync_bag_to_db(bag, "dags-folder", None, session=session)
    with create_session() as session:
        errors = {e.filename: e.stacktrace for e in session.scalars(select(ParseImportError))}
        stored = sorted(session.scalars(select(SerializedDagModel.dag_id)))
    auth, may = FabAuthManager(), {}
    for name in ("alice", "bob", "carol"):
        user = sm.find_user(username=name)
        for dag_id in bag.dag_ids:
            dag = DagDetails(id=dag_id)
            may.setdefault(name, {})[dag_id] = {
                "see": auth.is_authorized_dag(method="GET", user=user, details=dag),
                "trigger": auth.is_authorized_dag(method="POST", user=user, access_entity=DagAccessEntity.RUN,
                                                  details=dag),
                "pause": auth.is_authorized_dag(method="PUT", user=user, details=dag),
                "clear": auth.is_authorized_dag(method="POST", user=user,
                                                access_entity=DagAccessEntity.TASK_INSTANCE, details=dag)}

# who may still trigger the backfill DAG when its task acts, asked as the task asks (lakehouse_airflow.audit)
from dataclasses import asdict
from lakehouse_airflow import audit
from airflow.sdk.execution_time.supervisor import block_orm_access

backfill = sys.argv[3] + "_backfill"
now = {name: asdict(audit.trigger_authority(name, backfill)) for name in ("alice", "bob", "carol", "dave")}
with get_application_builder() as appbuilder:  # alice loses the operator role after triggering
    sm = appbuilder.sm
    alice = sm.find_user(username="alice")
    alice.roles = [sm.find_role("Viewer")]
    sm.update_user(alice)
later = asdict(audit.trigger_authority("alice", backfill))
block_orm_access()  # what an Airflow 3 worker does before it runs a task
in_worker = asdict(audit.trigger_authority("carol", backfill))
with open(found, "w") as out:
    json.dump({"errors": errors, "stored": stored, "may": may,
               "authority": {"now": now, "later": later, "in_worker": in_worker}}, out)
"""


@pytest.mark.slow
def test_with_the_fab_auth_manager_only_the_operator_role_may_trigger_the_dags_that_change_what_readers_see(
        make_spec, tmp_path):
    spec = make_spec()
    home = tmp_path / "airflow"
    home.mkdir()
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__AUTH_MANAGER": FAB,
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
           "LAKEHOUSE_OPERATOR_ROLE": "data_ops", "LAKEHOUSE_PIPELINES_DIR": str(make_spec.directory),
           "PYTHONPATH": os.pathsep.join([str(config.REPO_ROOT / "plugins"), str(config.REPO_ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    airflow = Path(sys.executable).with_name("airflow")
    migrated = subprocess.run([str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    found = tmp_path / "found.json"
    done = subprocess.run([sys.executable, "-c", FAB_SETUP, str(found), "data_ops", spec.name], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(found.read_text())

    # FAB accepts the access_control: every DAG of the pipeline is stored, none is an import error
    ours = {f"{spec.name}_{kind}" for kind in ("ingest", "maintenance", "verify", *RESTRICTED)}
    assert result["errors"] == {}
    assert ours <= set(result["stored"])
    may = {name: {dag_id: can for dag_id, can in dags.items() if dag_id in ours}
           for name, dags in result["may"].items()}
    restricted = {f"{spec.name}_{kind}" for kind in RESTRICTED}
    # alice, a viewer with the operator role, triggers, pauses and clears the tasks of the restricted DAGs only:
    # FAB bounds the role's global task instance and run actions by the DAG-level edit access_control grants
    assert {d for d, can in may["alice"].items() if can["trigger"]} == restricted
    assert {d for d, can in may["alice"].items() if can["pause"]} == restricted
    assert {d for d, can in may["alice"].items() if can["clear"]} == restricted
    # bob, a viewer without it, sees every DAG and can trigger, pause or clear none of them
    assert all(can == {"see": True, "trigger": False, "pause": False, "clear": False} for can in may["bob"].values())
    # access_control only adds: carol's User role triggers every DAG (hence: Viewer for everybody else)
    assert all(can["trigger"] for can in may["carol"].values())

    # when the backfill's task acts it asks FAB again, as the REST API asks for a trigger: alice may, bob may not
    # (named with what he lacks), carol may (her User role), dave is nobody; alice, her role taken away, no more
    authority, backfill = result["authority"], f"{spec.name}_backfill"
    assert {name: found["allowed"] for name, found in authority["now"].items()} == \
        {"alice": True, "bob": False, "carol": True, "dave": False}
    assert authority["now"]["bob"]["reason"] == (
        f"FAB does not let 'bob' (roles Viewer) trigger (create runs of) {backfill}: that takes can_create on DAG "
        f"Runs and can_edit on the DAG, which the role data_ops has on it")
    assert authority["now"]["dave"]["reason"] == "'dave' is not a user of the FAB auth manager (any more)"
    assert authority["later"]["allowed"] is False and "'alice' (roles Viewer)" in authority["later"]["reason"]
    # in an Airflow 3 worker task code cannot reach FAB's users: nobody is vouched for (LAKEHOUSE_OPERATORS decides)
    assert authority["in_worker"]["allowed"] is None
    assert "an Airflow 3 worker keeps task code away from" in authority["in_worker"]["reason"]


@pytest.mark.slow
def test_command_line_replays_record_the_os_user_the_arguments_and_the_outcome(platform, pipeline, spark, monkeypatch):
    spec = pipeline(partitions=1)
    send(platform, spec.source.topic, [(b"k", json.dumps({"order_id": f"o-{i}"}).encode()) for i in range(8)])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0

    done = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:0-8")
    refused = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:0-80")
    assert (done.returncode, refused.returncode) == (0, 2)
    assert "goes past the pipeline's committed position 8" in refused.stderr

    failed, ok = actions(platform, spec, "replay")
    for event, asked in ((ok, "0:0-8"), (failed, "0:0-80")):
        assert event["actor"] == OS_USER
        assert event["details"]["actor"] | {"pid": None} == {"user": OS_USER, "via": "cli", "os_user": OS_USER,
                                                             "host": socket.gethostname(), "pid": None}
        assert event["details"]["parameters"] == {"offsets": asked}
    assert ok["status"] == "ok" and ok["metrics"]["records"] == 8
    assert failed["status"] == "failed" and "goes past the pipeline's committed position 8" in failed["message"]

    # the replay job a backfill DAG run submits records the user who triggered that run
    operator = events.Actor.airflow(f"{spec.name}_backfill", "manual__7", "manual", "alice")
    monkeypatch.setenv(events.AIRFLOW_RUN_ENV, operator.environment()[events.AIRFLOW_RUN_ENV])
    assert run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:2-4", "--backfill").returncode == 0
    [backfilled] = actions(platform, spec, "backfill")
    assert (backfilled["actor"], backfilled["details"]["actor"]["run_id"]) == ("alice", "manual__7")
    assert backfilled["details"]["parameters"] == {"offsets": "0:2-4"}


@pytest.mark.slow
def test_rollback_runs_record_who_triggered_them_and_someone_not_an_operator_is_refused(
        platform, pipeline, make_spec, run_dag, spark, monkeypatch):
    live = pipeline()
    nothing = run_dag(f"{live.name}_cutover", make_spec.directory, conf={"action": "rollback"})
    assert task_states(nothing) == {"cutover_or_rollback": "failed"}
    [attempt] = actions(platform, live, "rollback")
    assert (attempt["status"], attempt["actor"]) == ("failed", "dag_test")
    assert "nothing to roll back" in attempt["message"]
    assert attempt["details"]["actor"]["dag_id"] == f"{live.name}_cutover"

    monkeypatch.setenv("LAKEHOUSE_OPERATORS", "alice, bob")
    refused = run_dag(f"{live.name}_cutover", make_spec.directory, conf={"action": "rollback"})
    assert task_states(refused) == {"cutover_or_rollback": "failed"}
    newest = actions(platform, live, "rollback")[0]
    assert (newest["status"], newest["actor"]) == ("failed", "dag_test")
    assert "'dag_test' triggered" in newest["message"] and "not a lakehouse operator: only alice, bob may" \
        in newest["message"]


@pytest.mark.slow
def test_a_forced_publication_passes_the_slo_gates_and_shows_on_the_page_as_forced_by_who_triggered_it(
        platform, pipeline, make_spec, run_dag, spark, monkeypatch):
    spec = pipeline(partitions=1, slo={"lag_records": 1, "lag_seconds": "30s"})
    now = datetime.now(timezone.utc).isoformat()
    good = [(f"o-{i}".encode(), json.dumps({"order_id": f"o-{i}", "customer_id": "c-1", "amount": 1.0,
                                             "currency": "EUR", "status": "created", "event_time": now}).encode())
            for i in range(6)]
    send(platform, spec.source.topic, good[:3])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    producer = Producer(platform.kafka())  # a backlog, two minutes old: the lag gate would hold publication back
    for key, value in good[3:]:
        producer.produce(spec.source.topic, key=key, value=value, timestamp=int(time.time() * 1000) - 120_000)
    assert producer.flush(30) == 0

    run = run_dag(f"{spec.name}_publish", make_spec.directory, conf={"force": True})

    assert task_states(run) == {"quality": "success", "verify": "success", "freshness": "success", "lag": "success",
                                "publish": "success"}
    lag = xcom(run, "lag")
    assert lag["forced"] is True and lag["ok"] is False  # measured and logged, not waited for
    [published] = actions(platform, spec, "publish")
    assert (published["status"], published["actor"]) == ("ok", "dag_test")
    assert published["details"]["parameters"]["forced"] is True
    assert "forced past the SLO gates" in published["message"]

    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    from lakehouse_airflow import ui as lakehouse_ui
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from lakehouse.ops.overview_cache import OverviewCache

    # the page as a signed-in admin sees it, from its cache read once (tests/e2e/test_ui_access.py drives the app)
    cache = OverviewCache(make_spec.directory, refresh_s=3600, rescan_s=3600, autostart=False)
    while cache.step():
        pass
    monkeypatch.setattr(lakehouse_ui, "CACHE", cache)
    forget_auth_manager()
    airflow_app.create_auth_manager()
    admin = SimpleAuthManagerUser(username="admin", role="admin")
    status, cards = lakehouse_ui.cards_json(admin)
    assert status == 200
    [card] = [e for e in cards if e["pipeline"] == spec.name]
    [shown] = [a for a in card["timeline"]["actions"] if a["kind"] == "publish"]
    assert (shown["actor"], shown["status"], shown["parameters"]["forced"]) == ("dag_test", "ok", True)
    assert (shown["via"], shown["dag_id"]) == ("airflow", f"{spec.name}_publish")
    page = lakehouse_ui.cards_page(admin)
    forget_auth_manager()
    assert '<li data-kind="publish">' in page and 'data-field="action_actor" class="">dag_test<' in page
    assert 'data-field="latest_publish_actor" class="">dag_test<' in page
