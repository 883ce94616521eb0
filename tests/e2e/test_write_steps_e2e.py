"""A continuous job with `trigger.write_interval` shorter than its trigger reads and writes files every write
interval and commits them once per trigger, as the Kafka Connect sink does; every offset still lands once,
through a stop and through a kill -9 between steps. The planning and joining of steps is specified in
tests/unit/ingest/test_write_steps.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from e2e import assert_exactly_once, pipeline, run_cli, send, spawn, summaries, table  # noqa: F401 - pipeline is a fixture

from lakehouse.core.table_properties import SnapshotSummary
from tests.e2e.test_table_layout_e2e import Producer, order

STEPPED = {"interval": "4s", "write_interval": "1s"}
BROKEN = [(b"bad-1", b"{not json"), (b"bad-2", b'{"order_id": 7}')]


@pytest.mark.slow
def test_a_batch_written_in_steps_is_committed_once_per_trigger_exactly_once(platform, spark, pipeline):
    from lakehouse.ingest.job import IngestJob

    spec = pipeline(partitions=2, trigger=STEPPED)
    send(platform, spec.source.topic, BROKEN)
    job = IngestJob(spec, platform, spark)
    producer = Producer(platform, spec.source.topic)
    receipts = []
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    producer.start()
    try:
        job.run_continuous(on_batch=receipts.append, max_batches=2)
    finally:
        produced = producer.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)

    assert len(receipts) == 2
    # a step of fewer than 10,000 records is one task (plan.task_groups): two tasks or more in such a batch
    # means two steps or more. (The first batch's first step includes the writer's claim: on a slow machine it
    # can take most of the window, leaving room for one more step only.)
    assert all(r.tasks >= 2 and r.records < 10_000 for r in receipts), [(r.tasks, r.records) for r in receipts]
    assert receipts[0].dead_letters == len(BROKEN)
    # one commit per table per batch, each holding every step's offsets as one range per partition
    for name in (spec.target.table, spec.dead_letter_table):
        batches = [s[SnapshotSummary.BATCH] for s in summaries(platform, spec, name) if SnapshotSummary.BATCH in s]
        assert batches == [r.batch_id for r in receipts]
    assert receipts[1].ranges and all(receipts[1].ranges[p][0] == receipts[0].ranges[p][1]
                                      for p in receipts[0].ranges if p in receipts[1].ranges)

    IngestJob(spec, platform, spark).run_once()  # what arrived after the second commit
    assert assert_exactly_once(platform, spec) == produced + len(BROKEN)


@pytest.mark.slow
def test_a_kill_between_steps_leaves_orphan_files_and_loses_nothing(platform, pipeline):
    spec = pipeline(partitions=2, trigger=STEPPED)
    send(platform, spec.source.topic, [order(i) for i in range(200)])
    job = spawn(spec, "ingest", "--pipeline", spec.name, env={"LAKEHOUSE_FAULT": "between_steps"})
    producer = Producer(platform, spec.source.topic)
    producer.start()
    try:
        job.wait(timeout=300)
    finally:
        produced = 200 + producer.stop()
    assert job.returncode == -signal.SIGKILL, job.stderr.read()[-3000:] if job.stderr else ""

    data = table(platform, spec, spec.target.table)
    assert data.current_snapshot() is None  # the steps' files were never committed
    written = {p.name for p in Path(data.location().removeprefix("file:"), "data").rglob("*.parquet")}
    assert written, "the killed job wrote its first steps' files"

    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    assert assert_exactly_once(platform, spec) == produced
    live = {Path(f["file_path"]).name for f in table(platform, spec, spec.target.table).inspect.files().to_pylist()}
    assert written.isdisjoint(live)  # the orphans stay invisible; maintenance removes them
