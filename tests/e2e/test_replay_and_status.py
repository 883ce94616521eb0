"""Replays are idempotent, dead letters can be replayed after a fix, status tells the recovery point,
and the continuous job commits per trigger, picks up an evolved spec and stops cleanly on SIGTERM."""

import json
import signal
from pathlib import Path

import pytest
import yaml
from polling import wait_until, while_running
from pyiceberg.expressions import EqualTo

from e2e import (  # noqa: F401 (fixture)
    assert_exactly_once,
    log_ends,
    pipeline,
    rows,
    run_cli,
    send,
    spawn,
    summaries,
    table,
)
from lakehouse.core import events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def order(i: int, status="created", channel=None) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": status, "event_time": "2026-11-20T12:00:00+00:00"}
    if channel:
        record["channel"] = channel
    return record["order_id"].encode(), json.dumps(record).encode()


def cli(spec, *args):
    run = run_cli(spec, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_replaying_an_offset_range_restores_lost_rows_exactly_once(platform, pipeline):
    spec = pipeline(partition_by=[])  # pyiceberg deletes from day-partitioned tables need pyiceberg-core
    produce.produce(spec, 900, bad_ratio=0.1, seed=3)
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    # someone deletes rows by mistake
    table(platform, spec, spec.target.table).delete(EqualTo("status", "paid"))
    assert all(row["status"] != "paid" for row in rows(platform, spec, spec.target.table))
    ends = log_ends(platform, spec.source.topic)

    spans = ",".join(f"{p}:0-{e}" for p, e in ends.items() if e)
    first = json.loads(cli(spec, "replay", "--pipeline", spec.name, "--offsets", spans, "--json").stdout)
    assert first["inserted_by_table"][spec.target.table] > 0
    assert assert_exactly_once(platform, spec) == 900
    again = json.loads(cli(spec, "replay", "--pipeline", spec.name, "--offsets", spans, "--json").stdout)
    assert again["inserted_by_table"][spec.target.table] == 0 and again["dead_letters_added"] == 0
    assert assert_exactly_once(platform, spec) == 900

    replays = [s for s in summaries(platform, spec, spec.target.table) if s.get(SnapshotSummary.KIND) == "replay"]
    assert len(replays) == 2
    assert offsets.decode_ranges(replays[0][SnapshotSummary.RANGES]) == {p: (0, e) for p, e in ends.items() if e}
    # replays never move the pipeline's resume position
    positions = offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table,
                                      spec.name).positions
    assert positions == ends


def test_a_replay_past_the_committed_position_is_refused(platform, pipeline):
    spec = pipeline()
    send(platform, spec.source.topic, [order(i) for i in range(10)], partition=0)
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    run = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:5-50")
    assert run.returncode == 2
    assert "goes past the pipeline's committed position 10" in run.stderr
    bad = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:9-3")
    assert bad.returncode == 2 and "START < END" in bad.stderr


def test_a_time_range_replay_is_idempotent(platform, pipeline):
    spec = pipeline()
    send(platform, spec.source.topic, [order(i) for i in range(40)])
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    run = cli(spec, "replay", "--pipeline", spec.name, "--from-time", "2000-01-01T00:00:00Z", "--json")
    assert json.loads(run.stdout)["records"] == 40
    assert assert_exactly_once(platform, spec) == 40


def test_dead_letters_are_replayed_into_the_table_once_the_contract_is_fixed(platform, pipeline):
    spec = pipeline()
    send(platform, spec.source.topic, [order(i, status="returned" if i % 4 == 0 else "paid") for i in range(40)])
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert len(rows(platform, spec, spec.dead_letter_table)) == 10

    raw = yaml.safe_load(Path(spec.path).read_text())
    raw["contract"]["fields"][4]["enum"].append("returned")
    Path(spec.path).write_text(yaml.safe_dump(raw))
    result = json.loads(cli(spec, "replay", "--pipeline", spec.name, "--dead-letters", "--json").stdout)
    assert result["dead_letters_resolved"] == 10
    assert rows(platform, spec, spec.dead_letter_table) == []
    assert sum(r["status"] == "returned" for r in rows(platform, spec, spec.target.table)) == 10
    assert assert_exactly_once(platform, spec) == 40


def test_status_reports_lag_recovery_point_and_counts(platform, pipeline):
    spec = pipeline()
    produce.produce(spec, 300, bad_ratio=0.1, seed=5)
    cli(spec, "ingest", "--pipeline", spec.name, "--once")
    produce.produce(spec, 120, seed=6)
    [status] = json.loads(cli(spec, "status", "--pipeline", spec.name, "--json").stdout)
    assert status["lag_records"] == 120
    assert status["rows"] + status["dead_letters"] == 300
    assert status["last_commit_at"] and status["newest_event_time"]
    data = status["tables"][0]
    assert data["table"] == spec.qualified(spec.target.table) and data["recovery_snapshot_id"]
    assert sum(p["end"] for p in status["kafka"]["partitions"]) == 420
    # what happened comes from the ops timeline: the batch that committed, and the newest event per kind
    timeline = status["timeline"]
    assert timeline["last_batch"]["records"] == 300 and timeline["last_batch"]["lag_records"] == 0
    assert timeline["last_batch"]["dead_letters"] == status["dead_letters"]
    assert timeline["recent"]["records"] == 300 and timeline["recent"]["batches"] == 1
    assert "quality" not in timeline["latest"]
    events.record(events.Event(spec.name, "quality", "failed", "amount: 3 rows below 0"), platform=platform)
    human = cli(spec, "status", "--pipeline", spec.name).stdout
    assert spec.name in human and "LAG" in human and "120" in human
    assert "latest quality: failed" in human and "amount: 3 rows below 0" in human
    assert "last batch" in human and "decode" in human


def test_continuous_mode_commits_per_trigger_evolves_and_stops_cleanly_on_sigterm(platform, pipeline):
    spec = pipeline()
    job = spawn(spec, "ingest", "--pipeline", spec.name, "--trigger-interval", "1s", "--json")
    try:
        send(platform, spec.source.topic, [order(i) for i in range(50)])
        wait_until(while_running(job, lambda: len(table_rows(platform, spec)) == 50), 180, "the first 50 rows")

        raw = yaml.safe_load(Path(spec.path).read_text())
        raw["contract"]["fields"].append({"name": "channel", "type": "string"})
        Path(spec.path).write_text(yaml.safe_dump(raw))
        send(platform, spec.source.topic, [order(i, channel="web") for i in range(50, 80)])
        wait_until(while_running(job, lambda: sum(r.get("channel") == "web" for r in table_rows(platform, spec)) == 30),
                   180, "30 rows with the evolved spec's new column")
    finally:
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    assert assert_exactly_once(platform, spec) == 80
    assert len([line for line in out.splitlines() if line.startswith("{")]) >= 2


def table_rows(platform, spec) -> list[dict]:
    """The data table's rows; none while the continuous job has not created the table yet."""
    try:
        return rows(platform, spec, spec.target.table)
    except Exception:  # noqa: BLE001 - the table does not exist before the job's first commit
        return []
