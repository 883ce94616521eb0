"""The ops timeline: one Iceberg table, `ops.pipeline_events`, one row per thing that happened.

Restarts, maintenance runs, quality results, publications, cutovers, rollbacks,
retention checks, backfills, retries after transient failures, writer claims
and fencings, and layout changes (a table following its edited spec) each append one event, so the Airflow page, `lakehouse
status` and ad-hoc SQL read the same history:

    SELECT ts, kind, status, message, metrics['lag_records']
    FROM lake.ops.pipeline_events WHERE pipeline = 'orders' ORDER BY ts DESC

`record()` appends with pyiceberg (no Spark needed, so sensors and callbacks can
call it) and retries when another writer commits first. `recent()` reads events back,
newest first.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import AlwaysTrue, And, EqualTo, GreaterThanOrEqual
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import DoubleType, MapType, NestedField, StringType, TimestamptzType

from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import ConfigurationError

EVENTS_TABLE = "ops.pipeline_events"
KINDS = ("batch", "restart", "hung", "maintenance", "retention", "quality", "publish", "cutover", "rollback",
         "backfill", "replay", "gap", "retry", "writer", "layout")
STATUSES = ("ok", "warn", "failed", "skipped")
COMMIT_ATTEMPTS = 10
# One commit per event call: merge manifests as they pile up and keep only recent metadata files,
# so appends and scans stay cheap between maintenance runs (which compact files and expire snapshots).
PROPERTIES = {"format-version": "2", "commit.manifest-merge.enabled": "true",
              "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "20"}

SCHEMA = Schema(
    NestedField(1, "event_id", StringType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "pipeline", StringType(), required=True),
    NestedField(4, "kind", StringType(), required=True),
    NestedField(5, "status", StringType(), required=True),
    NestedField(6, "message", StringType(), required=False),
    NestedField(7, "metrics", MapType(8, StringType(), 9, DoubleType(), value_required=False), required=False),
    NestedField(10, "details", StringType(), required=False, doc="JSON object"),
)
PARTITIONING = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"))
_ARROW = pa.schema([
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("pipeline", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("message", pa.string()),
    pa.field("metrics", pa.map_(pa.string(), pa.float64())),
    pa.field("details", pa.string()),
])


class EventError(ConfigurationError):
    """An event that does not fit the timeline (unknown kind or status)."""


@dataclass(frozen=True)
class Event:
    pipeline: str
    kind: str
    status: str = "ok"
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    ts: datetime | None = None
    event_id: str | None = None

    def row(self) -> dict:
        return {
            "event_id": self.event_id or uuid.uuid4().hex,
            "ts": self.ts or datetime.now(timezone.utc),
            "pipeline": self.pipeline,
            "kind": self.kind,
            "status": self.status,
            "message": self.message,
            "metrics": [(k, None if v is None else float(v)) for k, v in self.metrics.items()],
            "details": json.dumps(self.details, default=str, sort_keys=True),
        }


def events_table(platform: config.PlatformConfig | None = None, catalog: str = "lake"):
    """The `ops.pipeline_events` table, created on first use."""
    cat = open_catalog(platform or config.load(), catalog)
    try:
        return cat.load_table(EVENTS_TABLE)  # every call after the first: one catalog read
    except NoSuchTableError:
        pass
    try:
        cat.create_namespace("ops")
    except NamespaceAlreadyExistsError:
        pass
    try:
        return cat.create_table(EVENTS_TABLE, schema=SCHEMA, partition_spec=PARTITIONING, properties=PROPERTIES)
    except TableAlreadyExistsError:  # another process created it meanwhile
        return cat.load_table(EVENTS_TABLE)


def record(*events: Event, platform: config.PlatformConfig | None = None, catalog: str = "lake") -> None:
    """Append events to the timeline in one commit; retried when a concurrent writer wins.

    Raises EventError for an unknown kind or status, CommitFailedException after
    COMMIT_ATTEMPTS lost races.
    """
    for event in events:
        if event.kind not in KINDS:
            raise EventError(f"unknown event kind {event.kind!r}; one of {', '.join(KINDS)}")
        if event.status not in STATUSES:
            raise EventError(f"unknown event status {event.status!r}; one of {', '.join(STATUSES)}")
    data = pa.Table.from_pylist([e.row() for e in events], schema=_ARROW)
    table = events_table(platform, catalog)
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            table.append(data)
            return
        except CommitFailedException:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
            table = table.refresh()


def _rows(arrow: pa.Table) -> list[dict]:
    rows = arrow.to_pylist()
    for row in rows:
        row["metrics"] = dict(row["metrics"] or [])
        row["details"] = json.loads(row["details"] or "{}")
    return rows


def digest(pipeline: str, since: datetime, batches: int = 60, platform: config.PlatformConfig | None = None,
           catalog: str = "lake") -> dict:
    """One scan of a pipeline's events since `since`: {"batches": the newest `batches` batch events,
    newest first, "latest": {kind: the newest event of that kind}} (kinds without events are absent)."""
    table = events_table(platform, catalog)
    arrow = table.scan(row_filter=And(EqualTo("pipeline", pipeline), GreaterThanOrEqual("ts", since.isoformat()))) \
        .to_arrow().sort_by([("ts", "descending")])
    kinds = arrow.column("kind")
    latest = {}
    for kind in KINDS:
        at = pc.index(kinds, kind).as_py()
        if at >= 0:
            latest[kind] = _rows(arrow.slice(at, 1))[0]
    newest = arrow.filter(pc.equal(kinds, "batch")).slice(0, batches)
    return {"batches": _rows(newest), "latest": latest}


def recent(pipeline: str | None = None, kind: str | None = None, since: datetime | None = None,
           limit: int = 100, platform: config.PlatformConfig | None = None, catalog: str = "lake") -> list[dict]:
    """Events newest first, as dicts (metrics as a dict, details parsed), optionally filtered."""
    table = events_table(platform, catalog)
    condition = AlwaysTrue()
    if pipeline is not None:
        condition = And(condition, EqualTo("pipeline", pipeline))
    if kind is not None:
        condition = And(condition, EqualTo("kind", kind))
    if since is not None:
        condition = And(condition, GreaterThanOrEqual("ts", since.isoformat()))
    return _rows(table.scan(row_filter=condition).to_arrow().sort_by([("ts", "descending")]).slice(0, limit))
