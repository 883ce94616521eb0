"""Offsets are data: they travel in each Iceberg commit's snapshot summary.

Every ingest commit records, under `lakehouse.*` summary keys, the pipeline, the
topic and its id, the Kafka offset range `[start, end)` per partition it covers,
and the resulting position (next offset to read) per partition. The table, not a
checkpoint folder, is the source of truth for resume: `read_progress` walks the
table's current snapshot and its ancestors back to the newest commit of the
pipeline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakehouse.config import PlatformConfig

PREFIX = "lakehouse."
K_PIPELINE = PREFIX + "pipeline"
K_KIND = PREFIX + "kind"            # ingest | replay | dead-letter-replay
K_TOPIC = PREFIX + "topic"
K_TOPIC_ID = PREFIX + "topic-id"
K_RANGES = PREFIX + "offsets"       # {"partition": [start, end)} contained in this commit
K_POSITIONS = PREFIX + "positions"  # {"partition": next offset} after this commit (ingest only)
K_BATCH = PREFIX + "batch-id"
K_MAX_EVENT_TIME = PREFIX + "max-event-time"
K_GAPS = PREFIX + "gaps"            # {"partition": [start, end)} aged out of Kafka before ingestion
K_MIN_KAFKA_TIME = PREFIX + "min-kafka-time"  # oldest Kafka timestamp read by the batch (ingest only)


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

    def position(self, partition: int) -> int | None:
        return self.positions.get(partition)


def open_catalog(platform: PlatformConfig, name: str) -> Catalog:
    """The pyiceberg view of the JDBC catalog Spark writes (same database, same tables).

    An s3:// or s3a:// warehouse gets the object store's endpoint, addressing style and
    region (LAKEHOUSE_S3_*); credentials come from the AWS environment, as on the JVM side.
    """
    io_properties = platform.object_store.pyiceberg_properties() if platform.warehouse_on_s3 else {}
    return SqlCatalog(name, uri=platform.catalog_uri, warehouse=platform.warehouse, **io_properties)


def summary_properties(snapshot) -> dict[str, str]:
    summary = snapshot.summary
    if summary is None:
        return {}
    props = dict(summary.additional_properties)
    props["operation"] = str(summary.operation.value) if summary.operation else ""
    return props


def progress_of(table: Table, name: str, pipeline: str) -> TableProgress:
    current = table.current_snapshot()
    if current is None:
        return TableProgress(table=name, exists=True, snapshot_count=len(table.snapshots()))
    props = summary_properties(current)
    total = int(props.get("total-records", 0))
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    snap = current
    while snap is not None:
        props = summary_properties(snap)
        if props.get(K_PIPELINE) == pipeline and K_POSITIONS in props:
            event_time = props.get(K_MAX_EVENT_TIME)
            return TableProgress(
                table=name, exists=True,
                positions=decode_positions(props[K_POSITIONS]),
                topic_id=props.get(K_TOPIC_ID) or None,
                snapshot_id=snap.snapshot_id,
                committed_at=datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=timezone.utc),
                max_event_time=datetime.fromisoformat(event_time) if event_time else None,
                current_snapshot_id=current.snapshot_id,
                total_records=total,
                snapshot_count=len(by_id),
            )
        snap = by_id.get(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return TableProgress(table=name, exists=True, current_snapshot_id=current.snapshot_id,
                         total_records=total, snapshot_count=len(by_id))


def read_progress(catalog: Catalog, table: str, pipeline: str) -> TableProgress:
    """The pipeline's committed progress in `table` (namespace.name); empty if none yet."""
    try:
        loaded = catalog.load_table(table)
    except NoSuchTableError:
        return TableProgress(table=table, exists=False)
    return progress_of(loaded, table, pipeline)
