"""One writer per pipeline, fenced in the catalog; resume fails closed; expiry keeps what resume and the
next audit walk; one table has one owner; an upsert replay cannot bring back a deleted key.

The ingest jobs run in the test process (one Spark session) or as `lakehouse ingest` processes, on the
real embedded broker and the SQLite JDBC catalog.
"""

import dataclasses
import json
import signal
import time
from pathlib import Path

import pytest
from polling import wait_until, while_running
from pyiceberg.expressions import EqualTo

from e2e import assert_exactly_once, pipeline, rows, run_cli, send, spawn, table  # noqa: F401 (fixture)
from lakehouse.core import events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import PositionsLostError, TableOwnershipError, WriterFencedError
from lakehouse.core.spec import load_spec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest import committer
from lakehouse.ingest.job import IngestJob
from lakehouse.recovery import backfill
from lakehouse.upkeep import maintenance
from lakehouse.wap import publish, quality
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def order(i: int, status: str = "created") -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": status, "event_time": "2026-11-20T12:00:00+00:00"}
    return record["order_id"].encode(), json.dumps(record).encode()


def writers_of_ingest_commits(platform, spec, name) -> list[str]:
    """The writer id of every ingest commit on `main`, oldest first."""
    return [offsets.summary_properties(s)[SnapshotSummary.WRITER]
            for s in offsets.ingest_commits(table(platform, spec, name), spec.name)]


def test_a_newer_ingest_job_fences_the_older_one_in_the_catalog(platform, pipeline, spark):
    spec = pipeline(partition_by=[])
    send(platform, spec.source.topic, [order(i) for i in range(100)])
    old = IngestJob(spec, platform, spark)
    assert old.run_batch() is not None
    # a second job of the pipeline starts elsewhere (another LAKEHOUSE_HOME, same catalog and broker)
    elsewhere = dataclasses.replace(platform, home=Path(platform.home) / "elsewhere")
    new = IngestJob(spec, elsewhere, spark)
    send(platform, spec.source.topic, [order(i) for i in range(100, 150)])
    assert new.run_batch() is not None
    assert new.writer().epoch == old.writer().epoch + 1
    send(platform, spec.source.topic, [order(i) for i in range(150, 200)])
    before = table(platform, spec, spec.target.table).current_snapshot().snapshot_id
    with pytest.raises(WriterFencedError, match="another ingest job took over"):
        old.run_batch()  # the zombie wakes up: nothing it does becomes visible
    assert table(platform, spec, spec.target.table).current_snapshot().snapshot_id == before
    assert new.run_batch() is not None
    assert assert_exactly_once(platform, spec) == 200
    assert set(writers_of_ingest_commits(platform, spec, spec.target.table)[1:]) == {new.writer().writer_id}
    claims = events.recent(spec.name, "writer", platform=platform)
    assert [e["status"] for e in claims] == ["failed", "ok", "ok"], "claims and the fencing are on the timeline"


def test_the_fence_is_checked_inside_the_catalog_swap_not_before_it(platform, pipeline, spark, monkeypatch):
    """The zombie passes every check, then pauses; the newer job claims the tables; the zombie's commit
    must still fail, because the fence is validated against the metadata the catalog swaps."""
    spec = pipeline(partition_by=[])
    send(platform, spec.source.topic, [order(i) for i in range(60)])
    zombie = IngestJob(spec, platform, spark)
    zombie.writer()
    real_commit = committer.append_files
    taken_over = []

    def pause_then_commit(catalog, table_, files, summary, fence):
        if not taken_over:  # the pause: a newer job claims the tables right before the swap
            taken_over.append(committer.Writer.claim(catalog, spec.name, list(spec.positioned_tables)))
        return real_commit(catalog, table_, files, summary, fence)

    monkeypatch.setattr(committer, "append_files", pause_then_commit)
    with pytest.raises(WriterFencedError):
        zombie.run_batch()
    monkeypatch.undo()
    for name in (spec.target.table, spec.dead_letter_table):
        assert offsets.read_progress(open_catalog(platform, spec.catalog), name, spec.name).positions == {}


def test_two_continuous_jobs_with_different_homes_leave_every_offset_exactly_once(platform, pipeline, tmp_path):
    """Two `lakehouse ingest` processes of one pipeline, each with its own LAKEHOUSE_HOME (so their local
    locks do not see each other), on the same catalog and broker: the job that claims the tables last
    fences the other, which exits with code 4; every offset lands exactly once."""
    spec = pipeline(partition_by=[], trigger={"interval": "1s"})
    shared = {"LAKEHOUSE_CATALOG_URI": platform.catalog_uri, "LAKEHOUSE_WAREHOUSE": platform.warehouse,
              "LAKEHOUSE_BOOTSTRAP_SERVERS": platform.bootstrap_servers}
    jobs = [spawn(spec, "ingest", "--pipeline", spec.name, "--json",
                  env={**shared, "LAKEHOUSE_HOME": str(tmp_path / f"home-{n}")}) for n in ("a", "b")]
    catalog = open_catalog(platform, spec.catalog)
    produced, seed = 0, 21

    def exited_job():
        """The first job that exited; until one does, 50 more records each time (the interval sets the rate)."""
        nonlocal produced, seed
        exited = [job for job in jobs if job.poll() is not None]
        if exited:
            return exited[0]
        produce.produce(spec, 50, bad_ratio=0.1, seed=seed)  # records keep coming until one job is fenced
        produced, seed = produced + 50, seed + 1
        return None

    def ingested() -> int:
        return sum(offsets.read_progress(catalog, spec.dead_letter_table, spec.name).positions.values())

    try:
        fenced = wait_until(exited_job, 180, "one of the jobs to be fenced by the other", interval=0.5)
        survivor = next(job for job in jobs if job is not fenced)
        _, err = fenced.communicate(timeout=60)
        assert fenced.returncode == 4 and "another ingest job took over" in err, err[-3000:]
        produce.produce(spec, 100, bad_ratio=0.1, seed=seed)
        produced += 100
        wait_until(while_running(survivor, lambda: ingested() >= produced), 120,
                   "the surviving job to ingest every record", interval=0.3)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
                job.communicate(timeout=120)
    assert survivor.returncode == 0
    assert assert_exactly_once(platform, spec) == produced
    # once the survivor committed, every later ingest commit is the survivor's: no interleaving
    order = writers_of_ingest_commits(platform, spec, spec.target.table)
    assert set(order[order.index(order[-1]):]) == {order[-1]}, order


def test_resume_stops_when_the_history_holding_the_positions_was_expired(platform, pipeline, spark):
    spec = pipeline(partition_by=[])
    send(platform, spec.source.topic, [order(i) for i in range(50)])
    IngestJob(spec, platform, spark).run_once()
    positions_id = table(platform, spec, spec.target.table).current_snapshot().snapshot_id
    table(platform, spec, spec.target.table).delete(EqualTo("order_id", "ord-0"))  # a commit without positions
    # someone expires aggressively with Iceberg's own procedure, taking the positions snapshot
    spark.sql(f"CALL {spec.catalog}.system.expire_snapshots(table => '{spec.target.table}', "
              f"snapshot_ids => array({positions_id}L))")
    progress = offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table, spec.name)
    assert progress.positions == {} and "was expired" in progress.lost
    send(platform, spec.source.topic, [order(i) for i in range(50, 60)])
    with pytest.raises(PositionsLostError, match="would duplicate rows"):
        IngestJob(spec, platform, spark).run_once()
    assert len(rows(platform, spec, spec.target.table)) == 49, "nothing was read again"
    # a backfill cannot bound its range by a position nobody knows: it stops before planning anything
    with pytest.raises(PositionsLostError, match="was expired"):
        backfill.plan(spec, backfill.BackfillRequest("offsets", "in_place", dry_run=True, ranges={0: (0, 10)}),
                      platform)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert run.returncode == 3 and "was expired" in run.stderr, run.stderr[-2000:]
    [status] = json.loads(run_cli(spec, "status", "--pipeline", spec.name, "--json").stdout)  # a list, one item
    assert any("was expired" in (t["lost"] or "") for t in status["tables"])


def test_aggressive_expiry_keeps_the_resume_chain_and_the_unpublished_lineage(platform, pipeline, spark):
    # no compaction here: it would rewrite published rows into new files the next audit reads again
    spec = pipeline(partition_by=[], retention={"replay_window": "1s"}, maintenance={"min_input_files": 1000})
    job = IngestJob(spec, platform, spark)
    send(platform, spec.source.topic, [order(i) for i in range(30)])
    job.run_once()
    audited = quality.audit(spec, platform)
    publish.publish(spec, audited.snapshots, platform, spark_factory=lambda: spark)
    for start in (30, 60, 90):  # commits after the publication, some without positions on top
        send(platform, spec.source.topic, [order(i) for i in range(start, start + 30)])
        job.run_once()
        spark.sql(f"CALL {spec.catalog}.system.rewrite_manifests(table => '{spec.target.table}')")
    time.sleep(1.5)  # the behaviour under test, not an event: everything ages past the 1s replay window
    receipt = maintenance.run(spec, platform, spark)
    assert receipt.ok, receipt.to_json()
    data = next(t for t in receipt.tables if t.table == spec.qualified(spec.target.table))
    assert data.snapshots_expired == 0 and data.kept_for_resume > 0, "every snapshot is still walked by someone"
    t = table(platform, spec, spec.target.table)
    published = t.metadata.refs[spec.publish.branch].snapshot_id
    chain = [s.snapshot_id for s in offsets.main_ancestry(t.metadata)]
    assert published in chain, "the lineage from main down to the published head is intact"
    # the next ingest resumes exactly once, and the next audit covers everything since the publication
    send(platform, spec.source.topic, [order(i) for i in range(120, 150)])
    job.run_once()
    assert assert_exactly_once(platform, spec) == 150
    audited = quality.audit(spec, platform, record_event=False)
    assert audited.success and audited.rows == 120
    publish.publish(spec, audited.snapshots, platform, spark_factory=lambda: spark)
    time.sleep(1.5)  # the behaviour under test, not an event: the new commits age past the 1s replay window
    receipt = maintenance.run(spec, platform, spark)
    data = next(t for t in receipt.tables if t.table == spec.qualified(spec.target.table))
    assert data.snapshots_expired > 0, "once published, the old lineage may go"
    assert offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table,
                                 spec.name).positions


def test_a_table_owned_by_another_pipeline_is_refused(platform, pipeline, make_spec, spark, tmp_path):
    first = pipeline(partition_by=[])
    send(platform, first.source.topic, [order(i) for i in range(10)])
    IngestJob(first, platform, spark).run_once()
    # a second pipeline names the first one's table, declared in another folder (within one folder the
    # specs already refuse to load: tests/unit/core/test_spec_hostile.py)
    declared = Path(make_spec(target={"table": first.target.table}).path)
    elsewhere = tmp_path / "elsewhere" / declared.name
    elsewhere.parent.mkdir()
    declared.rename(elsewhere)
    intruder = load_spec(elsewhere)
    with pytest.raises(TableOwnershipError, match=f"belongs to pipeline '{first.name}'"):
        IngestJob(intruder, platform, spark)
    run = run_cli(intruder, "ingest", "--pipeline", intruder.name, "--once")
    assert run.returncode == 2 and "belongs to pipeline" in run.stderr, run.stderr[-2000:]
    assert len(rows(platform, first, first.target.table)) == 10


def test_an_upsert_replay_does_not_bring_back_a_key_a_later_tombstone_deleted(platform, pipeline, spark):
    spec = pipeline(mode="upsert", table_key=["order_id"], partition_by=[])
    send(platform, spec.source.topic, [order(1), order(2), (b"ord-1", None)], partition=0)
    IngestJob(spec, platform, spark).run_once()
    assert {r["order_id"] for r in rows(platform, spec, spec.target.table)} == {"ord-2"}
    ledger = rows(platform, spec, spec.target.table + "__tombstones")
    assert [(r["order_id"], r["_kafka"]["offset"]) for r in ledger] == [("ord-1", 2)]
    run = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:0-3", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert {r["order_id"] for r in rows(platform, spec, spec.target.table)} == {"ord-2"}, "ord-1 stays deleted"
    # a record newer than the tombstone re-creates the key, also through a replay after losing it
    send(platform, spec.source.topic, [order(1, status="paid")], partition=0)
    IngestJob(spec, platform, spark).run_once()
    assert {r["order_id"]: r["status"] for r in rows(platform, spec, spec.target.table)} == \
        {"ord-1": "paid", "ord-2": "created"}
