"""The tests' one polling helper (tests/support/polling.py): what it returns, how it fails, how it ends early."""

import subprocess
import sys

import pytest
from polling import wait_until, while_running


def test_the_first_truthy_value_is_returned_and_nothing_is_asked_after_it():
    answers = iter([None, 0, [], {"rows": 3}, "never asked"])
    asked = []

    def predicate():
        asked.append(True)
        return next(answers)

    assert wait_until(predicate, 5, "three rows", interval=0) == {"rows": 3}
    assert len(asked) == 4


def test_a_timeout_names_what_was_awaited_and_the_last_value_seen():
    with pytest.raises(AssertionError, match=r"timed out after 0.2s waiting for the first batch; "
                                             r"last value seen: \[\]"):
        wait_until(lambda: [], 0.2, "the first batch", interval=0.05)


def test_the_predicate_is_asked_once_more_after_the_deadline():
    asked = []
    with pytest.raises(AssertionError):
        wait_until(lambda: asked.append(True), 0, "nothing", interval=0)
    assert len(asked) == 1  # a zero timeout still looks once


def test_what_can_describe_state_the_predicate_gathered_when_the_wait_fails():
    pending = {0, 1}

    def read():
        pending.discard(0)
        return not pending

    with pytest.raises(AssertionError, match=r"EOF from partitions \[1\]"):
        wait_until(read, 0.1, lambda: f"EOF from partitions {sorted(pending)}", interval=0.05)


def test_an_exception_of_the_predicate_ends_the_wait_at_once():
    def broken():
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        wait_until(broken, 60, "never")


def test_while_running_fails_with_the_exit_code_and_stderr_of_a_process_that_ended():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('broker unreachable'); sys.exit(3)"],
                            stderr=subprocess.PIPE, text=True)
    proc.wait(timeout=60)
    with pytest.raises(AssertionError, match=r"(?s)exited with code 3 while it was waited on.*broker unreachable"):
        wait_until(while_running(proc, lambda: False), 60, "the first batch")


def test_while_running_asks_the_predicate_while_the_process_runs():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_until(while_running(proc, lambda: "committed"), 5, "a commit") == "committed"
    finally:
        proc.kill()
        proc.wait()
