"""The tests' one way to wait for something: poll a condition until it holds, or fail saying what was awaited.

    wait_until(predicate, timeout, what, interval=0.5) -> predicate()'s first truthy value
    while_running(process, predicate)                 -> predicate that first fails if `process` exited

No dependencies beyond the standard library: conftest, the end-to-end helpers, unit tests and the worker
processes some tests start (`python tests/e2e/test_postgres.py ...`) all import it.
"""

from __future__ import annotations

import subprocess
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str],
               interval: float = 0.5) -> T:
    """predicate()'s first truthy value, asked every `interval` seconds for up to `timeout` seconds.

    The predicate is asked once more after the deadline, so a wait never fails without a last look.
    Raises AssertionError naming `what` (a string, or a callable giving one when the wait fails, for
    state the predicate gathered) and the last value the predicate returned. An exception the predicate
    raises ends the wait at once: that is how a predicate fails early, e.g. when the process whose
    progress it polls has exited (`while_running`). `timeout` bounds the wait, never the outcome.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {described}; "
                                 f"last value seen: {repr(value)[:2000]}")
        time.sleep(interval)


def while_running(process: subprocess.Popen, predicate: Callable[[], T]) -> Callable[[], T]:
    """`predicate`, asked only while `process` runs: once it has exited, the wait fails with its exit
    code and the end of its stderr (when that is a pipe) instead of waiting out the timeout."""

    def check() -> T:
        code = process.poll()
        if code is not None:
            _, err = process.communicate()
            raise AssertionError(f"process {process.pid} exited with code {code} while it was waited on:\n"
                                 f"{(err or '')[-3000:]}")
        return predicate()

    return check
