"""Trace one record: where is `topic[partition]@offset` of a pipeline, and why there.

`trace_record(spec, partition, offset)` answers with one verdict:

| verdict | meaning |
|---|---|
| `in-table` | a row of a data table holds it; the commits whose ranges hold the offset say when it arrived |
| `dead-letter` | the dead-letter table holds it, with its `error_kind` and `error_detail` |
| `tombstone` | an upsert pipeline's tombstone: the ledger holds it as the newest delete of its key |
| `duplicated` | more than one row holds it (a breach of exactly-once: `lakehouse verify` lists all) |
| `foreign` | a row holds it but no commit of the pipeline covers the offset (a breach: written by something else) |
| `superseded` | upsert: no row holds it because a newer record of its key replaced it (or a newer tombstone) |
| `deleted` | upsert: its key was deleted by a later tombstone |
| `not-yet-ingested` | at or past the pipeline's committed position: the next batch reads it (the lag says how far) |
| `gap` | it aged out of Kafka before it was ingested; the commit that recorded the gap is named |
| `beyond-log-end` | past the end of the partition: Kafka has not received it |
| `no-record` | Kafka delivers no record there (a transaction marker or an aborted record): nothing to ingest |
| `aged-out` | no row holds it and Kafka no longer does (below the earliest offset): it cannot be checked |
| `missing` | Kafka holds it, a commit covers it, but no table holds it (a breach: replay it) |
| `not-held` | upsert keyed by the value: no row holds it; a newer record of its key may have replaced it |

Rows are found with one pyiceberg scan per table filtered on `_kafka.topic`, `_kafka.partition`
and `_kafka.offset`; the task writer records bounds for those fields in every data file's metrics,
so the scan reads the few files whose bounds contain the offset, not the table. Kafka is asked only
when no row holds the record (its earliest offset, log end, and the record itself).

`trace_key(spec, key, since, until)` traces every record of one Kafka key over a time window: the
rows whose `_kafka.key` and `_kafka.timestamp` match (pruned by the same metrics) and the records
Kafka still holds in the window (read from `offsets_for_times`), each with its verdict.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan

from lakehouse.audit.coordinates import Lineage, coordinate_filter, lineage, read_kafka
from lakehouse.audit.intervals import Coverage
from lakehouse.audit.keys import RecordKey, TableKeys
from lakehouse.audit.verdicts import BREACHES, Sighting, Whereabouts, held_verdict, not_held_verdict
from lakehouse.core import config, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import EXIT_SOURCE, TraceError
from lakehouse.core.offsets import OffsetRange
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.plan import TopicState, offsets_for_time, topic_state_for
from lakehouse.ingest.reader import reader_consumer
from lakehouse.ingest.validator import canonical_key

MAX_KEY_SCAN = 5_000_000  # records of a time window read from Kafka to find one key's records
MAX_VALUE_CHARS = 2000    # raw values shown per row
MAX_KEY_CHARS = 65536     # a traced Kafka key
MAX_PARTITION = 2 ** 31 - 1
MAX_OFFSET = 2 ** 63 - 1


@dataclass(frozen=True)
class TraceRequest:
    """What a trace asks (`trace_request` checks it): one record, `partition` and `offset`; or every record
    of Kafka key `key` from `since` to `until` (None: now)."""

    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def trace_request(partition: int | None = None, offset: int | None = None, key: str | None = None,
                  since: datetime | None = None, until: datetime | None = None,
                  now: datetime | None = None) -> TraceRequest:
    """The trace asked for, checked: the one rule `lakehouse trace`, the Airflow UI's trace page and
    `trace_record`/`trace_key` apply, in one wording. Either a partition and an offset (each from 0 to
    MAX_PARTITION/MAX_OFFSET) or a key of 1 to MAX_KEY_CHARS characters with `since` and optionally
    `until`, later than `since` (`until` defaults to `now`, default the current time). Raises TraceError
    saying what is refused."""
    if key is None:
        if since is not None or until is not None:
            raise TraceError("since and until go with a key, not with a partition and offset")
        if partition is None or offset is None:
            raise TraceError("give a partition and an offset, or a key and since (a time window)")
        for name, value, maximum in (("partition", partition, MAX_PARTITION), ("offset", offset, MAX_OFFSET)):
            if not 0 <= value <= maximum:
                raise TraceError(f"{name} must be a whole number from 0 to {maximum}, got {value}")
        return TraceRequest(partition, offset)
    if partition is not None or offset is not None:
        raise TraceError("a key is traced over a time window (since, until), not at a partition and offset")
    if not 0 < len(key) <= MAX_KEY_CHARS:
        raise TraceError(f"key must be a Kafka key of 1 to {MAX_KEY_CHARS} characters, got {len(key)}")
    if since is None:
        raise TraceError("since is required with a key: an ISO-8601 time or a duration ago (30m, 2h, 7d)")
    end = until or now or datetime.now(UTC)
    if since >= end:
        raise TraceError(f"until ({end.isoformat()}) must be later than since ({since.isoformat()})")
    return TraceRequest(key=key, since=since, until=until)


@dataclass
class RecordTrace:
    pipeline: str
    topic: str
    partition: int
    offset: int
    verdict: str
    message: str
    sightings: list[Sighting] = field(default_factory=list)
    kafka: dict | None = None      # earliest, end, committed and lag of the partition, when Kafka was asked
    record: dict | None = None     # the Kafka record (timestamp, key, tombstone), when it was read
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_SOURCE if self.verdict in BREACHES else 0

    def to_json(self) -> dict:
        return asdict(self) | {"seconds": round(self.seconds, 3)}

    def render(self) -> str:
        lines = [f"{self.topic}[{self.partition}]@{self.offset} ({self.pipeline}): {self.verdict}", f"  {self.message}"]
        for s in self.sightings:
            lines.append(f"  {s.role} row in {s.table}: " + ", ".join(
                f"{k}={v}" for k, v in s.row.items() if k not in ("_kafka", "headers", "value", "key")))
            for c in s.commits:
                lines.append(f"    committed by snapshot {c['snapshot_id']} ({c['kind']}, batch {c['batch_id']}) "
                             f"at {c['at']}")
            if not s.commits:
                lines.append("    the commit that added it is no longer in the table's history (expired)"
                             if not s.history_complete else "    no commit of the pipeline holds this offset")
        if self.kafka:
            k = self.kafka
            lines.append(f"  partition {self.partition}: earliest {k['earliest']}, committed {k['committed']}, "
                         f"log end {k['end']}, lag {k['lag']}")
        return "\n".join(lines)


@dataclass
class KeyTrace:
    pipeline: str
    key: str
    since: str
    until: str
    scanned: int                   # records read from Kafka to find the key's
    records: list[RecordTrace]
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return max((r.exit_code for r in self.records), default=0)

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "key": self.key, "since": self.since, "until": self.until,
                "scanned": self.scanned, "records": [r.to_json() for r in self.records],
                "seconds": round(self.seconds, 3)}

    def render(self) -> str:
        head = (f"key {self.key!r} of {self.pipeline} from {self.since} to {self.until}: {len(self.records)} "
                f"record(s) ({self.scanned} Kafka records scanned, {self.seconds:.1f}s)")
        return "\n".join([head, *(r.render() for r in self.records)]) if self.records else head + ": none found"


# ---------------------------------------------------------------------------- what the tables hold


def _plain(value):
    """`value` as JSON takes it: bytes as UTF-8 text (else `base64:`), times in ISO-8601, long text cut."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = "base64:" + base64.b64encode(value).decode("ascii")
        return text[:MAX_VALUE_CHARS]
    if isinstance(value, str):
        return value[:MAX_VALUE_CHARS]
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


class _Tables:
    """The pipeline's tables (positioned ones and the tombstone ledger) loaded once, and their lineages."""

    def __init__(self, spec: PipelineSpec, platform: config.PlatformConfig):
        self.spec = spec
        self.catalog = open_catalog(platform, spec.catalog)
        self.loaded = {}
        for name in (*spec.positioned_tables, *((spec.tombstone_table,) if spec.tombstone_table else ())):
            try:
                self.loaded[name] = self.catalog.load_table(name)
            except NoSuchTableError:
                continue
        self._lineages: dict[str, Lineage] = {}

    def role(self, name: str) -> str:
        return ("dead-letter" if name == self.spec.dead_letter_table else
                "tombstones" if name == self.spec.tombstone_table else "data")

    def lineage(self, name: str) -> Lineage:
        if name not in self._lineages:
            self._lineages[name] = lineage(self.loaded[name], name, self.spec.name)
        return self._lineages[name]

    def rows(self, row_filter) -> list[tuple[str, dict]]:
        """(table, row) of every row matching `row_filter` in every table, as of each table's head."""
        found = []
        for name, table in self.loaded.items():
            if table.current_snapshot() is None:
                continue
            for row in table.scan(row_filter=row_filter).to_arrow().to_pylist():
                found.append((name, row))
        return found

    def sighting(self, name: str, row: dict) -> Sighting:
        kafka = row["_kafka"]
        history = self.lineage(name)
        commits = [c.to_json() for c in history.containing(kafka["partition"], kafka["offset"])]
        return Sighting(name, self.role(name), _plain(row), commits, history.complete)

    def gaps(self) -> list[tuple[Coverage, dict]]:
        """Every recorded gap with the commit that recorded it."""
        return [(c.gaps, c.to_json()) for name in self.spec.positioned_tables if name in self.loaded
                for c in self.lineage(name).commits if c.gaps]

    def key_coordinates(self, name: str, found: RecordKey) -> tuple | None:
        """Where the row of the table key `found` names is in upsert table or ledger `name` (one per key) at its
        head: (partition, offset, timestamp ms), and for a change stream's data table also its `_cdc`
        position and source time (ms), which order its changes (keys.newer). The scan filters on the key
        columns, so a key's row is found whichever record key wrote it."""
        table = self.loaded.get(name)
        if table is None or table.current_snapshot() is None:
            return None
        by_source = self.spec.is_cdc and self.role(name) == "data"
        keyed: BooleanExpression = AlwaysTrue()
        for column, value in zip(self.spec.target.key, found.values, strict=True):
            keyed = And(keyed, EqualTo(term=column, value=value))
        rows = table.scan(row_filter=keyed, selected_fields=("_kafka", *(("_cdc",) if by_source else ()))) \
            .to_arrow().to_pylist()
        if not rows:
            return None
        kafka = rows[0]["_kafka"]
        at = (kafka["partition"], kafka["offset"], _millis(kafka.get("timestamp")))
        if not by_source:
            return at
        cdc = rows[0].get("_cdc") or {}
        return (*at, cdc.get("position"), _millis(cdc.get("source_ts")))


def _millis(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1000) if moment is not None else None


def _partition_state(spec: PipelineSpec, tables: _Tables, platform: config.PlatformConfig,
                     partition: int) -> tuple[TopicState, dict[int, int]]:
    """The topic's state and the pipeline's committed positions; TraceError for a partition it lacks."""
    progress = [offsets.read_progress(tables.catalog, t, spec.name) for t in spec.positioned_tables]
    state = topic_state_for(platform.kafka(), spec.source.topic, progress)
    if partition not in state.partitions:
        raise TraceError(f"topic {spec.source.topic!r} has no partition {partition} (it has "
                         f"{len(state.partitions)}: 0 to {len(state.partitions) - 1})")
    return state, offsets.committed_positions(progress, state.earliest)


def _whereabouts(spec: PipelineSpec, tables: _Tables, state: TopicState, committed: dict[int, int], partition: int,
                 offset: int, record: dict | None, read: bool, found: RecordKey | None = None) -> Whereabouts:
    """The Whereabouts of a record no row holds, looking up its gap and (upsert) its key's row and tombstone;
    `found` is the record's table key (`_read_records`)."""
    ps = state.partitions[partition]
    gap = next((commit for gaps, commit in tables.gaps() if (partition, offset) in gaps), None)
    row = tomb = None
    ledger = spec.tombstone_table  # there is one when tombstones delete keys
    if found is not None and ledger is not None and ps.earliest <= offset < committed[partition]:
        row, tomb = (tables.key_coordinates(name, found) for name in (spec.target.table, ledger))
    return Whereabouts(ps.earliest, ps.end, committed[partition], gap, read, record, row, tomb, found)


def trace_record(spec: PipelineSpec, partition: int, offset: int,
                 platform: config.PlatformConfig | None = None) -> RecordTrace:
    """Where record `partition`@`offset` of the pipeline's topic is (see the module doc for the verdicts).

    Raises TraceError for a request `trace_request` refuses or a partition the topic lacks, the planner's
    SourceErrors when Kafka must be asked and cannot answer.
    """
    trace_request(partition, offset)
    started = time.monotonic()
    platform = platform or config.load()
    tables = _Tables(spec, platform)
    sightings = [tables.sighting(name, row) for name, row in
                 tables.rows(coordinate_filter(partition, offset, spec.source.topic))]
    result = RecordTrace(spec.name, spec.source.topic, partition, offset, "", "", sightings)
    if sightings:
        result.verdict, result.message = held_verdict(spec, partition, offset, sightings)
    else:
        state, committed = _partition_state(spec, tables, platform, partition)
        ps = state.partitions[partition]
        result.kafka = {"earliest": ps.earliest, "end": ps.end, "committed": committed[partition],
                        "lag": max(0, ps.end - committed[partition])}
        readable = ps.earliest <= offset < min(ps.end, committed[partition])
        found = None
        if readable:
            read = _read_records(spec, platform, OffsetRange(spec.source.topic, partition, offset, offset + 1))
            result.record, found = read[0] if read else (None, None)
        result.verdict, result.message = not_held_verdict(spec, partition, offset, _whereabouts(
            spec, tables, state, committed, partition, offset, result.record, readable, found))
    result.seconds = time.monotonic() - started
    return result


def _read_records(spec: PipelineSpec, platform: config.PlatformConfig,
                  rng: OffsetRange) -> list[tuple[dict, RecordKey | None]]:
    """The Kafka records of `rng` as dicts (partition, offset, timestamp_ms, key, tombstone), each with what
    ingestion derives from it (keys.TableKeys) when tombstones delete keys: `key` is then the key as
    `_kafka.key` shows it (a record key as compact JSON), `table_key` the text of its table key and `delete`
    whether it deletes it; the RecordKey beside it is None when its key does not decode."""
    derived: list[RecordKey | None] = []
    keys = TableKeys(spec, platform.schema_registry()) if spec.tombstones_delete else None
    identify: Callable[[Any, Any], None] | None = None
    if keys is not None:
        table_keys = keys

        def record_key(key, value) -> None:
            derived.append(table_keys.identify(key, value, with_text=True))

        identify = record_key

    with reader_consumer(platform.kafka(), spec.name) as (consumer, _watch):
        records = read_kafka(consumer, rng, stall_timeout=15.0, with_keys=True, on_record=identify).to_pylist()
    if keys is None:
        return [(record, None) for record in records]
    for record, found in zip(records, derived, strict=True):
        if found is not None:
            record.update(key=found.text, table_key=keys.text(found), delete=found.delete)
    return list(zip(records, derived, strict=True))


def shown_key(spec: PipelineSpec, key: str) -> str:
    """`key` as `_kafka.key` shows it: a record key (a JSON document, e.g. `{"product_id": 516}`) as compact
    JSON with sorted fields, as ingestion writes it; text keys, and text that is no JSON, as given."""
    if spec.source.key_format == "string":
        return key
    try:
        return canonical_key(json.loads(key))
    except ValueError:
        return key


def trace_key(spec: PipelineSpec, key: str, since: datetime, until: datetime | None = None,
              platform: config.PlatformConfig | None = None, progress=None,
              max_scan: int = MAX_KEY_SCAN) -> KeyTrace:
    """Every record of Kafka key `key` from `since` to `until` (default now), each with its verdict: the
    rows whose `_kafka.key` and `_kafka.timestamp` match, and the records Kafka still holds in the window.

    Raises TraceError for a request `trace_request` refuses or when the window holds more than `max_scan`
    records in Kafka (narrow it), the planner's SourceErrors when Kafka cannot answer.
    """
    trace_request(key=key, since=since, until=until)
    started = time.monotonic()
    platform = platform or config.load()
    key = shown_key(spec, key)
    to_end = until is None  # up to the log end as the planner finds it (ListOffsets by time can lag behind it)
    until = until or datetime.now(UTC)
    progress = progress or (lambda line: None)
    tables = _Tables(spec, platform)
    in_window = And(EqualTo(term="_kafka.key", value=key),
                    And(GreaterThanOrEqual(term="_kafka.timestamp", value=since.isoformat()),
                        LessThan(term="_kafka.timestamp", value=until.isoformat())))
    held: dict[tuple[int, int], list[Sighting]] = {}
    for name, row in tables.rows(in_window):
        held.setdefault((row["_kafka"]["partition"], row["_kafka"]["offset"]), []).append(tables.sighting(name, row))
    progress_list = [offsets.read_progress(tables.catalog, t, spec.name) for t in spec.positioned_tables]
    state = topic_state_for(platform.kafka(), spec.source.topic, progress_list)
    committed = offsets.committed_positions(progress_list, state.earliest)
    ends = {p: ps.end for p, ps in state.partitions.items()}
    conf = platform.kafka()
    starts = offsets_for_time(conf, spec.source.topic, ends, int(since.timestamp() * 1000), ends)
    stops = ends if to_end else offsets_for_time(conf, spec.source.topic, ends, int(until.timestamp() * 1000), ends)
    ranges = [OffsetRange(spec.source.topic, p, max(starts[p], state.partitions[p].earliest), stops[p])
              for p in sorted(ends) if stops[p] > max(starts[p], state.partitions[p].earliest)]
    scanned = sum(r.count for r in ranges)
    if scanned > max_scan:
        raise TraceError(f"the window holds {scanned} records in Kafka, more than the {max_scan} a key trace "
                         f"reads here: narrow the window (since/until)")
    records: dict[tuple[int, int], tuple[dict, RecordKey | None]] = {}
    for rng in ranges:
        progress(f"reading {rng} for key {key!r}")
        for record, found in _read_records(spec, platform, rng):
            if record["key"] == key:
                records[(record["partition"], record["offset"])] = (record, found)
    traces = []
    for p, o in sorted({*held, *records}):
        read_record, found = records.get((p, o), (None, None))
        trace = RecordTrace(spec.name, spec.source.topic, p, o, "", "", held.get((p, o), []), record=read_record)
        if trace.sightings:
            trace.verdict, trace.message = held_verdict(spec, p, o, trace.sightings)
        else:
            ps = state.partitions[p]
            trace.kafka = {"earliest": ps.earliest, "end": ps.end, "committed": committed[p],
                           "lag": max(0, ps.end - committed[p])}
            trace.verdict, trace.message = not_held_verdict(spec, p, o, _whereabouts(
                spec, tables, state, committed, p, o, trace.record, True, found))
        traces.append(trace)
    return KeyTrace(spec.name, key, since.isoformat(), until.isoformat(), scanned, traces,
                    time.monotonic() - started)
