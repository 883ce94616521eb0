"""Operator authority is checked where the action happens (unit layer; the end-to-end runs are in
test_backfill, test_quality_publish and test_audit).

- A backfill's job runs the plan of its own run only: the plan the `plan` task pushed to XCom is accepted
  when it is exactly a plan the run's request yields (offsets: the same ranges; a time window: ranges
  inside the window as cut now) and refused, naming the difference, when anything in it was changed.
- Who may still trigger a DAG when a task acts: the simple auth manager answers from its configured
  users and roles; an auth manager that cannot be asked from a task says so instead of guessing; the
  task refuses (an audited `failed` event) unless the user who triggered the run is allowed by every
  layer that can be asked, and a run nobody triggered.
- The publish gate accepts only a verification of exactly the snapshots it publishes: a passing
  verification of other snapshots, or of each table alongside other snapshots of the others, does not
  count, and the newest verification of the exact snapshots decides; on real Iceberg tables no branch
  moves until it has.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lakehouse.audit import verify, verify_model, windows
from lakehouse.audit.intervals import Coverage
from lakehouse.core import config, errors, events
from lakehouse.core.catalog import open_catalog
from lakehouse.recovery import backfill
from lakehouse.wap import publish

EXAMPLES = settings(max_examples=60, deadline=None, database=None)

# ---------------------------------------------------------------------------- the backfill's plan

ranges_ = st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 500), st.integers(1, 500))
                          .map(lambda r: (min(r), max(r) + 1)), max_size=4)
plans = st.builds(
    backfill.BackfillPlan, pipeline=st.just("orders"),
    target_table=st.sampled_from(["lake.raw.orders", "lake.raw.cand"]),
    candidate_table=st.sampled_from([None, "raw.cand"]), ranges=ranges_, dry_run=st.booleans(),
    notes=st.lists(st.text(max_size=20), max_size=2).map(tuple))


@EXAMPLES
@given(plans)
def test_a_plan_survives_its_trip_through_xcom_exactly(plan):
    assert backfill.plan_from_json(plan.to_json()) == plan
    assert backfill.check_plan(backfill.plan_from_json(plan.to_json()), plan, "offsets") == plan


TAMPERINGS = {
    "job arguments": lambda p: p["job_args"].extend(["--into-table", "ops.pipeline_events"]) if p["job_args"]
    else p.update(job_args=["--offsets", "0:0-1"]),
    "the offsets text": lambda p: p.update(offsets="0:0-999999"),
    "the record count": lambda p: p.update(records=p["records"] + 1),
    "a bound written as text": lambda p: p.update(ranges={"0": ["0", "10"]}),
    "a bound written as a truth value": lambda p: p.update(ranges={"0": [False, True]}),
    "an empty range": lambda p: p.update(ranges={"0": [10, 10]}),
    "a negative start": lambda p: p.update(ranges={"0": [-5, 10]}),
    "a partition not written as a number": lambda p: p.update(ranges={"zero": [0, 10]}),
    "a range of three bounds": lambda p: p.update(ranges={"0": [0, 5, 10]}),
    "a field removed": lambda p: p.pop("target_table"),
    "a field added": lambda p: p.update(extra="x"),
    "notes that are not a list": lambda p: p.update(notes=5),
}


@EXAMPLES
@given(plans, st.sampled_from(sorted(TAMPERINGS)))
def test_a_plan_changed_in_xcom_is_refused_naming_what_does_not_follow(plan, tampering):
    changed = copy.deepcopy(plan.to_json())
    TAMPERINGS[tampering](changed)
    assume(changed != plan.to_json())
    with pytest.raises(errors.PlanMismatchError) as refused:
        backfill.check_plan(backfill.plan_from_json(changed), plan, "offsets")
    assert re.search("not a backfill plan|do not follow from its ranges|is not what this run's request plans",
                     str(refused.value)), refused.value
    assert "Nothing was written; trigger a new run" in str(refused.value)


@pytest.mark.parametrize("planned", [None, "0:0-10", ["ranges"], 7])
def test_a_missing_plan_is_refused(planned):
    with pytest.raises(errors.PlanMismatchError, match="no backfill plan: .* Nothing was written; trigger a new run"):
        backfill.plan_from_json(planned)


@EXAMPLES
@given(plans, plans)
def test_in_mode_offsets_only_the_requests_own_plan_runs(given_, now):
    agrees = all(getattr(given_, f) == getattr(now, f)
                 for f in ("pipeline", "target_table", "candidate_table", "dry_run", "ranges"))
    if agrees:
        assert backfill.check_plan(given_, now, "offsets") == given_
    else:
        with pytest.raises(errors.PlanMismatchError, match="is not what this run's request plans"):
            backfill.check_plan(given_, now, "offsets")


@EXAMPLES
@given(ranges_, ranges_)
def test_in_mode_time_a_plan_runs_when_every_range_lies_inside_the_window_as_cut_now(planned, now):
    base = dict(pipeline="orders", target_table="lake.raw.orders", candidate_table=None, dry_run=False)
    given_, current = backfill.BackfillPlan(ranges=planned, **base), backfill.BackfillPlan(ranges=now, **base)
    inside = all(p in now and now[p][0] <= s and e <= now[p][1] for p, (s, e) in planned.items())
    if inside:
        assert backfill.check_plan(given_, current, "time") == given_
    else:
        with pytest.raises(errors.PlanMismatchError) as refused:
            backfill.check_plan(given_, current, "time")
        outside = next(p for p, (s, e) in sorted(planned.items())
                       if not (p in now and now[p][0] <= s and e <= now[p][1]))
        assert f"partition {outside}: [{planned[outside][0]}, {planned[outside][1]}) is not inside" \
            in str(refused.value)


def test_a_window_whose_cut_moved_up_since_the_plan_still_runs_the_plan_as_made():
    """Ingestion commits between the plan and the job: the window's cut moves up, the plan made earlier holds
    less than a plan made now, and runs as it was shown."""
    base = dict(pipeline="orders", target_table="lake.raw.orders", candidate_table=None, dry_run=False)
    planned = backfill.BackfillPlan(ranges={0: (10, 50), 1: (0, 7)}, **base)
    now = backfill.BackfillPlan(ranges={0: (10, 80), 1: (0, 9), 2: (0, 4)}, **base)
    assert backfill.check_plan(planned, now, "time").job_args() == \
        ["--offsets", "0:10-50,1:0-7", "--backfill", "--json"]
    with pytest.raises(errors.PlanMismatchError, match=r"target_table 'lake.raw.orders' instead of 'lake.raw.x'"):
        backfill.check_plan(planned, backfill.BackfillPlan(ranges=now.ranges, **{**base,
                                                                                   "target_table": "lake.raw.x"}),
                            "time")


# ---------------------------------------------------------------------------- who may still trigger

def authority(monkeypatch, users: str, user: str, **settings_):
    from lakehouse_airflow import audit

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", users)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", str(settings_.get("all_admins", False)))
    return audit.trigger_authority(user, "orders_backfill")


@pytest.mark.parametrize(("user", "allowed", "reason"), [
    ("alice", True, "gives 'alice' the role OP"),
    ("ursula", True, "gives 'ursula' the role USER"),
    ("bob", False, "gives 'bob' the role VIEWER, which may not trigger (create runs of) orders_backfill"),
    ("mallory", False, "gives 'mallory' the role SUPERUSER, which may not trigger"),
    ("carol", False, "'carol' is not a user of the simple auth manager (AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS "
                     "names alice, bob, mallory, ursula)"),
    ("scheduler", False, "'scheduler' is not a user"),
])
def test_the_simple_auth_manager_answers_from_its_configured_users_and_roles(monkeypatch, user, allowed, reason):
    found = authority(monkeypatch, "alice:op,bob:viewer,ursula:user,mallory:superuser", user)
    assert found.allowed is allowed and reason in found.reason


def test_with_every_user_an_admin_the_simple_auth_manager_lets_anyone_trigger(monkeypatch):
    found = authority(monkeypatch, "alice:viewer", "carol", all_admins=True)
    assert found.allowed is True and "simple_auth_manager_all_admins" in found.reason


def test_an_auth_manager_that_cannot_be_asked_from_a_task_says_so(monkeypatch):
    from lakehouse_airflow import audit

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "airflow.api_fastapi.auth.managers.base_auth_manager."
                                                      "BaseAuthManager")
    found = audit.trigger_authority("alice", "orders_backfill")
    assert found.allowed is None and "cannot be asked about a user by name" in found.reason
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "no.such.AuthManager")
    found = audit.trigger_authority("alice", "orders_backfill")
    assert found.allowed is None and "cannot be loaded" in found.reason
    # FAB in an Airflow 3 worker: the supervisor points the database at a URL that refuses every use
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "airflow.providers.fab.auth_manager.fab_auth_manager."
                                                      "FabAuthManager")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "airflow-db-not-allowed:///")
    found = audit.trigger_authority("alice", "orders_backfill")
    assert found.allowed is None and "keeps users and roles in the metadata database" in found.reason


SIMPLE = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
UNASKABLE = "airflow.api_fastapi.auth.managers.base_auth_manager.BaseAuthManager"


@pytest.mark.parametrize(("triggered_by", "manager", "listed", "refusal"), [
    ("alice", SIMPLE, "", None),
    ("alice", SIMPLE, "alice,carol", None),
    ("bob", SIMPLE, "", "'bob' triggered {dag} but may not trigger (create runs of) it now: the simple auth "
                        "manager gives 'bob' the role VIEWER"),
    ("bob", SIMPLE, "bob", "the simple auth manager gives 'bob' the role VIEWER"),  # both layers must agree
    ("alice", SIMPLE, "carol", "'alice' triggered {dag} but is not a lakehouse operator: only carol may"),
    ("alice", UNASKABLE, "alice", None),  # the auth manager cannot be asked here: LAKEHOUSE_OPERATORS decides
    ("alice", UNASKABLE, "", "cannot confirm that 'alice', who triggered {dag}, may still trigger (create runs "
                             "of) it: the auth manager"),
    (None, SIMPLE, "", "nobody triggered {dag} run manual__1 (manual): only a person may backfill"),
])
def test_the_acting_task_refuses_unless_the_user_who_triggered_the_run_still_may(
        own_home, make_spec, monkeypatch, triggered_by, manager, listed, refusal):
    from lakehouse_airflow.audit import NotAnOperatorError, require_authority
    from lakehouse_airflow.hooks import LakehouseHook

    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(Path(spec.path).parent))
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", manager)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "alice:op,bob:viewer")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("LAKEHOUSE_OPERATORS", listed)
    hook = LakehouseHook(spec.name, kafka_conn_id=None, schema_registry_conn_id=None)
    dag = f"{spec.name}_backfill"
    actor = events.Actor.airflow(dag, "manual__1", "manual", triggered_by)
    if refusal is None:
        require_authority(actor, "backfill", {"offsets": "0:0-5"}, hook)
        assert events.recent(spec.name, "backfill", platform=hook.platform) == []
        return
    with pytest.raises(NotAnOperatorError) as refused:
        require_authority(actor, "backfill", {"offsets": "0:0-5"}, hook)
    assert refusal.format(dag=dag) in str(refused.value) and "Nothing was changed" in str(refused.value)
    [recorded] = events.recent(spec.name, "backfill", platform=hook.platform)  # audited: who, what, why
    assert (recorded["status"], recorded["actor"], recorded["message"]) == \
        ("failed", triggered_by or "scheduler", str(refused.value))
    assert recorded["details"]["parameters"] == {"offsets": "0:0-5"}


# ---------------------------------------------------------------------------- the publish gate

TABLES = ("raw.a", "raw.b")


def record_verification(spec, platform, snapshots: dict[str, int], status: str, mode: str) -> None:
    """A verification's `verify` event, as `lakehouse.audit.verify.record` writes it for a run that verified
    `snapshots` (table -> snapshot) in `mode` with `status` (ok: nothing found; failed: one duplicate)."""
    findings = verify_model.Findings()
    if status == "failed":
        findings.add(verify_model.Problem("duplicated", 0, 7, tuple(snapshots), "held twice", spec.source.topic))
    scopes = {t: verify_model.TableScope(t, s, None, () if status == "skipped" else (s,), {0: 10})
              for t, s in snapshots.items()}
    verify.record(spec, verify_model.Verification(
        pipeline=spec.name, topic=spec.source.topic, mode=mode, engine="local", tables=scopes,
        window=Coverage.of({0: [(0, 10)]}), kafka=Coverage.of({0: [(0, 10)]}), committed={0: 10},
        gaps=Coverage(), findings=findings), platform)


pins = st.fixed_dictionaries({t: st.integers(1, 3) for t in TABLES})
# (status, mode) of a run: `skipped` is an incremental run with nothing new; `since` never joins the chain
outcomes = st.sampled_from([("ok", "incremental"), ("ok", "full"), ("failed", "incremental"), ("failed", "full"),
                            ("skipped", "incremental"), ("ok", "since"), ("failed", "since")])
runs = st.lists(st.tuples(pins, outcomes), max_size=5)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs, pins, st.sampled_from([TABLES, TABLES[:1]]))
def test_the_gate_passes_only_when_the_newest_verification_of_exactly_the_published_snapshots_passed(
        own_home, make_spec, verifications, published, tables):
    spec = make_spec()
    platform = config.load()
    for snapshots, (status, mode) in verifications:
        record_verification(spec, platform, snapshots, status, mode)
    assert [e["status"] for e in events.recent(spec.name, "verify", platform=platform)] == \
        [status for _, (status, _) in reversed(verifications)]
    wanted = {t: published[t] for t in tables}
    # the model: the chain's runs that verified something, newest first; the first that pinned every published
    # table at exactly its snapshot decides
    exact = [status for snapshots, (status, mode) in reversed(verifications)
             if mode in verify_model.CHAIN_MODES and status != "skipped"
             and all(snapshots[t] == s for t, s in wanted.items())]
    if exact and exact[0] == "ok":
        found = publish.require_verification(spec, wanted, platform)
        assert found["status"] == "ok"
        assert {t: found["details"]["snapshots"][t] for t in wanted} == wanted
    else:
        listed = ", ".join(f"{t} snapshot {s}" for t, s in wanted.items())
        with pytest.raises(errors.UnverifiedError, match=("the newest verification of exactly " if exact
                                                          else "no verification verified exactly ") + listed):
            publish.require_verification(spec, wanted, platform)


def test_passing_verifications_of_each_table_with_other_snapshots_of_the_other_do_not_open_the_gate(
        own_home, make_spec):
    """Exactly once holds across a pipeline's tables: a: 2 verified with b: 1, and b: 2 with a: 1, say nothing
    about an offset held by a at 2 and by b at 2. (The chain of per-table snapshots said they were verified.)"""
    spec = make_spec()
    platform = config.load()
    record_verification(spec, platform, {"raw.a": 2, "raw.b": 1}, "ok", "incremental")
    record_verification(spec, platform, {"raw.a": 1, "raw.b": 2}, "ok", "incremental")
    chain = windows.verified_snapshots(spec, platform)
    assert 2 in chain["raw.a"] and 2 in chain["raw.b"]  # each was verified, separately
    with pytest.raises(errors.UnverifiedError, match=r"no verification verified exactly raw.a snapshot 2, raw.b "
                                                     r"snapshot 2 together.*_publish again"):
        publish.require_verification(spec, {"raw.a": 2, "raw.b": 2}, platform)

    record_verification(spec, platform, {"raw.a": 2, "raw.b": 2}, "ok", "full")
    passed = publish.require_verification(spec, {"raw.a": 2, "raw.b": 2}, platform)
    assert passed["details"]["mode"] == "full" and passed["details"]["snapshots"] == {"raw.a": 2, "raw.b": 2}
    # a later failed verification of the same snapshots closes it again, naming the failure
    record_verification(spec, platform, {"raw.a": 2, "raw.b": 2}, "failed", "incremental")
    with pytest.raises(errors.UnverifiedError, match=r"newest verification of exactly .* failed .*duplicated"):
        publish.require_verification(spec, {"raw.a": 2, "raw.b": 2}, platform)


def test_a_verification_event_with_nonsense_snapshots_proves_nothing(own_home, make_spec):
    spec = make_spec()
    platform = config.load()
    events.record(events.Event(spec.name, "verify", "ok", "by hand", details={
        "mode": "incremental", "snapshots": {"raw.a": "two", "raw.b": None}}), platform=platform)
    with pytest.raises(errors.UnverifiedError, match="no verification verified exactly"):
        publish.require_verification(spec, {"raw.a": 2}, platform)


def test_on_real_tables_no_branch_moves_until_one_verification_verified_exactly_the_snapshots_published(
        own_home, make_spec):
    """A fan-out pipeline's two tables in the SQLite catalog, each with two snapshots: verifications of each
    table's head beside the other's older snapshot leave the readers' branches where they were; one of both
    heads together moves them; a failed verification of the next snapshots keeps them there."""
    spec = make_spec(fanout={"field": "currency", "routes": {"USD": "raw.orders_{suffix}_usd"}},
                     publish={"view": None})  # no readers' view: nothing here needs Spark
    platform = config.load()
    catalog = open_catalog(platform, spec.catalog)
    catalog.create_namespace_if_not_exists("raw")
    default, usd = spec.target.tables
    tables = {name: catalog.create_table(name, pa.schema([("n", pa.int64())])) for name in (default, usd)}
    snapshots: dict[str, list[int]] = {name: [] for name in tables}

    def commit(name: str) -> None:
        tables[name].append(pa.table({"n": [len(snapshots[name])]}))
        snapshots[name].append(tables[name].current_snapshot().snapshot_id)

    def branches() -> dict[str, int | None]:
        return {name: publish.published_head(catalog.load_table(name), spec.publish.branch) for name in tables}

    for name in tables:
        commit(name)
        commit(name)
    (a1, a2), (b1, b2) = snapshots[default], snapshots[usd]
    heads = {default: a2, usd: b2}
    record_verification(spec, platform, {default: a2, usd: b1}, "ok", "incremental")
    record_verification(spec, platform, {default: a1, usd: b2}, "ok", "incremental")
    chain = windows.verified_snapshots(spec, platform)
    assert all(s in chain[t] for t, s in heads.items())  # the old gate: each head was verified, separately
    with pytest.raises(errors.UnverifiedError, match=f"no verification verified exactly {default} snapshot {a2}, "
                                                     f"{usd} snapshot {b2} together"):
        publish.publish(spec, heads, platform, require_verified=True)
    assert branches() == {default: None, usd: None}
    assert events.recent(spec.name, "publish", platform=platform)[0]["status"] == "failed"

    record_verification(spec, platform, heads, "ok", "incremental")
    done = publish.publish(spec, heads, platform, require_verified=True)
    assert {p.table: (p.previous_snapshot_id, p.snapshot_id) for p in done} == {default: (None, a2), usd: (None, b2)}
    assert branches() == heads

    commit(default)
    following = {default: snapshots[default][-1], usd: b2}
    record_verification(spec, platform, following, "failed", "incremental")
    record_verification(spec, platform, {default: following[default], usd: b1}, "ok", "full")  # not together
    with pytest.raises(errors.UnverifiedError, match="the newest verification of exactly .* failed .*duplicated"):
        publish.publish(spec, following, platform, require_verified=True)
    assert branches() == heads
