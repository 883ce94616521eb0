"""Operator actions are audited and restricted: every replay, backfill, cutover, rollback, publication
(forced ones too) and maintenance run records who made it happen (the Airflow user who triggered the
DAG run, `scheduler` for a run nobody triggered, or the OS user of a command), when, with which
parameters and with what outcome, on the ops timeline and the pipelines page; the DAGs that change
what readers see are granted to the operator role where the auth manager has DAG-level permissions,
and LAKEHOUSE_OPERATORS refuses anyone else under any auth manager.

With the FAB auth manager (apache-airflow-providers-fab, in requirements.txt), the restriction is also
checked against real users and roles in a throwaway Airflow: FAB's own authorization lets an operator
trigger these DAGs and refuses a viewer, and the backfill task, which asks again when it acts, sees a
role taken away since (and, in an Airflow 3 worker, that FAB cannot be asked from there).

(The audit of write-audit-publish, the quality gate, is tests/unit/wap/test_audit_lineage.py.)
Airflow's `dag.test()` runs record the user Airflow gives them, `dag_test`.

The unit half; the end-to-end half is tests/e2e/test_audit_e2e.py.
"""

from __future__ import annotations

import os
import pwd
import socket
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema

from e2e import pipeline, run_cli, send, task_states, xcom  # noqa: F401 (fixture)
from lakehouse.core import config, events
from lakehouse.core.catalog import open_catalog

OS_USER = pwd.getpwuid(os.geteuid()).pw_name


# ---------------------------------------------------------------------------- who acts

def test_a_command_acts_as_its_os_user_and_a_job_an_airflow_run_started_as_the_user_who_triggered_it(monkeypatch):
    monkeypatch.setenv("USER", "somebody-else")  # $USER is anyone's to set; the process's uid is not
    monkeypatch.delenv(events.AIRFLOW_RUN_ENV, raising=False)
    command = events.Actor.of_process()
    assert (command.user, command.via, command.origin["host"]) == (OS_USER, "cli", socket.gethostname())

    triggered = events.Actor.airflow("orders_backfill", "manual__1", "manual", "alice")
    monkeypatch.setenv(events.AIRFLOW_RUN_ENV, triggered.environment()[events.AIRFLOW_RUN_ENV])
    job = events.Actor.of_process()
    assert (job.user, job.via, job.origin["dag_id"], job.origin["run_id"]) == \
        ("alice", "airflow", "orders_backfill", "manual__1")
    assert job.origin["os_user"] == OS_USER  # and what the job itself ran as
    assert events.Actor.airflow("orders_maintenance", "scheduled__1", "scheduled", None).user == events.SCHEDULER

    monkeypatch.setenv(events.AIRFLOW_RUN_ENV, "{not json")
    assert events.Actor.of_process().via == "cli"


# ---------------------------------------------------------------------------- the timeline keeps it

OLD_SCHEMA = Schema(*(f for f in events.SCHEMA.fields if f.name != "actor"))  # the timeline of the first release


def test_a_timeline_from_before_actors_gains_the_column_and_its_old_events_name_nobody(own_home):
    platform = config.load()
    catalog = open_catalog(platform, "lake")
    catalog.create_namespace("ops")
    old = catalog.create_table(events.EVENTS_TABLE, schema=OLD_SCHEMA, partition_spec=events.PARTITIONING)
    row = events.Event("orders", "maintenance", message="before").row()
    del row["actor"]
    old.append(pa.Table.from_pylist([row], schema=pa.schema([f for f in events.ARROW_SCHEMA if f.name != "actor"])))

    alice = events.Actor.airflow("orders_cutover", "manual__2", "manual", "alice")
    events.record(events.Event("orders", "cutover", message="after", actor=alice), platform=platform)

    assert "actor" in catalog.load_table(events.EVENTS_TABLE).schema().column_names
    after, before = events.recent("orders", platform=platform)
    assert (after["actor"], after["details"]["actor"]["dag_id"]) == ("alice", "orders_cutover")
    assert (before["message"], before["actor"]) == ("before", None)


def test_an_audited_action_is_one_event_whatever_its_outcome(own_home):
    platform = config.load()
    bob = events.Actor.of_process()
    with events.audited("orders", "replay", bob, {"offsets": "0:0-10"}, platform) as audit:
        audit.message, audit.metrics = "replayed 10 records", {"records": 10}
    with pytest.raises(ValueError, match="bad range"):
        with events.audited("orders", "replay", bob, {"offsets": "0:9-1"}, platform) as audit:
            audit.details["planned"] = True
            raise ValueError("bad range")

    failed, done = events.recent("orders", "replay", platform=platform)
    assert (done["status"], done["message"], done["actor"]) == ("ok", "replayed 10 records", bob.user)
    assert done["details"]["parameters"] == {"offsets": "0:0-10"} and done["metrics"] == {"records": 10.0}
    assert (failed["status"], failed["message"]) == ("failed", "ValueError: bad range")
    assert failed["details"] == {"planned": True, "parameters": {"offsets": "0:9-1"}, "actor": bob.to_json()}


def test_the_page_lists_what_people_did_not_what_the_scheduler_ran(own_home):
    platform = config.load()
    scheduler = events.Actor.airflow("orders_maintenance", "scheduled__3", "scheduled", None)
    alice = events.Actor.airflow("orders_publish", "manual__3", "manual", "alice")
    events.record(events.Event("orders", "maintenance", actor=scheduler), events.Event("orders", "batch"),
                  events.Event("orders", "publish", details={"parameters": {"forced": True}}, actor=alice),
                  platform=platform)
    found = events.digest("orders", datetime.now(timezone.utc) - timedelta(hours=1), platform=platform)
    assert [(a["kind"], a["actor"]) for a in found["actions"]] == [("publish", "alice")]
    assert found["latest"]["maintenance"]["actor"] == events.SCHEDULER


# ---------------------------------------------------------------------------- who may

RESTRICTED = ("publish", "backfill", "cutover")


# Airflow 3 deprecates DAG-level access_control (it warns whenever it is set); FAB still applies it
@pytest.mark.filterwarnings("ignore:The airflow.security.permissions module is deprecated")
@pytest.mark.parametrize(("auth_manager", "granted"), [
    ("airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager", True),
    ("airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager", False),
])
def test_the_dags_that_change_what_readers_see_are_granted_to_the_operator_role_where_the_auth_manager_can(
        make_spec, monkeypatch, auth_manager, granted):
    from airflow.dag_processing.dagbag import DagBag

    spec = make_spec()
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", auth_manager)
    monkeypatch.setenv("LAKEHOUSE_OPERATOR_ROLE", "data_ops")
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    bag = DagBag(str(config.REPO_ROOT / "dags"))
    assert bag.import_errors == {}
    for kind in ("ingest", "maintenance", *RESTRICTED):
        dag = bag.dags[f"{spec.name}_{kind}"]
        expected = {"data_ops": {"DAGs": {"can_read", "can_edit"}, "DAG Runs": {"can_read", "can_create"}}}
        assert dag.access_control == (expected if granted and kind in RESTRICTED else None), kind
        assert ("**Restricted** to lakehouse operators" in dag.doc_md) == (kind in RESTRICTED)
    assert bag.dags["retention_guard"].access_control is None


# ---------------------------------------------------------------------------- end to end

def actions(platform, spec, kind: str) -> list[dict]:
    return events.recent(spec.name, kind, platform=platform, catalog=spec.catalog)


