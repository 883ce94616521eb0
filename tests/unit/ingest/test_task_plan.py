"""How a batch is cut into Spark tasks, and what a task leaves out: no Spark, no broker.

Properties over arbitrary plans: every planned offset is in exactly one task, no more tasks
than slots, every slot's share of a large batch even, quiet partitions packed together, a tiny
batch is one task; a task's rows below a table's held positions are left out, whatever the
partitions.
"""

import pyarrow as pa
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lakehouse.core.offsets import OffsetRange
from lakehouse.ingest.batch_state import Written
from lakehouse.ingest.layout import KAFKA_STRUCT
from lakehouse.ingest.plan import task_groups
from lakehouse.ingest.taskwriter import TaskResult, below_held

ranges = st.dictionaries(st.integers(0, 2_000), st.tuples(st.integers(0, 10**6), st.integers(0, 300_000)),
                         max_size=60).map(lambda found: [OffsetRange("t", p, s, s + n) for p, (s, n) in found.items()])


def covered(pieces) -> dict[int, list[tuple[int, int]]]:
    """Per partition, its pieces' [start, end) merged where they touch."""
    out: dict[int, list[tuple[int, int]]] = {}
    for r in sorted(pieces, key=lambda r: (r.partition, r.start)):
        spans = out.setdefault(r.partition, [])
        assert not spans or r.start >= spans[-1][1], f"{r} overlaps another piece"
        if spans and spans[-1][1] == r.start:
            spans[-1] = (spans[-1][0], r.end)
        else:
            spans.append((r.start, r.end))
    return out


@settings(deadline=None)
@given(ranges, st.integers(1, 16))
def test_every_planned_offset_is_in_exactly_one_task_and_no_more_tasks_than_slots(plan, slots):
    groups = task_groups(plan, slots)
    assert len(groups) <= slots
    assert all(r.count > 0 for g in groups for r in g), "a task never gets an empty range"
    assert covered(r for g in groups for r in g) == {r.partition: [(r.start, r.end)] for r in plan if r.count}


@settings(deadline=None)
@given(ranges, st.integers(2, 16))
def test_large_batches_keep_every_slot_busy_and_balanced(plan, slots):
    assume(sum(r.count for r in plan) >= 10_000 * slots)
    groups = task_groups(plan, slots)
    assert len(groups) == slots
    loads = [sum(r.count for r in g) for g in groups]
    assert max(loads) - min(loads) <= 1  # even shares, whatever the partitions' sizes


@settings(deadline=None)
@given(ranges, st.integers(1, 16))
def test_a_partition_is_cut_at_most_where_a_task_ends_and_a_task_reads_partitions_in_order(plan, slots):
    groups = task_groups(plan, slots)
    pieces = sum(len(g) for g in groups)
    assert pieces <= sum(1 for r in plan if r.count) + max(0, len(groups) - 1)  # a piece more per boundary at most
    for g in groups:
        assert [(r.partition, r.start) for r in g] == sorted((r.partition, r.start) for r in g)


def test_three_partitions_on_two_slots_make_two_tasks_of_one_and_a_half_partitions():
    plan = [OffsetRange("t", p, 0, 33_334 if p == 0 else 33_333) for p in range(3)]
    assert task_groups(plan, 2) == [[OffsetRange("t", 0, 0, 33_334), OffsetRange("t", 1, 0, 16_666)],
                                    [OffsetRange("t", 1, 16_666, 33_333), OffsetRange("t", 2, 0, 33_333)]]


def test_a_thousand_quiet_partitions_make_as_many_tasks_as_slots_not_a_thousand():
    plan = [OffsetRange("t", p, 100, 120) for p in range(1_000)]
    assert len(task_groups(plan, 4)) == 2  # 20,000 records: two tasks of at least 10,000
    assert len(task_groups([OffsetRange("t", p, 0, 3) for p in range(3)], 4)) == 1  # a tiny batch: one task


def kafka_rows(coordinates):
    return pa.table({"_kafka": pa.array([{"topic": "t", "partition": p, "offset": o, "timestamp": None, "key": None}
                                         for p, o in coordinates], KAFKA_STRUCT)})


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), max_size=300),
       st.dictionaries(st.integers(0, 60), st.integers(0, 250), max_size=20))
def test_a_task_leaves_out_exactly_the_offsets_a_table_already_holds(coordinates, held):
    kept = below_held(kafka_rows(coordinates), held).column("_kafka").to_pylist()
    assert [(k["partition"], k["offset"]) for k in kept] == \
        [(p, o) for p, o in coordinates if o >= held.get(p, 0)]


def test_the_batch_numbers_add_up_over_the_tasks():
    results = [TaskResult(files={"raw.t": ["f1"]}, rows={"raw.t": 5}, dead_letters=1, max_event_us=10,
                          min_kafka_us=7, read_s=1.0, started=100.5, ended=101.5),
               TaskResult(files={"raw.t": ["f2"], "raw.t_dlq": ["d1"]}, rows={"raw.t": 3}, dead_letters=2,
                          max_event_us=30, min_kafka_us=4, read_s=0.5, started=100.7, ended=101.9),
               TaskResult(started=100.6, ended=100.6)]  # a task whose ranges held no records
    written = Written.of(results, started=100.0, ended=102.0)
    assert written.files == {"raw.t": ["f1", "f2"], "raw.t_dlq": ["d1"]}
    assert (written.rows, written.dead_letters, written.max_event_us, written.min_kafka_us) == \
        ({"raw.t": 8}, 3, 30, 4)
    assert written.tasks == 3 and written.read_s == 1.5
    assert round(written.launch_s, 3) == 0.5 and round(written.tail_s, 3) == 0.1 and round(written.busy_s, 3) == 2.2
