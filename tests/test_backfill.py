"""Backfills from the UI: the form is validated with clear messages, a dry run only plans, an in-place
backfill restores lost rows exactly once, a candidate backfill fills a separate table with exactly the
range, both are idempotent and neither moves the live pipeline's positions."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pyiceberg.expressions import EqualTo

from conftest import DAGS_FOLDER
from e2e import assert_exactly_once, lakehouse, pipeline, rows, summaries, table  # noqa: F401 (fixture)
from lakehouse.core import events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.recovery import backfill
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def ingest(spec) -> None:
    run = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once")
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
        with pytest.raises(backfill.BackfillError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("+", r"\+").replace("?", r"\?")):
            backfill.parse_request(params, live)

    # checked against Kafka and the tables: nothing is committed yet
    produce.produce(spec, 20, seed=2)
    with pytest.raises(backfill.BackfillError, match="has no partition 7 \\(partitions: 0, 1\\)"):
        backfill.plan(spec, backfill.parse_request({"offsets": "7:0-5"}), platform)
    with pytest.raises(backfill.BackfillError, match=r"partition 0: range \[0, 5\) goes past the pipeline's "
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
    assert all(offsets.K_POSITIONS not in s for s in summaries(platform, spec, candidate))
    # the live table is untouched: same snapshots, same positions
    assert len(summaries(platform, spec, spec.target.table)) == live_snapshots
    assert positions(platform, spec) == live_positions
    assert assert_exactly_once(platform, spec) == 120
