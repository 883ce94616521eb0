"""A reader task reads all of its offset ranges with one consumer assignment, exactly once.

A task of the batch (lakehouse.ingest.plan.task_groups) holds many small ranges when the topic has
many quiet partitions, and several pieces of one partition when a large one is split. The task
assigns every partition at once and routes each record to its range; these tests hold it to what
reading the ranges one after another guaranteed, on the embedded Apache Kafka broker:

- every record of every range comes out once (a table row or a dead letter), no record outside
  them, a partition's rows in offset order, batches of at most `batch_rows` rows, whatever the
  layout of the ranges (pieces of one partition contiguous or not, in any order, empty ones);
- on a transactional topic, ranges that end on transaction markers or aborted records complete
  without waiting for records that never come;
- a range whose records were deleted (retention) fails the task with OffsetGapError naming it,
  and the same ranges planned again from the log's new start read every record once;
- a partition whose planned records do not come stalls the task with BrokerStalledError naming
  that partition and offset, after every record of the other partitions came out;
- the fault points fire where they did: before any read, and half way through a range;
- reading 300 tiny ranges together costs a fraction of reading them one after another;
- and a task's consumer fetches little beyond its ranges (librdkafka's prefetch, bounded).

The end-to-end half; the unit half is tests/unit/ingest/test_task_reads.py.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core import config, errors
from lakehouse.core.errors import BrokerStalledError, OffsetGapError, RecordFailureError
from lakehouse.core.offsets import OffsetRange
from lakehouse.ingest.plan import topic_state
from lakehouse.ingest.reader import BatchBuilder, StageClock, read_range, read_ranges, reader_consumer
from lakehouse.ingest.validator import RecordValidator
from tests.conftest import consume_everything
from tests.unit.ingest.test_task_reads import (  # noqa: F401 - fixtures among them
    INGESTED_AT,
    SPEC,
)

LAYOUTS = settings(max_examples=25, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def order(partition: int, i: int) -> tuple[bytes, bytes]:
    """A valid order, or (one in seven) a value that is not JSON: a dead letter."""
    key = f"p{partition}-{i}".encode()
    if i % 7 == 3:
        return key, b"{not json"
    return key, json.dumps({"order_id": key.decode(), "customer_id": "c-1", "amount": 1.0 + i, "currency": "EUR",
                            "status": "created", "event_time": "2026-11-26T10:00:00+00:00"}).encode()


def create_topic(platform: config.PlatformConfig, partitions: int) -> str:
    topic = f"task-reads-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(platform.kafka())
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    return topic


def send(platform: config.PlatformConfig, topic: str, counts: dict[int, int]) -> None:
    """`counts[p]` orders to partition p, acknowledged."""
    producer = Producer(platform.kafka(**{"linger.ms": 5}))
    for p, n in counts.items():
        for i in range(n):
            key, value = order(p, i)
            while True:
                try:
                    producer.produce(topic, key=key, value=value, partition=p)
                    break
                except BufferError:  # the local queue is full: deliver some first
                    producer.poll(0.1)
    assert producer.flush(60) == 0


@dataclass(frozen=True)
class Topic:
    """A topic written for these tests: its log end per partition and the records a reader is given."""

    name: str
    ends: dict[int, int]
    records: dict[tuple[int, int], tuple[bytes, bytes]]  # (partition, offset) -> (key, value), delivered only


def described(platform: config.PlatformConfig, topic: str) -> Topic:
    state = topic_state(platform.kafka(), topic)
    messages = consume_everything(topic, platform)
    return Topic(topic, {p: ps.end for p, ps in state.partitions.items()},
                 {(m.partition(), m.offset()): (m.key(), m.value()) for m in messages})


@pytest.fixture(scope="module")
def plain_topic(stack) -> Topic:
    """16 partitions holding 0 to 40 orders each (one in seven not JSON)."""
    platform = config.load()
    topic = create_topic(platform, 16)
    send(platform, topic, {p: (p * 11) % 41 for p in range(16)})
    return described(platform, topic)


@pytest.fixture(scope="module")
def transactional_topic(stack) -> Topic:
    """8 partitions written by 30 transactions of 1 to 3 orders to each of 1 to 4 partitions, every third one
    aborted: the logs hold commit and abort markers and aborted records, offsets that deliver nothing."""
    platform = config.load()
    topic = create_topic(platform, 8)
    producer = Producer(platform.kafka(**{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(60)
    rng, sent = random.Random(26), dict.fromkeys(range(8), 0)
    for t in range(30):
        producer.begin_transaction()
        for p in rng.sample(range(8), rng.randint(1, 4)):
            for _ in range(rng.randint(1, 3)):
                key, value = order(p, sent[p])
                producer.produce(topic, key=key, value=value, partition=p)
                sent[p] += 1
        producer.flush(30)
        if t % 3 == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    found = described(platform, topic)
    undelivered = sum(found.ends.values()) - len(found.records)
    assert undelivered >= 30, "every transaction leaves at least its marker"
    return found


def read_task(ranges: list[OffsetRange], batch_rows: int = 10_000, stall_timeout: float = 20.0, fault=None,
              poisoned=None, clock: StageClock | None = None) -> list[pa.RecordBatch]:
    """What one reader task makes of `ranges`: its consumer, as make_task_writer opens it."""
    builder = BatchBuilder(SPEC, RecordValidator(SPEC), INGESTED_AT)
    with reader_consumer(config.load().kafka(), SPEC.name) as (consumer, watch):
        return list(read_ranges(consumer, ranges, builder, batch_rows, stall_timeout, fault, clock, watch=watch,
                                poisoned=poisoned))


def coordinates(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    if not batches:
        return []
    kafka = pa.Table.from_batches(batches).column("_kafka").to_pylist()
    return [(k["partition"], k["offset"]) for k in kafka]


@st.composite
def layouts(draw, ends: dict[int, int]) -> list[OffsetRange]:
    """Some pieces of some partitions' logs, in any order: each partition's log cut at random offsets
    and a random choice of its pieces kept (contiguous or with pieces left out between them)."""
    pieces = []
    for p, end in ends.items():
        cuts = sorted(draw(st.sets(st.integers(0, end), max_size=4)) | {0, end})
        for start, stop in itertools.pairwise(cuts):
            if draw(st.booleans()):
                pieces.append(OffsetRange("", p, start, stop))
    if draw(st.booleans()):  # an empty range of a partition, as a plan may hold
        pieces.append(OffsetRange("", draw(st.sampled_from(sorted(ends))), 0, 0))
    return draw(st.permutations(pieces))


def assert_exactly(batches: list[pa.RecordBatch], topic: Topic, ranges: list[OffsetRange], batch_rows: int,
                   poisoned: dict[tuple[int, int], str]) -> None:
    """The batches hold every delivered record of `ranges` once, in offset order per partition, as what it is."""
    assert all(0 < b.num_rows <= batch_rows for b in batches)
    got = coordinates(batches)
    expected = sorted((p, o) for (p, o) in topic.records
                      if any(r.partition == p and r.start <= o < r.end for r in ranges))
    assert sorted(got) == expected and len(set(got)) == len(got)
    for p in {p for p, _ in got}:
        offsets = [o for q, o in got if q == p]
        assert offsets == sorted(offsets), f"partition {p}'s rows out of offset order"
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    for row in rows:
        where = (row["_kafka"]["partition"], row["_kafka"]["offset"])
        key, value = topic.records[where]
        assert row["_kafka"]["key"] == key.decode() and row["_kafka"]["topic"] == topic.name
        if where in poisoned:
            assert (row["_dlq_error_kind"], row["_dlq_error_detail"], row["_dlq_value"]) == \
                ("reader_failure", poisoned[where], value)
        elif value.startswith(b"{not"):
            assert row["_dlq_error_kind"] == "malformed_json" and row["_dlq_value"] == value
        else:
            assert row["_dlq_error_kind"] is None and row["order_id"] == key.decode()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["plain_topic", "transactional_topic"])
def test_every_record_of_a_tasks_ranges_comes_out_once_whatever_their_layout(which, request):
    topic: Topic = request.getfixturevalue(which)

    @LAYOUTS
    @given(data=st.data())
    def check(data):
        pieces = data.draw(layouts(topic.ends), label="ranges")
        ranges = [OffsetRange(topic.name, r.partition, r.start, r.end) for r in pieces]
        inside = sorted(c for c in topic.records if any(r.partition == c[0] and r.start <= c[1] < r.end
                                                        for r in ranges))
        poisoned = {c: f"the reader failed on this record: boom at {c}"
                    for c in data.draw(st.sets(st.sampled_from(inside), max_size=3) if inside else st.just(set()),
                                       label="poisoned")}
        batch_rows = data.draw(st.integers(1, 60), label="batch_rows")
        started = time.monotonic()
        batches = read_task(ranges, batch_rows=batch_rows, poisoned=poisoned)
        assert time.monotonic() - started < 10  # no wait for records that never come (markers, aborted ones)
        assert_exactly(batches, topic, ranges, batch_rows, poisoned)

    check()


def undelivered_offsets(topic: Topic, partition: int) -> list[int]:
    return [o for o in range(topic.ends[partition]) if (partition, o) not in topic.records]


@pytest.mark.slow
def test_ranges_ending_on_transaction_markers_and_aborted_records_complete_at_once(transactional_topic):
    topic = transactional_topic
    ranges = []
    for p, end in topic.ends.items():  # a range ends just past each offset that delivers nothing, and at the log end
        cuts = sorted({0, end, *(o + 1 for o in undelivered_offsets(topic, p))})
        ranges += [OffsetRange(topic.name, p, a, b) for a, b in itertools.pairwise(cuts)]
    assert sum(1 for p in topic.ends for _ in undelivered_offsets(topic, p)) >= 30
    clock = StageClock()
    started = time.monotonic()
    batches = read_task(ranges, batch_rows=25, stall_timeout=30.0, clock=clock)
    elapsed = time.monotonic() - started
    assert_exactly(batches, topic, ranges, 25, {})
    assert len(coordinates(batches)) == len(topic.records)
    assert elapsed < 5, f"{len(ranges)} ranges ending on markers took {elapsed:.1f}s: it waited for them"
    assert 0 < clock.read_s <= elapsed and clock.decode_s > 0


@pytest.mark.slow
def test_a_range_whose_records_were_deleted_fails_the_task_naming_it_and_a_replanned_read_is_exact(stack):
    platform = config.load()
    name = create_topic(platform, 6)
    send(platform, name, dict.fromkeys(range(6), 12))
    admin = AdminClient(platform.kafka())  # what retention does to partition 4: its log now starts at 5
    admin.delete_records([TopicPartition(name, 4, 5)])[TopicPartition(name, 4, 5)].result(30)
    ranges = [OffsetRange(name, p, 0, 12) for p in range(6)]

    with pytest.raises(OffsetGapError) as info:
        read_task(ranges)
    assert f"{name}[4]@[0,12): offset 0 was deleted from Kafka while the batch was being read" in str(info.value)
    assert "rerun to plan again" in str(info.value)

    replanned = [OffsetRange(name, p, 5 if p == 4 else 0, 12) for p in range(6)]  # the planner starts at 5
    topic = described(platform, name)
    assert_exactly(read_task(replanned, batch_rows=7), topic, replanned, 7, {})
    assert len(coordinates(read_task(replanned))) == 5 * 12 + 7


@pytest.mark.slow
def test_a_partition_whose_planned_records_never_come_stalls_the_task_naming_it(stack):
    platform = config.load()
    name = create_topic(platform, 8)
    send(platform, name, dict.fromkeys(range(8), 6))
    # partition 5 is planned to 9, its log holds 6: records 6-8 never come (a broker that stopped answering)
    ranges = [OffsetRange(name, p, 0, 9 if p == 5 else 6) for p in range(8)]
    builder = BatchBuilder(SPEC, RecordValidator(SPEC), INGESTED_AT)
    came: list[pa.RecordBatch] = []
    started = time.monotonic()
    with reader_consumer(platform.kafka(), SPEC.name) as (consumer, watch), pytest.raises(BrokerStalledError) as info:
        for batch in read_ranges(consumer, ranges, builder, 1, 2.0, watch=watch):
            came.append(batch)
    elapsed = time.monotonic() - started

    assert errors.marker_in(str(info.value)) == ("retryable", {"why": "broker-stalled", "topic": name,
                                                              "partition": "5", "offset": "6"})
    assert str(info.value).startswith(f"{name}[5]@[0,9): no records past offset 6 for 2s although they were planned")
    assert errors.transient_cause(RuntimeError(f"Python worker failed: {info.value}")) == "broker-stalled"
    assert sorted(coordinates(came)) == [(p, o) for p in range(8) for o in range(6)]  # the rest came, once
    assert 2.0 <= elapsed < 10


@pytest.mark.slow
def test_the_fault_points_fire_before_the_read_and_half_way_through_a_range(plain_topic):
    topic = plain_topic
    ranges = [OffsetRange(topic.name, p, 0, end) for p, end in topic.ends.items() if end >= 4]
    reached: list[str] = []

    def lose_the_task_at(point: str):
        def fault(site: str) -> None:
            reached.append(site)
            if site == point:
                raise RuntimeError(f"injected at {site}")
        return fault

    with pytest.raises(RecordFailureError, match="injected at task_failure") as info:
        read_task(ranges, fault=lose_the_task_at("task_failure"))
    first = ranges[0]
    assert errors.marker_in(str(info.value)) == ("record-failure", {"topic": topic.name,
                                                                    "partition": str(first.partition), "offset": "0"})
    assert reached == ["task_failure"]

    reached.clear()
    with pytest.raises(RecordFailureError, match="injected at during_read") as info:
        read_task(ranges, fault=lose_the_task_at("during_read"))
    assert reached == ["task_failure"] * len(ranges) + ["during_read"]  # once per range before reading
    where = errors.marker_in(str(info.value))[1]
    hit = next(r for r in ranges if r.partition == int(where["partition"]))
    assert int(where["offset"]) == hit.start + hit.count // 2  # the record half way through its range

    reached.clear()
    batches = read_task(ranges, fault=lambda site: reached.append(site))  # a fault hook that lets it pass
    assert reached.count("during_read") == len(ranges)  # every range's half-way record was reached once
    assert_exactly(batches, topic, ranges, 10_000, {})


@pytest.mark.slow
def test_reading_300_tiny_ranges_together_costs_a_fraction_of_reading_them_one_after_another(stack):
    platform = config.load()
    name = create_topic(platform, 300)
    send(platform, name, dict.fromkeys(range(300), 3))
    ranges = [OffsetRange(name, p, 0, 3) for p in range(300)]
    read_task(ranges)  # the topic's metadata and the broker warm

    started = time.monotonic()
    together = read_task(ranges)
    at_once = time.monotonic() - started

    builder = BatchBuilder(SPEC, RecordValidator(SPEC), INGESTED_AT)
    started = time.monotonic()
    with reader_consumer(platform.kafka(), SPEC.name) as (consumer, _watch):
        one_by_one = [b for r in ranges for b in read_range(consumer, r, builder, 10_000, 20.0)]
    in_turn = time.monotonic() - started

    assert sorted(coordinates(together)) == sorted(coordinates(one_by_one)) == \
        [(p, o) for p in range(300) for o in range(3)]
    assert at_once * 4 < in_turn, f"together {at_once:.2f}s, one after another {in_turn:.2f}s"


def test_a_task_fetches_little_beyond_its_ranges(stack):
    """librdkafka fetches ahead of a task, and what it brings from beyond the task's ranges the broker sends and
    the task parses for nothing: a task that reads 10,000 records of a partition holding 100,000 receives (the
    consumer's own count, librdkafka's `rxmsgs`) its queue's 10,000 messages more and a fetch or two of at most
    1 MB, where 10 MB fetches and librdkafka's default queue of 100,000 messages brought the whole partition."""
    platform = config.load()
    name = create_topic(platform, 1)
    send(platform, name, {0: 100_000})
    received: list[int] = []
    settings = platform.kafka(**{"statistics.interval.ms": 100,
                                 "stats_cb": lambda text: received.append(json.loads(text)["rxmsgs"])})
    builder = BatchBuilder(SPEC, RecordValidator(SPEC), INGESTED_AT)
    with reader_consumer(settings, SPEC.name) as (consumer, watch):
        batches = list(read_ranges(consumer, [OffsetRange(name, 0, 0, 10_000)], builder, 10_000, 20.0, watch=watch))
        # the task is done here (its consumer closes); paused, the partition is fetched no further, and polls
        # serve the statistics without taking records off the queue (which librdkafka would fill again)
        consumer.pause([TopicPartition(name, 0)])
        count, deadline = len(received), time.monotonic() + 10
        while len(received) < count + 3 and time.monotonic() < deadline:
            assert consumer.poll(0.1) is None
    assert coordinates(batches) == [(0, o) for o in range(10_000)]
    # 10,000 read, 10,000 queued ahead, and the fetches in flight (about 6,000 of these orders a MB)
    assert received and received[-1] <= 40_000, received
