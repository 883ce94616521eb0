"""Reading a batch in Spark tasks: each task reads exactly its offset ranges and decodes them.

Each Spark task reads its planned ranges (lakehouse.ingest.plan) with confluent-kafka, so a
retried task reads the same records, and decodes them (lakehouse.ingest.validator) into Arrow
batches, which the task writes as data files (lakehouse.ingest.taskwriter) or, for replays,
hands to the JVM.

One bad record never fails a task: every value a batch carries is checked against what
Arrow, Spark and Python can hold (or the record is a dead letter saying why), an
exception in decoding dead-letters its record as `reader_failure`, and anything else a
task did not expect is raised with a `record-failure` marker naming the record it was at,
so that the driver can dead-letter that record and read the batch again.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from lakehouse.core import errors, kafka_security, sparkenv
from lakehouse.core.errors import BrokerStalledError, OffsetGapError, RecordFailureError, SourceError
from lakehouse.core.offsets import OffsetRange
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.checks import MAX_TIMESTAMP_US, MIN_TIMESTAMP_US, TIMESTAMP_RANGE, lone_surrogate
from lakehouse.ingest.layout import DEAD_LETTER_BATCH_COLUMNS, KAFKA_STRUCT, batch_schema
from lakehouse.ingest.plan import kafka_consumer
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.writer_schemas import WriterSchemas

# Kafka timestamps (milliseconds) inside checks.TIMESTAMP_RANGE; a broker takes any 64-bit value.
MIN_KAFKA_TIMESTAMP_MS = -(-MIN_TIMESTAMP_US // 1000)
MAX_KAFKA_TIMESTAMP_MS = MAX_TIMESTAMP_US // 1000
_DETAIL_CHARS = 2000  # error_detail is for people; an exception can quote a whole value
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MILLISECOND = timedelta(milliseconds=1)
# a record's coordinates, route and op as BatchBuilder keeps them (`_records`)
_RECORD_TYPE = pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                          ("timestamp", pa.timestamp("ms", tz="UTC")), ("key", pa.string()), ("route", pa.string()),
                          ("op", pa.string())])


# Messages asked of consume() at a time. A Message is a GC-tracked object: a chunk of thousands
# outlives enough collections to reach the oldest generation and sets off full collections that
# cost more than decoding it (10,000 at a time halved the reader's throughput).
CONSUME_CHUNK = 200


class StageClock:
    """Seconds one task spent in `consumer.consume` (read) and decoding records into batches (decode)."""

    __slots__ = ("read_s", "decode_s")

    def __init__(self) -> None:
        self.read_s = 0.0
        self.decode_s = 0.0

    def report(self, timers) -> None:
        """Adds the totals to `timers`, a pair (read, decode) of objects with `.add(float)`, when given."""
        if timers is not None:
            read_timer, decode_timer = timers
            read_timer.add(self.read_s)
            decode_timer.add(self.decode_s)


def _utf8(text: str) -> str:
    """`text` cut to _DETAIL_CHARS and made valid UTF-8: lone surrogates become \\ud800 escapes."""
    text = text[:_DETAIL_CHARS]
    return text if lone_surrogate(text) is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(exc: BaseException) -> str:
    """`Type: message` of an exception, for an error_detail (even when its __str__ fails)."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the error's type
        message = "(message unprintable)"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _in_range_ms(ts_ms: Any) -> bool:
    """Whether `ts_ms` is a Kafka timestamp a batch can carry."""
    return type(ts_ms) is int and MIN_KAFKA_TIMESTAMP_MS <= ts_ms <= MAX_KAFKA_TIMESTAMP_MS


def _key_text(key: Any) -> str | None:
    """The key as `_kafka.key` shows it: its text when it is UTF-8, else None."""
    try:
        return key.decode("utf-8") if type(key) is bytes else None
    except UnicodeDecodeError:
        return None


def _as_bytes(raw: Any, what: str, notes: list[str]) -> bytes | None:
    """`raw` as a binary column takes it; anything but bytes (only ever from a caller's bug) is noted."""
    if raw is None or type(raw) is bytes:
        return raw
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return bytes(raw)
    if isinstance(raw, str):
        notes.append(f"{what} came as text, kept as its UTF-8 bytes")
        return raw.encode("utf-8", "surrogatepass")
    notes.append(f"{what} came as {type(raw).__name__}, not bytes; left out")
    return None


def _header_key(key: Any) -> str:
    """A header key that is not UTF-8 text as text: undecodable bytes and lone surrogates as escapes."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8", "backslashreplace")
    return _utf8(key if isinstance(key, str) else str(key))


def _readable_headers(headers: Any) -> tuple[list[dict], list[str]]:
    """A dead letter's headers as Arrow stores them, and notes on what could not be kept as it came.

    `headers` is the record's list of (key, value) pairs, or a function returning it
    (Message.headers). Never raises: a key that is not UTF-8 text is kept with escapes; when
    confluent-kafka cannot decode the headers at all (a key that is not UTF-8 on the wire), they
    are left out and the note says why.
    """
    notes: list[str] = []
    try:
        raw = headers() if callable(headers) else headers
    except Exception as exc:  # noqa: BLE001 - confluent-kafka raises when a header key is not UTF-8
        return [], [f"the headers could not be read ({_describe(exc.__cause__ or exc)}); left out"]
    try:
        items = list(raw or ())
    except Exception as exc:  # noqa: BLE001 - never raises: headers of any other shape are left out, with a note
        return [], [*notes, f"the headers are not a list ({_describe(exc)}); left out"]
    kept: list[dict] = []
    for i, item in enumerate(items):
        try:
            key, value = item
        except Exception:  # noqa: BLE001 - never raises: a header of any other shape is left out, with a note
            notes.append(f"header {i} is not a (key, value) pair; left out")
            continue
        if key is not None and (type(key) is not str or lone_surrogate(key) is not None):
            notes.append(f"the key of header {i}, {_utf8(ascii(key))[:100]}, is not UTF-8 text; kept with escapes")
            key = _header_key(key)
        kept.append({"key": key, "value": _as_bytes(value, f"the value of header {i}", notes)})
    return kept, notes


class BatchBuilder:
    """Decodes records and emits them as Arrow record batches of `batch_schema(spec)`.

    A record is kept as two tuples (its contract values; its coordinates, route and op) and
    its raw value, dead letters on the side; at flush each list of tuples becomes one Arrow
    struct array whose fields are the columns (a Python list per column took 1.5 times as long).

    No record can fail the batch. Every value kept is one Arrow, Spark and Python can hold
    (the validator checks contract values; `add` checks the Kafka timestamp), `add`
    dead-letters a record whose decoding raises anything as `reader_failure`, and should
    Arrow still refuse a value at flush, the records it refuses become `reader_failure`
    dead letters and the rest of the batch is emitted.
    """

    def __init__(self, spec: PipelineSpec, validator: RecordValidator, ingested_at_us: int):
        if type(ingested_at_us) is not int or not MIN_TIMESTAMP_US <= ingested_at_us <= MAX_TIMESTAMP_US:
            raise ValueError(f"ingested_at_us {ingested_at_us!r} is not microseconds in {TIMESTAMP_RANGE}")
        self.schema, _ = batch_schema(spec)
        self.validator = validator
        self.contract = spec.contract.names
        # a change stream's row ends with its `_cdc` value (validator.RecordValidator.check_change)
        self._cdc = spec.is_cdc
        self._null_row = (None,) * (len(self.contract) + self._cdc)
        self._key_index = self.contract.index(validator.key_field) if validator.key_field else None
        self.default_table = spec.target.table
        fanout = spec.target.fanout
        self._route_index = self.contract.index(fanout.field) if fanout else None
        self.routes = fanout.routes if fanout else {}
        self._ingested_at = pa.scalar(ingested_at_us, self.schema.field("_ingested_at").type)
        row_names = [*self.contract, "_cdc"] if self._cdc else self.contract
        self._row_type = pa.struct([self.schema.field(name) for name in row_names])
        self.reset()

    def reset(self) -> None:
        self._rows: list[tuple] = []     # contract values, all None for a dead letter
        self._records: list[tuple] = []  # (topic, partition, offset, timestamp ms, key text, route, op)
        # raw values, apart: only a record Arrow refuses needs its value, and copying every value into Arrow
        # with the records would cost time and as much memory as the batch's values again
        self._values: list[bytes | None] = []
        self._dead: list[tuple] = []     # (position, key, value, headers, error kind, error detail)

    @property
    def size(self) -> int:
        """Records added since the last flush."""
        return len(self._records)

    def add(self, topic: str, partition: int, offset: int, ts_ms: int | None,
            key: bytes | None, value: bytes | None, headers) -> None:
        """Decode one record and keep it as a table row or, when rejected, as a dead letter.

        `headers` is the record's list of (key, value) pairs or a function that
        returns it; it is read for dead letters only (building it costs more than
        decoding a valid record). Never raises.
        """
        validator = self.validator
        row: tuple | None
        try:
            if ts_ms is not None and not MIN_KAFKA_TIMESTAMP_MS <= ts_ms <= MAX_KAFKA_TIMESTAMP_MS:
                raise Rejected("bad_kafka_timestamp", f"Kafka timestamp {ts_ms} ms is outside {TIMESTAMP_RANGE}; "
                                                      f"_kafka.timestamp left null")
            if self._cdc:  # a change event: its row (a delete's holds the primary key) and op
                key_text, row, op = validator.check_change(key, value)
                route = self.default_table
            else:
                key_text = validator.check_key(key)
                row = validator.check_row(key_text, value)
                if row is None:  # tombstone on an upsert pipeline: delete the key (the key field's value)
                    key_value = validator.key_value(key_text)
                    row = tuple(key_value if i == self._key_index else None for i in range(len(self.contract)))
                    route, op = self.default_table, "delete"
                elif self._route_index is None:
                    route, op = self.default_table, "upsert"
                else:
                    routed = row[self._route_index]
                    route = self.default_table if routed is None else self.routes.get(str(routed), self.default_table)
                    op = "upsert"
        except Rejected as rejected:
            self.reject(topic, partition, offset, ts_ms, key, value, headers, rejected.kind, rejected.detail)
            return
        except (errors.RetryableError, errors.SchemaChangeError, errors.WriterSchemaIncompatibleError,
                errors.SchemaUnknownError):
            raise  # an outage (the schema registry) or a writer schema for the driver: never the record's fault
        except Exception as exc:  # noqa: BLE001 - a bug or a library's error costs this record, not the task
            self.reject(topic, partition, offset, ts_ms, key, value, headers, "reader_failure",
                        f"the reader failed on this record: {_describe(exc)}")
            return
        self._rows.append(row)
        self._records.append((topic, partition, offset, ts_ms, key_text, route, op))
        self._values.append(value)

    def reject(self, topic: str, partition: int, offset: int, ts_ms: int | None,
               key: bytes | None, value: bytes | None, headers, kind: str, detail: str) -> None:
        """Keep one record, undecoded, as a dead letter of `kind` with `detail`.

        The raw key, value and headers are kept as they came, as far as a dead-letter row
        can hold them; what it cannot (a Kafka timestamp outside TIMESTAMP_RANGE, a header
        key that is not UTF-8) is described at the end of the detail. Never raises.
        """
        notes: list[str] = []
        if ts_ms is not None and not _in_range_ms(ts_ms):
            if kind != "bad_kafka_timestamp":
                notes.append(f"Kafka timestamp {_utf8(repr(ts_ms))[:100]} is outside {TIMESTAMP_RANGE}; left out")
            ts_ms = None
        kept_headers, header_notes = _readable_headers(headers)
        raw_key = _as_bytes(key, "the key", notes)
        raw_value = _as_bytes(value, "the value", notes)
        detail = detail if isinstance(detail, str) else repr(detail)
        detail = "; ".join([detail, *notes, *header_notes])
        self._dead.append((len(self._records), raw_key, raw_value, kept_headers, _utf8(str(kind)), _utf8(detail)))
        self._rows.append(self._null_row)
        self._records.append((topic, partition, offset, ts_ms, _key_text(key), None, None))
        self._values.append(raw_value)

    def flush(self) -> pa.RecordBatch:
        """The records added since the last flush as one Arrow batch; the builder starts empty again.

        A record whose values Arrow refuses (none should be) becomes a `reader_failure`
        dead letter; an error no single record causes is raised.
        """
        rows, records, values, dead = self._rows, self._records, self._values, self._dead
        self.reset()
        try:
            return self._arrow(rows, records, dead)
        except Exception:  # find the records at fault, dead-letter them, emit the rest
            refused = self._refused(rows, records, dead, 0, len(records))
            if not refused:
                raise
            return self._arrow(*self._without(rows, records, values, dead, refused))

    def _arrow(self, rows: list[tuple], records: list[tuple], dead: list[tuple]) -> pa.RecordBatch:
        n = len(records)
        columns: dict[str, Any] = dict(zip(self._row_type.names, pa.array(rows, self._row_type).flatten(), strict=True))
        topic, partition, offset, timestamp, key, route, op = pa.array(records, _RECORD_TYPE).flatten()
        columns["_route"], columns["_op"] = route, op
        # Kafka gives milliseconds, checked to fit, so the cast to microseconds cannot overflow
        columns["_kafka"] = pa.StructArray.from_arrays(
            [topic, partition, offset, timestamp.cast(KAFKA_STRUCT.field("timestamp").type), key],
            fields=list(KAFKA_STRUCT))
        columns["_ingested_at"] = pa.repeat(self._ingested_at, n)
        if dead:  # a few rows each: each column is taken from its dead letters' values, null elsewhere
            picks = np.full(n, len(dead), np.int64)
            picks[[position for position, *_ in dead]] = np.arange(len(dead))
            for i, name in enumerate(DEAD_LETTER_BATCH_COLUMNS, 1):
                letters = pa.array([letter[i] for letter in dead] + [None], self.schema.field(name).type)
                columns[name] = letters.take(picks)
        else:
            columns.update((name, pa.nulls(n, self.schema.field(name).type)) for name in DEAD_LETTER_BATCH_COLUMNS)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.schema], schema=self.schema)

    def _refused(self, rows: list[tuple], records: list[tuple], dead: list[tuple], lo: int, hi: int) -> dict[int, str]:
        """Positions in [lo, hi) whose records Arrow refuses, with its error, found by halving the range."""
        part = [(position - lo, *rest) for position, *rest in dead if lo <= position < hi]
        try:
            self._arrow(rows[lo:hi], records[lo:hi], part)
            return {}
        except Exception as exc:  # noqa: BLE001 - narrowed down below
            if hi - lo == 1:
                return {lo: _describe(exc)}
        middle = (lo + hi) // 2
        return {**self._refused(rows, records, dead, lo, middle), **self._refused(rows, records, dead, middle, hi)}

    def _without(self, rows: list[tuple], records: list[tuple], values: list[bytes | None], dead: list[tuple],
                 refused: dict[int, str]) -> tuple[list[tuple], list[tuple], list[tuple]]:
        """The batch with each refused record replaced by a bare `reader_failure` dead letter.

        It keeps the coordinates and raw key and value; a row's headers were never kept.
        """
        rows, records = list(rows), list(records)
        letters = {entry[0]: entry for entry in dead}
        dead = [entry for entry in dead if entry[0] not in refused]
        for position, error in refused.items():
            topic, partition, offset, ts_ms, key_text, _, _ = records[position]
            value = values[position]
            if position in letters:
                _, key, value, _, kind, detail = letters[position]
                why = f"Arrow refused this dead letter ({kind}: {detail}): {error}; headers left out"
            else:
                key = key_text.encode("utf-8", "surrogatepass") if isinstance(key_text, str) else None
                why = f"Arrow refused this record's values: {error}; headers left out"
            key, value = (v if type(v) is bytes else None for v in (key, value))
            rows[position] = self._null_row
            records[position] = (topic, partition, offset, ts_ms if _in_range_ms(ts_ms) else None,
                                 _key_text(key), None, None)
            dead.append((position, key, value, [], "reader_failure", _utf8(why)))
        return rows, records, dead


def _task_failure(exc: Exception, rng: OffsetRange, offset: int) -> errors.LakehouseError:
    """What a task raises for `exc`, an error it did not expect while at `offset` of `rng`.

    An error of the Kafka client stays a source error, retryable when librdkafka calls it
    transient: it is never the record's fault. Anything else becomes a RecordFailureError
    whose message starts with the `record-failure` marker and quotes `exc`.
    """
    where = {"topic": rng.topic, "partition": rng.partition, "offset": offset}
    if isinstance(exc, KafkaException):
        transient = errors.transient_cause(exc)
        if transient:
            return BrokerStalledError(f"{rng}: Kafka failed at offset {offset}: {transient} "
                                      f"{errors.task_marker('retryable', why='kafka-transient-error', **where)}")
        return SourceError(f"{rng}: Kafka failed at offset {offset}: {_describe(exc)}")
    return RecordFailureError(f"{errors.task_marker('record-failure', **where)} {rng}: the reader failed "
                              f"at offset {offset}: {_describe(exc)}")


class _PartitionRead:
    """A task's ranges of one partition, read in offset order from the one fetch position the
    consumer holds for the partition.

    `position` is the next offset of the range being read (`ranges[index]`): a record below it
    was read already, or lies between two ranges of the task, or was fetched before a seek. The
    records of a partition come in offset order, so a record (or the end of the partition) at an
    offset says that no record below it is still to come: the ranges that end there are complete,
    whatever offsets they hold that deliver no record (transaction markers, aborted records,
    compacted ones).
    """

    __slots__ = ("partition", "ranges", "index", "position", "poison", "since", "range", "end")

    def __init__(self, partition: int, ranges: list[OffsetRange], poison: dict[int, str], now: float):
        self.partition, self.ranges, self.index = partition, ranges, 0
        self.position = ranges[0].start
        self.poison = poison
        self.since = now  # when a record of this partition last came (or the read began)
        # the range being read (the last one once all are complete) and its end: attributes, not properties, as
        # the read loop asks for them at every record
        self.range: OffsetRange = ranges[0]
        self.end: int = ranges[0].end

    @property
    def halfway(self) -> int:
        """The offset half way through the range being read, where the `during_read` fault fires."""
        rng = self.range
        return rng.start + rng.count // 2

    def reach(self, offset: int) -> bool:
        """No record below `offset` is still to come: completes the ranges ending there and moves to the
        start of the next one. True when every range of the partition is complete."""
        ranges = self.ranges
        while self.index < len(ranges) and ranges[self.index].end <= offset:
            self.index += 1
        self.range = ranges[min(self.index, len(ranges) - 1)]
        self.end = self.range.end
        if self.index == len(ranges):
            return True
        self.position = max(self.position, ranges[self.index].start)
        return False


def _partition_reads(ranges: list[OffsetRange], poisoned: Mapping[tuple[int, int], str],
                     now: float) -> dict[int, _PartitionRead]:
    """The non-empty `ranges` grouped by partition (in partition order), each partition's in offset order.

    Raises ValueError for ranges of several topics or ranges of one partition that overlap: a plan
    that would read a record twice is a bug of the planner, never something to read.
    """
    by_partition: dict[int, list[OffsetRange]] = {}
    for rng in ranges:
        if rng.count > 0:
            by_partition.setdefault(rng.partition, []).append(rng)
    topics = sorted({rng.topic for pieces in by_partition.values() for rng in pieces})
    if len(topics) > 1:
        raise ValueError(f"a task reads the ranges of one topic, got ranges of {topics}")
    reads = {}
    for partition in sorted(by_partition):
        pieces = sorted(by_partition[partition], key=lambda r: r.start)
        for before, after in itertools.pairwise(pieces):
            if after.start < before.end:
                raise ValueError(f"ranges {before} and {after} overlap: their common offsets would be read twice")
        poison = {o: why for (p, o), why in poisoned.items()
                  if p == partition and any(r.start <= o < r.end for r in pieces)}
        reads[partition] = _PartitionRead(partition, pieces, poison, now)
    return reads


def read_ranges(consumer: Consumer, ranges: list[OffsetRange], builder: BatchBuilder, batch_rows: int,
                stall_timeout: float, fault=None, clock: StageClock | None = None,
                watch: kafka_security.ErrorWatch | None = None,
                poisoned: Mapping[tuple[int, int], str] | None = None) -> Iterator[pa.RecordBatch]:
    """Decoded Arrow batches (at most `batch_rows` rows each) of exactly the records in `ranges`.

    All the ranges (of one topic) are read with one assignment: every partition from its first
    range's start at once, each record routed to its range by partition and offset, a partition
    paused once its last range is complete, and the read done when every range is. A task of
    1,000 quiet partitions then costs a few fetches, not 1,000 assignments that each restart
    fetching (measured: 7.5 s for 1,000 ranges of 20 records one after another). Several ranges
    of one partition (pieces of a split partition) are read in offset order; between two that are
    not contiguous the consumer seeks to the next one's start.

    The rows of a partition come in offset order; those of different partitions interleave.

    `clock` adds up the seconds spent in `consumer.consume` and in decoding and building
    batches, per consume() call and per chunk of records; the time this generator is suspended
    at `yield` counts as neither. `watch`, the consumer's error_cb, turns a refused login into
    KafkaAuthError when no records come. `poisoned` maps (partition, offset) to a reason: those
    records are dead-lettered as `reader_failure` with that reason as the detail, without being
    decoded. `fault` is called with `task_failure` before the read of each range and with
    `during_read` at the record half way through each range.

    Errors: Kafka's own keep their types (OffsetGapError, SourceError, KafkaAuthError), named
    after the range they hit; when no planned record comes for `stall_timeout`, BrokerStalledError
    names the partition and offset that waited longest; any other error is raised as
    RecordFailureError naming the record (or the position) it happened at. Ranges of several
    topics, or overlapping ranges of one partition, raise ValueError before anything is read.
    """
    reads = _partition_reads(list(ranges), poisoned or {}, time.monotonic())
    if not reads:
        return
    clock = clock if clock is not None else StageClock()
    topic = next(iter(reads.values())).range.topic
    current = next(iter(reads.values()))  # the partition whose range a failure is named after
    at_range, at = current.range, current.position
    try:
        if fault is not None:
            for read in reads.values():
                for at_range in read.ranges:
                    at = at_range.start
                    fault("task_failure")
        consumer.assign([TopicPartition(topic, p, read.position) for p, read in reads.items()])
        waiting = dict(reads)  # partitions with a range still incomplete
        consume, add, reject = consumer.consume, builder.add, builder.reject
        chunk = min(CONSUME_CHUNK, batch_rows)
        pending = builder.size
        last_progress = time.monotonic()
        while waiting:
            if current.partition not in waiting:
                current = next(iter(waiting.values()))
            at_range, at = current.range, current.position
            started = time.perf_counter()
            # what has come, then (only when nothing has) a wait for the next record: consume() waits out its
            # timeout for a count it cannot fill, and offsets that deliver no record (transaction markers,
            # aborted or compacted records) make any count of what the ranges still hold an overcount
            msgs = consume(num_messages=chunk, timeout=0)
            if not msgs:
                msgs = consume(num_messages=1, timeout=0.5)
            decoding = time.perf_counter()
            clock.read_s += decoding - started
            moment = time.monotonic()
            if not msgs and watch is not None:
                watch.check()
            progressed = False
            finished: list[_PartitionRead] = []
            for msg in msgs:
                # None for a partition done (fetched before its pause took hold) or not the task's, and for
                # an error of no partition (a broker connection lost: a stall, if it lasts)
                partition = msg.partition()
                found = None if partition is None else waiting.get(partition)
                if found is None:
                    continue
                read = current = found
                at_range, at = read.range, read.position
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof = msg.offset()
                        # the range ends in offsets that deliver no record (transactions)
                        if eof is not None and eof >= read.end:
                            progressed, read.since = True, moment
                            if read.reach(eof):
                                finished.append(waiting.pop(read.partition))
                        continue
                    # the consumer resets no offset (auto.offset.reset=error): a position the log no longer
                    # holds comes as _AUTO_OFFSET_RESET, the broker's OFFSET_OUT_OF_RANGE in its text
                    if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                        raise OffsetGapError(f"{read.range}: offset {read.position} was deleted from Kafka while the "
                                             f"batch was being read (retention); rerun to plan again")
                    raise SourceError(f"{read.range}: {err.str()}")
                offset = msg.offset()
                if offset is None or offset < read.position:  # read already, or fetched before a seek
                    continue
                at = offset
                if offset >= read.end:  # its range is complete: the record is the next range's, or none's
                    progressed, read.since = True, moment
                    if read.reach(offset):
                        finished.append(waiting.pop(read.partition))
                        continue
                    at_range = read.range
                    if offset < read.position:  # between two ranges of the task: on to the next one's start
                        if offset + 1 < read.position:
                            consumer.seek(TopicPartition(topic, read.partition, read.position))
                        continue
                ts_type, ts = msg.timestamp()
                poison = read.poison
                if poison and offset in poison:
                    reject(topic, read.partition, offset, ts if ts_type != 0 else None, msg.key(), msg.value(),
                           msg.headers, "reader_failure", poison[offset])
                else:
                    add(topic, read.partition, offset, ts if ts_type != 0 else None, msg.key(), msg.value(),
                        msg.headers)
                read.position = offset + 1
                progressed, read.since = True, moment
                if fault is not None and offset == read.halfway and offset not in poison:  # where a record is decoded
                    fault("during_read")
                if offset + 1 >= read.end:  # the range's last offset: complete
                    if read.reach(offset + 1):
                        finished.append(waiting.pop(read.partition))
                    elif offset + 1 < read.position:  # the partition's next range starts further on
                        consumer.seek(TopicPartition(topic, read.partition, read.position))
                pending += 1
                if pending >= batch_rows:
                    batch = builder.flush()
                    pending = 0
                    clock.decode_s += time.perf_counter() - decoding
                    yield batch
                    decoding = time.perf_counter()
            clock.decode_s += time.perf_counter() - decoding
            if progressed:
                last_progress = moment
            if finished and waiting:  # the last partitions need no pause: the consumer closes with the task
                consumer.pause([TopicPartition(topic, read.partition) for read in finished])
            if not progressed and time.monotonic() - last_progress > stall_timeout:
                stalled = min(waiting.values(), key=lambda r: (r.since, r.partition))
                others = f" (and {len(waiting) - 1} more partitions of this task)" if len(waiting) > 1 else ""
                marker = errors.task_marker("retryable", why="broker-stalled", topic=topic,
                                            partition=stalled.partition, offset=stalled.position)
                raise BrokerStalledError(f"{stalled.range}: no records past offset {stalled.position}{others} for "
                                         f"{stall_timeout:.0f}s although they were planned; broker stalled? {marker}")
        if builder.size:
            flushing = time.perf_counter()
            batch = builder.flush()
            clock.decode_s += time.perf_counter() - flushing
            yield batch
    except errors.LakehouseError:  # Kafka's own, already named; KafkaAuthError
        raise
    except Exception as exc:  # named for the driver, which dead-letters the record and reruns
        raise _task_failure(exc, at_range, at if type(at) is int else at_range.start) from exc


def read_range(consumer: Consumer, rng: OffsetRange, builder: BatchBuilder, batch_rows: int,
               stall_timeout: float, fault=None, clock: StageClock | None = None,
               watch: kafka_security.ErrorWatch | None = None,
               poisoned: Mapping[int, str] | None = None) -> Iterator[pa.RecordBatch]:
    """`read_ranges` of the one range `rng`; `poisoned` maps offsets of `rng` to a reason."""
    yield from read_ranges(consumer, [rng], builder, batch_rows, stall_timeout, fault, clock, watch=watch,
                           poisoned={(rng.partition, o): why for o, why in (poisoned or {}).items()})


# librdkafka settings of the consumers in reader tasks. No long poll: a task reads records known to exist, and
# a fetch the broker holds open at the end of one range (500 ms by default) would delay the task's next range on
# the same broker connection. A short prefetch: a task stops at its ranges' ends, and what librdkafka fetched
# beyond them (it fetches a partition until queued.min.messages are queued, 100,000 by default, each fetch up to
# max.partition.fetch.bytes) the broker sent and the task parsed for nothing (docs/benchmarks.md, "A short
# prefetch"). A partition above the marks is fetched again after fetch.queue.backoff.ms: 1 s by default, a
# stall at marks this low.
READER_FETCH = {"fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 1_048_576,
                "queued.min.messages": 10_000, "queued.max.messages.kbytes": 262_144, "fetch.queue.backoff.ms": 10,
                "fetch.wait.max.ms": 10}


@contextlib.contextmanager
def reader_consumer(kafka_conf: dict, pipeline: str) -> Iterator[tuple[Consumer, kafka_security.ErrorWatch]]:
    """A consumer for one reader task, with the error watch that turns a refused login into a task
    failure (not a stall); closed when the task is done.

    Not kept for the next task: reassigned to another range of a partition it read before, a
    kept consumer can stall on what it fetched for the old range (measured on 100k-record
    batches: with consumers kept, some batches' reads took 3-4x as long; without, reads were
    steady).
    """
    conf, watch = kafka_security.watched(kafka_conf)
    consumer = kafka_consumer(conf, f"lakehouse-reader-{pipeline}", **READER_FETCH)
    try:
        yield consumer, watch
    finally:
        consumer.close()


def make_reader(spec: PipelineSpec, kafka_conf: dict, quarantined: frozenset[str], ingested_at_us: int,
                batch_rows: int = 10_000, stall_timeout: float = 60.0, fault=None, timers=None,
                poisoned: Mapping[tuple[int, int], str] | None = None,
                writer_schemas: WriterSchemas = WriterSchemas()):
    """The function mapInArrow runs in each task: plan rows in, decoded batches out.

    `fault` (the fault hook's task probe, lakehouse.core.hooks) injects the tests' task-side faults.

    `timers`, when given, is a stage clock for the ops timeline: a pair
    `(read, decode)` of objects with `.add(float)`, e.g. two pyspark float
    Accumulators. Each task adds once, when it ends (also when it fails), the
    seconds it spent in `consumer.consume` to `read` and the seconds it spent
    decoding records and building Arrow batches to `decode`, measured with
    time.perf_counter per consume() call and per chunk of records, not per
    record; the time a task waits for Spark to take a batch counts as neither.

    `poisoned` maps (partition, offset) to a reason: each such record is
    dead-lettered as `reader_failure` with the reason as its detail, without being
    decoded. The driver fills it from the marker of a failed task: an error a task
    does not expect is raised with `errors.task_marker("record-failure", topic=...,
    partition=..., offset=...)` in its message (see `read_ranges`).

    `writer_schemas` is what the driver says about writer schemas beyond those shipped with `spec`
    (writer_schemas.WriterSchemas): tasks never talk to a schema registry; an id they were not shipped stops
    the task (SchemaUnknownError) for the driver to resolve, when it can.
    """
    poisoned = dict(poisoned or {})

    def read(plan_batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sparkenv.steady_zip_imports()
        clock = StageClock()
        validator = RecordValidator(spec, quarantined, writer_schemas=writer_schemas)
        builder = BatchBuilder(spec, validator, ingested_at_us)
        try:
            ranges = [OffsetRange(row["topic"], row["partition"], row["start"], row["end"])
                      for plan in plan_batches for row in plan.to_pylist()]
            with reader_consumer(kafka_conf, spec.name) as (consumer, watch):
                yield from read_ranges(consumer, ranges, builder, batch_rows, stall_timeout, fault, clock,
                                       watch=watch, poisoned=poisoned)
        finally:
            clock.report(timers)

    return read


def _epoch_ms(moment: datetime | None) -> int | None:
    """Milliseconds since the epoch of a timestamp read back from a table (naive means UTC), exactly."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _ONE_MILLISECOND


def make_redecoder(spec: PipelineSpec, quarantined: frozenset[str], ingested_at_us: int, timers=None,
                   writer_schemas: WriterSchemas = WriterSchemas()):
    """The mapInArrow function that decodes dead letters again (after a contract fix).

    `timers` is the stage clock of `make_reader`; nothing is read from Kafka, so
    each task adds 0 to `read` and its decoding seconds to `decode`.
    """

    def redecode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        clock = StageClock()
        builder = BatchBuilder(spec, RecordValidator(spec, quarantined, writer_schemas=writer_schemas), ingested_at_us)
        try:
            for batch in batches:
                decoding = time.perf_counter()
                for row in batch.to_pylist():
                    k = row["_kafka"]
                    headers = [(h["key"], h["value"]) for h in row["headers"] or []]
                    builder.add(k["topic"], k["partition"], k["offset"], _epoch_ms(k["timestamp"]), row["key"],
                                row["value"], headers)
                    if builder.size >= 10_000:
                        out = builder.flush()
                        clock.decode_s += time.perf_counter() - decoding
                        yield out
                        decoding = time.perf_counter()
                clock.decode_s += time.perf_counter() - decoding
            if builder.size:
                decoding = time.perf_counter()
                out = builder.flush()
                clock.decode_s += time.perf_counter() - decoding
                yield out
        finally:
            clock.report(timers)

    return redecode
