"""The retry policies (lakehouse.core.retry), as their callers meet them: a commit another writer beat is made
again on the reloaded table and lands; attempts that keep losing end in the caller's error naming what
conflicted and what to do; what waiting cannot fix is raised at once; an outage is waited out until its
deadline. Real pyiceberg tables on a SQLite catalog in tmp_path; no test sleeps (the policies are handed a
`sleep` that records and, for deadlines, a clock that the recorded waits move)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

from lakehouse.core import errors, retry

TABLE = "db.t"
ROWS = pa.schema([("id", pa.int64()), ("writer", pa.string())])


def clients(tmp_path: Path) -> tuple[SqlCatalog, SqlCatalog]:
    """Two clients of one SQLite catalog (as two processes would be), and the table they both write: without
    pyiceberg's own commit retries, so that a lost race reaches the policy."""
    uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", (tmp_path / "warehouse").as_uri()
    ours, theirs = SqlCatalog("lake", uri=uri, warehouse=warehouse), SqlCatalog("lake", uri=uri, warehouse=warehouse)
    ours.create_namespace("db")
    ours.create_table(TABLE, schema=ROWS, properties={"commit.retry.num-retries": "0"})
    return ours, theirs


def rows(writer: str, *ids: int) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "writer": writer} for i in ids], schema=ROWS)


def content(catalog: SqlCatalog) -> list[tuple[int, str]]:
    return sorted((r["id"], r["writer"]) for r in catalog.load_table(TABLE).scan().to_arrow().to_pylist())


class Clock:
    """A monotonic clock that moves only when the policy waits or an attempt says it took time."""

    def __init__(self) -> None:
        self.now, self.waits = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


# ---------------------------------------------------------------------------- commit conflicts, real tables

def test_a_commit_another_writer_beat_is_made_again_on_the_reloaded_table_and_both_rows_land(tmp_path, caplog):
    ours, theirs = clients(tmp_path)
    waits: list[float] = []

    def append(number: int) -> int:
        table = ours.load_table(TABLE)  # every attempt works on the table as it is now
        if number == 1:  # another writer commits between our read and our commit
            theirs.load_table(TABLE).append(rows("theirs", 1))
        table.append(rows("ours", 2))
        return number

    with caplog.at_level(logging.WARNING, logger="lakehouse.retry"):
        landed_in = retry.commit_conflicts(f"commit to {TABLE}", attempts=3, sleep=waits.append).run(append)
    assert landed_in == 2
    assert content(ours) == [(1, "theirs"), (2, "ours")]
    assert len(waits) == 1 and 0.05 <= waits[0] <= 0.1  # the first wait: half to all of first_wait_s
    assert f"commit to {TABLE} conflicted with another commit (attempt 1 of 3); reloading and retrying in " \
           f"{waits[0]:.2f}s: CommitFailedException: " in caplog.text


def test_a_commit_that_loses_every_attempt_raises_the_callers_error_naming_what_conflicted(tmp_path):
    ours, theirs = clients(tmp_path)
    waits: list[float] = []

    class BatchCommitError(errors.CommitError):
        """A caller's own error type, which its callers catch."""

    def append(number: int) -> None:
        table = ours.load_table(TABLE)
        theirs.load_table(TABLE).append(rows("theirs", number))  # another writer always gets in first
        table.append(rows("ours", 100 + number))

    policy = retry.commit_conflicts(f"commit to {TABLE}", attempts=3, error=BatchCommitError, sleep=waits.append,
                                    next_step="Run the batch again when the compaction is done.")
    with pytest.raises(BatchCommitError) as raised:
        policy.run(append)
    message = str(raised.value)
    assert message.startswith(f"commit to {TABLE} conflicted with another commit in each of its 3 attempts (the "
                              f"last: CommitFailedException: ")
    assert message.endswith("Run the batch again when the compaction is done.")
    assert isinstance(raised.value.__cause__, CommitFailedException)
    assert content(ours) == [(1, "theirs"), (2, "theirs"), (3, "theirs")]  # none of ours became visible
    assert len(waits) == 2 and all(0.0 < w <= 0.2 for w in waits)


def test_an_error_raised_while_handling_a_conflict_is_that_error_and_is_not_retried(tmp_path):
    """As publishing does: on a conflict it reloads the table and may find a reason to stop (the branch moved);
    that refusal carries the conflict as its context, and must still end the commit at once."""
    ours, theirs = clients(tmp_path)
    waits: list[float] = []
    attempts: list[int] = []

    def publish(number: int) -> None:
        attempts.append(number)
        table = ours.load_table(TABLE)
        theirs.load_table(TABLE).append(rows("theirs", number))
        try:
            table.append(rows("ours", 100))
        except CommitFailedException:
            raise errors.TableStateError("the branch moved meanwhile (another publisher?)") from None

    with pytest.raises(errors.TableStateError, match="the branch moved meanwhile"):
        retry.commit_conflicts("publishing db.t", attempts=5, sleep=waits.append).run(publish)
    assert attempts == [1] and waits == []
    assert content(ours) == [(1, "theirs")]


@pytest.mark.parametrize("raised, conflict, outages, retried", [
    (ValueError("a bad partition transform"), retry.is_conflict, False, False),
    (errors.CatalogUnavailableError("catalog down"), retry.is_conflict, False, False),
    (errors.CatalogUnavailableError("catalog down"), retry.is_conflict_in_chain, True, True),
    (errors.WriterFencedError("another ingest job took over the table"), retry.is_conflict_in_chain, True, False),
    (errors.PositionsMovedError("positions moved since the batch was planned"), retry.is_conflict, False, True),
    (KeyboardInterrupt(), retry.is_conflict_in_chain, True, False),
])
def test_what_a_commit_policy_retries(raised, conflict, outages, retried):
    waits: list[float] = []
    attempts: list[int] = []

    def commit(number: int) -> str:
        attempts.append(number)
        if number == 1:
            try:
                raise CommitFailedException("another commit landed first")  # the error's context, for the chain
            except CommitFailedException:
                raise raised  # noqa: B904 - its context is the conflict, as for an error raised while handling one
        return "committed"

    policy = retry.commit_conflicts("commit to db.t", attempts=2, conflict=conflict, outages=outages,
                                    sleep=waits.append)
    if retried:
        assert policy.run(commit) == "committed" and attempts == [1, 2] and len(waits) == 1
    else:
        with pytest.raises(type(raised)):
            policy.run(commit)
        assert attempts == [1] and waits == []


@settings(max_examples=200, deadline=None)
@given(attempts=st.integers(1, 8), losses=st.integers(0, 10), first=st.floats(0.0, 2.0), growth=st.floats(1.0, 50.0))
def test_a_commit_is_tried_at_most_its_attempts_with_waits_doubling_within_their_jitter(attempts, losses, first,
                                                                                        growth):
    waits: list[float] = []
    ceiling = first * growth

    def commit(number: int) -> int:
        if number <= losses:
            raise CommitFailedException(f"lost race {number}")
        return number

    policy = retry.commit_conflicts("commit to db.t", attempts=attempts, first_wait_s=first, max_wait_s=ceiling,
                                    sleep=waits.append)
    if losses < attempts:
        assert policy.run(commit) == losses + 1
    else:
        with pytest.raises(errors.CommitError, match=f"in each of its {attempts} attempts .*lost race {attempts}"):
            policy.run(commit)
    assert len(waits) == min(losses, attempts - 1)
    for retried, wait in enumerate(waits, start=1):
        longest = min(ceiling, first * 2 ** (retried - 1))
        assert longest / 2 <= wait <= longest * (1 + 1e-9)


# ---------------------------------------------------------------------------- transient faults, a deadline

def test_an_outage_is_retried_until_it_passes_and_each_retry_is_reported_before_its_wait(caplog):
    clock, reported = Clock(), []

    def run_batch(number: int) -> str:
        if number < 4:
            raise errors.CatalogUnavailableError("the catalog did not answer")
        return "batch committed"

    policy = retry.transient("pipeline orders", deadline_s=300.0, next_step="Start it again.", first_wait_s=1.0,
                             on_retry=reported.append, sleep=clock.sleep, clock=clock.monotonic)
    with caplog.at_level(logging.WARNING, logger="lakehouse.retry"):
        assert policy.run(run_batch) == "batch committed"
    assert clock.waits == [1.0, 2.0, 4.0]
    assert [(r.attempt, r.wait_s, r.reason) for r in reported] == [
        (1, 1.0, "the catalog did not answer"), (2, 2.0, "the catalog did not answer"),
        (3, 4.0, "the catalog did not answer")]
    assert "pipeline orders: transient failure (the catalog did not answer); retry 3 in 4.0s, 297s of the 300s " \
           "deadline left" in caplog.text


@settings(max_examples=200, deadline=None)
@given(deadline=st.floats(0.0, 600.0), duration=st.floats(0.0, 60.0), first=st.floats(0.01, 5.0),
       ceiling=st.floats(5.0, 60.0))
def test_an_outage_that_outlasts_the_deadline_gives_up_once_it_has_passed_since_the_first_failure(
        deadline, duration, first, ceiling):
    clock = Clock()
    failed_at: list[float] = []

    def run_batch(number: int) -> None:
        clock.now += duration  # the attempt takes this long, then the broker does not answer
        failed_at.append(clock.now)
        raise errors.BrokerUnavailableError("the broker did not answer")

    policy = retry.transient("pipeline orders", deadline_s=deadline, next_step="Start it again.",
                             first_wait_s=first, max_wait_s=ceiling, sleep=clock.sleep, clock=clock.monotonic)
    with pytest.raises(errors.OutageError) as raised:
        policy.run(run_batch)
    since_first = [t - failed_at[0] for t in failed_at]
    assert since_first[-1] >= deadline and all(s < deadline for s in since_first[:-1])
    assert len(clock.waits) == len(failed_at) - 1
    for retried, wait in enumerate(clock.waits, start=1):  # doubling, never past the deadline, never a busy loop
        assert wait <= min(ceiling, first * 2 ** (retried - 1)) + 1e-9
        assert wait >= min(first * 2 ** (retried - 1), ceiling, retry.LAST_WAIT_S) - 1e-9
    message = str(raised.value)
    assert message.startswith(f"pipeline orders: gave up after {len(clock.waits)} retries over ")
    assert message.endswith("the broker did not answer. Start it again.")
    assert isinstance(raised.value.__cause__, errors.BrokerUnavailableError)


def test_what_waiting_cannot_fix_is_raised_at_once_whatever_its_cause():
    clock = Clock()

    def run_batch(number: int) -> None:
        try:
            raise errors.CatalogUnavailableError("the catalog did not answer")
        except errors.CatalogUnavailableError as exc:
            raise errors.ConfigurationError("the spec names no such catalog") from exc

    policy = retry.transient("pipeline orders", deadline_s=300.0, next_step="-", sleep=clock.sleep,
                             clock=clock.monotonic)
    with pytest.raises(errors.ConfigurationError, match="no such catalog"):
        policy.run(run_batch)
    assert clock.waits == []


def test_a_stop_requested_while_waiting_ends_the_retries_without_another_attempt():
    stop, attempts = threading.Event(), []
    policy = retry.transient("pipeline orders", deadline_s=300.0, next_step="-", first_wait_s=30.0,
                             on_retry=lambda failed: stop.set(), stop_event=stop)

    def run() -> str | None:
        for attempt in policy:
            with attempt:
                attempts.append(attempt.number)
                raise errors.BrokerUnavailableError("the broker did not answer")
        return None

    assert run() is None and attempts == [1]  # and it did not wait the 30 s: the stop ended the wait


@pytest.mark.parametrize("made, why", [
    (lambda: retry.commit_conflicts("commit to db.t", attempts=0), "attempts must be at least 1"),
    (lambda: retry.commit_conflicts("commit to db.t", attempts=3, first_wait_s=-1.0), "0 <= first_wait_s"),
    (lambda: retry.transient("pipeline orders", deadline_s=10.0, next_step="-", first_wait_s=0.0),
     "an outage is waited for"),
    (lambda: retry.Policy("conflict", "commit to db.t", errors.CommitError, "-"), "attempts or a deadline"),
])
def test_a_policy_that_could_not_work_is_refused_when_made(made, why):
    with pytest.raises(ValueError, match=why):
        made()
