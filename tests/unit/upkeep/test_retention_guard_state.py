"""The retention guard reads its own state back from its newest `retention_guard` event. An event that
says the guard raised the retention but not what from (a timeline written by hand, or truncated) leaves
the guard without the retention it must keep: it warns and names what to set, and touches nothing
(found by the type check: the guard compared ages with that unknown retention and failed with a
TypeError). Pure decisions: no broker, no catalog."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.upkeep.retention import GuardReport, GuardState, decide

HOUR_MS, MINUTE_MS = 3_600_000, 60_000


@pytest.fixture
def spec(make_spec):
    return make_spec(slo={"lag_seconds": "60s"})  # decided on, never changed: one per test is enough


def _report(retention_ms: int, age_ms: int) -> GuardReport:
    # no source.retention_ms: the guard's raise is what tells the retention to restore
    return GuardReport(pipeline="orders", topic="orders", retention_ms=retention_ms, declared_ms=None,
                       threshold_ms=None, max_retention_ms=3 * HOUR_MS, oldest_age_ms=age_ms)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(age_ms=st.integers(0, 10 * HOUR_MS), raised_to=st.integers(MINUTE_MS, 10 * HOUR_MS))
def test_a_raise_whose_event_lost_the_declared_retention_warns_and_changes_nothing(spec, age_ms, raised_to):
    state = GuardState.of({"details": {"guard_state": {"raised": True, "set_ms": raised_to}}})
    assert state == GuardState(True, None, raised_to)
    done = decide(spec, _report(retention_ms=raised_to, age_ms=age_ms), state)
    assert (done.action, done.status, done.new_retention_ms) == ("none", "warn", None)
    assert "the retention to keep is unknown" in done.message and "set source.retention_ms" in done.message
    assert done.state == state  # still raised: a later run that knows the retention can restore it


def test_a_known_retention_is_still_guarded_as_before(spec):
    report = GuardReport(pipeline="orders", topic="orders", retention_ms=HOUR_MS, declared_ms=HOUR_MS,
                         threshold_ms=30 * MINUTE_MS, max_retention_ms=3 * HOUR_MS, oldest_age_ms=40 * MINUTE_MS)
    done = decide(spec, report, GuardState())
    assert (done.action, done.status, done.new_retention_ms) == ("raised", "warn", 100 * MINUTE_MS)
