"""Offsets are data: they travel in each Iceberg commit's snapshot summary.

Every ingest commit records, under `lakehouse.*` summary keys (`SnapshotSummary` of
lakehouse.core.table_properties), the pipeline, the topic and its id, the Kafka offset
range `[start, end)` per partition it covers, and the resulting position (next offset
to read) per partition. The table, not a checkpoint folder, is the source of truth for
resume: `read_progress` walks the
table's current snapshot and its ancestors (`main_ancestry`, the one walk of a table's
history) back to the newest commit of the pipeline (`resume_point`, the one implementation
of a table's committed position); `committed_positions` is the pipeline's across its tables.

Resume fails closed: a table that holds rows but whose walk ends before a commit
carrying the pipeline's positions (expired history, rows written by something else)
reports `TableProgress.lost` instead of an empty position, and the ingest job stops
on it rather than read the topic again from its earliest offset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from lakehouse.core.errors import PositionsLostError
from lakehouse.core.table_properties import SnapshotSummary


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets `[start, end)` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self):
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"invalid offset range {self}")

    @property
    def count(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@[{self.start},{self.end})"


def encode_ranges(ranges: dict[int, tuple[int, int]]) -> str:
    return json.dumps({str(p): [s, e] for p, (s, e) in sorted(ranges.items())}, separators=(",", ":"))


def decode_ranges(text: str | None) -> dict[int, tuple[int, int]]:
    if not text:
        return {}
    return {int(p): (int(s), int(e)) for p, (s, e) in json.loads(text).items()}


def encode_positions(positions: dict[int, int]) -> str:
    return json.dumps({str(p): o for p, o in sorted(positions.items())}, separators=(",", ":"))


def decode_positions(text: str | None) -> dict[int, int]:
    if not text:
        return {}
    return {int(p): int(o) for p, o in json.loads(text).items()}


def commit_summary(pipeline: str, kind: str, topic: str, ranges: Mapping[int, tuple[int, int]], batch_id: str, *,
                   topic_id: str | None = None, positions: Mapping[int, int] | None = None, writer: str | None = None,
                   gaps: Mapping[int, tuple[int, int]] | None = None, max_event_time: datetime | None = None,
                   min_kafka_time: datetime | None = None) -> dict[str, str]:
    """The `lakehouse.*` snapshot summary of one commit of a pipeline, the one place it is put together
    (ingest, replay, the benchmark's made-up commits; read back by `progress_of` and lakehouse.audit).

    `kind` is ingest, replay or dead-letter-replay; `ranges` the offsets the commit holds; `positions` the
    pipeline's positions after it (ingest only); `gaps` the offsets that aged out of Kafka before they were
    ingested (left out when empty); `max_event_time` the newest event time, `min_kafka_time` the oldest
    Kafka timestamp read; each optional one left out when None.
    """
    summary = {SnapshotSummary.PIPELINE: pipeline, SnapshotSummary.KIND: kind, SnapshotSummary.TOPIC: topic,
               SnapshotSummary.RANGES: encode_ranges(dict(ranges)), SnapshotSummary.BATCH: batch_id}
    optional = {SnapshotSummary.TOPIC_ID: topic_id,
                SnapshotSummary.POSITIONS: encode_positions(dict(positions)) if positions is not None else None,
                SnapshotSummary.WRITER: writer,
                SnapshotSummary.GAPS: encode_ranges(dict(gaps)) if gaps else None,
                SnapshotSummary.MAX_EVENT_TIME: max_event_time.isoformat() if max_event_time is not None else None,
                SnapshotSummary.MIN_KAFKA_TIME: min_kafka_time.isoformat() if min_kafka_time is not None else None}
    summary.update({key: value for key, value in optional.items() if value is not None})
    return summary


@dataclass(frozen=True)
class TableProgress:
    """What one table holds of one pipeline, read from its snapshot history."""

    table: str
    exists: bool
    positions: dict[int, int] = field(default_factory=dict)
    topic_id: str | None = None
    snapshot_id: int | None = None      # newest snapshot carrying the pipeline's positions
    committed_at: datetime | None = None
    max_event_time: datetime | None = None
    current_snapshot_id: int | None = None
    total_records: int = 0
    snapshot_count: int = 0
    lost: str | None = None             # why the positions cannot be known although the table holds rows

    def position(self, partition: int) -> int | None:
        return self.positions.get(partition)

    def require_positions(self) -> TableProgress:
        """This progress, or PositionsLostError when the table's positions cannot be found."""
        if self.lost:
            raise PositionsLostError(self.lost)
        return self


@dataclass(frozen=True)
class ResumePoint:
    """Where `main`'s history says a pipeline stands: the newest ancestor of the head carrying the
    pipeline's positions, and the snapshots a reader walks to reach it."""

    snapshot: Snapshot | None  # None when no reachable ancestor carries positions
    chain: tuple[int, ...]     # snapshot ids from main's head down to `snapshot` (inclusive)
    broken_at: int | None      # a parent id the walk could not find (expired), when it stopped early


def carries_positions(snapshot: Snapshot, pipeline: str) -> bool:
    """Whether `snapshot` is an ingest commit of `pipeline` (its summary records positions)."""
    props = summary_properties(snapshot)
    return props.get(SnapshotSummary.PIPELINE) == pipeline and SnapshotSummary.POSITIONS in props


def main_ancestry(metadata: TableMetadata) -> Iterator[Snapshot]:
    """`main`'s head and its ancestors, newest first, lazily; the walk ends where history was expired
    (a parent no longer in `metadata`). The one walk of a table's history (pyiceberg's `ancestors_of`)
    that resume, the ingest-commit listing and maintenance use."""
    return iter(ancestors_of(metadata.current_snapshot(), metadata))  # typed Iterable, made as a generator


def ingest_commits(table: Table, pipeline: str) -> list[Snapshot]:
    """The ingest commits of `pipeline` that landed on `main` (its retained history), oldest first;
    staged snapshots of attempts that were never published are not among them."""
    return [snap for snap in reversed(list(main_ancestry(table.metadata))) if carries_positions(snap, pipeline)]


def resume_point(metadata: TableMetadata, pipeline: str) -> ResumePoint:
    """The ResumePoint of `pipeline` in table metadata `metadata` (walking `main`'s ancestry)."""
    chain: list[int] = []
    last: Snapshot | None = None
    for snap in main_ancestry(metadata):
        chain.append(snap.snapshot_id)
        if carries_positions(snap, pipeline):
            return ResumePoint(snap, tuple(chain), None)
        last = snap
    return ResumePoint(None, tuple(chain), last.parent_snapshot_id if last is not None else None)


def summary_properties(snapshot) -> dict[str, str]:
    summary = snapshot.summary
    if summary is None:
        return {}
    props = dict(summary.additional_properties)
    props["operation"] = str(summary.operation.value) if summary.operation else ""
    return props


def progress_of(table: Table, name: str, pipeline: str) -> TableProgress:
    """What table `table` (named `name`) holds of `pipeline`; `lost` says why not when it holds rows
    but its positions cannot be found."""
    current = table.current_snapshot()
    snapshot_count = len(table.metadata.snapshots)
    if current is None:
        return TableProgress(table=name, exists=True, snapshot_count=snapshot_count)
    total = int(summary_properties(current).get("total-records", 0))
    point = resume_point(table.metadata, pipeline)
    snap = point.snapshot
    if snap is not None:
        props = summary_properties(snap)
        event_time = props.get(SnapshotSummary.MAX_EVENT_TIME)
        return TableProgress(
            table=name, exists=True,
            positions=decode_positions(props[SnapshotSummary.POSITIONS]),
            topic_id=props.get(SnapshotSummary.TOPIC_ID) or None,
            snapshot_id=snap.snapshot_id,
            committed_at=datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=UTC),
            max_event_time=datetime.fromisoformat(event_time) if event_time else None,
            current_snapshot_id=current.snapshot_id,
            total_records=total,
            snapshot_count=snapshot_count,
        )
    lost = None
    if total > 0:
        if point.broken_at is not None:
            lost = (f"table {name} holds {total} rows, but its history was expired between the head "
                    f"{current.snapshot_id} and the newest commit carrying pipeline {pipeline!r}'s positions "
                    f"(parent snapshot {point.broken_at} is gone), so nobody can tell which offsets it holds. "
                    f"Reading the topic again from its earliest offset would duplicate rows, so the job stops. "
                    f"Point the catalog back at a metadata file that still has the positions snapshot (see "
                    f"`previous_metadata_location` in the catalog), or move the table aside and ingest the "
                    f"topic again into a new table.")
        else:
            lost = (f"table {name} holds {total} rows, but no commit of pipeline {pipeline!r} with positions is in "
                    f"its history (the rows were written by something else, e.g. a replay into a new table), so "
                    f"ingesting from the earliest offset would duplicate them. Ingest into an empty table, or "
                    f"drop the rows first.")
    return TableProgress(table=name, exists=True, current_snapshot_id=current.snapshot_id,
                         total_records=total, snapshot_count=snapshot_count, lost=lost)


def read_progress(catalog: Catalog, table: str, pipeline: str) -> TableProgress:
    """The pipeline's committed progress in `table` (namespace.name); empty if none yet."""
    try:
        loaded = catalog.load_table(table)
    except NoSuchTableError:
        return TableProgress(table=table, exists=False)
    return progress_of(loaded, table, pipeline)


def committed_positions(progress: Iterable[TableProgress], earliest: Mapping[int, int] | None = None,
                        ) -> dict[int, int]:
    """The pipeline's committed position per partition: the next offset it reads there, the lowest
    position over its tables (`progress`: one TableProgress per table of `spec.positioned_tables`),
    since each table holds every offset of the pipeline below its own position. The one
    implementation of "where a pipeline stands" across its tables: ingest plans from it, status,
    supervision, replay, backfill and cutover report and check against it.

    A table that holds no position in a partition yet reads it from the oldest offset Kafka still
    holds: with `earliest` (partition -> that offset, e.g. the ingest plan's `TopicState.earliest`), every
    partition of `earliest` is answered, such a table counting as standing at the earliest offset
    (a position below it is a gap: records that aged out before they were ingested). Without
    `earliest`, only the partitions every table holds a position in are answered.
    """
    tables = [tp.positions for tp in progress]
    if earliest is None:
        held = set.intersection(*map(set, tables)) if tables else set()
        return {p: min([positions[p] for positions in tables]) for p in sorted(held)}
    if not tables:
        return dict(earliest)
    return {p: min([positions.get(p, low) for positions in tables]) for p, low in earliest.items()}
