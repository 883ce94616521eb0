"""Debezium change streams for `lakehouse produce`: a source table's life as Debezium's PostgreSQL connector
writes it to Kafka, for a pipeline in `target.mode: cdc`.

The contract is the table's row and `target.key` its primary key. The stream starts with a snapshot
(op `r` for an initial set of rows, `source.snapshot` "true", "last" on the final one, all at the
snapshot's log position), then streams transactions of creates (`c`), updates (`u`, with the row before
and after) and deletes (`d`, with the row before and no after), each delete followed by its tombstone
(the same key, no value); now and then a deleted key is created again. Keys are records holding the
primary key, so Kafka's partitioner keeps one key's events in order on one partition. Each event's
`source` names the connector, server, database, schema and table, the commit time, the transaction id and
the log position (`lsn`, increasing with every change), as Debezium 2.7 does.

Values and keys are written in the spec's formats:

    json          Kafka Connect's JsonConverter: the plain envelope (schemas.enable=false), or with
                  `connect_schemas` {"schema": <Connect schema>, "payload": <envelope>} (schemas.enable=true);
                  decimals as text (decimal.handling.mode=string), timestamps as io.debezium.time types
    avro          Confluent's AvroConverter: record Envelope with before/after ["null", Value], the Source
                  record, op, ts_ms; decimals as the decimal logical type (decimal.handling.mode=precise)
    protobuf, json_schema   Confluent's converters: the envelope's fields as a message / a JSON Schema

Broken events (about `bad_ratio` of the changes) are the kinds the reader gives them
(lakehouse.ingest.validator.RecordValidator.check_change): a row that breaks the contract, a payload that
does not decode, no envelope at all (`bad_envelope`), a logical decoding message (`unsupported_change`),
a key that is missing, does not decode or names another row. Every record is checked against the
reader before it is sent, so the summary (`ChangeSummary`) says exactly what the table holds once all
of them are ingested: the source's rows, as far as valid changes carried them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from random import Random
from typing import Any, Callable, Iterator

from lakehouse.core import config, errors
from lakehouse.core.spec import FieldSpec, PipelineSpec
from lakehouse_dev.defects import (
    BAD_KINDS,
    FAULT_HEADER,
    FIELD_KINDS,
    FORMAT_KINDS,
    MAX_SENDABLE_BYTES,
    FieldPath,
    RecordBreaker,
)
from lakehouse_dev.record_factory import RecordFactory, deep_copy
from lakehouse_dev.record_formats import (
    CONTENT_TYPES,
    WIRE_WRITERS,
    JsonWriter,
    ProduceError,
    contract_schema,
    decimals_as_text,
    writer_schema,
)
from lakehouse_dev.record_stream import SOURCE_HEADER, SyntheticRecord
from lakehouse_dev.verdicts import (
    ATTEMPTS,
    SELF_TEST_RECORDS,
    attempts_failed,
    check_valid,
    reader_validator,
    verdict,
    written,
)

DEBEZIUM_VERSION = "2.7.0.Final"
# What a change stream can break, beyond the value format's kinds: events that are no row change
CHANGE_KINDS = ("key_mismatch", "bad_envelope", "unsupported_change")
_TOPIC = re.compile(r"([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)")
_DEBEZIUM_TIMES = {None: ("string", "io.debezium.time.ZonedTimestamp"), "ms": ("int64", "io.debezium.time.Timestamp"),
                   "us": ("int64", "io.debezium.time.MicroTimestamp"), "s": ("int64", None)}


@dataclass
class ChangeSummary:
    """What the table of a change stream holds once every record is ingested.

    `final_rows`: primary key -> row, both as the reader checks them (RecordValidator.check_fields:
    timestamps in epoch microseconds, dates in epoch days, decimals as Decimal, uuids as text); the key
    is the tuple of `target.key`'s values. `deleted_keys`: keys a valid delete or tombstone removed that
    no later change brought back. `by_op`: records sent per Debezium op (r, c, u, d, m) and `tombstone`,
    broken ones included. `snapshot`: rows of the snapshot phase."""

    final_rows: dict[tuple, dict] = field(default_factory=dict)
    deleted_keys: set[tuple] = field(default_factory=set)
    by_op: dict[str, int] = field(default_factory=dict)
    snapshot: int = 0


# ------------------------------------------------------------------------ Kafka Connect and Debezium schemas

def connect_type(f: FieldSpec, decimals: str, name: str = "") -> dict:
    """The Kafka Connect schema Debezium's PostgreSQL connector gives a column of contract type `f` (without
    `field` and `optional`): io.debezium.time types for timestamps and dates with units, ZonedTimestamp
    text for the others, io.debezium.data.Uuid, io.debezium.data.Enum for string enums, decimals as text
    (`decimals` "string") or Connect's Decimal ("precise")."""
    if f.type == "struct":
        return {"type": "struct", "fields": [connect_field(c, decimals, f"{name}.{c.name}") for c in f.fields],
                "name": name or f.name}
    if f.type == "list":
        return {"type": "array", "items": {**connect_type(f.items, decimals, f"{name}.element"),
                                           "optional": not f.items.required}}
    if f.type == "map":
        return {"type": "map", "keys": {"type": "string", "optional": False},
                "values": {**connect_type(f.values, decimals, f"{name}.value"), "optional": not f.values.required}}
    if f.type == "decimal":
        if decimals == "string":
            return {"type": "string"}
        return {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
                "parameters": {"scale": str(f.scale), "connect.decimal.precision": str(f.precision)}}
    if f.type == "timestamp":
        kind, named = _DEBEZIUM_TIMES[f.unit]
        return {"type": kind, **({"name": named, "version": 1} if named else {})}
    if f.type == "date":
        return {"type": "int32", "name": "io.debezium.time.Date", "version": 1} if f.unit == "days" else {"type": "string"}
    if f.type == "uuid":
        return {"type": "string", "name": "io.debezium.data.Uuid", "version": 1}
    if f.type == "string" and f.enum:
        return {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": ",".join(f.enum)}}
    return {"type": {"string": "string", "int": "int32", "long": "int64", "float": "float", "double": "double",
                     "boolean": "boolean", "binary": "bytes"}[f.type]}


def connect_field(f: FieldSpec, decimals: str, name: str = "") -> dict:
    return {**connect_type(f, decimals, name), "optional": not f.required, "field": f.name}


def _string(name: str, optional: bool = False) -> dict:
    return {"type": "string", "optional": optional, "field": name}


def _int64(name: str, optional: bool = False) -> dict:
    return {"type": "int64", "optional": optional, "field": name}


SOURCE_CONNECT = {
    "type": "struct", "name": "io.debezium.connector.postgresql.Source", "optional": False, "field": "source",
    "fields": [_string("version"), _string("connector"), _string("name"), _int64("ts_ms"),
               {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": "true,last,false,incremental"}, "default": "false", "field": "snapshot"},
               _string("db"), _string("sequence", True), _int64("ts_us", True), _int64("ts_ns", True),
               _string("schema"), _string("table"), _int64("txId", True), _int64("lsn", True), _int64("xmin", True)]}
TRANSACTION_CONNECT = {"type": "struct", "name": "event.block", "version": 1, "optional": True, "field": "transaction",
                       "fields": [_string("id"), _int64("total_order"), _int64("data_collection_order")]}


def envelope_connect(fields: tuple[FieldSpec, ...], prefix: str, decimals: str) -> dict:
    """The Connect schema of Debezium 2.7's change event value for a table of contract `fields`
    (`prefix` is `<server>.<schema>.<table>`)."""
    row = {"type": "struct", "fields": [connect_field(f, decimals, f"{prefix}.{f.name}") for f in fields],
           "optional": True, "name": f"{prefix}.Value"}
    return {"type": "struct", "name": f"{prefix}.Envelope", "version": 2, "optional": False, "fields": [
        {**row, "field": "before"}, {**row, "field": "after"}, SOURCE_CONNECT, TRANSACTION_CONNECT,
        _string("op"), _int64("ts_ms", True), _int64("ts_us", True), _int64("ts_ns", True)]}


def key_connect(fields: tuple[FieldSpec, ...], prefix: str, decimals: str) -> dict:
    """The Connect schema of Debezium's change event key: the primary key's columns."""
    return {"type": "struct", "name": f"{prefix}.Key", "optional": False,
            "fields": [connect_field(f, decimals, f"{prefix}.{f.name}") for f in fields]}


_AVRO_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
                    "float": "float", "float64": "double", "double": "double", "boolean": "boolean",
                    "string": "string", "bytes": "bytes"}


def connect_avro(schema: dict, defined: set[str] | None = None) -> Any:
    """Connect schema `schema` as Confluent's AvroConverter (AvroData) writes it: structs as records named
    after the Connect name (a name met again refers to the record defined first), Connect names and
    parameters as `connect.*` properties, Connect's Decimal as the decimal logical type, optional as a
    union with null (a default's type first)."""
    defined = set() if defined is None else defined
    kind = schema["type"]
    if kind == "struct":
        full = schema.get("name") or "ConnectDefault"
        if full in defined:
            return full
        defined.add(full)
        namespace, _, name = full.rpartition(".")
        out: dict[str, Any] = {"type": "record", "name": _avro_name(name),
                               **({"namespace": namespace} if namespace else {}), "fields": []}
        for f in schema["fields"]:
            entry: dict[str, Any] = {"name": f["field"], "type": _optional_avro(f, defined)}
            if f.get("optional"):
                entry["default"] = f.get("default")
            out["fields"].append(entry)
    elif kind == "array":
        out = {"type": "array", "items": _optional_avro(schema["items"], defined)}
    elif kind == "map":
        out = {"type": "map", "values": _optional_avro(schema["values"], defined)}
    else:
        out = {"type": _AVRO_PRIMITIVES[kind]}
        if schema.get("name") == "org.apache.kafka.connect.data.Decimal":
            params = schema["parameters"]
            out.update(logicalType="decimal", precision=int(params["connect.decimal.precision"]),
                       scale=int(params["scale"]))
    if schema.get("version") is not None:
        out["connect.version"] = schema["version"]
    if schema.get("parameters"):
        out["connect.parameters"] = schema["parameters"]
    if schema.get("default") is not None:
        out["connect.default"] = schema["default"]
    if schema.get("name"):
        out["connect.name"] = schema["name"]
    return out if len(out) > 1 or kind in ("struct", "array", "map") else out["type"]


def _optional_avro(schema: dict, defined: set[str]) -> Any:
    typed = connect_avro(schema, defined)
    if not schema.get("optional"):
        return typed
    return [typed, "null"] if schema.get("default") is not None else ["null", typed]


def _avro_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text) if text[:1].isalpha() or text[:1] == "_" else f"_{text}"


def envelope_fields(fields: tuple[FieldSpec, ...]) -> tuple[FieldSpec, ...]:
    """The change event value's fields as contract fields (for the Protobuf and JSON Schema converters'
    schemas and for rendering any format): before/after rows of `fields`, source, transaction, op, ts_*."""
    def scalar(f: dict) -> FieldSpec:
        return FieldSpec(f["field"], "long" if f["type"] == "int64" else "string", required=not f["optional"])

    source = FieldSpec("source", "struct", required=True, fields=tuple(scalar(f) for f in SOURCE_CONNECT["fields"]))
    transaction = FieldSpec("transaction", "struct", fields=tuple(scalar(f) for f in TRANSACTION_CONNECT["fields"]))
    return (FieldSpec("before", "struct", fields=fields), FieldSpec("after", "struct", fields=fields), source,
            transaction, FieldSpec("op", "string", required=True), FieldSpec("ts_ms", "long"),
            FieldSpec("ts_us", "long"), FieldSpec("ts_ns", "long"))


def _source_names(spec: PipelineSpec) -> tuple[str, str, str]:
    """(server, schema, table) of the source table: Debezium's topic `<server>.<schema>.<table>`, else the
    pipeline's name, `public` and the target table's name."""
    found = _TOPIC.fullmatch(spec.source.topic)
    if found:
        return found.group(1), found.group(2), found.group(3)
    return spec.name, "public", spec.target.table.split(".")[-1]


# ------------------------------------------------------------------------------------------ the stream

class KeyedRows(dict):
    """Rows by primary key that also give a random key in constant time: the keys in a list, each key's
    place in it, a removed key's place taken by the last one. A stream of hundreds of thousands of changes
    picks a row per update or delete; `random.choice(list(rows))` made that quadratic."""

    def __init__(self, rows: dict | None = None):
        super().__init__()
        self._keys: list = []
        self._at: dict = {}
        for key, row in (rows or {}).items():
            self[key] = row

    def __setitem__(self, key, row) -> None:
        if key not in self._at:
            self._at[key] = len(self._keys)
            self._keys.append(key)
        super().__setitem__(key, row)

    def __delitem__(self, key) -> None:
        self.pop(key)

    def pop(self, key, *default):
        place = self._at.pop(key, None)
        if place is not None:
            last = self._keys.pop()
            if place < len(self._keys):
                self._keys[place] = last
                self._at[last] = place
        return super().pop(key, *default)

    def choice(self, rng: Random):
        """A key drawn uniformly by `rng`; IndexError when there is none."""
        return rng.choice(self._keys)


class ChangeStream:
    """The records of a change stream (see the module's docstring), reproducible from `rng`.

    Raises ProduceError at construction when the contract cannot be generated, the reader refuses a valid
    event, or the writer schemas cannot be found or registered; ConfigurationError for connect_schemas
    with a value format other than json.
    """

    def __init__(self, spec: PipelineSpec, rng: Random, platform: config.PlatformConfig | None = None,
                 now: Callable[[], datetime] | None = None, connect_schemas: bool = False,
                 updates: float = 0.45, deletes: float = 0.20):
        """`updates` and `deletes`: the shares of streamed changes that update or delete a row (the rest
        create one); each delete is followed by its tombstone."""
        if not (0 <= updates and 0 <= deletes and updates + deletes <= 1):
            raise ValueError(f"updates ({updates}) and deletes ({deletes}) must be shares adding up to at most 1")
        self.creates_below, self.updates_below = 1 - updates - deletes, 1 - deletes
        if connect_schemas and spec.source.value_format != "json":
            raise errors.ConfigurationError(
                f"Connect schemas (schemas.enable=true) are Kafka Connect's JSON converter's; pipeline {spec.name!r} "
                f"writes {spec.source.value_format} values, whose schemas are in the registry or folder")
        self.spec = spec
        self.rng = rng
        self.factory = RecordFactory(spec, rng, now=now)
        self.breaker = RecordBreaker(self.factory)
        self.connect_schemas = connect_schemas
        self.pk = spec.target.key
        self.server, self.schema, self.table = _source_names(spec)
        prefix = f"{self.server}.{self.schema}.{self.table}"
        fmt, key_fmt = spec.source.value_format, spec.source.key_format
        decimals = "precise" if fmt == "avro" else "string"
        row_fields = spec.contract.fields
        key_fields = tuple(spec.contract.field(name) for name in self.pk)
        self.value_schema = envelope_connect(row_fields, prefix, decimals)
        self.key_schema = key_connect(key_fields, prefix, "precise" if key_fmt == "avro" else "string")
        self.values = self._writer(platform, fmt, "value", envelope_fields(row_fields), self.value_schema)
        self.keys = self._writer(platform, key_fmt, "key", key_fields, self.key_schema)
        self.validator = reader_validator(spec, platform)
        # what `_row` does to every row, worked out once: its columns, the zoned timestamps among them
        self.columns = tuple(f.name for f in row_fields)
        self.zoned_columns = tuple(f.name for f in row_fields if f.type == "timestamp" and f.unit is None)
        self.text_decimals = fmt != "avro"  # decimal.handling.mode string
        self.content_type = CONTENT_TYPES[fmt]
        # the source database: rows by primary key; the table as the valid changes leave it
        self.source = KeyedRows()
        self.table_rows: dict[tuple, dict] = {}
        self.deleted = KeyedRows()  # primary key -> the row a valid delete or tombstone removed
        self.lsn = rng.randrange(20_000_000, 40_000_000)
        self.last_commit_lsn: int | None = None
        self.tx_id = rng.randrange(500, 5_000)
        self.by_op: dict[str, int] = {}
        self.snapshot_rows = 0
        self.paths: dict[str, list[FieldPath | None]] = {}
        self.kinds = self._self_test()

    def _writer(self, platform, fmt: str, what: str, fields: tuple[FieldSpec, ...], connect: dict):
        if fmt == "json":
            return JsonWriter()
        if fmt == "avro":
            text = json.dumps(connect_avro(connect))
        else:
            text = contract_schema(fmt, fields, f"{self.server}_{self.table}_{what}")
        schema_id, text = writer_schema(self.spec, platform, fmt, what, text)
        return WIRE_WRITERS[fmt](schema_id, text, fields)

    # -- events ---------------------------------------------------------------------------

    def _pk(self, row: dict) -> tuple:
        return tuple(row[name] for name in self.pk)

    def _row(self, row: dict | None) -> dict | None:
        """A row as Debezium writes it: every column, decimals as text but in Avro (decimal.handling.mode
        string; precise for Avro), zoned timestamps in UTC with a Z."""
        if row is None:
            return None
        out = {name: row.get(name) for name in self.columns}  # every column, null or not
        for name in self.zoned_columns:
            value = out[name]
            if isinstance(value, str) and value.endswith("+00:00"):
                out[name] = value[:-6] + "Z"
        return decimals_as_text(out) if self.text_decimals else out

    def _event(self, op: str, before: dict | None, after: dict | None, source: dict) -> dict:
        ts_ms = source["ts_ms"] + self.rng.randint(1, 200)  # the connector saw it a moment after the commit
        return {"before": self._row(before), "after": self._row(after), "source": source, "transaction": None,
                "op": op, "ts_ms": ts_ms, "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000}

    def _source(self, snapshot: str, commit_ms: int, tx_id: int) -> dict:
        return {"version": DEBEZIUM_VERSION, "connector": "postgresql", "name": self.server, "ts_ms": commit_ms,
                "snapshot": snapshot, "db": self.server, "sequence": f'["{self.last_commit_lsn}","{self.lsn}"]'
                if self.last_commit_lsn is not None else f'[null,"{self.lsn}"]',
                "ts_us": commit_ms * 1000, "ts_ns": commit_ms * 1_000_000, "schema": self.schema,
                "table": self.table, "txId": tx_id, "lsn": self.lsn, "xmin": None}

    def _key(self, pk: tuple) -> bytes:
        record = dict(zip(self.pk, pk))
        if self.keys.fmt == "json":
            record = decimals_as_text(record)
            if self.connect_schemas:
                record = {"schema": self.key_schema, "payload": record}
        return self.keys.encode(record)

    def _value(self, event: dict) -> bytes:
        if self.connect_schemas:
            return self.values.encode({"schema": self.value_schema, "payload": event})
        return self.values.encode(event)

    def encode(self, op: str, before: dict | None, after: dict | None) -> tuple[bytes, bytes]:
        """Key and value of one change event of rows `before` -> `after` (op c, r, u or d) in this stream's
        formats, at the current log position; unchecked and not counted (for the benchmark's decoder)."""
        row = after if after is not None else before
        source = self._source("false", self._now_ms(), self.tx_id)
        return self._key(self._pk(row)), self._value(self._event(op, before, after, source))

    def _now_ms(self) -> int:
        return int(self.factory.now().timestamp() * 1000)

    def _plan(self, remaining: int, snapshot: bool) -> tuple[str, dict | None, dict | None]:
        """The next change of the source table: (op, before, after); applies it to `source`."""
        if snapshot or not self.source:
            row = self._new_row()
            self.source[self._pk(row)] = row
            return ("r" if snapshot else "c"), None, row
        choice = self.rng.random()
        if choice < self.creates_below:
            row = self._new_row()
            self.source[self._pk(row)] = row
            return "c", None, row
        pk = self.source.choice(self.rng)
        if choice < self.updates_below or remaining < 2:  # a delete needs room for its tombstone
            before = self.source[pk]
            after = self.factory.changed(before)
            self.source[pk] = after
            return "u", before, after
        return "d", self.source.pop(pk), None

    def _new_row(self) -> dict:
        """A new row: most get a new primary key, some re-create a deleted one."""
        row = self.factory.row()
        if self.deleted and self.rng.random() < 0.1:
            pk = self.deleted.choice(self.rng)
            if pk not in self.source:
                row.update(zip(self.pk, pk))
        while self._pk(row) in self.source:  # ids from a pool (not the sequence) may repeat
            row = self.factory.row()
        return row

    def records(self, count: int, bad_ratio: float) -> Iterator[SyntheticRecord]:
        """`count` records (tombstones included): the snapshot, then streamed transactions."""
        snapshot_left = min(max(1, count // 5), 5_000) if count else 0
        self.snapshot_rows = snapshot_left
        snapshot_tx, snapshot_ms = self.tx_id, self._now_ms()
        tx_left = 0
        commit_ms = snapshot_ms
        turn = sent = 0
        while sent < count:
            remaining = count - sent
            if snapshot_left > 0:
                snapshot_left -= 1
                flag = "last" if snapshot_left == 0 or remaining == 1 else "true"
                tx_id, commit_ms = snapshot_tx, snapshot_ms
            else:
                if tx_left == 0:  # a new transaction: its id, commit time and size
                    self.tx_id += self.rng.randint(1, 3)
                    tx_left = self.rng.randint(1, 4)
                    commit_ms = max(commit_ms, self._now_ms())
                    self.last_commit_lsn, self.lsn = self.lsn, self.lsn + self.rng.randint(40, 400)
                tx_left -= 1
                self.lsn += self.rng.randint(40, 400)
                flag, tx_id = "false", self.tx_id
            op, before, after = self._plan(remaining, snapshot=flag != "false")
            source = self._source(flag, commit_ms, tx_id)
            kind = None
            if bad_ratio and self.kinds and op != "d" and self.rng.random() < bad_ratio:
                kind = self.kinds[turn % len(self.kinds)]
                turn += 1
            yield self._emit(op, before, after, source, kind)
            sent += 1
            if op == "d" and sent < count:
                yield self._tombstone(before)
                sent += 1

    def _headers(self, kind: str | None) -> list[tuple[str, bytes]]:
        headers = [SOURCE_HEADER, ("trace_id", uuid.UUID(int=self.rng.getrandbits(128), version=4).hex.encode()),
                   ("content-type", self.content_type)]
        return headers + [(FAULT_HEADER, kind.encode())] if kind else headers

    def _emit(self, op: str, before: dict | None, after: dict | None, source: dict, kind: str | None) -> SyntheticRecord:
        self.by_op[op] = self.by_op.get(op, 0) + 1
        pk = self._pk(after if after is not None else before)
        if kind is not None:
            key, value, timestamp = self.broken(kind, op, before, after, source, pk)
            return SyntheticRecord(key, value, self._headers(kind), kind, timestamp)
        key, value = self._key(pk), self._value(self._event(op, before, after, source))
        self._check(key, value, None)
        if op == "d":
            self._delete(pk, before)
        else:
            self.table_rows[pk] = after
            self.deleted.pop(pk, None)
        return SyntheticRecord(key, value, self._headers(None))

    def _tombstone(self, row: dict) -> SyntheticRecord:
        self.by_op["tombstone"] = self.by_op.get("tombstone", 0) + 1
        key = self._key(self._pk(row))
        self._check(key, None, None)
        self._delete(self._pk(row), row)
        return SyntheticRecord(key, None, self._headers(None))

    def _delete(self, pk: tuple, row: dict) -> None:
        self.table_rows.pop(pk, None)
        self.deleted[pk] = row

    def _check(self, key: bytes | None, value: bytes | None, timestamp: int | None) -> None:
        """A valid record must be one the reader takes: the summary counts on it."""
        refused = verdict(self.validator, key, value, timestamp)
        if refused is not None:
            raise ProduceError(f"{self.spec.path}: generated a change event the reader rejects as {refused}; the "
                               f"generator needs a rule for this contract")

    # -- broken events --------------------------------------------------------------------

    def broken(self, kind: str, op: str, before: dict | None, after: dict | None, source: dict,
               pk: tuple) -> tuple[bytes | None, bytes | None, int | None]:
        """Key, value and Kafka timestamp of change `op` broken as `kind`, checked against the reader (the
        table does not see the change); ProduceError when none comes out in ATTEMPTS tries."""
        last = None
        for _ in range(ATTEMPTS):
            made = self._attempt(kind, self.rng.choice(self.paths[kind]), op, before, after, source, pk)
            if made is not None:
                last = verdict(self.validator, *made)
                if last == kind:
                    return made
        raise attempts_failed(self.spec, kind, last)

    def _attempt(self, kind: str, path: FieldPath | None, op: str, before: dict | None, after: dict | None,
                 source: dict, pk: tuple) -> tuple[bytes | None, bytes | None, int | None] | None:
        try:
            key = self._key(pk)
            event = self._event(op, before, after, source)
            if kind in self.values.OWN_KINDS:
                document = {"schema": self.value_schema, "payload": event} if self.connect_schemas else event
                return key, self.values.broken(kind, document, self.rng), None
            if kind == "null_key":
                return None, self._value(event), None
            if kind == "bad_key":
                own = self.keys.OWN_KINDS[0]
                return self.keys.broken(own, dict(zip(self.pk, pk)), self.rng), self._value(event), None
            if kind == "key_mismatch":
                other = self.factory.row()  # a row of another primary key
                return self._key(self._pk(other)), self._value(event), None
            if kind == "bad_kafka_timestamp":
                return key, self._value(event), self.breaker.kafka_timestamp()
            if kind == "bad_envelope":
                if self.values.fmt == "json" and self.rng.random() < 0.5:  # an application's row on the topic
                    return key, self._value(event["after"]), None
                return key, self._value({**event, "op": self.rng.choice(["x", "insert", "UPDATE"])}), None
            if kind == "unsupported_change":  # pg_logical_emit_message: a message event, no row
                message = {**event, "op": "m", "before": None, "after": None,
                           "message": {"prefix": "audit", "content": "dGVzdA=="}}
                return key, self._value(message), None
            broken = deep_copy(after)
            self.breaker.corrupt(kind, broken, path)
            return key, self._value(self._event(op, before, broken, source)), None
        except Exception:  # noqa: BLE001 - the writer schema cannot hold this defect
            return None

    def _self_test(self) -> tuple[str, ...]:
        """Check valid events and each defect kind against the reader on a copy of the state; returns the
        kinds this spec can carry."""
        state = self.factory.state()
        saved = (KeyedRows(self.source), self.lsn, self.tx_id)
        source = self._source("false", self._now_ms(), self.tx_id)
        try:
            for _ in range(SELF_TEST_RECORDS):
                row = self.factory.row()
                key, value = written(self.spec, lambda: (self._key(self._pk(row)),
                                                         self._value(self._event("c", None, row, source))))
                check_valid(self.validator, key, value, "change event", row)
            kinds = []
            for kind in (*FORMAT_KINDS[self.values.fmt], *CHANGE_KINDS):
                if kind in kinds or kind == "null_value":
                    continue
                if kind == "oversize" and self.spec.source.max_value_bytes + 1024 >= MAX_SENDABLE_BYTES:
                    continue
                candidates = self.breaker.paths(kind) if kind in FIELD_KINDS else [None]
                kept = []
                for path in candidates:
                    for _ in range(3):
                        row = self.factory.row()
                        made = self._attempt(kind, path, "c", None, row, source, self._pk(row))
                        if made is not None and verdict(self.validator, *made) == kind:
                            kept.append(path)
                            break
                if kept:
                    self.paths[kind] = kept
                    kinds.append(kind)
            return tuple(k for k in BAD_KINDS if k in kinds)
        finally:
            self.factory.restore(state)
            self.source, self.lsn, self.tx_id = saved

    def summary(self) -> ChangeSummary:
        """What the table holds once every record sent so far is ingested (see ChangeSummary)."""
        def typed(rows: dict[tuple, dict]) -> dict[tuple, dict]:
            out = {}
            for row in rows.values():
                checked = self.validator.check_fields(row)
                out[tuple(checked[name] for name in self.pk)] = checked
            return out

        final = typed(self.table_rows)
        return ChangeSummary(final_rows=final, deleted_keys=set(typed(self.deleted)) - set(final),
                             by_op=dict(self.by_op), snapshot=self.snapshot_rows)
