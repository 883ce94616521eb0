"""Source coordinates: what the commits say the tables hold, what Kafka holds, what the rows hold.

Every row carries `_kafka {topic, partition, offset, timestamp, key}` and every commit of a
pipeline records, in its snapshot summary, the offsets it holds (`lakehouse.offsets`), the
offsets that aged out before ingestion (`lakehouse.gaps`) and the positions after it
(lakehouse.core.offsets). `lakehouse.audit.trace` (where is one record?) and
`lakehouse.audit.verify` (is every offset of a range exactly once?) read the same three
sources through this module:

- `Intervals` and `Coverage` (lakehouse.audit.intervals): offsets of one partition, and of a topic,
  as disjoint half-open intervals, in which the functions below answer;
- `lineage(table, pipeline)`: the snapshots of `main`'s history as `Commit`s, newest first, with
  what each summary says, and `pinned(table, snapshot_id)`, the table as of one of them;
- `read_kafka(consumer, range)`: the coordinates of the records Kafka delivers in an offset
  range (offset, timestamp, key, tombstone), read with the ingest reader's consumer settings, so
  that transaction markers and aborted records are skipped exactly as ingestion skips them;
- `read_rows(...)`: rows' `_kafka` coordinates (and chosen columns) of a table as of a snapshot,
  with a row filter on `_kafka.partition`/`_kafka.offset` that prunes data files by the bounds
  the task writer records for them (lakehouse.ingest.taskwriter), so finding a few offsets in a
  table of millions of rows reads a few files, not the table.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyiceberg import conversions
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    LessThan,
    Or,
)
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.types import IcebergType, IntegerType, LongType

from lakehouse.audit.intervals import Coverage
from lakehouse.core import offsets
from lakehouse.core.errors import BrokerStalledError, SourceError
from lakehouse.core.offsets import OffsetRange
from lakehouse.core.table_properties import SnapshotSummary

# -------------------------------------------------------------------------- what the commits say


@dataclass(frozen=True)
class Commit:
    """One snapshot of a table's `main` history and what its summary says about the pipeline."""

    table: str
    snapshot_id: int
    parent_id: int | None
    at: datetime
    operation: str                  # append | overwrite | delete | replace
    kind: str | None                # ingest | replay | dead-letter-replay; None: not a commit of the pipeline
    ranges: Coverage                # offsets the commit holds (lakehouse.offsets)
    gaps: Coverage                  # offsets that aged out before ingestion (lakehouse.gaps)
    positions: dict[int, int] | None  # the pipeline's positions after an ingest commit, else None
    batch_id: str | None

    @property
    def timestamp_ms(self) -> int:
        return int(self.at.timestamp() * 1000)

    def to_json(self) -> dict:
        return {"table": self.table, "snapshot_id": self.snapshot_id, "at": self.at.isoformat(),
                "operation": self.operation, "kind": self.kind, "batch_id": self.batch_id}


def commit_of(snapshot, table: str, pipeline: str) -> Commit:
    """The Commit a pyiceberg `snapshot` of `table` is for `pipeline`."""
    props = offsets.summary_properties(snapshot)
    ours = props.get(SnapshotSummary.PIPELINE) == pipeline
    return Commit(
        table=table, snapshot_id=snapshot.snapshot_id, parent_id=snapshot.parent_snapshot_id,
        at=datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC),
        operation=props.get("operation", ""),
        kind=(props.get(SnapshotSummary.KIND) or "ingest") if ours else None,
        ranges=Coverage.of_ranges(offsets.decode_ranges(props.get(SnapshotSummary.RANGES))) if ours else Coverage(),
        gaps=Coverage.of_ranges(offsets.decode_ranges(props.get(SnapshotSummary.GAPS))) if ours else Coverage(),
        positions=offsets.decode_positions(props[SnapshotSummary.POSITIONS])
        if ours and SnapshotSummary.POSITIONS in props else None,
        batch_id=props.get(SnapshotSummary.BATCH) if ours else None,
    )


@dataclass(frozen=True)
class Lineage:
    """A table's history from one snapshot back: `commits` newest first; `complete` when it reaches the
    table's first snapshot (nothing expired in between), so the oldest commit is the table's first."""

    table: str
    commits: tuple[Commit, ...]
    complete: bool

    def containing(self, partition: int, offset: int) -> list[Commit]:
        """The commits of the pipeline whose ranges hold the offset, newest first."""
        return [c for c in self.commits if c.kind and (partition, offset) in c.ranges]

    def gaps(self) -> Coverage:
        """Every gap the pipeline's commits recorded."""
        found = Coverage()
        for commit in self.commits:
            found = found.union(commit.gaps)
        return found

    def floor(self) -> dict[int, int]:
        """Per partition, the first offset the table's ingest commits hold or skipped as a gap, when the
        history is complete (else {}): no row below it can have come from the pipeline's ingestion."""
        if not self.complete:
            return {}
        low: dict[int, int] = {}
        for commit in self.commits:
            if commit.kind != "ingest":
                continue
            for p, iv in commit.ranges.union(commit.gaps).partitions.items():
                low[p] = min(low.get(p, iv.spans[0][0]), iv.spans[0][0])
        return low


def lineage(table: Table, name: str, pipeline: str, snapshot_id: int | None = None) -> Lineage:
    """The Lineage of `table` (named `name`) from `snapshot_id` (default: main's head) back, walked with
    pyiceberg's `ancestors_of` as lakehouse.core.offsets.main_ancestry walks it."""
    start = table.metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else table.current_snapshot()
    snapshots = list(ancestors_of(start, table.metadata)) if start is not None else []
    complete = not snapshots or snapshots[-1].parent_snapshot_id is None
    return Lineage(name, tuple(commit_of(s, name, pipeline) for s in snapshots), complete)


def integer_bound(field_type: IcebergType, data: bytes) -> int | None:
    """A data file's lower or upper bound `data` of an int or long column (`_kafka.partition`,
    `_kafka.offset`), decoded; None for a column of another type, whose bounds place no coordinates.
    (pyiceberg's from_bytes is typed as returning any of its literal types.)"""
    if not isinstance(field_type, (IntegerType, LongType)):
        return None
    value: object = conversions.from_bytes(field_type, data)
    return value if isinstance(value, int) else None


def pinned(table: Table, snapshot_id: int) -> Table:
    """`table` as of `snapshot_id`: its `main` head is that snapshot (for lakehouse.core.offsets.progress_of)."""
    metadata = table.metadata.model_copy(update={"current_snapshot_id": snapshot_id})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog)


def is_on_main(table: Table, snapshot_id: int) -> bool:
    """Whether `snapshot_id` is main's head or one of its ancestors still in the table."""
    return any(s.snapshot_id == snapshot_id for s in offsets.main_ancestry(table.metadata))


# -------------------------------------------------------------------------- what Kafka holds

KAFKA_RECORDS = pa.schema([
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp_ms", pa.int64()),   # null when the record has none
    pa.field("key", pa.string()),           # the key as `_kafka.key` shows it: UTF-8 text, else null
    pa.field("tombstone", pa.bool_(), nullable=False),
])
CONSUME_CHUNK = 5_000


def _key_text(key) -> str | None:
    try:
        return key.decode("utf-8") if type(key) is bytes else None
    except UnicodeDecodeError:
        return None


def read_kafka(consumer: Consumer, rng: OffsetRange, stall_timeout: float = 30.0,
               with_keys: bool = False, on_record: Callable[[Any, Any], None] | None = None) -> pa.Table:
    """The records Kafka delivers in `rng` (KAFKA_RECORDS rows, in offset order), values not decoded.

    `consumer` reads with the ingest reader's settings (lakehouse.ingest.reader.reader_consumer):
    committed records only, so transaction markers and aborted records hold no offset here, as they
    hold no row in the tables. Keys and tombstone flags are kept with `with_keys` (else null key).
    `on_record(key, value)` is called with the raw key and value of each record returned, in order.
    The read ends at the range's end or where the partition ends (end-of-partition), whichever
    comes first. Raises BrokerStalledError when nothing comes for `stall_timeout` seconds before
    either, SourceError for a Kafka error (an offset deleted meanwhile, an unknown partition).
    """
    offsets_found: list[int] = []
    stamps: list[int | None] = []
    keys: list[str | None] = []
    tombstones: list[bool] = []
    if rng.count > 0:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        position, last_progress = rng.start, time.monotonic()
        collecting = gc.isenabled()
        gc.disable()  # thousands of short-lived Message objects per call; they hold no cycles
        try:
            while position < rng.end:
                msgs = consumer.consume(num_messages=min(CONSUME_CHUNK, rng.end - position), timeout=0.5)
                if not msgs and time.monotonic() - last_progress > stall_timeout:
                    raise BrokerStalledError(f"{rng}: no records past offset {position} for {stall_timeout:.0f}s; "
                                             f"is the broker healthy?")
                for msg in msgs:
                    if msg.partition() != rng.partition:
                        continue
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            position = rng.end  # the log ends here: nothing more to find in the range
                            break
                        raise SourceError(f"{rng}: reading offset {position}: {err.str()}")
                    offset = msg.offset()
                    if offset is None or offset < position:  # a record without an error has an offset
                        continue
                    if offset >= rng.end:
                        position = rng.end
                        break
                    ts_type, ts = msg.timestamp()
                    offsets_found.append(offset)
                    stamps.append(ts if ts_type != 0 else None)
                    if with_keys:
                        keys.append(_key_text(msg.key()))
                        tombstones.append(msg.value() is None)
                    if on_record is not None:
                        on_record(msg.key(), msg.value())
                    position = offset + 1
                if msgs:
                    last_progress = time.monotonic()
        finally:
            if collecting:
                gc.enable()
    n = len(offsets_found)
    return pa.Table.from_arrays([
        pa.array(np.full(n, rng.partition, dtype=np.int32)),
        pa.array(offsets_found, pa.int64()),
        pa.array(stamps, pa.int64()),
        pa.array(keys if with_keys else [None] * n, pa.string()),
        pa.array(tombstones if with_keys else [False] * n, pa.bool_()),
    ], schema=KAFKA_RECORDS)


# -------------------------------------------------------------------------- what the rows hold

COORDINATES = ("_kafka.topic", "_kafka.partition", "_kafka.offset")


def window_filter(window: Coverage) -> BooleanExpression:
    """Rows whose `_kafka.partition`/`_kafka.offset` lie in `window` (one conjunction per interval)."""
    condition: BooleanExpression = AlwaysFalse()
    for p, iv in window.partitions.items():
        for start, end in iv:
            in_range = And(GreaterThanOrEqual(term="_kafka.offset", value=start),
                           LessThan(term="_kafka.offset", value=end))
            condition = Or(condition, And(EqualTo(term="_kafka.partition", value=p), in_range))
    return condition


def coordinate_filter(partition: int, offset: int, topic: str | None = None) -> BooleanExpression:
    """Rows of exactly this record (of `topic` when given)."""
    found = And(EqualTo(term="_kafka.partition", value=partition), EqualTo(term="_kafka.offset", value=offset))
    return And(EqualTo(term="_kafka.topic", value=topic), found) if topic is not None else found


def plan_files(table: Table, snapshot_id: int, row_filter: BooleanExpression = AlwaysTrue()) -> list[FileScanTask]:
    """The data files of `table` as of `snapshot_id` that may hold rows matching `row_filter` (pruned by
    partition values and column bounds), with the delete files that apply to them."""
    return list(table.scan(snapshot_id=snapshot_id, row_filter=row_filter).plan_files())


def read_rows(table: Table, snapshot_id: int, row_filter: BooleanExpression = AlwaysTrue(),
              columns: tuple[str, ...] = COORDINATES, tasks: list[FileScanTask] | None = None) -> pa.Table:
    """The rows of `table` as of `snapshot_id` matching `row_filter` (deleted rows left out), with the
    `columns` asked for (nested ones as `_kafka.offset`), flattened: `_kafka.offset` becomes a column
    named `_kafka.offset`. `tasks` (from `plan_files` with a wider filter) spares planning again."""
    scan = table.scan(snapshot_id=snapshot_id, row_filter=row_filter, selected_fields=columns)
    if tasks is None:
        tasks = list(scan.plan_files())
    data = ArrowScan(scan.table_metadata, scan.io, scan.projection(), scan.row_filter,
                     scan.case_sensitive).to_table(tasks)
    return flatten(data, columns)


def flatten(data: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """`data` (a scan's result) with each of `columns` (`a` or `a.b`) as a top-level column of that name."""
    arrays = []
    for name in columns:
        parent, _, child = name.partition(".")
        column = data.column(parent)
        arrays.append(pc.struct_field(column, child) if child else column)
    return pa.Table.from_arrays(arrays, names=list(columns))
