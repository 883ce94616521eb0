"""Exactly once across the data and dead-letter tables, whatever kills the ingest process.

A run that is killed is `lakehouse ingest` as a user would start it, in its own process
group, on the real embedded broker, Spark and the JDBC catalog; the fault (LAKEHOUSE_FAULT,
see tests/support/faults.py) ends in kill -9 of driver and JVM. Runs that nothing kills (the
resume, a task retry, a concurrent writer) are the same command run in the test process,
on its Spark session.
"""

import json
import os
import signal
from pathlib import Path
from urllib.parse import urlparse

import pytest

from e2e import (  # noqa: F401 (fixture)
    KILL_POINTS,
    assert_exactly_once,
    committed_group_offsets,
    lakehouse,
    log_ends,
    pipeline,
    receipts,
    rows,
    run_cli,
    send,
    summaries,
    table,
)
from lakehouse.core import offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def ingest_once(spec, fault=None):
    """`lakehouse ingest --once --json`: its own process when `fault` kills it, else in this process."""
    args = ("ingest", "--pipeline", spec.name, "--once", "--json")
    if fault in KILL_POINTS:
        return lakehouse(spec, *args, fault=fault)
    return run_cli(spec, *args, fault=fault)


def produce_orders(spec, count=3000, bad_ratio=0.1, seed=7):
    return produce.produce(spec, count, bad_ratio=bad_ratio, seed=seed)


def test_once_ingests_every_record_exactly_once_and_records_offsets_in_the_commit(platform, pipeline):
    spec = pipeline()
    report = produce_orders(spec, count=2000)
    run = ingest_once(spec)
    assert run.returncode == 0, run.stderr
    total = assert_exactly_once(platform, spec)
    assert total == 2000
    ends = log_ends(platform, spec.source.topic)

    data = summaries(platform, spec, spec.target.table)[-1]
    assert data[SnapshotSummary.PIPELINE] == spec.name and data[SnapshotSummary.KIND] == "ingest"
    assert offsets.decode_positions(data[SnapshotSummary.POSITIONS]) == ends
    assert offsets.decode_ranges(data[SnapshotSummary.RANGES]) == {p: (0, e) for p, e in ends.items() if e}
    dlq = summaries(platform, spec, spec.dead_letter_table)[-1]
    assert offsets.decode_positions(dlq[SnapshotSummary.POSITIONS]) == ends
    assert committed_group_offsets(platform, spec) == ends

    table_rows = rows(platform, spec, spec.target.table)
    assert len(table_rows) == 2000 - sum(report.bad_by_kind.values())
    assert all(r["_kafka"]["topic"] == spec.source.topic and r["_ingested_at"] is not None for r in table_rows)
    assert all(r["_kafka"]["key"] == r["order_id"] for r in table_rows)

    # a second run resumes from the table's offsets, not from a checkpoint or the group
    produce_orders(spec, count=500, seed=8)
    run = ingest_once(spec)
    assert run.returncode == 0, run.stderr
    assert assert_exactly_once(platform, spec) == 2500
    second = summaries(platform, spec, spec.target.table)[-1]
    assert {p: s for p, (s, _) in offsets.decode_ranges(second[SnapshotSummary.RANGES]).items()} == \
        {p: e for p, e in ends.items() if p in offsets.decode_ranges(second[SnapshotSummary.RANGES])}

    run = ingest_once(spec)
    assert run.returncode == 0 and receipts(run.stdout) == []
    assert "nothing to ingest" not in run.stdout  # --json prints receipts only


def orphan_files(platform, spec, name) -> set[str]:
    t = table(platform, spec, name)
    referenced = {urlparse(f.file.file_path).path for f in t.scan().plan_files()}
    data_dir = Path(urlparse(t.location()).path) / "data"
    return {str(p) for p in data_dir.rglob("*.parquet")} - referenced


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_9_at_any_point_neither_loses_nor_duplicates(platform, pipeline, point):
    spec = pipeline()
    produce_orders(spec)
    crashed = ingest_once(spec, fault=point)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    ends = log_ends(platform, spec.source.topic)

    catalog = open_catalog(platform, spec.catalog)
    data_positions = offsets.read_progress(catalog, spec.target.table, spec.name).positions
    dlq_positions = offsets.read_progress(catalog, spec.dead_letter_table, spec.name).positions
    if point in ("during_read", "after_files"):
        assert data_positions == {} and dlq_positions == {}, "nothing may be visible before the commit"
    if point == "after_files":
        assert orphan_files(platform, spec, spec.target.table), "the kill should land after files were written"
    if point == "after_table_commit":
        assert data_positions == ends and dlq_positions == {}
    if point == "before_group_commit":
        assert data_positions == ends and dlq_positions == ends
        assert all(o < 0 for o in committed_group_offsets(platform, spec).values())

    scratch = Path(platform.home) / "spark-local"
    killed_copies = {p.relative_to(scratch).parts[0] for p in scratch.rglob("*.jar")
                     if not p.relative_to(scratch).parts[0].startswith(f"{os.getpid()}-")}  # not this process's
    assert killed_copies, "the killed driver should have left its copy of the Spark packages"

    resumed = ingest_once(spec)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 3000
    assert committed_group_offsets(platform, spec) == ends
    # the next start removed what the killed driver left of Spark's local files
    assert not killed_copies & {p.name for p in scratch.iterdir()}


def test_a_failed_task_is_retried_and_reads_exactly_the_same_range(platform, pipeline):
    spec = pipeline()
    produce_orders(spec, count=1500)
    run = ingest_once(spec, fault="task_failure")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (Path(platform.home) / "faults" / spec.name / "fired-task_failure").exists(), "the fault should have fired"
    assert assert_exactly_once(platform, spec) == 1500


def test_an_append_commits_through_a_concurrent_commit_by_another_writer(platform, pipeline):
    spec = pipeline()
    produce_orders(spec, count=1000)
    run = ingest_once(spec, fault="concurrent_commit")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "lakehouse.test.concurrent-writer" in table(platform, spec, spec.target.table).properties
    assert assert_exactly_once(platform, spec) == 1000


def test_an_upsert_that_conflicts_with_another_writer_is_retried_without_loss(platform, pipeline):
    # no Iceberg-internal retries, so the conflict reaches the job's own retry loop
    spec = pipeline(mode="upsert", table_key=["order_id"], partition_by=[],
                    target={"properties": {"commit.retry.num-retries": "0"}})
    first = [(f"ord-{i}".encode(), json.dumps(order(i, "created")).encode()) for i in range(2000)]
    send(platform, spec.source.topic, first)
    assert ingest_once(spec).returncode == 0
    send(platform, spec.source.topic, [(k, v.replace(b'"created"', b'"paid"')) for k, v in first])
    # once the update's row delta is written, before it commits, another writer deletes one of the rows it updates
    run = ingest_once(spec, fault="concurrent_commit")
    assert run.returncode == 0, run.stderr[-2000:]
    [receipt] = receipts(run.stdout)
    assert receipt["commit_retries"] >= 1, "the upsert should have met a conflicting commit"
    current = {r["order_id"]: r["status"] for r in rows(platform, spec, spec.target.table)}
    assert len(current) == 2000 and set(current.values()) == {"paid"}


def order(i: int, status: str) -> dict:
    return {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": 1.0, "currency": "EUR", "status": status,
            "event_time": "2026-11-20T12:00:00+00:00"}
