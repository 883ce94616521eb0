"""The retention guard: when the oldest record not yet ingested nears the topic's retention horizon it
raises the topic's retention.ms (never past the pipeline's cap), alerts, and restores the declared value
once the writer has caught up; a guard that cannot protect the records (no cap, cap reached, a broker
refusing the change) alerts naming why.

The end-to-end tests run on the embedded Apache Kafka. A stalled writer is records whose Kafka timestamps
are already old, produced and not ingested (the horizon is an hour away: retention deletes none of them).
The refusal is the broker's own: the guard runs as a SCRAM user whose ACLs lack ALTER_CONFIGS on the topic.

The unit half; the end-to-end half is tests/e2e/test_retention_guard_e2e.py.
"""

from __future__ import annotations


import pytest
from confluent_kafka import KafkaError

from e2e import pipeline, run_cli, xcom  # noqa: F401 (fixture)
from lakehouse.core import config, errors
from lakehouse.core.spec import SpecError
from lakehouse.upkeep import retention
from lakehouse.upkeep.retention import GuardReport, GuardState, decide

HOUR_MS, MINUTE_MS = 3_600_000, 60_000


# ---------------------------------------------------------------------------- the decision, without I/O

def report(retention_ms: int | None = HOUR_MS, age_ms: int | None = 10 * MINUTE_MS, declared_ms: int = HOUR_MS,
           threshold_ms: int = 30 * MINUTE_MS, cap_ms: int | None = 3 * HOUR_MS) -> GuardReport:
    return GuardReport(pipeline="orders", topic="orders", retention_ms=retention_ms, declared_ms=declared_ms,
                       threshold_ms=threshold_ms, max_retention_ms=cap_ms, oldest_age_ms=age_ms)


@pytest.fixture
def spec(make_spec):
    return make_spec(retention_ms=HOUR_MS, slo={"lag_seconds": "60s"})


def test_a_writer_far_from_the_horizon_is_left_alone(spec):
    done = decide(spec, report(age_ms=29 * MINUTE_MS), GuardState())
    assert (done.action, done.status, done.new_retention_ms, done.recorded) == ("none", "ok", None, False)


def test_within_the_threshold_retention_is_raised_a_full_declared_retention_past_the_oldest_record(spec):
    done = decide(spec, report(age_ms=40 * MINUTE_MS + 1), GuardState())
    assert (done.action, done.status) == ("raised", "warn")
    assert done.new_retention_ms == 101 * MINUTE_MS  # 40 min + 1 ms + 1 h, in whole minutes
    assert done.state == GuardState(raised=True, declared_ms=HOUR_MS, set_ms=101 * MINUTE_MS)
    assert "once the writer" in done.message and done.recorded


def test_the_raise_stops_at_the_cap_and_an_exhausted_cap_or_no_cap_is_a_failed_alert(spec):
    assert decide(spec, report(age_ms=150 * MINUTE_MS, retention_ms=2 * HOUR_MS), GuardState()).new_retention_ms \
        == 3 * HOUR_MS
    capped = decide(spec, report(age_ms=160 * MINUTE_MS, retention_ms=3 * HOUR_MS),
                    GuardState(True, HOUR_MS, 3 * HOUR_MS))
    assert (capped.action, capped.status, capped.new_retention_ms) == ("at-risk", "failed", None)
    assert "above retention.max_retention" in capped.message
    uncapped = decide(spec, report(age_ms=45 * MINUTE_MS, cap_ms=None), GuardState())
    assert (uncapped.action, uncapped.status) == ("at-risk", "failed")
    assert "retention.max_retention is not set" in uncapped.message
    with pytest.raises(errors.RetentionAtRiskError, match="only alerts"):
        uncapped.raise_for_status()


def test_the_declared_retention_comes_back_once_the_writer_has_caught_up(spec):
    raised = GuardState(True, HOUR_MS, 101 * MINUTE_MS)
    behind = decide(spec, report(retention_ms=101 * MINUTE_MS, age_ms=5 * MINUTE_MS), raised)
    assert (behind.action, behind.status, behind.state) == ("none", "warn", raised)  # not caught up: stays raised
    caught_up = decide(spec, report(retention_ms=101 * MINUTE_MS, age_ms=20_000), raised)
    assert (caught_up.action, caught_up.status, caught_up.new_retention_ms) == ("restored", "ok", HOUR_MS)
    assert caught_up.state == GuardState()


def test_a_retention_someone_else_changed_meanwhile_is_left_to_them(spec):
    done = decide(spec, report(retention_ms=5 * HOUR_MS, age_ms=0), GuardState(True, HOUR_MS, 101 * MINUTE_MS))
    assert (done.action, done.new_retention_ms, done.state) == ("released", None, GuardState())
    assert "someone changed it" in done.message


@pytest.mark.parametrize(("retention_ms", "age_ms", "status", "says"), [
    (-1, 10 ** 9, "ok", "forever"),
    (None, 0, "warn", "reports no retention.ms"),
    (HOUR_MS, None, "warn", "could not be read"),
])
def test_what_the_guard_cannot_measure_it_does_not_touch(spec, retention_ms, age_ms, status, says):
    done = decide(spec, report(retention_ms=retention_ms, age_ms=age_ms), GuardState())
    assert (done.action, done.status, done.new_retention_ms) == ("none", status, None)
    assert says in done.message


def test_the_guard_state_is_read_back_from_its_newest_event():
    assert GuardState.of(None) == GuardState()
    event = {"details": {"guard_state": {"raised": True, "declared_ms": HOUR_MS, "set_ms": 2 * HOUR_MS}}}
    assert GuardState.of(event) == GuardState(True, HOUR_MS, 2 * HOUR_MS)


def test_an_authorization_refusal_names_the_missing_permission():
    platform = config.load()
    refused = retention.refusal(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed"),
                                "orders", 2 * HOUR_MS, platform)
    assert isinstance(refused, errors.RetentionChangeRefusedError)
    assert refused.missing_permission == "ALTER_CONFIGS on topic orders"
    assert "--operation AlterConfigs --topic orders" in str(refused)
    other = retention.refusal(KafkaError(KafkaError.REQUEST_TIMED_OUT, "timed out"), "orders", HOUR_MS, platform)
    assert isinstance(other, errors.TopicError) and "timed out" in str(other)


def test_the_spec_declares_the_threshold_as_a_share_or_a_duration_and_the_cap(make_spec):
    shared = make_spec(retention={"guard_threshold": "25%", "max_retention": "14d"})
    assert shared.retention.guard_threshold_ms(HOUR_MS) == 15 * MINUTE_MS
    assert shared.retention.max_retention_ms == 14 * 86400 * 1000
    assert make_spec(retention={"guard_threshold": "6h"}).retention.guard_threshold_ms(7 * 24 * HOUR_MS) == 6 * HOUR_MS
    assert make_spec().retention.guard_threshold_ms(HOUR_MS) == HOUR_MS // 2  # default: half the declared


@pytest.mark.parametrize(("retention", "why"), [
    ({"guard_threshold": "100%"}, "below 100%"),
    ({"guard_threshold": "8d"}, "not shorter than source.retention_ms"),  # orders.yaml declares 7 days
    ({"guard_threshold": "soon"}, "is not a duration"),
    ({"max_retention": "1d"}, "below source.retention_ms"),
])
def test_a_guard_setting_that_cannot_work_is_refused_naming_the_field(make_spec, retention, why):
    with pytest.raises(SpecError, match=why) as refused:
        make_spec(retention=retention)
    assert refused.value.field.startswith("retention.")


# ---------------------------------------------------------------------------- on the broker


