"""Decode and validate one Kafka record against a pipeline's contract: `RecordValidator`.

The path of a record: `RecordValidator.check(key, value)` either returns the
typed row (a dict of contract columns) or raises `Rejected(kind, detail)`
(lakehouse.ingest.rejects), which the reader turns into a dead letter. The value's
decoder is JSON (lakehouse.ingest.json_decode) or a wire format's
(lakehouse.ingest.wire_decoders: Avro, Protobuf, JSON Schema, whose writer schemas a
`SchemaGate` of lakehouse.ingest.writer_schemas checks against the contract once
each); the decoded value's fields go through the contract's checks
(lakehouse.ingest.checks). A record key is UTF-8 text or, decoded the same way, a
record. A change stream's events (`mode: cdc`, lakehouse.ingest.change_events) go
through `check_change` instead: their `after` row or, for a delete, the primary
key of their key record.

`check` is the reference: every verdict is defined by it. The reader calls
`RecordValidator.check_row`, which gives the same verdict as a tuple, faster: for
JSON (and JSON Schema's documents) it first tries the JSON fast path
(lakehouse.ingest.json_fast_path), a msgspec decoder generated from the contract
that accepts only records the reference accepts, with the same values, and hands
everything else (errors, anything it cannot vouch for) to `check`; for Avro and
Protobuf a row compiled per writer schema reads the value straight into the row
(lakehouse.ingest.compiled_rows) and hands anything unusual to a row
plan per writer schema (lakehouse.ingest.row_plans), which leaves out the checks
the writer's types make moot. `check_change` does the same for change events: plain
JSON envelopes and keys through msgspec (lakehouse.ingest.change_fast_path), Avro
ones through a change and a key record compiled per writer schema, anything else
(and any doubt) through its own reference path.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any, Protocol, runtime_checkable

from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.change_events import change_meta, unwrap
from lakehouse.ingest.change_fast_path import ChangeFastPath, key_of_record
from lakehouse.ingest.checks import field_checker
from lakehouse.ingest.compiled_rows import RowContract
from lakehouse.ingest.json_decode import DECODERS, Decoder, JsonDecoder
from lakehouse.ingest.json_fast_path import JsonFastPath
from lakehouse.ingest.rejects import Rejected, quarantined, show
from lakehouse.ingest.row_plans import row_plan
from lakehouse.ingest.schema_store import schema_store
from lakehouse.ingest.wire import HEADER
from lakehouse.ingest.wire_decoders import wire_decoder
from lakehouse.ingest.writer_schemas import SchemaGate, WriterSchemas


@runtime_checkable
class WriterSchemaDecoder(Decoder, Protocol):
    """A wire-format decoder (lakehouse.ingest.wire_decoders.WireDecoder): also names the writer schema (a
    schema_store.WriterSchema) each value was written with."""

    def decode_with_writer(self, value: bytes) -> tuple[Any, dict]: ...


def canonical_key(record: Any) -> str:
    """A decoded record key as `_kafka.key` shows it: compact JSON with sorted keys."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


class RecordValidator:
    """Checks records against a spec's contract and source rules.

    `check` returns the row as a dict of contract columns in their Arrow-ready
    form (timestamps as epoch microseconds, dates as epoch days), or None for a
    tombstone that an upsert pipeline turns into a delete. It is the reference
    path: `check_row` gives the same verdicts, faster.

    `registry` (client settings) lets the validator fetch writer schemas itself, as the driver does;
    reader tasks get `writer_schemas` instead (see WriterSchemas).
    """

    def __init__(self, spec: PipelineSpec, quarantined: frozenset[str] = frozenset(), registry: dict | None = None,
                 writer_schemas: WriterSchemas = WriterSchemas(), gated: bool = True):
        self.spec = spec
        source = spec.source
        store = None
        if spec.wire_formats:
            store = schema_store(spec, registry, writer_schemas.resolvable, writer_schemas.missing)
        # `gated`: writer schemas pass the SchemaGate before their first value is decoded (ingestion); an
        # audit of what was ingested (lakehouse.audit.verify) reads values of any writer schema
        gate = SchemaGate(spec, writer_schemas.accepted) if gated else None
        self.decoder = self._decoder(source.value_format, store, gate, "value")
        self.key_decoder = None if source.key_format == "string" else \
            self._decoder(source.key_format, store, None, "key")
        self.key_record: dict | None = None  # the decoded key of the last check_key (record keys)
        self.fields = [(f.name, f.required, field_checker(f)) for f in spec.contract.fields]
        self._checks = {name: check for name, _, check in self.fields}
        self.quarantined = quarantined
        self.max_value_bytes = source.max_value_bytes
        self.key_field = source.key_field
        self.key_required = source.key_required
        self.tombstone_deletes = spec.tombstones_delete
        self.names = spec.contract.names
        # Avro and Protobuf (`_wire`, the decoder that names writer schemas): per writer schema, a row plan
        # that skips the checks its types make moot
        self._wire = self.decoder \
            if isinstance(self.decoder, WriterSchemaDecoder) and not hasattr(self.decoder, "payload") else None
        self._plans: dict[int, Callable[[dict], tuple] | None] = {}
        # ... and the compiled rows of those whose values it reads straight into rows, by the bytes their
        # values start with (a header, Protobuf's message indexes), all of one length (WireDecoder.compile_row)
        self._wire_rows: dict[bytes, Callable[[str | None, bytes], tuple | None]] = {}
        self._wire_changes: dict[bytes, Callable[[bytes], tuple | None]] = {}  # of a change stream (check_change)
        # ... and of a change stream's keys in a wire format, by the bytes their values start with (None: none)
        self._wire_keys: dict[bytes, Callable[[bytes], dict | None] | None] = {}
        self._key_wire: Any = self.key_decoder \
            if spec.is_cdc and getattr(self.key_decoder, "compile_record", None) is not None else None
        self._key_of = None if self._key_wire is None else key_of_record(spec)
        self._wire_head = 0
        # the JSON fast path: plain JSON values (or JSON Schema's payloads) with text keys, no quarantine
        self._payload = getattr(self.decoder, "payload", None)
        json_values = type(self.decoder) is JsonDecoder or self._payload is not None
        self.fast_path = JsonFastPath.for_spec(spec) \
            if json_values and self.key_decoder is None and not quarantined else None
        self._fast_row = None if self.fast_path is None else self.fast_path.decode_row
        # ... and of change events in plain JSON (check_change)
        self.change_path = ChangeFastPath.for_spec(spec) \
            if spec.is_cdc and type(self.decoder) is JsonDecoder and not quarantined else None
        # a change event's primary key: its columns' places in a row
        self._primary = [self.names.index(name) for name in spec.target.key] if spec.is_cdc else []
        # ... read from a row at once (a tuple for a key of several columns)
        self._primary_of: Callable[[tuple], Any] = itemgetter(*self._primary) if self._primary else tuple
        self.fallbacks = 0  # records the fast paths left to the reference (or a writer schema's row plan)

    def _decoder(self, fmt: str, store, gate, what: str) -> Decoder:
        if fmt == "json":
            return DECODERS["json"](self.spec, None) if what == "value" else JsonDecoder()
        return wire_decoder(fmt, self.spec, store, gate, what)

    def check_key(self, key: bytes | None) -> str | None:
        """The key as text (`_kafka.key`): UTF-8 text, or a record key as compact JSON (kept decoded in
        `key_record`); Rejected when it is missing though required, or does not decode."""
        self.key_record = None
        if key is None:
            if self.key_required:
                raise Rejected("null_key", "record has no key; the pipeline requires one")
            return None
        if self.key_decoder is not None:
            try:
                record = unwrap(self.key_decoder.decode(key))
            except Rejected as rejected:
                raise Rejected("bad_key", f"{rejected.kind}: {rejected.detail}") from None
            if not isinstance(record, dict):
                raise Rejected("bad_key", f"the key is a {type(record).__name__}, not a record")
            self.key_record = record
            return canonical_key(record)
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejected("bad_key", f"key is not UTF-8 at byte {exc.start}") from None

    def table_key(self, key: bytes | None) -> tuple | None:
        """The values of the table key (`target.key`) of the row a record with Kafka key `key` upserts or
        deletes, derived as ingestion derives them, checked, in the contract's internal form (dates as
        epoch days, timestamps as epoch micros): a change event's primary-key columns from its key record,
        else its `source.key.field` (`key_value`). None for a record without a key; Rejected when the key
        does not decode (the record is a dead letter)."""
        key_text = self.check_key(key)
        if self.spec.is_cdc:
            if self.key_record is None:
                raise Rejected("bad_key", "a change event's key must be a record holding the primary key columns")
            keys = self._key_values(self.key_record)
            return tuple(keys[name] for name in self.spec.target.key)
        found = self.key_value(key_text)
        return None if found is None else (found,)

    def key_value(self, key_text: str | None) -> Any:
        """The value of `source.key.field` that a record with key `key_text` (what `check_key` returned)
        carries, checked, in the contract's internal form: the key column of the record's row, a
        tombstone's too. A record key's field, else the key's text read as the field's type (an int or
        long field from its digits, a boolean from true or false). None without a key; Rejected
        (bad_key) when it is no value of the field."""
        if key_text is None or self.key_field is None:
            return None
        raw = self.key_record.get(self.key_field) if self.key_decoder is not None and self.key_record is not None \
            else key_text
        if raw is None:
            raise Rejected("bad_key", f"the key record has no field {self.key_field}")
        kind = self.spec.contract.field(self.key_field).type
        if isinstance(raw, str) and kind in ("int", "long"):
            if not re.fullmatch(r"-?[0-9]{1,20}", raw):
                raise Rejected("bad_key", f"key {show(raw)} is not a {kind} for {self.key_field}")
            raw = int(raw)
        elif isinstance(raw, str) and kind == "boolean":
            raw = {"true": True, "false": False}.get(raw, raw)
        try:
            return self._checks[self.key_field](raw)
        except Rejected as rejected:
            raise Rejected("bad_key", f"{rejected.kind}: {rejected.detail}") from None

    def change_of(self, value: bytes | None) -> tuple[bool, dict]:
        """(whether it deletes its key, its `_cdc` value) of a change event's `value`, as `check_change` reads
        them without checking the row: a null value (the tombstone after a delete) and op `d` delete.
        Rejected when `value` is no change event."""
        if value is None:
            return True, {"op": "d", "source_ts": None, "position": None}
        if len(value) > self.max_value_bytes:
            raise Rejected("oversize", f"value has {len(value)} bytes, at most {self.max_value_bytes} allowed")
        op, meta = change_meta(unwrap(self.decoder.decode(value)))
        return op == "d", meta

    def _key_value(self, key_text: str | None) -> str | None:
        """What the value's key field must equal: the key's text, or the field of a record key."""
        if self.key_decoder is None or self.key_record is None:
            return key_text
        found = self.key_record.get(self.key_field)
        return None if found is None else str(found)

    def check(self, key_text: str | None, value: bytes | None) -> dict | None:
        if value is None:
            if self.tombstone_deletes and key_text is not None:
                return None
            raise Rejected("null_value", "record has no value (tombstone)")
        if len(value) > self.max_value_bytes:
            raise Rejected("oversize", f"value has {len(value)} bytes, at most {self.max_value_bytes} allowed")
        obj = self.decoder.decode(value)
        row = self.check_fields(obj)
        if self.key_field is not None and key_text is not None:
            expected = self._key_value(key_text)
            got = obj.get(self.key_field)
            if expected != str(got):
                raise Rejected("key_mismatch", f"key {show(expected)} differs from {self.key_field} {show(got)}")
        return row

    def check_fields(self, obj: dict) -> dict:
        """The contract columns of a decoded record `obj`, checked (Rejected when one does not pass)."""
        row: dict[str, Any] = {}
        for name, required, check in self.fields:
            v = obj.get(name)
            if v is None:
                if required:
                    raise Rejected("missing_required", f"{name} is required")
                row[name] = None
                continue
            if name in self.quarantined:
                raise quarantined(name)
            row[name] = check(v)
        return row

    def check_change(self, key: bytes | None, value: bytes | None) -> tuple[str | None, tuple, str]:
        """A change event of a `mode: cdc` pipeline (Debezium's envelope), checked: (key text, row, op).

        The row is the contract values of the event's `after` (creates `c`, snapshot reads `r`, updates
        `u`: op "upsert") or, for a delete (`d`) or a tombstone (a null value), the primary-key columns
        from the key record (op "delete"); its last element is the event's `_cdc` value: the Debezium
        op, the source's commit time (epoch micros) and its position in the source's log (see
        `source_position`), which order changes of one key across Kafka partitions. Kafka Connect's JSON
        envelopes with schemas ({"schema": ..., "payload": ...}) are unwrapped. Raises Rejected."""
        fast = self.change_path
        known = None
        if fast is not None:  # plain JSON
            known = None if key is None else fast.decode_key(key)
        elif self._key_of is not None and type(key) is bytes:  # Avro: the key schema's compiled record
            read = self._wire_keys.get(key[:HEADER.size])
            record = None if read is None else read(key)
            known = None if record is None else self._key_of(record)
        if known is None:
            key_text = self.check_key(key)
            if self.key_record is None:  # a key that is not a record holding the primary key
                raise Rejected("bad_key", "a change event's key must be a record holding the primary key columns")
            keys = self._key_values(self.key_record)
            key_row = tuple(keys.get(name) for name in self.names)
            if self._key_of is not None and type(key) is bytes:
                self._compile_key(key)
        else:
            key_text, key_row = known
        if value is None:  # the tombstone after a delete: the key stays deleted
            return key_text, (*key_row, {"op": "d", "source_ts": None, "position": None}), "delete"
        if len(value) > self.max_value_bytes:
            raise Rejected("oversize", f"value has {len(value)} bytes, at most {self.max_value_bytes} allowed")
        found = None
        if fast is not None:  # plain JSON
            found = fast.decode(value)
        elif self._wire_changes and type(value) is bytes:  # Avro: the writer schema's compiled change
            compiled = self._wire_changes.get(value[:self._wire_head])
            found = None if compiled is None else compiled(value)
        if found is not None:
            op, values, meta = found
            if values is None:
                return key_text, (*key_row, meta), "delete"
            if self._primary_of(values) == self._primary_of(key_row):
                return key_text, (*values, meta), "upsert"
        if fast is not None or self._wire is not None:
            self.fallbacks += 1  # the reference names what is wrong (a key mismatch too), or compiles the change
        plan = None
        if self._wire is not None:  # Avro, Protobuf: the writer schema's row plan checks the `after` row
            writer, event = self._wire.decode_with_writer(value)
            plan = self._writer_plan(writer)
        else:
            event = self.decoder.decode(value)
        event = unwrap(event)
        op, meta = change_meta(event)
        if op in ("c", "r", "u"):
            after = unwrap(event.get("after"))
            if not isinstance(after, dict):
                raise Rejected("bad_envelope", f"a change event with op {op!r} has no `after` row")
            if plan is not None:
                values = plan(after)
            else:
                row = self.check_fields(after)
                values = tuple(row[name] for name in self.names)
            for index in self._primary:
                if values[index] != key_row[index]:
                    raise Rejected("key_mismatch", f"the key's {self.names[index]} {show(key_row[index])} differs "
                                                   f"from the row's {show(values[index])}")
            return key_text, (*values, meta), "upsert"
        return key_text, (*key_row, meta), "delete"  # op d: change_meta admits nothing else

    def _writer_plan(self, writer) -> Callable[[dict], tuple] | None:
        """The row plan of writer schema `writer` (lakehouse.ingest.row_plans), made once; its compiled row too."""
        try:
            return self._plans[writer.schema_id]
        except KeyError:
            plan = self._plans[writer.schema_id] = row_plan(self.spec, self.fields, self.quarantined, writer)
            self._compile_row(writer)
            return plan

    def _planned_row(self, wire: WriterSchemaDecoder, key_text: str | None, value: bytes) -> tuple:
        """`check_row` of a wire-format value through its writer schema's row plan (`row_plan`): the same
        verdict as `check`, which it is equivalent to field by field."""
        writer, obj = wire.decode_with_writer(value)
        plan = self._writer_plan(writer)
        if plan is None:
            row = self.check_fields(obj)
            values = tuple(row[name] for name in self.names)
        else:
            values = plan(obj)
        if self.key_field is not None and key_text is not None:
            expected = self._key_value(key_text)
            got = obj.get(self.key_field)
            if expected != str(got):
                raise Rejected("key_mismatch", f"key {show(expected)} differs from {self.key_field} {show(got)}")
        return values

    def _compile_row(self, writer) -> None:
        """Keep the compiled row of admitted writer schema `writer` (lakehouse.ingest.compiled_rows: its values read
        straight into rows, None where it cannot vouch for `check`'s verdict), if the decoder has one; of a change
        stream, its compiled change (for `check_change`)."""
        if self.key_field is not None and self.key_field not in self.names:
            return
        contract = RowContract(
            self.spec.contract.fields, tuple(check for _, _, check in self.fields), self.quarantined,
            None if self.key_field is None else self.names.index(self.key_field),
            None if self.key_decoder is None else self._key_value, self.max_value_bytes)
        compile_row = getattr(self.decoder, "compile_change" if self.spec.is_cdc else "compile_row", None)
        compiled = None if compile_row is None else compile_row(writer, contract)
        if compiled is not None:
            head, row = compiled
            self._wire_head = len(head)
            (self._wire_changes if self.spec.is_cdc else self._wire_rows)[head] = row

    def _compile_key(self, key: bytes) -> None:
        """Keep the compiled record of the (admitted) writer schema of change event key `key`, once."""
        head = key[:HEADER.size]
        if head not in self._wire_keys:
            writer, _ = self._key_wire.writer(key)
            compiled = self._key_wire.compile_record(writer)
            self._wire_keys[head] = None if compiled is None or compiled[0] != head else compiled[1]

    def _key_values(self, record: dict) -> dict:
        """The primary-key columns (target.key) of a change event's key record, checked."""
        record = unwrap(record)
        if not isinstance(record, dict):
            raise Rejected("bad_key", "a change event's key must be a record holding the primary key columns")
        found = {}
        for name in self.spec.target.key:
            value = record.get(name)
            if value is None:
                raise Rejected("bad_key", f"the key record has no primary key column {name}")
            try:
                found[name] = self._checks[name](value)
            except Rejected as rejected:
                raise Rejected("bad_key", f"{rejected.kind}: {rejected.detail}") from None
        return found

    def check_row(self, key_text: str | None, value: bytes | None) -> tuple | None:
        """The verdict of `check` as a tuple of contract values in contract order.

        Returns None for a tombstone delete and raises `Rejected` exactly when
        `check` does, with the same kind and detail. Records the fast path vouches
        for never reach `check`; the others do and are counted in `fallbacks`.
        """
        wire = self._wire
        if wire is not None:  # Avro, Protobuf: the writer schema's compiled row, else its row plan
            if type(value) is bytes:
                wire_row = self._wire_rows.get(value[:self._wire_head])
                if wire_row is not None:
                    row = wire_row(key_text, value)
                    if row is not None:
                        return row
            if value is not None and len(value) <= self.max_value_bytes:
                self.fallbacks += 1
                return self._planned_row(wire, key_text, value)
        fast_row = self._fast_row
        if fast_row is not None:
            if self._payload is None:
                row = fast_row(key_text, value)
            else:  # JSON Schema: the document after the header, once the header names a known schema
                try:
                    row = None if value is None or len(value) > self.max_value_bytes else \
                        fast_row(key_text, self._payload(value))
                except Rejected:
                    row = None
            if row is not None:
                return row
        self.fallbacks += 1
        checked = self.check(key_text, value)
        return None if checked is None else tuple(checked[name] for name in self.names)
