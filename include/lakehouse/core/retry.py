"""Retry policies: the one place that decides what is worth another attempt, how long to wait before
it, and what to say when the attempts run out.

Two kinds of trouble pass when tried again, and each has a policy:

- `commit_conflicts`: another commit won the catalog's compare-and-set (Iceberg's optimistic
  concurrency). pyiceberg raises CommitFailedException, and so do the lakehouse's own commit
  requirements (lakehouse.ingest.committer's PositionsMovedError derives from it);
  through Spark, py4j wraps Iceberg's Java CommitFailedException and ValidationException
  (`is_conflict_in_chain`). An attempt that lost must not be replayed as it was: every attempt after
  the first works on the table reloaded from the catalog (the body is handed its attempt number and
  reloads when it is above 1). The attempts are bounded; the waits between them double from
  `first_wait_s` up to `max_wait_s`, each drawn between half and all of that (jitter), so that
  writers that collided once do not collide again in step.
- `transient`: the catalog, the object store, the schema registry or the broker did not answer
  (`transient_reason`: errors.transient_cause, which knows RetryableError and the drivers' and
  clients' outage errors). Tried again with a doubling wait until a deadline counted from the first
  failure, since an outage is measured in time, not in attempts.

Anything else is raised at once and unchanged, as is every error the body raises on purpose. Each
wait is logged on `lakehouse.retry` (what is retried, the attempt, the reason, the wait). When the
attempts or the deadline run out the policy raises its `error` type, the one the site's callers catch
(IngestError, MaintenanceError, PublishError, CommitFailedException, OutageError...), with a message
naming what conflicted or failed, how often, the last reason and what to do next, chained to the last
failure.

Built on tenacity (its stop, wait, before-sleep and give-up hooks). A policy is a frozen value, made
where it is used:

    def attempt(number: int) -> Snapshot:
        table = loaded if number == 1 else catalog.load_table(name)
        ...commit on `table`...
    return retry.commit_conflicts(f"commit to {name}", attempts=6, error=IngestError,
                                  next_step="...").run(attempt)

    for attempt in retry.transient(f"pipeline {name}", deadline_s=300.0, stop_event=stop, ...):
        with attempt:
            return run_once()
    return None  # the stop was requested while waiting

Tests hand a policy their own `sleep` (and `clock`), so that no test waits.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, NoReturn, TypeVar

import tenacity
from pyiceberg.exceptions import CommitFailedException

from lakehouse.core import errors
from lakehouse.core.sparkenv import describe_error

log = logging.getLogger("lakehouse.retry")
T = TypeVar("T")
# the shortest wait before a deadline's last attempts: an outage that has almost used its deadline up still
# gets another look, without a busy loop
LAST_WAIT_S = 0.1
CONFLICT_NEXT_STEP = ("Nothing of the last attempt is visible; run it again. If it keeps conflicting, another "
                      "writer commits to the table very often: see its commits in `lakehouse status`.")
_jitter = random.Random()


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` itself is pyiceberg's report that another commit won the catalog's compare-and-set
    (CommitFailedException; the lakehouse's own requirements' refusals derive from it). Its causes are not
    looked at: an error raised while handling a conflict (a refusal found on the reloaded table) is that
    error, not a conflict."""
    return isinstance(exc, CommitFailedException)


def is_conflict_in_chain(exc: BaseException) -> bool:
    """Whether `exc` or one of its causes is a commit conflict, pyiceberg's or Iceberg's Java one behind a
    Spark or py4j error (errors.commit_conflict), for commits made through Spark or wrapped by the caller.
    A fenced writer never is one: it must stop, not try again."""
    return not isinstance(exc, errors.WriterFencedError) and errors.commit_conflict(exc)


def transient_reason(exc: BaseException) -> str | None:
    """Why waiting may help with `exc` (errors.transient_cause), or None when it cannot: a configuration error,
    a table the pipeline cannot continue from and a fenced writer stay what they are however long one waits,
    whatever their causes say."""
    if isinstance(exc, (errors.ConfigurationError, errors.TableStateError, errors.WriterFencedError)):
        return None
    return errors.transient_cause(exc)


@dataclass(frozen=True)
class Retry:
    """One failed attempt the policy tries again: what it logs and hands to its `on_retry`."""

    what: str
    attempt: int  # the attempt that failed, from 1: also the number of this retry
    reason: str
    wait_s: float  # before the next attempt
    error: BaseException


class Attempt:
    """One attempt of a policy's iteration: a context manager that hands what its body raises to the policy,
    which tries again, raises it unchanged, or gives up."""

    def __init__(self, manager: tenacity.AttemptManager):
        self._manager = manager

    @property
    def number(self) -> int:
        """This attempt's number, from 1."""
        return self._manager.retry_state.attempt_number

    def __enter__(self) -> Attempt:
        self._manager.__enter__()
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool | None:
        return self._manager.__exit__(exc_type, exc, traceback)


@dataclass(frozen=True)
class Policy:
    """What is retried (`retries`: a `conflict`, and with `outages` a transient fault, or for the transient kind
    a transient fault), how often (`attempts`) or for how long (`deadline_s`, counted from the first failure),
    the waits (`first_wait_s` doubled per attempt up to `max_wait_s`, optionally jittered), and the `error`
    raised with `next_step` once they run out. Made by `commit_conflicts` and `transient`."""

    kind: Literal["conflict", "transient"]
    what: str
    error: Callable[[str], BaseException]
    next_step: str
    conflict: Callable[[BaseException], bool] = is_conflict
    outages: bool = False
    attempts: int | None = None
    deadline_s: float | None = None
    first_wait_s: float = 0.0
    max_wait_s: float = 30.0
    jitter: bool = False
    on_retry: Callable[[Retry], None] | None = None
    stop_event: threading.Event | None = None  # set while waiting: the iteration ends without a result
    sleep: Callable[[float], object] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.attempts is None and self.deadline_s is None:
            raise ValueError(f"retry policy for {self.what}: give it attempts or a deadline, or it never ends")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"retry policy for {self.what}: attempts must be at least 1, not {self.attempts}")
        if self.deadline_s is not None and self.first_wait_s <= 0:
            raise ValueError(f"retry policy for {self.what}: an outage is waited for; first_wait_s must be above 0")
        if self.first_wait_s < 0 or self.max_wait_s < self.first_wait_s:
            raise ValueError(f"retry policy for {self.what}: waits must satisfy 0 <= first_wait_s <= max_wait_s, "
                             f"not {self.first_wait_s} and {self.max_wait_s}")

    def retries(self, exc: BaseException) -> bool:
        """Whether this policy tries again after `exc` (an Exception: KeyboardInterrupt, SystemExit and the like pass
        whatever their causes say)."""
        if not isinstance(exc, Exception):
            return False
        return self.conflicted(exc) or ((self.kind == "transient" or self.outages)
                                         and transient_reason(exc) is not None)

    def conflicted(self, exc: BaseException) -> bool:
        """Whether `exc` is a commit conflict this policy retries."""
        return self.kind == "conflict" and self.conflict(exc)

    def backoff_s(self, attempt: int) -> float:
        """The longest wait after failed attempt number `attempt`: `first_wait_s` doubled per attempt, at most
        `max_wait_s` (jitter draws between half of it and all of it; a deadline may shorten it)."""
        return min(self.max_wait_s, self.first_wait_s * 2.0 ** min(attempt - 1, 64))

    def __iter__(self) -> Iterator[Attempt]:
        """The attempts, each used as `with attempt:` around one try; the iteration ends after a try that did
        not raise, raises what is not retried, and raises `error` when the attempts or the deadline run out.
        With a `stop_event` set while waiting it ends without another attempt."""
        for manager in _Run(self).retrying():
            stopped = self.stop_event is not None and self.stop_event.is_set()
            if stopped and manager.retry_state.attempt_number > 1:
                return
            yield Attempt(manager)

    def run(self, fn: Callable[[int], T]) -> T:
        """fn(attempt number) until it returns, tried again as this policy says."""
        if self.stop_event is not None:
            raise ValueError(f"retry policy for {self.what}: a stop may end it without a result; iterate it instead")
        for attempt in self:
            with attempt:
                return fn(attempt.number)
        raise AssertionError("unreachable: without a stop_event the policy returns or raises")


class _Run:
    """One use of a policy: when its first failure happened (a deadline counts from it)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.first_failure: float | None = None

    def retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(retry=tenacity.retry_if_exception(self.policy.retries), stop=self.stop,
                                 wait=self.wait, sleep=self.sleep, before_sleep=self.before_sleep,
                                 retry_error_callback=self.give_up)

    def elapsed(self) -> float:
        now = self.policy.clock()
        if self.first_failure is None:
            self.first_failure = now
        return now - self.first_failure

    def wait(self, state: tenacity.RetryCallState) -> float:
        policy = self.policy
        wait = policy.backoff_s(state.attempt_number)
        if policy.jitter:
            wait = _jitter.uniform(wait / 2, wait)
        if policy.deadline_s is not None:
            wait = min(wait, max(LAST_WAIT_S, policy.deadline_s - self.elapsed()))
        return wait

    def stop(self, state: tenacity.RetryCallState) -> bool:
        policy = self.policy
        if policy.attempts is not None and state.attempt_number >= policy.attempts:
            return True
        return policy.deadline_s is not None and self.elapsed() >= policy.deadline_s

    def sleep(self, seconds: float) -> None:
        if self.policy.stop_event is not None:
            self.policy.stop_event.wait(seconds)
        else:
            self.policy.sleep(seconds)

    def reason(self, exc: BaseException) -> str:
        if self.policy.conflicted(exc):
            return describe_error(exc)
        return transient_reason(exc) or describe_error(exc)

    def before_sleep(self, state: tenacity.RetryCallState) -> None:
        policy, exc = self.policy, _failure(state)
        retry = Retry(policy.what, state.attempt_number, self.reason(exc), state.upcoming_sleep, exc)
        if policy.kind == "transient":
            log.warning("%s: transient failure (%s); retry %d in %.1fs, %.0fs of the %gs deadline left",
                        policy.what, retry.reason, retry.attempt, retry.wait_s,
                        max(0.0, (policy.deadline_s or 0.0) - self.elapsed()), policy.deadline_s or 0.0)
        elif policy.conflicted(exc):
            log.warning("%s conflicted with another commit (attempt %d of %s); reloading and retrying in %.2fs: %s",
                        policy.what, retry.attempt, policy.attempts, retry.wait_s, retry.reason)
        else:
            log.warning("%s met a transient fault (attempt %d of %s); retrying in %.2fs: %s",
                        policy.what, retry.attempt, policy.attempts, retry.wait_s, retry.reason)
        if policy.on_retry is not None:
            policy.on_retry(retry)

    def give_up(self, state: tenacity.RetryCallState) -> NoReturn:
        policy, exc = self.policy, _failure(state)
        n = state.attempt_number
        if policy.kind == "transient":
            message = (f"{policy.what}: gave up after {n - 1} retries over {self.elapsed():.0f}s (a deadline of "
                       f"{policy.deadline_s:g}s from the first failure): {self.reason(exc)}. {policy.next_step}")
        else:
            met = "conflicted with another commit" + (" or met a transient fault" if policy.outages else "")
            message = (f"{policy.what} {met} in each of its {n} attempts (the last: {self.reason(exc)}). "
                       f"{policy.next_step}")
        raise policy.error(message) from exc


def _failure(state: tenacity.RetryCallState) -> BaseException:
    exc = state.outcome.exception() if state.outcome is not None else None
    if exc is None:  # pragma: no cover - the policies retry on exceptions only
        raise AssertionError("a retry without a failure")
    return exc


def commit_conflicts(what: str, *, attempts: int, error: Callable[[str], BaseException] = errors.CommitError,
                     next_step: str = CONFLICT_NEXT_STEP, first_wait_s: float = 0.1, max_wait_s: float = 2.0,
                     conflict: Callable[[BaseException], bool] = is_conflict, outages: bool = False,
                     sleep: Callable[[float], object] = time.sleep) -> Policy:
    """A commit that another commit may beat to the catalog's compare-and-set, tried `attempts` times in all
    (the body reloads the table on every attempt after the first), waiting a jittered, doubling backoff from
    `first_wait_s` (0: none) up to `max_wait_s` in between. `conflict` says what a conflict is (`is_conflict`:
    pyiceberg's CommitFailedException; `is_conflict_in_chain` for commits made through Spark); `outages` also
    retries transient faults (`transient_reason`) within the same attempts. Once they run out: `error` naming
    `what` conflicted, the last reason and `next_step`."""
    return Policy("conflict", what, error, next_step, conflict=conflict, outages=outages, attempts=attempts,
                  first_wait_s=first_wait_s, max_wait_s=max(first_wait_s, max_wait_s), jitter=True, sleep=sleep)


def transient(what: str, *, deadline_s: float, next_step: str,
              error: Callable[[str], BaseException] = errors.OutageError, first_wait_s: float = 1.0,
              max_wait_s: float = 30.0, on_retry: Callable[[Retry], None] | None = None,
              stop_event: threading.Event | None = None, sleep: Callable[[float], object] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> Policy:
    """Work an outage may interrupt (a catalog, object store, schema registry or broker that does not answer:
    `transient_reason`), tried again until `deadline_s` have passed since its first failure, waiting
    `first_wait_s` doubled per retry up to `max_wait_s` (never past the deadline, but at least LAST_WAIT_S).
    `on_retry` sees each retry before its wait; a `stop_event` set during a wait ends the iteration. Once the
    deadline has passed: `error` naming `what`, the retries, the last reason and `next_step`."""
    return Policy("transient", what, error, next_step, deadline_s=deadline_s, first_wait_s=first_wait_s,
                  max_wait_s=max(first_wait_s, max_wait_s), on_retry=on_retry,
                  stop_event=stop_event, sleep=sleep, clock=clock)
