"""Backfills from the UI: the form is validated with clear messages, a dry run only plans, an in-place
backfill restores lost rows exactly once, a candidate backfill fills a separate table with exactly the
range, both are idempotent and neither moves the live pipeline's positions. The task that writes checks
again, when it writes, that the user who triggered the run may still trigger it and that the plan it got
through XCom is its run's."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pyiceberg.expressions import EqualTo

from tests.conftest import DAGS_FOLDER
from e2e import assert_exactly_once, pipeline, rows, run_cli, summaries, table, xcom  # noqa: F401 (fixture)
from lakehouse.core import errors, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.recovery import backfill
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def ingest(spec) -> None:
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert run.returncode == 0, run.stderr[-3000:]


def positions(platform, spec) -> dict[int, int]:
    return offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table,
                                 spec.name).positions


def backfill_events(platform, spec) -> list[dict]:
    return sorted(events.recent(spec.name, "backfill", platform=platform), key=lambda e: e["ts"])


def test_the_backfill_form_defaults_validate_and_bad_requests_are_refused_clearly(platform, pipeline,
                                                                                   airflow_db, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import ParamValidationError

    spec = pipeline(partitions=2)
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(Path(spec.path).parent))
    bag = DagBag(str(DAGS_FOLDER))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag(f"{spec.name}_backfill")
    assert dag.schedule is None and dag.max_active_runs == 1
    assert dag.params.validate() == {"mode": "offsets", "offsets": "", "start_time": None, "end_time": None,
                                     "target": "in_place", "candidate_table": None, "dry_run": True}
    for name, value in (("mode", "everything"), ("target", "prod"), ("dry_run", "no"),
                        ("candidate_table", "Raw.Orders; DROP"), ("offsets", "0:1-2; rm")):
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError):
            params[name] = value
            params.validate()

    live = backfill.live_tables({spec.name: spec})
    refused = {
        "offsets: required in mode offsets": {"mode": "offsets"},
        "offsets: offset range '0:9-3': need 0 <= START < END": {"offsets": "0:9-3"},
        "offsets: offset range 'zero' is not PARTITION:START-END": {"offsets": "zero"},
        "start_time: required in mode time": {"mode": "time"},
        "start_time 2026-11-20T12:00:00+00:00 is not before end_time 2026-11-20T11:00:00+00:00":
            {"mode": "time", "start_time": "2026-11-20T12:00:00+00:00", "end_time": "2026-11-20T11:00:00+00:00"},
        "end_time: 'noon' is not an ISO-8601 time": {"mode": "time", "start_time": "2026-11-20", "end_time": "noon"},
        "candidate_table: required when target is candidate": {"offsets": "0:0-1", "target": "candidate"},
        "candidate_table: 'raw.orders; drop table x' is not valid":
            {"offsets": "0:0-1", "target": "candidate", "candidate_table": "raw.orders; drop table x"},
        f"candidate_table: {spec.target.table} is a live table":
            {"offsets": "0:0-1", "target": "candidate", "candidate_table": spec.target.table},
        "candidate_table: ops.pipeline_events is a live table":
            {"offsets": "0:0-1", "target": "candidate", "candidate_table": "ops.pipeline_events"},
        "candidate_table: only used when target is candidate": {"offsets": "0:0-1", "candidate_table": "x.y"},
    }
    for message, params in refused.items():
        with pytest.raises(errors.BackfillError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("+", r"\+").replace("?", r"\?")):
            backfill.parse_request(params, live)

    # checked against Kafka and the tables: nothing is committed yet
    produce.produce(spec, 20, seed=2)
    with pytest.raises(errors.BackfillError, match="has no partition 7 \\(partitions: 0, 1\\)"):
        backfill.plan(spec, backfill.parse_request({"offsets": "7:0-5"}), platform)
    with pytest.raises(errors.BackfillError, match=r"partition 0: range \[0, 5\) goes past the pipeline's "
                                                     r"committed position 0"):
        backfill.plan(spec, backfill.parse_request({"offsets": "0:0-5"}), platform)


def test_an_in_place_backfill_restores_deleted_rows_exactly_once_and_a_dry_run_writes_nothing(
        platform, pipeline, run_dag):
    spec = pipeline(partitions=2, partition_by=[])  # pyiceberg deletes from day-partitioned tables need pyiceberg-core
    produce.produce(spec, 300, bad_ratio=0.1, seed=4)
    ingest(spec)
    live_positions = positions(platform, spec)
    table(platform, spec, spec.target.table).delete(EqualTo("status", "paid"))
    remaining = len(rows(platform, spec, spec.target.table))
    pipelines_dir = Path(spec.path).parent
    everything = ",".join(f"{p}:0-{e}" for p, e in sorted(live_positions.items()) if e)

    # a dry run plans (time windows resolve to offsets, cut at the committed position) and writes nothing
    dry = run_dag(f"{spec.name}_backfill", pipelines_dir,
                  conf={"mode": "time", "start_time": "2000-01-01T00:00:00+00:00"})
    assert dry.state == "success"
    planned = dry.get_task_instance("plan").xcom_pull(task_ids="plan")
    assert planned["ranges"] == {str(p): [0, e] for p, e in live_positions.items() if e}
    assert planned["records"] == 300 and planned["dry_run"] is True
    assert planned["target_table"] == spec.qualified(spec.target.table)
    assert dry.get_task_instance("backfill").state == "skipped"
    assert len(rows(platform, spec, spec.target.table)) == remaining
    [dry_event] = backfill_events(platform, spec)  # audited: who asked what, and that nothing was written
    assert (dry_event["status"], dry_event["actor"]) == ("skipped", "dag_test")
    assert dry_event["details"]["parameters"]["start_time"] == "2000-01-01T00:00:00+00:00"

    # a refused request fails the plan and never reaches the job
    refused = run_dag(f"{spec.name}_backfill", pipelines_dir, conf={"offsets": "0:0-100000", "dry_run": False})
    assert refused.state == "failed"
    assert refused.get_task_instance("plan").state == "failed"
    assert refused.get_task_instance("backfill").state == "upstream_failed"
    assert backfill_events(platform, spec)[-1]["status"] == "failed"

    first = run_dag(f"{spec.name}_backfill", pipelines_dir, conf={"offsets": everything, "dry_run": False})
    assert first.state == "success" and first.get_task_instance("backfill").state == "success"
    assert assert_exactly_once(platform, spec) == 300
    again = run_dag(f"{spec.name}_backfill", pipelines_dir, conf={"offsets": everything, "dry_run": False})
    assert again.state == "success"
    assert assert_exactly_once(platform, spec) == 300

    recorded = [e for e in backfill_events(platform, spec) if e["status"] == "ok"]
    assert [e["metrics"]["inserted"] for e in recorded] == [len(rows(platform, spec, spec.target.table)) - remaining, 0]
    # the replay job spark-submit ran records the user who triggered the DAG run, and the run
    assert [(e["actor"], e["details"]["actor"]["run_id"]) for e in recorded] == \
        [("dag_test", first.run_id), ("dag_test", again.run_id)]
    assert recorded[0]["metrics"]["records"] == 300
    assert positions(platform, spec) == live_positions  # the live pipeline's resume point did not move


def test_a_candidate_backfill_fills_a_separate_table_with_exactly_the_range_idempotently(
        platform, pipeline, run_dag):
    spec = pipeline(partitions=1)
    produce.produce(spec, 120, seed=8)  # all valid: every record of the range becomes a row
    ingest(spec)
    live_positions = positions(platform, spec)
    live_snapshots = len(summaries(platform, spec, spec.target.table))
    candidate = f"{spec.target.table.split('.')[0]}.cand_{spec.name}"
    conf = {"offsets": "0:10-60", "target": "candidate", "candidate_table": candidate, "dry_run": False}

    for _ in range(2):
        run = run_dag(f"{spec.name}_backfill", Path(spec.path).parent, conf=conf)
        assert run.state == "success"
        held = sorted(r["_kafka"]["offset"] for r in rows(platform, spec, candidate))
        assert held == list(range(10, 60))
    assert run.get_task_instance("plan").xcom_pull(task_ids="plan")["target_table"] == spec.qualified(candidate)
    assert [e["metrics"]["inserted"] for e in backfill_events(platform, spec)] == [50, 0]
    assert all(SnapshotSummary.POSITIONS not in s for s in summaries(platform, spec, candidate))
    # the live table is untouched: same snapshots, same positions
    assert len(summaries(platform, spec, spec.target.table)) == live_snapshots
    assert positions(platform, spec) == live_positions
    assert assert_exactly_once(platform, spec) == 120


def run_task_again(run, task_id: str, monkeypatch) -> str:
    """Run task `task_id` of DAG run `run` once more, as the scheduler does with a cleared task, with
    `airflow tasks test DAG TASK RUN_ID` (in this process: the run's XComs and the metadata DB as they are);
    the task instance's state afterwards."""
    from airflow.cli import cli_parser
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    monkeypatch.setenv("AIRFLOW_TEST_MODE", "True")  # `tasks test` sets it; restored after the test
    args = cli_parser.get_parser().parse_args(["tasks", "test", run.dag_id, task_id, run.run_id])
    args.func(args)
    with create_session() as session:
        return session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id,
                                                     task_id=task_id).one().state


def edit_xcom(run, task_id: str, value) -> None:
    """Replace the return value task `task_id` pushed in `run`, as Airflow's REST API does for a user allowed to
    edit XComs (PATCH /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/xcomEntries/return_value)."""
    from airflow.api_fastapi.core_api.datamodels.xcom import XComUpdateBody
    from airflow.api_fastapi.core_api.routes.public.xcom import update_xcom_entry
    from airflow.utils.session import create_session

    with create_session() as session:
        update_xcom_entry(run.dag_id, task_id, run.run_id, "return_value", XComUpdateBody(value=value),
                          session=session)


def test_the_backfill_task_writes_only_for_a_user_who_may_still_trigger_it_and_only_the_plan_of_its_run(
        platform, pipeline, run_dag, monkeypatch):
    """The job runs after its plan, and a cleared task runs again any time later: the `backfill` task itself
    checks, when it is about to write, that the user who triggered the run may still trigger the DAG and that
    the plan it got through XCom is what the run's request plans. dag.test() runs are triggered by `dag_test`
    (an OP of the simple auth manager in tests/conftest.py; the other tests here write as it). Every case is
    refused before spark-submit; the answers of each layer are unit-tested in tests/unit/ops/test_operator_authority.py."""
    spec = pipeline(partitions=1, partition_by=[])
    produce.produce(spec, 40, seed=9)
    ingest(spec)
    candidate = f"{spec.target.table.split('.')[0]}.cand_{spec.name}"

    def refusal() -> str:
        newest = backfill_events(platform, spec)[-1]
        assert (newest["status"], newest["actor"]) == ("failed", "dag_test"), newest
        assert newest["details"]["parameters"]["offsets"] == "0:10-20"
        return newest["message"]

    # dag_test is a viewer now: the plan is made (the form is valid), the task that writes refuses
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,dag_test:viewer")
    run = run_dag(f"{spec.name}_backfill", Path(spec.path).parent,
                  conf={"offsets": "0:10-20", "target": "candidate", "candidate_table": candidate, "dry_run": False})
    assert (run.get_task_instance("plan").state, run.get_task_instance("backfill").state) == ("success", "failed")
    assert f"'dag_test' triggered {spec.name}_backfill but may not trigger (create runs of) it now: the simple " \
           f"auth manager gives 'dag_test' the role VIEWER" in refusal()
    assert not open_catalog(platform, spec.catalog).table_exists(candidate)  # nothing written, nothing created

    # an operator again, but the plan in XCom was edited (as the REST API lets users allowed to edit XComs):
    # a wider range, or the job's arguments pointed at another table; the cleared task writes neither
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,dag_test:op")
    planned = xcom(run, "plan")
    wider = backfill.BackfillPlan(planned["pipeline"], planned["target_table"], candidate, {0: (0, 40)},
                                  False).to_json()
    for edited, why in ((wider, "offsets 0:0-40 instead of 0:10-20"),
                        ({**planned, "job_args": [*planned["job_args"][:-2], "--into-table", "raw.elsewhere"]},
                         "the plan's job_args do not follow from its ranges and tables")):
        edit_xcom(run, "plan", edited)
        assert xcom(run, "plan") == edited
        assert run_task_again(run, "backfill", monkeypatch) == "failed"
        assert why in refusal() and "Nothing was written" in refusal()
        assert not open_catalog(platform, spec.catalog).table_exists(candidate)
        assert not open_catalog(platform, spec.catalog).table_exists("raw.elsewhere")
