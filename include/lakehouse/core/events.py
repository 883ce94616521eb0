"""The ops timeline: one Iceberg table, `ops.pipeline_events`, one row per thing that happened.

Restarts, maintenance runs, quality results, exactly-once verifications, publications,
cutovers, rollbacks, retention checks and the retention guard's changes, backfills, retries
after transient failures, writer claims and fencings, schema evolutions and layout changes (a
table following its edited spec) each append one event, so the Airflow page, `lakehouse
status` and ad-hoc SQL read the same history:

    SELECT ts, kind, status, actor, message, metrics['lag_records']
    FROM lake.ops.pipeline_events WHERE pipeline = 'orders' ORDER BY ts DESC

Operator actions (replays, backfills, cutovers, rollbacks, publications, maintenance runs,
retention changes) are audited: their event names the `actor` (the Airflow user who triggered
the DAG run, `scheduler` for a run nobody triggered, or the OS user of a command; `details.actor`
says through what and from where) and `details.parameters` what was asked; its status and
message are the outcome. `audited()` records exactly one such event whether the action succeeds
or fails.

`record()` appends with pyiceberg (no Spark needed, so sensors and callbacks can
call it) and retries when another writer commits first. `recent()` reads events back,
newest first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import socket
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, GreaterThanOrEqual
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import DoubleType, MapType, NestedField, StringType, TimestamptzType

from lakehouse.core import config, retry
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import EventError, LakehouseError
from lakehouse.core.table_properties import IcebergProperties

log = logging.getLogger("lakehouse.events")

EVENTS_TABLE = "ops.pipeline_events"
KINDS = ("batch", "restart", "hung", "maintenance", "retention", "retention_guard", "quality", "publish", "cutover",
         "rollback", "backfill", "replay", "gap", "retry", "writer", "schema", "verify", "layout")
STATUSES = ("ok", "warn", "failed", "skipped")
COMMIT_ATTEMPTS = 10
# One commit per event call: merge manifests as they pile up and keep only recent metadata files,
# so appends and scans stay cheap between maintenance runs (which compact files and expire snapshots).
# Read-only: pyiceberg's create_table pops format-version out of the mapping it is given, so it gets a copy.
PROPERTIES = MappingProxyType({IcebergProperties.FORMAT_VERSION: "2", IcebergProperties.MANIFEST_MERGE_ENABLED: "true",
                               IcebergProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
                               IcebergProperties.METADATA_PREVIOUS_VERSIONS_MAX: "20"})

SCHEMA = Schema(
    NestedField(1, "event_id", StringType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "pipeline", StringType(), required=True),
    NestedField(4, "kind", StringType(), required=True),
    NestedField(5, "status", StringType(), required=True),
    NestedField(6, "message", StringType(), required=False),
    NestedField(7, "metrics", MapType(8, StringType(), 9, DoubleType(), value_required=False), required=False),
    NestedField(10, "details", StringType(), required=False, doc="JSON object"),
    # added after the first release: `events_table` adds it to a timeline created without it
    NestedField(11, "actor", StringType(), required=False, doc="who made an operator action happen"),
)
PARTITIONING = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"))
ARROW_SCHEMA = pa.schema([
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("pipeline", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("message", pa.string()),
    pa.field("metrics", pa.map_(pa.string(), pa.float64())),
    pa.field("details", pa.string()),
    pa.field("actor", pa.string()),
])
ACTIONS_SHOWN = 10  # operator actions `digest` returns
MAX_MESSAGE = 2000  # characters of an error kept in a failed action's message
# set by the Airflow operators for the jobs they start (spark-submit), read by `Actor.of_process`
AIRFLOW_RUN_ENV = "LAKEHOUSE_AIRFLOW_RUN"
SCHEDULER = "scheduler"  # the actor of a DAG run nobody triggered (scheduled, asset-triggered)


def _os_user() -> str:
    """The name of the user this process runs as (its effective uid; not $USER, which anyone can set)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        return str(os.geteuid())


@dataclass(frozen=True)
class Actor:
    """Who made an operator action happen.

    `user` is the Airflow user who triggered the DAG run (SCHEDULER for a run nobody triggered)
    or, for a command, the OS user it runs as; `via` is "airflow" or "cli"; `origin` says from
    where: the DAG run (dag_id, run_id, run_type, and `triggered_by`, the triggering user or None)
    or the host and process, and always the OS user the acting process ran as (`os_user`).
    """

    user: str
    via: str
    origin: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def airflow(cls, dag_id: str, run_id: str, run_type: str, triggering_user: str | None) -> Actor:
        """The actor of an Airflow DAG run: its triggering user, or SCHEDULER when nobody triggered it."""
        return cls(triggering_user or SCHEDULER, "airflow", {"dag_id": dag_id, "run_id": run_id, "run_type": run_type,
                                                             "triggered_by": triggering_user, "os_user": _os_user()})

    @classmethod
    def of_process(cls) -> Actor:
        """This process's actor: the Airflow run that started it (AIRFLOW_RUN_ENV, set by the operators
        for the Spark jobs they submit), else the OS user of the command, on this host."""
        text = os.environ.get(AIRFLOW_RUN_ENV)
        if text:
            try:
                run = json.loads(text)
                return cls(str(run["user"]), "airflow", {**{k: str(run[k]) for k in ("dag_id", "run_id", "run_type")},
                                                         "os_user": _os_user(), "host": socket.gethostname()})
            except (ValueError, TypeError, KeyError):
                log.warning("ignoring %s: not the JSON an Airflow operator sets (%.200s)", AIRFLOW_RUN_ENV, text)
        return cls(_os_user(), "cli", {"os_user": _os_user(), "host": socket.gethostname(), "pid": os.getpid()})

    def environment(self) -> dict[str, str]:
        """The variable that makes a process started for this actor (a Spark job) record it."""
        return {AIRFLOW_RUN_ENV: json.dumps({"user": self.user, **self.origin}, sort_keys=True)}

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "via": self.via, **self.origin}

    def __str__(self) -> str:
        if self.via == "airflow":
            return f"{self.user} (Airflow run {self.origin.get('dag_id')}/{self.origin.get('run_id')})"
        return f"{self.user} (command on {self.origin.get('host')})"


@dataclass(frozen=True)
class Event:
    pipeline: str
    kind: str
    status: str = "ok"
    message: str = ""
    metrics: Mapping[str, float | None] = field(default_factory=dict)  # None: not known (a null in the map)
    details: dict[str, Any] = field(default_factory=dict)
    ts: datetime | None = None
    event_id: str | None = None
    actor: Actor | None = None  # set on operator actions (see `audited`)

    def row(self) -> dict:
        details = self.details if self.actor is None else {**self.details, "actor": self.actor.to_json()}
        return {
            "event_id": self.event_id or uuid.uuid4().hex,
            "ts": self.ts or datetime.now(UTC),
            "pipeline": self.pipeline,
            "kind": self.kind,
            "status": self.status,
            "message": self.message,
            "metrics": [(k, None if v is None else float(v)) for k, v in self.metrics.items()],
            "details": json.dumps(details, default=str, sort_keys=True),
            "actor": None if self.actor is None else self.actor.user,
        }


def events_table(platform: config.PlatformConfig | None = None, catalog: str = "lake"):
    """The `ops.pipeline_events` table, created on first use."""
    cat = open_catalog(platform or config.load(), catalog)
    try:
        return _with_actor(cat.load_table(EVENTS_TABLE))  # every call after the first: one catalog read
    except NoSuchTableError:
        pass
    try:
        cat.create_namespace("ops")
    except NamespaceAlreadyExistsError:
        pass
    try:
        return cat.create_table(EVENTS_TABLE, schema=SCHEMA, partition_spec=PARTITIONING,
                                properties=dict(PROPERTIES))
    except TableAlreadyExistsError:  # another process created it meanwhile
        return _with_actor(cat.load_table(EVENTS_TABLE))


def _with_actor(table):
    """`table`, with the `actor` column added when it was created before there was one. Processes of
    the earlier release keep appending without it (an optional column they leave empty), and so does this
    process when other commits keep winning the race to the table (the next process adds it)."""
    def attempt(number: int):
        nonlocal table
        if number > 1:  # another commit (perhaps the same change) landed first
            table = table.refresh()
        if "actor" not in table.schema().column_names:
            with table.update_schema() as update:
                update.add_column("actor", StringType(), doc="who made an operator action happen")
        return table

    try:
        return retry.commit_conflicts(f"adding the actor column to {EVENTS_TABLE}", attempts=COMMIT_ATTEMPTS,
                                      error=CommitFailedException, first_wait_s=0.0).run(attempt)
    except CommitFailedException as exc:
        log.warning("%s; appending events without it", exc)
        return table.refresh()


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
    data = pa.Table.from_pylist([e.row() for e in events], schema=ARROW_SCHEMA)
    table = events_table(platform, catalog)

    def attempt(number: int) -> None:
        nonlocal table
        if number > 1:
            table = table.refresh()
        table.append(data)

    retry.commit_conflicts(f"appending {len(events)} event(s) to {EVENTS_TABLE}", attempts=COMMIT_ATTEMPTS,
                           error=CommitFailedException, first_wait_s=0.05, max_wait_s=0.5,
                           next_step="The events were not recorded; other processes keep appending to the "
                                     "timeline at the same moment: record them again.").run(attempt)


@dataclass
class Audit:
    """An operator action under way (see `audited`): what its event says when the action returns."""

    status: str = "ok"
    message: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def audited(pipeline: str, kind: str, actor: Actor, parameters: dict[str, Any],
            platform: config.PlatformConfig | None = None, catalog: str = "lake") -> Iterator[Audit]:
    """Carry out an operator action in the `with` block and record it as one `kind` event naming
    `actor`, with `parameters` under `details.parameters` and the outcome.

    Yields an Audit for the block to fill in (status, message, metrics, details). When the block
    returns, the event says what the Audit holds; when it raises, the event is `failed`, says the
    error and keeps the details gathered so far, and the error is raised on (a timeline that cannot
    be written then is logged: it must not hide the action's own error). Raises what `record`
    raises when the action succeeded but its event cannot be written.
    """
    audit = Audit()
    try:
        yield audit
    except Exception as exc:
        error = str(exc) if isinstance(exc, LakehouseError) else f"{type(exc).__name__}: {exc}"
        failed = Event(pipeline, kind, "failed", error[:MAX_MESSAGE], audit.metrics,
                       {**audit.details, "parameters": parameters}, actor=actor)
        try:
            record(failed, platform=platform, catalog=catalog)
        except Exception as unrecorded:  # noqa: BLE001 - the action's error is the one to report
            log.warning("could not record the failed %s of %s by %s: %s", kind, pipeline, actor, unrecorded)
        raise
    record(Event(pipeline, kind, audit.status, audit.message, audit.metrics,
                 {**audit.details, "parameters": parameters}, actor=actor), platform=platform, catalog=catalog)


def _rows(arrow: pa.Table) -> list[dict]:
    rows: list[dict] = arrow.to_pylist()
    for row in rows:
        row["metrics"] = dict(row["metrics"] or [])
        row["details"] = json.loads(row["details"] or "{}")
    return rows


def digest(pipeline: str, since: datetime, batches: int = 60, platform: config.PlatformConfig | None = None,
           catalog: str = "lake") -> dict:
    """One scan of a pipeline's events since `since`: {"batches": the newest `batches` batch events,
    newest first, "latest": {kind: the newest event of that kind} (kinds without events are absent),
    "actions": the newest ACTIONS_SHOWN operator actions people took (events naming an actor other
    than the scheduler), newest first}."""
    table = events_table(platform, catalog)
    row_filter = And(EqualTo(term="pipeline", value=pipeline), GreaterThanOrEqual(term="ts", value=since.isoformat()))
    arrow = table.scan(row_filter=row_filter).to_arrow().sort_by([("ts", "descending")])
    kinds = arrow.column("kind")
    latest = {}
    for kind in KINDS:
        at = pc.index(kinds, kind).as_py()
        if at >= 0:
            latest[kind] = _rows(arrow.slice(at, 1))[0]
    newest = arrow.filter(pc.equal(kinds, "batch")).slice(0, batches)
    actors = arrow.column("actor")  # people's actions: the scheduler's runs would crowd them out
    actions = arrow.filter(pc.and_(pc.is_valid(actors), pc.not_equal(actors, SCHEDULER))).slice(0, ACTIONS_SHOWN)
    return {"batches": _rows(newest), "latest": latest, "actions": _rows(actions)}


def recent(pipeline: str | None = None, kind: str | None = None, since: datetime | None = None,
           limit: int = 100, platform: config.PlatformConfig | None = None, catalog: str = "lake") -> list[dict]:
    """Events newest first, as dicts (metrics as a dict, details parsed), optionally filtered."""
    table = events_table(platform, catalog)
    condition: BooleanExpression = AlwaysTrue()
    if pipeline is not None:
        condition = And(condition, EqualTo(term="pipeline", value=pipeline))
    if kind is not None:
        condition = And(condition, EqualTo(term="kind", value=kind))
    if since is not None:
        condition = And(condition, GreaterThanOrEqual(term="ts", value=since.isoformat()))
    return _rows(table.scan(row_filter=condition).to_arrow().sort_by([("ts", "descending")]).slice(0, limit))
