"""Planning a batch on the driver: where each partition stands, which offsets to read, in which tasks.

`topic_state` asks Kafka for each partition's earliest offset and log end; `plan_batch` turns the
positions committed in the tables (lakehouse.core.offsets) into one `OffsetRange` per partition
within the batch's record budget, recording ranges that aged out of Kafka as gaps (or stopping on
them) and stopping on a topic that was deleted and recreated; `task_groups` cuts the ranges into
the batch's Spark tasks, an even share each (lakehouse.ingest.reader reads them).

Every consumer reads committed records only (isolation.level read_committed, as Kafka Connect and
Spark's Kafka source do), so the end of a partition is its last stable offset: ListOffsets answers it
(the high watermark when no transaction is open). Only where the tables stand past it does the planner
fetch, to tell a log that grew meanwhile from a recreated topic. Records of a transaction still open are
not planned; aborted records and transaction markers (and records compaction removed) hold offsets no
consumer is given: a range may end on one, and its readers stop at the range's end or the log's,
whichever they meet first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from lakehouse.core import errors, kafka_security
from lakehouse.core.errors import (
    BrokerUnavailableError,
    OffsetGapError,
    SourceError,
    TopicMissingError,
    TopicRecreatedError,
)
from lakehouse.core.offsets import OffsetRange, TableProgress, committed_positions
from lakehouse.core.spec import PipelineSpec


@dataclass(frozen=True)
class PartitionState:
    partition: int
    earliest: int
    end: int  # one past the last fetchable record


@dataclass(frozen=True)
class TopicState:
    topic: str
    topic_id: str | None
    partitions: dict[int, PartitionState]

    @property
    def earliest(self) -> dict[int, int]:
        """Per partition, the oldest offset Kafka still holds (where a table without a position reads from)."""
        return {p: ps.earliest for p, ps in self.partitions.items()}


@dataclass(frozen=True)
class BatchPlan:
    topic: str
    topic_id: str | None
    ranges: tuple[OffsetRange, ...]
    ends: dict[int, int]                      # log end per partition when planned
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def record_count(self) -> int:
        return sum(r.count for r in self.ranges)

    def range_map(self) -> dict[int, tuple[int, int]]:
        return {r.partition: (r.start, r.end) for r in self.ranges}

    @property
    def next_starts(self) -> dict[int, int]:
        """Per partition planned, the offset a plan following this one starts at."""
        return {r.partition: r.end for r in self.ranges}

    def followed_by(self, later: BatchPlan) -> BatchPlan:
        """This plan and `later` (planned from this one's `next_starts`) as one: each partition's ranges joined,
        the log ends as `later` found them, the gaps of both."""
        joined = self.range_map()
        for r in later.ranges:
            start, end = joined.get(r.partition, (r.start, r.end))
            if end != r.start and r.partition in joined:
                raise ValueError(f"partition {r.partition}: [{r.start}, {r.end}) does not follow [{start}, {end})")
            joined[r.partition] = (start, r.end)
        return BatchPlan(topic=self.topic, topic_id=self.topic_id,
                         ranges=tuple(OffsetRange(self.topic, p, s, e) for p, (s, e) in sorted(joined.items())),
                         ends={**self.ends, **later.ends}, gaps={**self.gaps, **later.gaps})


def kafka_consumer(kafka_conf: dict, group: str, **extra) -> Consumer:
    conf = {
        **kafka_conf,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",  # librdkafka's default too: aborted records are never delivered
        **extra,
    }
    return Consumer(conf)


class AdminSession:
    """An AdminClient (and the ErrorWatch of its logins) for the topic probes of one run of a job: each
    batch's `topic_state` then asks over the connections the last one opened instead of opening new ones
    (a client per batch also cost a batch of 1,000 partitions about 30 ms here, and a broker behind TLS and
    SASL a handshake per batch). A probe that fails drops the client: the next one starts afresh, as a
    new client per probe did."""

    def __init__(self, kafka_conf: dict):
        self.kafka_conf = kafka_conf
        self._client: tuple[AdminClient, kafka_security.ErrorWatch] | None = None

    def client(self) -> tuple[AdminClient, kafka_security.ErrorWatch]:
        """The kept client, or a new one; its watch holds only the login errors of the probe about to ask."""
        if self._client is None:
            watched_conf, watch = kafka_security.watched(self.kafka_conf)
            self._client = (AdminClient(watched_conf), watch)
        self._client[1].errors.clear()
        return self._client

    def close(self) -> None:
        self._client = None


def topic_state(kafka_conf: dict, topic: str, starts: dict[int, int] | None = None,
                timeout: float = 15.0, expected_id: str | None = None,
                session: AdminSession | None = None) -> TopicState:
    """Earliest offset and log end of every partition of `topic`, plus its topic id.

    `starts` (partition -> offset) are where the tables stand: a partition whose start is past its
    last stable offset is fetched from there, and a start beyond the log's end raises
    TopicRecreatedError, and so does a topic id other than `expected_id` (checked before any fetch).
    A cluster that refuses the credentials or the TLS handshake raises KafkaAuthError at once (not
    after `timeout`). With a `session`, its client asks (and is dropped when anything fails);
    without, a client of its own.
    """
    session = session if session is not None else AdminSession(kafka_conf)
    try:
        return _topic_state(kafka_conf, topic, starts, timeout, expected_id, *session.client())
    except BaseException:
        session.close()
        raise


def _topic_state(kafka_conf: dict, topic: str, starts: dict[int, int] | None, timeout: float,
                 expected_id: str | None, admin: AdminClient, watch: kafka_security.ErrorWatch) -> TopicState:
    from confluent_kafka import TopicCollection

    try:
        future = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic]
        described = kafka_security.wait_future(future, admin, watch, timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise TopicMissingError(f"topic {topic!r} does not exist on {kafka_conf.get('bootstrap.servers')}") \
                from None
        if errors.transient_cause(exc):  # timed out, transport down: the broker may answer again soon
            raise BrokerUnavailableError(f"cannot describe topic {topic!r} on {kafka_conf.get('bootstrap.servers')}: "
                                         f"{err.str()}") from None
        raise SourceError(f"cannot describe topic {topic!r}: {err.str()}") from None
    topic_id = str(described.topic_id) if getattr(described, "topic_id", None) else None
    if expected_id and topic_id and expected_id != topic_id:
        raise TopicRecreatedError(
            f"topic {topic!r} now has id {topic_id} but the tables were written from id {expected_id}: "
            f"the topic was deleted and recreated. Its offsets restart, so resuming would skip or mix "
            f"records; reset the pipeline's tables or write the new topic to new tables.")
    partitions = sorted(p.id for p in described.partitions)
    starts = starts or {}
    watermarks = _watermarks(admin, watch, topic, partitions, timeout)
    earliest = {p: low for p, (low, _) in watermarks.items()}
    ends = {p: high for p, (_, high) in watermarks.items()}
    # only a partition whose tables stand past its last stable offset needs a fetch: one that answers is
    # a log that grew meanwhile, one that does not is a recreated topic. A consumer assigned every
    # partition and waiting for each one's end-of-partition cost a batch of 1,000 partitions 0.2 s
    past_watermark = {p: starts[p] for p in partitions if starts.get(p, 0) > ends[p]}
    if past_watermark:
        consumer = kafka_consumer(kafka_conf, "lakehouse-planner", **{"fetch.wait.max.ms": 10})
        try:
            ends.update(_probe_ends(consumer, topic, past_watermark, timeout))
        finally:
            consumer.close()
    return TopicState(topic, topic_id, {p: PartitionState(p, earliest[p], ends[p]) for p in partitions})


def topic_state_for(kafka_conf: dict, topic: str, progress: Iterable[TableProgress],
                    timeout: float = 15.0, session: AdminSession | None = None) -> TopicState:
    """`topic_state` probed from where the tables stand, checked against the topic id they recorded."""
    progress = list(progress)
    starts: dict[int, int] = {}
    for tp in progress:
        for p, pos in tp.positions.items():
            starts[p] = max(starts.get(p, 0), pos)
    expected = next((tp.topic_id for tp in progress if tp.topic_id), None)
    return topic_state(kafka_conf, topic, starts, timeout=timeout, expected_id=expected, session=session)


# Errors of a partition the broker just described that say the client does not know where it lives yet: a
# broker back from a freeze or a restart, fenced until the controller unfences it, or a leader moving. They
# pass once the client's metadata catches up, as the transient ones (errors.transient_cause) do.
NOT_YET_KNOWN = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                           KafkaError.NOT_LEADER_FOR_PARTITION})


def _not_answering_yet(err: KafkaError) -> bool:
    return err.code() in NOT_YET_KNOWN or errors.transient_cause(KafkaException(err)) is not None


# What a partition's ListOffsets answers while its leadership settles (a broker back from a freeze or a
# restart, a leader moving): the errors Kafka's own clients retry (RetriableException), and librdkafka's
# _NOENT ("Failed to query partition leaders: No leaders found") while no leader of the request is known.
# librdkafka surfaces them per partition without retrying, as its consumer's watermark query did.
LIST_OFFSETS_RETRIABLE = NOT_YET_KNOWN | frozenset({
    KafkaError._NOENT, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.BROKER_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE, KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE})


def _watermarks(admin: AdminClient, watch: kafka_security.ErrorWatch, topic: str, partitions: list[int],
                timeout: float) -> dict[int, tuple[int, int]]:
    """The low and high watermark of each partition the broker described just before, as the planner's
    read_committed consumer sees them (the high one is the last stable offset, as librdkafka's
    get_watermark_offsets answers for such a consumer): two ListOffsets requests for all partitions, not
    two round trips per partition, which made planning a batch over 1,000 partitions take a second. A broker
    that cannot tell them now raises BrokerUnavailableError (the batch is retried), anything else SourceError."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import OffsetSpec

    asked = {}
    for which, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
        asked[which] = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                          isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
    found: dict[int, list[int]] = {p: [0, 0] for p in partitions}
    for slot, which in enumerate(("low", "high")):
        for tp, future in asked[which].items():
            try:
                found[tp.partition][slot] = kafka_security.wait_future(future, admin, watch, timeout).offset
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() in LIST_OFFSETS_RETRIABLE or _not_answering_yet(err):
                    raise BrokerUnavailableError(f"topic {topic!r} partition {tp.partition}: no watermarks yet "
                                                 f"({err.str()}); is the broker healthy?") from None
                raise SourceError(f"topic {topic!r} partition {tp.partition}: cannot read its watermarks: "
                                  f"{err.str()}") from None
    return {p: (low, high) for p, (low, high) in found.items()}


def _probe_ends(consumer: Consumer, topic: str, probe_from: dict[int, int], timeout: float) -> dict[int, int]:
    """Fetch from each start (where the tables stand, past the partition's last stable offset when
    ListOffsets answered) until end-of-partition; the EOF offset is the log end.

    A partition that never answers has no such offset: the topic was recreated.
    """
    ends = dict(probe_from)
    pending = set(probe_from)
    consumer.assign([TopicPartition(topic, p, o) for p, o in probe_from.items()])
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TopicRecreatedError(
                f"topic {topic!r} partitions {sorted(pending)}: the tables hold offsets past the log end and "
                f"the broker has nothing there; offsets went backwards, so the topic was recreated.")
        # a short timeout: consume() waits it out whenever fewer messages than asked for arrive,
        # which is always the case at the end of a log (it once cost half a second per batch)
        for msg in consumer.consume(num_messages=10_000, timeout=0.05):
            p, offset = msg.partition(), msg.offset()
            err = msg.error()
            if p is None or offset is None:  # neither a record nor a partition's end: an error of the client
                if err is not None and not _not_answering_yet(err):
                    raise SourceError(f"topic {topic!r}: {err.str()}")
                continue
            if err is None:
                ends[p] = max(ends[p], offset + 1)
            elif err.code() == KafkaError._PARTITION_EOF:
                ends[p] = max(ends[p], offset)
                pending.discard(p)
            elif _not_answering_yet(err):
                continue  # the client finds the partition again, or the deadline says the broker is not healthy
            elif err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                # with auto.offset.reset=error librdkafka reports the broker's OFFSET_OUT_OF_RANGE as the latter
                raise TopicRecreatedError(
                    f"topic {topic!r} partition {p}: the committed position {probe_from[p]} is beyond the "
                    f"end of the log; offsets went backwards, so the topic was deleted and recreated. "
                    f"The table holds records of the old topic; reset the pipeline's tables or ingest "
                    f"the new topic into new tables.")
            else:
                raise SourceError(f"topic {topic!r} partition {p}: {err.str()}")
    return ends


def plan_batch(spec: PipelineSpec, state: TopicState, progress: Iterable[TableProgress],
               max_records: int, accept_gap: bool = False, after: BatchPlan | None = None) -> BatchPlan:
    """The next batch's offset ranges, from the slowest table's position per partition (or, for the
    partitions `after` planned, from where that plan ends: a batch read in several steps).

    Raises TopicRecreatedError when the topic id changed or a position is past
    the log end, and OffsetGapError when a position is below the earliest
    retained offset (unless `accept_gap`, which records the gap in the plan).
    """
    topic = spec.source.topic
    progress = list(progress)
    for tp in progress:
        if tp.topic_id and state.topic_id and tp.topic_id != state.topic_id:
            raise TopicRecreatedError(
                f"topic {topic!r} now has id {state.topic_id} but table {tp.table} was written from "
                f"id {tp.topic_id}: the topic was deleted and recreated. Its offsets restart, so resuming "
                f"would skip or mix records; reset the pipeline's tables or write the new topic to new tables.")
        gone = sorted(set(tp.positions) - set(state.partitions))
        if gone:
            raise TopicRecreatedError(
                f"table {tp.table} holds offsets of partitions {gone} that topic {topic!r} no longer has: "
                f"the topic was recreated with fewer partitions.")
    starts: dict[int, int] = {}
    gaps: dict[int, tuple[int, int]] = {}
    committed = {**committed_positions(progress, state.earliest), **(after.next_starts if after else {})}
    for p, ps in state.partitions.items():
        start = committed[p]
        if start > ps.end:
            raise TopicRecreatedError(
                f"topic {topic!r} partition {p}: tables hold offsets up to {start} but the log ends at "
                f"{ps.end}; offsets went backwards, so the topic was recreated.")
        if start < ps.earliest:
            if not accept_gap:
                raise OffsetGapError(
                    f"topic {topic!r} partition {p}: offsets [{start}, {ps.earliest}) aged out of Kafka "
                    f"before they were ingested ({ps.earliest - start} records lost to retention). "
                    f"Replay them from another source if you have one, then rerun with --accept-gap to "
                    f"record the gap in the table and continue from offset {ps.earliest}. Raise "
                    f"retention.ms on the topic to cover the worst writer outage.")
            gaps[p] = (start, ps.earliest)
            start = ps.earliest
        starts[p] = start
    ranges = _budget(topic, starts, {p: ps.end for p, ps in state.partitions.items()}, max_records)
    return BatchPlan(topic=topic, topic_id=state.topic_id, ranges=tuple(ranges),
                     ends={p: ps.end for p, ps in state.partitions.items()}, gaps=gaps)


def _budget(topic: str, starts: dict[int, int], ends: dict[int, int], max_records: int) -> list[OffsetRange]:
    """Split `max_records` fairly across partitions with lag; unused shares go to the others."""
    lag = {p: ends[p] - starts[p] for p in starts if ends[p] > starts[p]}
    take = {p: 0 for p in lag}
    budget = max_records
    while budget > 0 and any(take[p] < lag[p] for p in lag):
        open_parts = [p for p in lag if take[p] < lag[p]]
        share = max(1, budget // len(open_parts))
        for p in open_parts:
            more = min(share, lag[p] - take[p], budget)
            take[p] += more
            budget -= more
            if budget == 0:
                break
    return [OffsetRange(topic, p, starts[p], starts[p] + take[p]) for p in sorted(take) if take[p] > 0]


def offsets_for_time(kafka_conf: dict, topic: str, partitions: Iterable[int], ts_ms: int,
                     ends: dict[int, int], timeout: float = 15.0) -> dict[int, int]:
    """First offset per partition whose timestamp is >= ts_ms (the log end if none)."""
    consumer = kafka_consumer(kafka_conf, "lakehouse-planner")
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, p, ts_ms) for p in partitions], timeout=timeout)
    finally:
        consumer.close()
    out = {}
    for tp in found:
        if tp.error:
            raise SourceError(f"offsets_for_times {topic}[{tp.partition}]: {tp.error}")
        out[tp.partition] = ends[tp.partition] if tp.offset in (-1, OFFSET_END) else tp.offset
    return out


def split_for_tasks(ranges: list[OffsetRange] | tuple[OffsetRange, ...], tasks: int,
                    min_records: int = 10_000) -> list[OffsetRange]:
    """`ranges` cut into about `tasks` pieces of similar size (none under `min_records` unless the
    range is), so that a few large partitions keep every task slot busy. Pieces of one partition
    are contiguous and cover its range exactly."""
    total = sum(r.count for r in ranges)
    target = max(min_records, -(-total // max(1, tasks)))  # ceil(total / tasks)
    pieces = []
    for r in ranges:
        if r.count == 0:
            pieces.append(r)
            continue
        step = -(-r.count // -(-r.count // target))  # ceil(count / pieces), pieces = ceil(count / target)
        pieces += [OffsetRange(r.topic, r.partition, s, min(s + step, r.end)) for s in range(r.start, r.end, step)]
    return pieces


def task_groups(ranges: list[OffsetRange] | tuple[OffsetRange, ...], tasks: int,
                min_records: int = 10_000) -> list[list[OffsetRange]]:
    """The offset ranges of each task of a batch: the ranges laid end to end in partition order and cut into
    about `tasks` even shares (task i holds records total*i//tasks up to total*(i+1)//tasks), a partition's range
    cut where a share ends. A few large partitions and many quiet ones alike keep every slot equally busy (three
    partitions on two slots make two tasks of 1.5 partitions, not one of two and one of one), 1,000 quiet
    partitions make `tasks` tasks, not 1,000, and no more tasks than `min_records` apiece fill (a 10-record batch
    is one task, one file per table). Empty ranges are left out; a task's ranges are in partition order."""
    live = sorted((r for r in ranges if r.count > 0), key=lambda r: (r.topic, r.partition, r.start))
    total = sum(r.count for r in live)
    tasks = max(1, min(tasks, -(-total // min_records)))
    ends = [total * (i + 1) // tasks for i in range(tasks)]
    groups: list[list[OffsetRange]] = [[] for _ in range(tasks)]
    task, placed = 0, 0  # placed: the records laid before `start`
    for r in live:
        start = r.start
        while start < r.end:
            while placed >= ends[task]:
                task += 1
            end = min(r.end, start + ends[task] - placed)
            groups[task].append(OffsetRange(r.topic, r.partition, start, end))
            placed += end - start
            start = end
    return [g for g in groups if g]
