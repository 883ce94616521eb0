"""A batch written in steps (`trigger.write_interval`): each step plans from where the batch's plan ends, and the
steps' plans and writes join into the one batch that is committed. The loop itself runs against Kafka and Spark
in tests/e2e/test_write_steps_e2e.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core.errors import SpecError
from lakehouse.core.offsets import OffsetRange, TableProgress
from lakehouse.ingest.batch_state import Written
from lakehouse.ingest.plan import BatchPlan, PartitionState, TopicState, plan_batch
from lakehouse.ingest.taskwriter import TaskResult


def state(ends: dict[int, int], earliest: int = 0) -> TopicState:
    return TopicState("t", None, {p: PartitionState(p, earliest, end) for p, end in ends.items()})


def stand(**positions: int) -> TableProgress:
    return TableProgress("raw.t", True, positions={int(p[1:]): o for p, o in positions.items()})


# a log's growth: per step, how many records each of three partitions gained
growth = st.lists(st.tuples(*(st.integers(0, 50),) * 3), min_size=1, max_size=6)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # the spec is only read
@given(steps=growth, cap=st.integers(1, 400))
def test_steps_planned_one_after_another_join_into_the_plan_one_step_would_make(steps, cap, make_spec):
    """Each step plans from where the joined plan ends, within what is left of the record budget; the steps
    joined cover, per partition, one contiguous range from the tables' position, never more than the budget,
    and a step after the log stopped growing plans nothing new."""
    spec, progress = make_spec(), [stand(p0=10, p1=0, p2=5)]
    ends = {0: 10, 1: 0, 2: 5}
    joined = None
    for gained in steps:
        left = cap - (joined.record_count if joined else 0)
        if left <= 0:
            break
        ends = {p: ends[p] + n for p, n in zip(sorted(ends), gained, strict=True)}
        step = plan_batch(spec, state(ends), progress, left, after=joined)
        joined = step if joined is None else joined.followed_by(step)
    assert joined is not None
    starts = {0: 10, 1: 0, 2: 5}
    for r in joined.ranges:
        assert r.start == starts[r.partition] and r.end <= ends[r.partition]
    assert joined.record_count == min(cap, sum(ends[p] - starts[p] for p in ends))
    assert joined.ends == ends


def test_a_step_that_does_not_follow_the_plan_is_refused():
    first = BatchPlan("t", None, (OffsetRange("t", 0, 0, 10),), {0: 10})
    later = BatchPlan("t", None, (OffsetRange("t", 0, 12, 20), OffsetRange("t", 1, 0, 5)), {0: 20, 1: 5})
    with pytest.raises(ValueError, match=r"partition 0: \[12, 20\) does not follow \[0, 10\)"):
        first.followed_by(later)
    fine = BatchPlan("t", None, (OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 0, 5)), {0: 20, 1: 5})
    assert first.followed_by(fine).range_map() == {0: (0, 20), 1: (0, 5)}


def test_a_step_reads_partitions_the_plan_has_not_reached_yet_from_the_tables(make_spec):
    """A partition without records in the earlier steps starts where the tables stand, and one aged out since is
    a gap, refused as a batch planned from the tables would."""
    first = plan_batch(make_spec(), state({0: 30, 1: 7}), [stand(p0=20, p1=7)], 100)
    assert first.range_map() == {0: (20, 30)}
    step = plan_batch(make_spec(), state({0: 35, 1: 9}), [stand(p0=20, p1=7)], 100, after=first)
    assert step.range_map() == {0: (30, 35), 1: (7, 9)}
    gapped = plan_batch(make_spec(), state({0: 40, 1: 20}, earliest=8), [stand(p0=20, p1=7)], 100, after=first,
                        accept_gap=True)
    assert gapped.gaps == {1: (7, 8)}


results = st.builds(
    TaskResult, rows=st.dictionaries(st.sampled_from(["raw.a", "raw.b"]), st.integers(0, 1000), max_size=2),
    files=st.dictionaries(st.sampled_from(["raw.a", "raw.b"]), st.lists(st.integers(), max_size=3), max_size=2),
    dead_letters=st.integers(0, 100), max_event_us=st.none() | st.integers(0, 10 ** 15),
    min_kafka_us=st.none() | st.integers(0, 10 ** 15), read_s=st.floats(0, 10), decode_s=st.floats(0, 10),
    write_s=st.floats(0, 10))


@given(st.lists(results, max_size=4), st.lists(results, max_size=4))
def test_two_steps_written_are_what_one_write_of_all_their_tasks_is(first, second):
    together = Written.of(first, 0.0, 1.0).plus(Written.of(second, 1.0, 3.0))
    once = Written.of(first + second, 0.0, 3.0)
    def present(by_table: dict) -> dict:
        return {t: sorted(v) if isinstance(v, list) else v for t, v in by_table.items() if v}

    assert present(together.files) == present(once.files) and present(together.rows) == present(once.rows)
    assert (together.dead_letters, together.max_event_us, together.min_kafka_us, together.tasks) == \
        (once.dead_letters, once.max_event_us, once.min_kafka_us, once.tasks)
    assert together.seconds == pytest.approx(once.seconds)
    assert together.decode_s == pytest.approx(once.decode_s)


def test_the_write_interval_is_read_and_checked(make_spec):
    spec = make_spec(trigger={"interval": "10s", "write_interval": "1s"})
    assert (spec.trigger.interval_s, spec.trigger.write_interval_s) == (10.0, 1.0)
    assert make_spec().trigger.write_interval_s is None
    with pytest.raises(SpecError, match=r"trigger\.write_interval.*20s is longer than trigger.interval \(10s\)"):
        make_spec(trigger={"interval": "10s", "write_interval": "20s"})
    with pytest.raises(SpecError, match=r"trigger\.write_interval.*applies to append pipelines; target.mode upsert"):
        make_spec(trigger={"interval": "10s", "write_interval": "1s"}, mode="upsert", table_key=["order_id"])
    with pytest.raises(SpecError, match=r"trigger\.write_interval"):
        make_spec(trigger={"interval": "10s", "write_interval": "0s"})
