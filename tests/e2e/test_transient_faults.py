"""Transient faults are retried inside the continuous job, not fatal: a SQLite catalog locked longer than
its busy timeout, and a broker that stops answering for a while. Each retry is a `retry` event on the
ops timeline, and every offset still lands exactly once. (Killed PostgreSQL connections: see
tests/e2e/test_postgres.py.)"""

import contextlib
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from polling import wait_until, while_running

from e2e import assert_exactly_once, pipeline, spawn  # noqa: F401 (fixture)
from lakehouse.core import errors, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


WAIT_S = 120.0  # the most a test waits for the job to get somewhere


def ingested(platform, spec) -> int:
    """Records the dead-letter table's positions account for (it commits last in a batch)."""
    progress = offsets.read_progress(open_catalog(platform, spec.catalog), spec.dead_letter_table, spec.name)
    return sum(progress.positions.values())


def stop(job) -> str:
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    return err


@contextlib.contextmanager
def catalog_locked(platform):
    """Hold the SQLite catalog's write lock (another process in the middle of a long transaction)."""
    path = platform.catalog_uri.split(":///", 1)[1]
    con = sqlite3.connect(path, isolation_level=None, timeout=30)
    con.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


def test_a_catalog_locked_longer_than_the_busy_timeout_is_waited_out(platform, pipeline):
    spec = pipeline(partition_by=[], trigger={"interval": "500ms"})
    produce.produce(spec, 300, bad_ratio=0.1, seed=31)
    job = spawn(spec, "ingest", "--pipeline", spec.name, "--json",
                env={"LAKEHOUSE_CATALOG_BUSY_TIMEOUT_MS": "500"})
    try:
        wait_until(while_running(job, lambda: ingested(platform, spec) == 300), WAIT_S, "the first batch",
                   interval=0.3)
        with catalog_locked(platform):
            produce.produce(spec, 300, bad_ratio=0.1, seed=32)
            # the fault itself, not a wait for an event: the lock is held for a dozen 500 ms busy timeouts
            time.sleep(6)
            assert job.poll() is None, job.communicate()[1][-3000:]
        wait_until(while_running(job, lambda: ingested(platform, spec) == 600), WAIT_S,
                   "the records produced during the lock", interval=0.3)
    finally:
        err = stop(job) if job.poll() is None else job.communicate()[1]
    retries = events.recent(spec.name, "retry", platform=platform)
    assert retries, f"the lock should have been retried: {err[-3000:]}"
    assert all("locked" in e["message"] or "busy" in e["message"] for e in retries), retries[0]["message"]
    assert assert_exactly_once(platform, spec) == 600


def answers_admin(platform, topic: str) -> bool:
    from lakehouse.core import topics

    try:
        topics.describe_config(topic, ["retention.ms"], platform, timeout=5)
    except errors.TopicError:
        return False
    return True


def test_a_stalled_broker_is_retried_until_it_answers_again(platform, pipeline):
    spec = pipeline(partition_by=[], trigger={"interval": "500ms"})
    produce.produce(spec, 200, bad_ratio=0.1, seed=41)
    job = spawn(spec, "ingest", "--pipeline", spec.name, "--json")
    broker = int(Path(platform.home, "stack.json").read_text().split('"pid": ')[1].split(",")[0])
    try:
        wait_until(while_running(job, lambda: ingested(platform, spec) == 200), WAIT_S, "the first batch",
                   interval=0.3)
        # stalled only once the batch is over (its event is recorded after the consumer group's commit,
        # which waits for the broker however long it takes): the stall meets the job planning
        wait_until(while_running(job, lambda: events.recent(spec.name, "batch", platform=platform)), WAIT_S,
                   "the first batch's event", interval=0.3)
        os.kill(broker, signal.SIGSTOP)  # the broker hangs: no answer, no error
        try:
            # the fault itself, not a wait for an event: the broker stays stalled longer than the planner
            # waits for metadata (15 s: lakehouse.ingest.plan.topic_state's timeout)
            time.sleep(20)
            assert job.poll() is None, job.communicate()[1][-3000:]
        finally:
            os.kill(broker, signal.SIGCONT)
        # Apache Kafka needs a moment to find its own controller again after a freeze this long: the broker,
        # fenced for missed heartbeats, answers once and then "waits for the controller" until it is unfenced,
        # so the records after the stall are produced once it has answered three times in a row
        answered = []
        wait_until(lambda: answered.append(answers_admin(platform, spec.source.topic)) or answered[-3:] == [True] * 3,
                   WAIT_S, "the broker to answer again", interval=1.0)
        produce.produce(spec, 200, bad_ratio=0.1, seed=42)
        wait_until(while_running(job, lambda: ingested(platform, spec) == 400), WAIT_S,
                   "the records produced after the stall", interval=0.3)
    finally:
        err = stop(job) if job.poll() is None else job.communicate()[1]
    retries = events.recent(spec.name, "retry", platform=platform)
    assert retries, f"the stall should have been retried: {err[-3000:]}"
    assert assert_exactly_once(platform, spec) == 400
