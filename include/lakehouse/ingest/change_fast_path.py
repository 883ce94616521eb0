"""The change events' fast path: `ChangeFastPath.for_spec(spec).decode(value)` reads, a few times faster, the
value of a Debezium change event in plain JSON that the reference (`RecordValidator.check_change`: JsonDecoder,
`change_meta`, then the contract's checks of its `after`) accepts, into (op, the contract values of its `after`,
None for a delete, its `_cdc` value); for anything else it returns None, "ask the reference". `decode_key(key)`
does the same for the key record: (its text as `_kafka.key` shows it, its primary-key columns at their places in
a row of Nones).

One msgspec Struct holds the envelope: the op (c, r, u or d), the `after` row, the few `source` fields the
`_cdc` value is made of, the event's own `ts_ms`; `before`, `transaction` and whatever else the envelope
carries are skipped without being built. In the row, msgspec checks what lakehouse.ingest.json_fast_path
mirrors exactly (types, bounds, enums, max_length); every other field (decimals, timestamps, dates and the
rest) is read as its JSON value (numbers with a fraction as Decimal where the reference does), and it and a
string with a pattern are checked by the reference's own checker (which remembers the values that matched).

Any doubt goes to the reference. Kafka Connect's envelope with schemas ({"schema": ..., "payload": ...}) has no
`op` of its own, so msgspec refuses it; an `after` row with schemas reads as a row without its primary key,
which then differs from the key's (check_change compares them). The reference unwraps both.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Literal

import msgspec

from lakehouse.core.spec import FieldSpec, PipelineSpec
from lakehouse.ingest.change_events import SOURCE_FIELDS, epoch_ms_to_us, source_position
from lakehouse.ingest.checks import INT32, INT64, field_checker, number_interval
from lakehouse.ingest.json_fast_path import checked_type, reads_alike

UNSET = msgspec.UNSET

Change = tuple[str, tuple | None, dict]
# a key record's field names and text values that compact JSON writes as they are
_BARE_NAME = re.compile(r"[A-Za-z0-9_]+").fullmatch


def _msgspec_type(f: FieldSpec) -> Any:
    """The msgspec type of the field's non-null values when msgspec checks them exactly as the reference does
    (None when no value can pass); Any (the JSON value, for the reference's checker) otherwise."""
    return Any if f.type in ("timestamp", "date") else checked_type(f)


class ChangeFastPath:
    """Decodes, a few times faster, the JSON change events `RecordValidator.check_change` accepts (see the
    module's docstring); `decode(value)` returns (op, values, `_cdc` value) or None, never a rejection."""

    def __init__(self, spec: PipelineSpec, kinds: list[Any]):
        """`kinds`: each contract field's `_msgspec_type`."""
        fields = spec.contract.fields
        names = [f.name for f in fields]
        struct_fields: list[tuple] = []
        checked: list[tuple[int, bool, Callable[[Any], Any]]] = []
        for i, (f, kind) in enumerate(zip(fields, kinds, strict=True)):
            if kind is Any or f.type == "string" and f.pattern and not f.enum:  # Any takes null: checked in decode
                checked.append((i, f.required, field_checker(f)))
            elif kind is None:  # no value can pass: only null
                kind = type(None)
            if f.required:
                struct_fields.append((f"f{i}", kind))
            else:
                struct_fields.append((f"f{i}", kind if kind in (Any, type(None)) else kind | None, None))
        # gc=False: JSON makes no reference cycles
        row = msgspec.defstruct("ChangeRow", struct_fields, kw_only=True, gc=False,
                                rename={f"f{i}": name for i, name in enumerate(names)})
        # a missing field reads as null (source_position reads `.get`s), but for ts_ms: the event's stands in
        source = msgspec.defstruct("ChangeSource", [(name, Any, UNSET if name == "ts_ms" else None)
                                                    for name in SOURCE_FIELDS], kw_only=True, gc=False)
        envelope = msgspec.defstruct("ChangeEnvelope", [
            ("op", Literal["c", "r", "u", "d"]), ("after", row | None, None), ("source", source | None, None),
            ("ts_ms", Any, None)], kw_only=True, gc=False)
        decoder = msgspec.json.Decoder(envelope, float_hook=Decimal if spec.contract.has_decimals else None)
        self.decode = _compile_decode(decoder.decode, reads_alike(spec.source.max_value_bytes), checked)
        self.decode_key = _compile_decode_key(msgspec.json.Decoder().decode, reads_alike(sys.maxsize),
                                              key_of_record(spec))

    @classmethod
    def for_spec(cls, spec: PipelineSpec) -> ChangeFastPath | None:
        """The fast path for `spec`'s change events, or None when no row can pass (a required field no value of
        which passes): every event then needs the reference's reason."""
        kinds = [_msgspec_type(f) for f in spec.contract.fields]
        if any(kind is None and f.required for f, kind in zip(spec.contract.fields, kinds, strict=True)):
            return None
        return cls(spec, kinds)


def _compile_decode(decode: Callable[[bytes], Any], alike: Callable[[bytes], bool],
                    checked: list[tuple[int, bool, Callable[[Any], Any]]]) -> Callable[[bytes], Change | None]:
    """`ChangeFastPath.decode` for one contract: a closure, since locals are cheaper than attributes."""
    astuple, asdict = msgspec.structs.astuple, msgspec.structs.asdict
    unset = UNSET

    def decode_change(value: bytes) -> Change | None:
        """(op, values or None for a delete, `_cdc` value) as the reference reads `value`, or None to ask it."""
        if not alike(value):
            return None
        try:
            event = decode(value)
        except Exception:  # noqa: BLE001 - any decode or validation error: the reference names the reason
            return None
        op = event.op
        values: tuple | None = None
        if op != "d":  # the reference reads no row of a delete
            after = event.after
            if after is None:
                return None
            found = astuple(after)
            if checked:
                row = list(found)
                try:
                    for i, required, check in checked:
                        v = row[i]
                        if v is None:
                            if required:
                                return None
                        else:
                            row[i] = check(v)
                except Exception:  # noqa: BLE001 - rejected (or worse): the reference says how
                    return None
                values = tuple(row)
            else:
                values = found
        source = event.source
        if source is None:
            return op, values, {"op": op, "source_ts": epoch_ms_to_us(event.ts_ms), "position": None}
        ts_ms = source.ts_ms
        return op, values, {"op": op, "source_ts": epoch_ms_to_us(event.ts_ms if ts_ms is unset else ts_ms),
                            "position": source_position(asdict(source))}

    return decode_change


def key_of_record(spec: PipelineSpec) -> Callable[[dict], tuple | None]:
    """For `spec`'s change events, a decoded key record (a dict, not wrapped in Kafka Connect's schemas) as
    (its text as `_kafka.key` shows it, its primary-key columns checked, at their places in a row of Nones), as
    RecordValidator.check_key and its key checks make them, for a record whose field names are bare words and
    whose values are integers or plain ASCII text (what Debezium's keys mostly are): the compact sorted JSON is
    written by hand (lakehouse.ingest.validator.canonical_key would write the same). None for any other record."""
    names = spec.contract.names
    width, bare = len(names), _BARE_NAME
    primary = [(name, names.index(name), field_checker(spec.contract.field(name))) for name in spec.target.key]
    # a key of one integer column, the record holding it alone (Debezium's key of a table with a serial id): read
    # with its check's bounds, its text and row built around the value; an empty range for any other key
    key_name, index, _ = primary[0]
    only = spec.contract.field(key_name)
    interval = None if len(primary) > 1 or only.type not in ("int", "long") or only.enum \
        else number_interval(only, *(INT32 if only.type == "int" else INT64), integral=True)
    lo, hi = interval or (1, 0)
    head, tail, text = (None,) * index, (None,) * (width - index - 1), f'{{"{key_name}":'

    def key_of(record: dict) -> tuple | None:
        if len(record) == 1:
            v = record.get(key_name)
            if type(v) is int and lo <= v <= hi:
                return f"{text}{v}}}", (*head, v, *tail)
        parts = []
        for name in sorted(record):
            v = record[name]
            if bare(name) is None:
                return None
            if type(v) is int:
                parts.append(f'"{name}":{v}')
            elif type(v) is str and v.isascii() and v.isprintable() and '"' not in v and "\\" not in v:
                parts.append(f'"{name}":"{v}"')
            else:
                return None
        row: list[Any] = [None] * width
        for name, index, check in primary:
            v = record.get(name)
            if v is None:
                return None
            try:
                row[index] = check(v)
            except Exception:  # noqa: BLE001 - the reference names the reason
                return None
        return "{" + ",".join(parts) + "}", tuple(row)

    return key_of


def _compile_decode_key(decode: Callable[[bytes], Any], alike: Callable[[bytes], bool],
                        key_of: Callable[[dict], tuple | None]) -> Callable[[bytes], tuple | None]:
    """`ChangeFastPath.decode_key`: a JSON key record read by msgspec, then `key_of_record`'s."""

    def decode_key(key: bytes) -> tuple | None:
        if not alike(key):
            return None
        try:
            record = decode(key)
        except Exception:  # noqa: BLE001 - the reference names the reason
            return None
        if type(record) is not dict or len(record) == 2 and "schema" in record and "payload" in record:
            return None
        return key_of(record)

    return decode_key
