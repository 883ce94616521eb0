"""Decode and validate one Kafka record against a pipeline's contract.

The path of a record: `RecordValidator.check(key, value)` either returns the
typed row (a dict of contract columns) or raises `Rejected(kind, detail)`, which
the reader turns into a dead letter. The value's decoder is JSON (`JsonDecoder`)
or a wire format's (lakehouse.ingest.formats: Avro, Protobuf, JSON Schema, whose
writer schemas a `SchemaGate` checks against the contract once each); a record key
is UTF-8 text or, decoded the same way, a record. A change stream's events
(`mode: cdc`) go through `check_change` instead: their `after` row or, for a
delete, the primary key of their key record.

`check` is the reference: every verdict is defined by it. The reader calls
`RecordValidator.check_row`, which gives the same verdict as a tuple, faster: for
JSON (and JSON Schema's documents) it first tries `JsonFastPath`, a msgspec decoder
generated from the contract that accepts only records the reference accepts, with
the same values, and hands everything else (errors, anything it cannot vouch for)
to `check`; for Avro and Protobuf a row compiled per writer schema reads the
value straight into the row (lakehouse.ingest.formats, "compiled rows") and
hands anything unusual to a row plan per writer schema, which leaves out the
checks the writer's types make moot.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal, Protocol, runtime_checkable
from uuid import UUID

import msgspec

from lakehouse.core import errors
from lakehouse.core.spec import MAX_MATCHED_CHARS, FieldSpec, PipelineSpec, contract_pattern

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DATE = date(1970, 1, 1)
_ONE_MICROSECOND = timedelta(microseconds=1)
# The instants Python's datetime can hold in UTC: pyspark turns collected timestamps into
# datetimes, so a value outside breaks whoever reads it, even though Arrow and Iceberg hold more.
MIN_TIMESTAMP_US = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // _ONE_MICROSECOND
MAX_TIMESTAMP_US = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _ONE_MICROSECOND
TIMESTAMP_RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"

# The reasons a record can be dead-lettered; stored in the dead-letter table's error_kind.
ERROR_KINDS = (
    "malformed_json",      # value is not parseable JSON
    "bad_wire_format",     # wire formats: no magic byte 0 and 4-byte schema id before the payload
    "unknown_schema",      # wire formats: the writer schema id is in neither the schema folder nor the registry
    "malformed_avro",      # Avro: the payload does not decode with its writer schema
    "malformed_protobuf",  # Protobuf: the payload (or its message indexes) does not decode with its writer schema
    "not_utf8",            # value bytes are not UTF-8
    "not_an_object",       # JSON, but not an object
    "missing_required",    # a required field is absent or null
    "wrong_type",          # a field has the wrong JSON type
    "bad_enum",            # value outside the field's enum
    "out_of_range",        # number outside min/max or the type's bounds, or not finite
    "pattern_mismatch",    # string does not match the field's pattern
    "too_long",            # string longer than max_length
    "bad_timestamp",       # not ISO-8601 with a UTC offset
    "bad_date",            # not an ISO-8601 date
    "bad_uuid",            # not a UUID in its 8-4-4-4-12 text form
    "oversize",            # value larger than source.max_value_bytes
    "null_value",          # tombstone where the pipeline has no use for one
    "null_key",            # no key where the spec requires one
    "bad_key",             # key bytes are not UTF-8
    "key_mismatch",        # key differs from the key field in the value
    "schema_incompatible", # carries a field the table cannot take under the quarantine policy
    "bad_envelope",        # CDC: not a change event (no op, an unknown op, no `after` row for an insert/update)
    "unsupported_change",  # CDC: a truncate (op t) or a message (op m): no row to apply
    "bad_string",          # a string field holds text that is not Unicode (an escaped lone surrogate "\ud800")
    "timestamp_out_of_range",  # ISO-8601 with an offset, but outside TIMESTAMP_RANGE once in UTC
    "bad_kafka_timestamp",     # the record's Kafka timestamp is outside TIMESTAMP_RANGE (set by the reader)
    "reader_failure",      # the reader failed on this record (a bug, a library error) or the driver marked
                           # it after a task failed on it; error_detail names the exception
)


class Rejected(Exception):
    """A record that cannot enter the table; `kind` is one of ERROR_KINDS."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class Decoder(Protocol):
    """Turns value bytes into a mapping of field name to JSON-like values."""

    def decode(self, value: bytes) -> dict: ...


@runtime_checkable
class WriterSchemaDecoder(Decoder, Protocol):
    """A wire-format decoder (lakehouse.ingest.formats.WireDecoder): also names the writer schema (a
    formats.WriterSchema) each value was written with."""

    def decode_with_writer(self, value: bytes) -> tuple[Any, dict]: ...


def _reject_constant(name: str) -> float:
    raise Rejected("out_of_range", f"{name} is not a finite number")


class JsonDecoder:
    """Plain JSON values. With `decimals` (a contract with decimal fields), JSON numbers with a fraction
    or an exponent are read exactly (Decimal), so that a decimal column gets the digits that were sent."""

    def __init__(self, decimals: bool = False):
        self._decoder = json.JSONDecoder(parse_constant=_reject_constant, parse_float=Decimal if decimals else None)

    def decode(self, value: bytes) -> dict:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejected("not_utf8", f"value is not UTF-8 at byte {exc.start}") from None
        try:
            obj = self._decoder.decode(text)
        except Rejected:
            raise
        except RecursionError:
            raise Rejected("malformed_json", "value nests too deeply") from None
        except ValueError as exc:
            raise Rejected("malformed_json", str(exc)[:200]) from None
        if not isinstance(obj, dict):
            raise Rejected("not_an_object", f"value is a JSON {type(obj).__name__}, expected an object")
        return obj


# value_format "json" -> the decoder's factory, given the spec and the schema registry's client settings (or
# None); the wire formats' decoders are lakehouse.ingest.formats'
DECODERS: dict[str, Callable[[PipelineSpec, dict | None], Decoder]] = {
    "json": lambda spec, registry: JsonDecoder(spec.contract.has_decimals)}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_timestamp(value: Any, name: str) -> int:
    """Microseconds since the epoch for an ISO-8601 timestamp that carries a UTC offset.

    The instant must lie in TIMESTAMP_RANGE: "9999-12-31T23:30:00-01:00" parses, but is
    in year 10000 once in UTC.
    """
    if isinstance(value, datetime):  # Avro's timestamp-millis/micros logical types (aware, UTC)
        parsed = value
    elif not isinstance(value, str):
        raise Rejected("bad_timestamp", f"{name} must be an ISO-8601 string, got {_show(value)}")
    else:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise Rejected("bad_timestamp", f"{name} {_show(value)} is not ISO-8601") from None
    if parsed.tzinfo is None:
        raise Rejected("bad_timestamp", f"{name} {_show(value)} has no UTC offset")
    delta = parsed - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if not MIN_TIMESTAMP_US <= micros <= MAX_TIMESTAMP_US:
        raise Rejected("timestamp_out_of_range", f"{name} {_show(value)} is outside {TIMESTAMP_RANGE} in UTC")
    return micros


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (JSON's "\\ud800" decodes to one), which no UTF-8 column
    can store; None when it is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


FLOAT32_MAX = 3.4028234663852886e38
_EPOCH_UNITS_US = {"s": 1_000_000, "ms": 1_000, "us": 1}
_DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?")
_DECIMAL_CONTEXT = decimal.Context(prec=80, Emax=10**6, Emin=-10**6, traps=[decimal.InvalidOperation])


def _field_checker(f: FieldSpec, path: str | None = None) -> Callable[[Any], Any]:
    """A function that returns the typed value of field `f` (named `path` in messages, its dotted path when
    nested) in the form Arrow takes it, or raises Rejected."""
    name = path or f.name
    matches = contract_pattern(f.pattern) if f.pattern else None
    matched: set[str] = set()  # up to 1024 short values that matched (currency codes): no RE2 call for them
    enum = frozenset(f.enum) if f.enum else None

    def bounds(number: float) -> None:
        if f.min is not None and number < f.min:
            raise Rejected("out_of_range", f"{name} {_show(number)} is below the minimum {f.min:g}")
        if f.max is not None and number > f.max:
            raise Rejected("out_of_range", f"{name} {_show(number)} is above the maximum {f.max:g}")

    if f.type == "string":
        def check(v: Any) -> Any:
            if not isinstance(v, str):
                raise Rejected("wrong_type", f"{name} must be a string, got {type(v).__name__} {_show(v)}")
            at = None if v.isascii() else lone_surrogate(v)
            if at is not None:
                raise Rejected("bad_string", f"{name} holds a lone surrogate {v[at]!r} at character {at}, "
                                             f"which is not Unicode")
            if enum is not None and v not in enum:
                raise Rejected("bad_enum", f"{name} {_show(v)} is not one of {', '.join(sorted(enum))}")
            if f.max_length is not None and len(v) > f.max_length:
                raise Rejected("too_long", f"{name} has {len(v)} characters, at most {f.max_length} allowed")
            if matches is not None and v not in matched:
                if len(v) > MAX_MATCHED_CHARS:  # bounded before matching, whatever the pattern
                    raise Rejected("too_long", f"{name} has {len(v)} characters; a field with a pattern is "
                                               f"matched up to {MAX_MATCHED_CHARS}")
                if not matches(v):
                    raise Rejected("pattern_mismatch", f"{name} {_show(v)} does not match {f.pattern}")
                if len(matched) < 1024 and len(v) <= 64:
                    matched.add(v)
            return v
    elif f.type in ("int", "long"):
        lo, hi = INT32 if f.type == "int" else INT64

        def check(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, int):
                raise Rejected("wrong_type", f"{name} must be an integer, got {type(v).__name__} {_show(v)}")
            if not lo <= v <= hi:
                raise Rejected("out_of_range", f"{name} {_show(v)} does not fit a {f.type}")
            if enum is not None and v not in enum:
                raise Rejected("bad_enum", f"{name} {v} is not one of {', '.join(map(str, sorted(enum)))}")
            bounds(v)
            return v
    elif f.type in ("double", "float"):
        limit = FLOAT32_MAX if f.type == "float" else math.inf

        def check(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, (int, float, Decimal)):
                raise Rejected("wrong_type", f"{name} must be a number, got {type(v).__name__} {_show(v)}")
            try:
                number = float(v)
            except OverflowError:  # an integer literal of 310+ digits: no double holds it
                raise Rejected("out_of_range", f"{name} {_show(v)} is not a finite {f.type}") from None
            if not math.isfinite(number) or abs(number) > limit:
                raise Rejected("out_of_range", f"{name} {_show(v)} is not a finite {f.type}")
            bounds(number)
            return number
    elif f.type == "decimal":
        return _decimal_checker(f, name)
    elif f.type == "boolean":
        def check(v: Any) -> Any:
            if not isinstance(v, bool):
                raise Rejected("wrong_type", f"{name} must be true or false, got {type(v).__name__} {_show(v)}")
            return v
    elif f.type == "timestamp":
        per_unit = None if f.unit is None else _EPOCH_UNITS_US.get(f.unit)

        def check(v: Any) -> Any:
            if per_unit is not None and type(v) is int:
                micros = v * per_unit
                if not MIN_TIMESTAMP_US <= micros <= MAX_TIMESTAMP_US:
                    raise Rejected("timestamp_out_of_range", f"{name} {_show(v)} {f.unit} since the epoch is "
                                                             f"outside {TIMESTAMP_RANGE}")
                return micros
            if type(v) is datetime and v.tzinfo is None:  # Avro's local-timestamp types: wall time, read as UTC
                v = v.replace(tzinfo=UTC)
            return parse_timestamp(v, name)
    elif f.type == "date":
        def check(v: Any) -> Any:
            if type(v) is date:  # Avro's date logical type
                return (v - _EPOCH_DATE).days
            if f.unit == "days" and type(v) is int:
                if not _MIN_DAYS <= v <= _MAX_DAYS:
                    raise Rejected("bad_date", f"{name} {v} days since the epoch is outside years 1 to 9999")
                return v
            if not isinstance(v, str):
                raise Rejected("bad_date", f"{name} must be an ISO-8601 date string, got {_show(v)}")
            try:
                return (date.fromisoformat(v) - _EPOCH_DATE).days
            except ValueError:
                raise Rejected("bad_date", f"{name} {_show(v)} is not an ISO-8601 date") from None
    elif f.type == "uuid":
        def check(v: Any) -> Any:
            if isinstance(v, UUID):  # Avro's uuid logical type
                return str(v)
            if type(v) is bytes and len(v) == 16:
                return str(UUID(bytes=v))
            if not isinstance(v, str) or len(v) != 36 or v[8] + v[13] + v[18] + v[23] != "----":
                raise Rejected("bad_uuid", f"{name} {_show(v)} is not a UUID (8-4-4-4-12 hexadecimal digits)")
            try:
                return str(UUID(v))
            except ValueError:
                raise Rejected("bad_uuid", f"{name} {_show(v)} is not a UUID (8-4-4-4-12 hexadecimal digits)") \
                    from None
    elif f.type == "binary":
        def check(v: Any) -> Any:
            if isinstance(v, (bytes, bytearray)):
                return bytes(v)
            if isinstance(v, str):  # JSON carries bytes as base64 (Kafka Connect's JSON converter does)
                try:
                    return base64.b64decode(v, validate=True)
                except (ValueError, binascii.Error):
                    raise Rejected("wrong_type", f"{name} is not base64 text: {_show(v)}") from None
            raise Rejected("wrong_type", f"{name} must be bytes (base64 text in JSON), got {type(v).__name__}")
    elif f.type == "struct":
        return _struct_checker(f, name)
    elif f.type == "list":
        return _list_checker(f, name)
    elif f.type == "map":
        return _map_checker(f, name)
    else:  # pragma: no cover - spec validation rejects unknown types
        raise ValueError(f"unsupported field type {f.type}")
    return check


_MIN_DAYS = (date.min - _EPOCH_DATE).days
_MAX_DAYS = (date.max - _EPOCH_DATE).days


def _decimal_checker(f: FieldSpec, name: str) -> Callable[[Any], Decimal]:
    """decimal(P,S): exact values only. A value with more than S decimal places (other than trailing
    zeros) or more than P-S integer digits is out_of_range, never rounded."""
    precision, scale = f.digits
    quantum = Decimal(1).scaleb(-scale)
    integer_digits = precision - scale
    lo = None if f.min is None else Decimal(repr(f.min))
    hi = None if f.max is None else Decimal(repr(f.max))

    def check(v: Any) -> Decimal:
        if isinstance(v, bool):
            raise Rejected("wrong_type", f"{name} must be a decimal number, got bool {_show(v)}")
        if isinstance(v, Decimal):
            d = v
        elif isinstance(v, int):
            d = Decimal(v)
        elif isinstance(v, float):  # a JSON number read as a double: its shortest text is what was sent
            d = Decimal(repr(v))
        elif isinstance(v, str) and len(v) <= 100 and _DECIMAL_TEXT.fullmatch(v.strip()):
            d = Decimal(v.strip())
        else:
            raise Rejected("wrong_type", f"{name} must be a decimal number or its text, got {type(v).__name__} "
                                         f"{_show(v)}")
        if not d.is_finite():
            raise Rejected("out_of_range", f"{name} {_show(v)} is not a finite decimal")
        if d and d.adjusted() >= integer_digits:
            raise Rejected("out_of_range", f"{name} {_show(v)} does not fit decimal({f.precision},{f.scale})")
        try:
            exact = d.quantize(quantum, context=_DECIMAL_CONTEXT)
        except decimal.InvalidOperation:
            raise Rejected("out_of_range", f"{name} {_show(v)} does not fit decimal({f.precision},{f.scale})") \
                from None
        if exact != d:
            raise Rejected("out_of_range", f"{name} {_show(v)} has more than {f.scale} decimal places; "
                                           f"decimal({f.precision},{f.scale}) would round it")
        if lo is not None and exact < lo:
            raise Rejected("out_of_range", f"{name} {_show(v)} is below the minimum {f.min:g}")
        if hi is not None and exact > hi:
            raise Rejected("out_of_range", f"{name} {_show(v)} is above the maximum {f.max:g}")
        return exact

    return check


def _struct_checker(f: FieldSpec, name: str) -> Callable[[Any], dict]:
    children = [(c.name, c.required, _field_checker(c, f"{name}.{c.name}")) for c in f.fields]

    def check(v: Any) -> dict:
        if not isinstance(v, dict):
            raise Rejected("wrong_type", f"{name} must be an object, got {type(v).__name__} {_show(v)}")
        out: dict[str, Any] = {}
        for child, required, check_child in children:
            value = v.get(child)
            if value is None:
                if required:
                    raise Rejected("missing_required", f"{name}.{child} is required")
                out[child] = None
            else:
                out[child] = check_child(value)
        return out

    return check


def _list_checker(f: FieldSpec, name: str) -> Callable[[Any], list]:
    check_item = _field_checker(f.element, f"{name}[]")
    required = f.element.required

    def check(v: Any) -> list:
        if not isinstance(v, (list, tuple)):
            raise Rejected("wrong_type", f"{name} must be a list, got {type(v).__name__} {_show(v)}")
        out: list[Any] = []
        for i, item in enumerate(v):
            if item is None:
                if required:
                    raise Rejected("missing_required", f"{name}[{i}] is null; the list's elements are required")
                out.append(None)
                continue
            try:
                out.append(check_item(item))
            except Rejected as rejected:  # name the element: `lines[3].sku`, not `lines[].sku`
                raise Rejected(rejected.kind, rejected.detail.replace(f"{name}[]", f"{name}[{i}]", 1)) from None
        return out

    return check


def _map_checker(f: FieldSpec, name: str) -> Callable[[Any], dict]:
    check_value = _field_checker(f.element, f"{name}{{}}")
    required = f.element.required

    def check(v: Any) -> dict:
        if not isinstance(v, dict):
            raise Rejected("wrong_type", f"{name} must be an object (a map), got {type(v).__name__} {_show(v)}")
        out: dict[str, Any] = {}
        for key, value in v.items():
            if not isinstance(key, str):
                raise Rejected("wrong_type", f"{name} has a key that is not text: {_show(key)}")
            if not key.isascii() and lone_surrogate(key) is not None:
                raise Rejected("bad_string", f"{name} has a key with a lone surrogate, which is not Unicode")
            if value is None:
                if required:
                    raise Rejected("missing_required", f"{name}[{_show(key)}] is null; the map's values are required")
                out[key] = None
                continue
            try:
                out[key] = check_value(value)
            except Rejected as rejected:
                raise Rejected(rejected.kind, rejected.detail.replace(f"{name}{{}}", f"{name}[{_show(key)}]", 1)) \
                    from None
        return out

    return check


# The reference decoder and msgspec both give up at Python's recursion limit (1000 by
# default), at depths that differ and depend on the caller's stack; values that could nest
# deeper than this go to the reference.
_MAX_FAST_NESTING = 100
_DOUBLE_MAX = sys.float_info.max


class _NotMirrored(Exception):
    """The contract has a rule the fast path does not reproduce exactly; use the reference."""


def _number_interval(f: FieldSpec, lo: float, hi: float, integral: bool) -> tuple[float, float] | None:
    """The closed interval of numbers `f`'s min/max let through within [lo, hi], or None if empty."""
    for bound, is_min in ((f.min, True), (f.max, False)):
        if bound is None or math.isnan(bound):  # the reference's `<` and `>` never fire on NaN
            continue
        if math.isinf(bound):
            if (bound < 0) == is_min:  # min -inf or max +inf: no bound
                continue
            return None
        if is_min:
            lo = max(lo, math.ceil(bound) if integral else bound)
        else:
            hi = min(hi, math.floor(bound) if integral else bound)
    return (lo, hi) if lo <= hi else None


def _fast_type(f: FieldSpec) -> Any:
    """The msgspec type of the non-null values of `f` that the reference accepts unchanged.

    None when no value can pass. Patterns, timestamps and dates decode as `str`
    and are checked in Python afterwards, like the reference does.
    """
    if f.type == "string":
        limit = f.max_length
        if f.pattern:  # the reference matches no longer value
            limit = MAX_MATCHED_CHARS if limit is None else min(limit, MAX_MATCHED_CHARS)
        if f.enum:
            matches = contract_pattern(f.pattern) if f.pattern else None
            allowed = tuple(e for e in f.enum if (limit is None or len(e) <= limit)
                            and (matches is None or matches(e)))
            return Literal[allowed] if allowed else None
        return str if limit is None else Annotated[str, msgspec.Meta(max_length=limit)]
    if f.type in ("int", "long"):
        interval = _number_interval(f, *(INT32 if f.type == "int" else INT64), integral=True)
        if interval is None:
            return None
        lo, hi = interval
        if f.enum:
            allowed = tuple(e for e in f.enum if lo <= e <= hi)
            return Literal[allowed] if allowed else None
        return Annotated[int, msgspec.Meta(ge=lo, le=hi)]
    if f.type in ("double", "float"):
        # finite bounds also turn away what msgspec might read as +-inf (the reference rejects it)
        largest = FLOAT32_MAX if f.type == "float" else _DOUBLE_MAX
        interval = _number_interval(f, -largest, largest, integral=False)
        if interval is None:
            return None
        return Annotated[float, msgspec.Meta(ge=interval[0], le=interval[1])]
    if f.type == "boolean":
        return bool
    if f.type in ("timestamp", "date"):
        return str
    raise _NotMirrored(f.type)  # pragma: no cover - spec validation rejects unknown types


class JsonFastPath:
    """Decodes, a few times faster, the JSON values the reference `RecordValidator.check` accepts.

    `decode_row(key_text, value)`, compiled for the contract, returns the row as
    a tuple of contract values (contract order, the forms `check` gives: epoch
    microseconds, epoch days, floats for doubles) or None when it cannot vouch
    for the verdict: the record is rejected, a tombstone, or unusual in a way
    where msgspec and the standard json module may disagree (invalid UTF-8 in a
    field msgspec skips, deep nesting, integers past Python's digit limit).
    None means "ask the reference", never "rejected".

    msgspec checks types, required fields, int32/int64 and min/max bounds,
    max_length and enums from a Struct generated from the contract; it takes the
    last of duplicate keys, as json does, and refuses NaN/Infinity, lone
    surrogates and non-finite doubles. Python then checks what msgspec expresses
    differently: `pattern` (msgspec searches, the contract means fullmatch),
    timestamps and dates (the reference's ISO-8601 parsing and range), and the key.
    """

    def __init__(self, spec: PipelineSpec):
        """Raises _NotMirrored when the contract has a rule the fast path cannot reproduce exactly."""
        fields = spec.contract.fields
        struct_fields: list[tuple] = []
        for i, f in enumerate(fields):
            fast_type = _fast_type(f)
            if f.required:
                if fast_type is None:  # no record can pass: every one needs the reference's reason
                    raise _NotMirrored(f"{f.name} accepts no value")
                struct_fields.append((f"f{i}", fast_type))
            else:
                struct_fields.append((f"f{i}", type(None) if fast_type is None else fast_type | None, None))
        # Attribute names f0, f1, ... so that contract names never collide with Struct internals.
        # gc=False: the row holds only str, int, float, bool and None, nothing the cyclic GC needs to see
        row_type = msgspec.defstruct("ContractRow", struct_fields, kw_only=True, gc=False,
                                     rename={f"f{i}": f.name for i, f in enumerate(fields)})
        key_index, key_is_text = None, True
        key_field = spec.source.key_field
        if key_field is not None:
            key_spec = spec.contract.field(key_field)
            if key_spec.type == "double":  # the reference compares the key with str() of the raw 5 or 5.0
                raise _NotMirrored(f"key field {key_field} is a double")
            key_index = spec.contract.names.index(key_field)
            key_is_text = key_spec.type in ("string", "timestamp", "date")  # still the raw string here
        self.decode_row = _compile_decode_row(
            decode=msgspec.json.Decoder(row_type).decode,
            max_bytes=spec.source.max_value_bytes,
            patterns=[(i, contract_pattern(f.pattern)) for i, f in enumerate(fields)
                      if f.type == "string" and f.pattern and not f.enum],
            timestamps=[i for i, f in enumerate(fields) if f.type == "timestamp"],
            dates=[i for i, f in enumerate(fields) if f.type == "date"],
            key_index=key_index, key_is_text=key_is_text)

    @classmethod
    def for_spec(cls, spec: PipelineSpec) -> JsonFastPath | None:
        """The fast path for `spec`'s contract, or None when it cannot mirror the reference exactly."""
        try:
            return cls(spec)
        except _NotMirrored:
            return None


def _compile_decode_row(decode: Callable[[bytes], Any], max_bytes: int, patterns: list[tuple[int, Callable]],
                        timestamps: list[int], dates: list[int], key_index: int | None,
                        key_is_text: bool) -> Callable[[str | None, bytes | None], tuple | None]:
    """`JsonFastPath.decode_row` for one contract: a closure, since locals are cheaper than attributes."""
    astuple = msgspec.structs.astuple
    fromisoformat, date_fromisoformat = datetime.fromisoformat, date.fromisoformat
    converts = bool(timestamps or dates)
    min_us, max_us = MIN_TIMESTAMP_US, MAX_TIMESTAMP_US
    # Up to 1024 short values per field that matched are remembered (e.g. currency codes) to skip the regex.
    matching: list[tuple[int, Callable, set[str]]] = [(i, fullmatch, set()) for i, fullmatch in patterns]
    # json turns integer literals longer than Python's digit limit into errors; msgspec does not
    digit_limit = sys.get_int_max_str_digits() or math.inf
    long_digit_run = re.compile(rb"(?<![0-9])[0-9]{%d}" % (digit_limit + 1)) if digit_limit < math.inf else None

    def decode_row(key_text: str | None, value: bytes | None) -> tuple | None:
        """The row the reference would return for this record, or None to ask the reference."""
        if value is None:
            return None
        size = len(value)
        if size > max_bytes:
            return None
        if not value.isascii():
            try:  # the reference rejects invalid UTF-8 anywhere; msgspec only in strings it keeps
                value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if size > 2 * _MAX_FAST_NESTING and (
                value.count(b"[") + value.count(b"{") > _MAX_FAST_NESTING
                or long_digit_run is not None and size > digit_limit and long_digit_run.search(value)):
            return None
        try:
            values = astuple(decode(value))
        except Exception:  # noqa: BLE001 - any decode or validation error: the reference names the reason
            return None
        if key_index is not None and key_text is not None:
            key_value = values[key_index]
            if key_value is None or key_text != (key_value if key_is_text else str(key_value)):
                return None
        for i, fullmatch, known in matching:
            text = values[i]
            if text is not None and text not in known:
                if not fullmatch(text):  # at most MAX_MATCHED_CHARS: the decoder's max_length
                    return None
                if len(known) < 1024 and len(text) <= 64:
                    known.add(text)
        if not converts:
            return values
        row = list(values)
        try:
            for i in timestamps:
                text = row[i]
                if text is not None:
                    moment = fromisoformat(text)
                    if moment.tzinfo is None:
                        return None
                    micros = (moment - _EPOCH) // _ONE_MICROSECOND  # exact, like parse_timestamp
                    if not min_us <= micros <= max_us:
                        return None
                    row[i] = micros
            for i in dates:
                text = row[i]
                if text is not None:
                    row[i] = (date_fromisoformat(text) - _EPOCH_DATE).days
        except Exception:  # noqa: BLE001 - not ISO-8601 (or worse): the reference says how
            return None
        return tuple(row)

    return decode_row


@dataclass(frozen=True)
class WriterSchemas:
    """What the ingest job's driver tells reader tasks about writer schemas (lakehouse.ingest.formats):
    whether it resolves ids the tasks were not shipped (it has a registry), the ids it evolved the tables
    for or quarantined (SchemaGate), and the ids no registry has (their records are dead letters)."""

    resolvable: bool = False
    accepted: frozenset[int] = frozenset()
    missing: frozenset[int] = frozenset()


class SchemaGate:
    """Whether a pipeline takes the records of a writer schema, asked once per schema id by the wire
    decoders (lakehouse.ingest.formats) before its first record is decoded.

    A declared contract takes a writer schema whose fields it can read (schemas.conflicts); a contract
    that follows the writer schemas takes one that adds nothing to it (schemas.compare). Otherwise:
    - a compatible change of a followed contract raises SchemaChangeError (the driver evolves the table
      and writes the batch again);
    - an incompatible writer schema under `schema_policy.on_incompatible: fail` raises
      WriterSchemaIncompatibleError (the job stops), under `quarantine` its records are dead-lettered
      as `schema_incompatible` (the returned reason).
    """

    def __init__(self, spec: PipelineSpec, accepted: frozenset[int] = frozenset()):
        self.spec = spec
        self.accepted = accepted  # ids the driver already evolved the table for, or quarantined

    def __call__(self, writer) -> str | None:
        from lakehouse.core import schemas

        contract = self.spec.contract
        try:
            fields = writer.fields(self.spec.source.envelope)
        except errors.SchemaTranslationError as exc:
            return self._incompatible(writer.schema_id, [str(exc)])
        if not contract.from_writer_schema:
            return self._incompatible(writer.schema_id, schemas.conflicts(contract.fields, fields))
        diff = schemas.compare(contract.fields, fields)
        if diff.incompatible:
            return self._incompatible(writer.schema_id, diff.incompatible)
        if diff.evolves and writer.schema_id not in self.accepted:
            raise errors.SchemaChangeError(
                f"writer schema {writer.schema_id} changes the contract ({_changes(diff)}) "
                f"{errors.task_marker('schema-change', schema_id=writer.schema_id)}")
        return None

    def _incompatible(self, schema_id: int, why: list[str]) -> str | None:
        if not why:
            return None
        reason = f"writer schema {schema_id} does not fit the contract: " + "; ".join(why)[:1500]
        if self.spec.schema_policy.on_incompatible == "quarantine" or schema_id in self.accepted:
            return reason
        raise errors.WriterSchemaIncompatibleError(
            f"{reason}. schema_policy.on_incompatible is 'fail': fix the producer, or set it to 'quarantine' "
            f"to dead-letter its records {errors.task_marker('schema-incompatible', schema_id=schema_id)}")


def _unwrap(obj: Any) -> Any:
    """Kafka Connect's JSON with schemas ({"schema": ..., "payload": ...}) as its payload; anything else as is."""
    if isinstance(obj, dict) and len(obj) == 2 and "schema" in obj and "payload" in obj:
        return obj["payload"]
    return obj


def _epoch_ms_to_us(ms: Any) -> int | None:
    if type(ms) is int and MIN_TIMESTAMP_US <= ms * 1000 <= MAX_TIMESTAMP_US:
        return ms * 1000
    return None


MAX_POSITION = 10 ** 38 - 1  # the `_cdc.position` column is a decimal(38,0)


def source_position(source: dict) -> Decimal | None:
    """Where a change event stands in its source database's log, as one number that orders the events of
    one connector: PostgreSQL's `lsn`; MySQL's binlog `file` number, `pos` and `row`; SQL Server's
    `change_lsn` and `event_serial_no`; Oracle's `scn`; MongoDB's `sec` and `ord`. None for a source
    without one (ordering then falls back to the commit time and the Kafka timestamp)."""
    try:
        if isinstance(source.get("lsn"), int):
            found = source["lsn"]
        elif isinstance(source.get("file"), str) and isinstance(source.get("pos"), int):
            number = int(re.sub(r"\D", "", source["file"])[-12:] or 0)
            found = (number * 10 ** 12 + source["pos"]) * 10 ** 6 + int(source.get("row") or 0)
        elif isinstance(source.get("change_lsn"), str):
            found = int(source["change_lsn"].replace(":", ""), 16) * 10 ** 6 + int(source.get("event_serial_no") or 0)
        elif isinstance(source.get("scn"), (str, int)):
            found = int(source["scn"])
        elif isinstance(source.get("sec"), int):
            found = source["sec"] * 10 ** 9 + int(source.get("ord") or 0)
        else:
            return None
    except (ValueError, TypeError, OverflowError):
        return None
    return Decimal(found) if 0 <= found <= MAX_POSITION else None


# (contract type, writer type) whose values need no check when the contract field has no constraint
_UNCHECKED = {("int", "int"), ("long", "int"), ("long", "long"), ("boolean", "boolean"), ("binary", "binary")}


def _passes_unchecked(f: FieldSpec, w: FieldSpec, schema_type: str) -> bool:
    """Whether every non-null value of writer field `w` passes contract field `f`'s check unchanged."""
    if f.enum is not None or f.min is not None or f.max is not None or f.pattern or f.max_length:
        return False
    if (f.type, w.type) in _UNCHECKED:
        # fastavro reads an Avro int's varint as 64 bits, so a value written by hand may be past 32 (its long's
        # are never past 64); a Protobuf "long" may be a uint64 beyond a long
        return (f.type, w.type) != (("int", "int") if schema_type == "AVRO" else ("long", "long"))
    # fastavro decodes Avro strings as strict UTF-8 (proto2 strings can come as bytes)
    return f.type == w.type == "string" and schema_type == "AVRO"


def _aware_micros(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An Avro timestamp (an aware datetime, always inside TIMESTAMP_RANGE) as epoch microseconds; the
    field's `check` for anything else."""
    def convert(v: Any) -> Any:
        if type(v) is datetime and v.tzinfo is not None:
            return (v - _EPOCH) // _ONE_MICROSECOND
        return check(v)
    return convert


def _quarantined(name: str) -> Callable[[Any], Any]:
    def refuse(v: Any) -> Any:
        raise Rejected("schema_incompatible",
                       f"{name} changed incompatibly in the contract; quarantined until the table is fixed")
    return refuse


def _changes(diff) -> str:
    parts = [f"{what} {', '.join(paths)}" for what, paths in
             (("adds", diff.added), ("widens", diff.widened), ("may leave null", diff.relaxed)) if paths]
    return "; ".join(parts)[:500]


def _change_meta(event: Any) -> tuple[str, dict]:
    """(op, `_cdc` value) of a Debezium change event (unwrapped): the op is c, r, u or d; the `_cdc` value
    holds it, the source's commit time (epoch micros) and its position in the source's log. Rejected for
    anything that is no change event, a truncate (t) and a logical decoding message (m)."""
    if not isinstance(event, dict):
        raise Rejected("bad_envelope", f"not a Debezium change event: the payload is {_show(event)}")
    op = event.get("op")
    if op in ("t", "m"):
        raise Rejected("unsupported_change", "a truncate (op t) empties the whole source table and is not applied "
                                             "row by row; replay the table's snapshot instead" if op == "t" else
                       "a logical decoding message (op m) carries no row")
    if op is None:
        raise Rejected("bad_envelope", "not a Debezium change event: it has no `op`")
    if op not in ("c", "r", "u", "d"):
        raise Rejected("bad_envelope", f"op {_show(op)} is not a Debezium operation (c, r, u, d, t, m)")
    source = event.get("source")
    if not isinstance(source, dict):
        source = {}
    return op, {"op": op, "source_ts": _epoch_ms_to_us(source.get("ts_ms", event.get("ts_ms"))),
                "position": source_position(source)}


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
            from lakehouse.ingest.formats import schema_store

            store = schema_store(spec, registry, writer_schemas.resolvable, writer_schemas.missing)
        # `gated`: writer schemas pass the SchemaGate before their first value is decoded (ingestion); an
        # audit of what was ingested (lakehouse.audit.verify) reads values of any writer schema
        gate = SchemaGate(spec, writer_schemas.accepted) if gated else None
        self.decoder = self._decoder(source.value_format, store, gate, "value")
        self.key_decoder = None if source.key_format == "string" else \
            self._decoder(source.key_format, store, None, "key")
        self.key_record: dict | None = None  # the decoded key of the last check_key (record keys)
        self.fields = [(f.name, f.required, _field_checker(f)) for f in spec.contract.fields]
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
        # values start with (a header, Protobuf's message indexes), all of one length (formats.compile_row)
        self._wire_rows: dict[bytes, Callable[[str | None, bytes], tuple | None]] = {}
        self._wire_head = 0
        # the JSON fast path: plain JSON values (or JSON Schema's payloads) with text keys, no quarantine
        self._payload = getattr(self.decoder, "payload", None)
        json_values = type(self.decoder) is JsonDecoder or self._payload is not None
        self.fast_path = JsonFastPath.for_spec(spec) \
            if json_values and self.key_decoder is None and not quarantined else None
        self._fast_row = None if self.fast_path is None else self.fast_path.decode_row
        self.fallbacks = 0  # records check_row's fast paths left to the reference (or a writer schema's row plan)

    def _decoder(self, fmt: str, store, gate, what: str) -> Decoder:
        if fmt == "json":
            return DECODERS["json"](self.spec, None) if what == "value" else JsonDecoder()
        from lakehouse.ingest.formats import wire_decoder

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
                record = _unwrap(self.key_decoder.decode(key))
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
                raise Rejected("bad_key", f"key {_show(raw)} is not a {kind} for {self.key_field}")
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
        op, meta = _change_meta(_unwrap(self.decoder.decode(value)))
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
                raise Rejected("key_mismatch", f"key {_show(expected)} differs from {self.key_field} {_show(got)}")
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
                raise Rejected("schema_incompatible",
                               f"{name} changed incompatibly in the contract; quarantined until the table is fixed")
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
        key_text = self.check_key(key)
        if self.key_record is None:  # a key that is not a record holding the primary key
            raise Rejected("bad_key", "a change event's key must be a record holding the primary key columns")
        keys = self._key_values(self.key_record)
        key_row = tuple(keys.get(name) for name in self.names)
        if value is None:  # the tombstone after a delete: the key stays deleted
            return key_text, (*key_row, {"op": "d", "source_ts": None, "position": None}), "delete"
        if len(value) > self.max_value_bytes:
            raise Rejected("oversize", f"value has {len(value)} bytes, at most {self.max_value_bytes} allowed")
        plan = None
        if self._wire is not None:  # Avro, Protobuf: the writer schema's row plan checks the `after` row
            writer, event = self._wire.decode_with_writer(value)
            plan = self._writer_plan(writer)
        else:
            event = self.decoder.decode(value)
        event = _unwrap(event)
        op, meta = _change_meta(event)
        if op in ("c", "r", "u"):
            after = _unwrap(event.get("after"))
            if not isinstance(after, dict):
                raise Rejected("bad_envelope", f"a change event with op {op!r} has no `after` row")
            if plan is not None:
                values = plan(after)
            else:
                row = self.check_fields(after)
                values = tuple(row[name] for name in self.names)
            for index, value_in_key in self._key_positions(keys):
                if values[index] != value_in_key:
                    raise Rejected("key_mismatch", f"the key's {self.names[index]} {_show(value_in_key)} differs "
                                                   f"from the row's {_show(values[index])}")
            return key_text, (*values, meta), "upsert"
        return key_text, (*key_row, meta), "delete"  # op d: _change_meta admits nothing else

    def _writer_plan(self, writer) -> Callable[[dict], tuple] | None:
        """The row plan of writer schema `writer` (`_plan`), made once; its compiled row too."""
        try:
            return self._plans[writer.schema_id]
        except KeyError:
            plan = self._plans[writer.schema_id] = self._plan(writer)
            self._compile_row(writer)
            return plan

    def _planned_row(self, wire: WriterSchemaDecoder, key_text: str | None, value: bytes) -> tuple:
        """`check_row` of a wire-format value through its writer schema's row plan (`_plan`): the same
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
                raise Rejected("key_mismatch", f"key {_show(expected)} differs from {self.key_field} {_show(got)}")
        return values

    def _compile_row(self, writer) -> None:
        """Keep the compiled row of admitted writer schema `writer` (lakehouse.ingest.formats: its values read
        straight into rows, None where it cannot vouch for `check`'s verdict), if the decoder has one."""
        if self.spec.source.envelope is not None or (self.key_field is not None and self.key_field not in self.names):
            return
        from lakehouse.ingest.formats import RowContract

        contract = RowContract(
            self.spec.contract.fields, tuple(check for _, _, check in self.fields), self.quarantined,
            None if self.key_field is None else self.names.index(self.key_field),
            None if self.key_decoder is None else self._key_value, self.max_value_bytes)
        compile_row = getattr(self.decoder, "compile_row", None)
        compiled = None if compile_row is None else compile_row(writer, contract)
        if compiled is not None:
            head, row = compiled
            self._wire_head = len(head)
            self._wire_rows[head] = row

    def _plan(self, writer) -> Callable[[dict], tuple] | None:
        """The row plan of writer schema `writer`: `check_fields` as a tuple, with the check of a field left out
        where the writer's type guarantees it passes (an int into a long, an unconstrained string from
        Avro, which decodes UTF-8 strictly, bytes, booleans) and timestamps converted directly. None when
        the writer schema does not translate (the reference then checks every field)."""
        try:
            written = {f.name: f for f in writer.fields(self.spec.source.envelope)}
        except errors.SchemaTranslationError:
            return None
        steps: list[tuple[str, bool, Callable[[Any], Any] | None]] = []  # convert None: the value as it is
        for f, (name, required, check) in zip(self.spec.contract.fields, self.fields, strict=True):
            w = written.get(name)
            convert: Callable[[Any], Any] | None = check
            if name in self.quarantined:
                convert = _quarantined(name)
            elif w is not None and _passes_unchecked(f, w, writer.schema_type):
                convert = None
            elif w is not None and f.type == "timestamp" and w.type == "timestamp" and w.unit is None \
                    and writer.schema_type == "AVRO" and not f.unit:
                convert = _aware_micros(check)
            steps.append((name, required, convert))

        def plan(obj: dict) -> tuple:
            out: list[Any] = []
            append = out.append
            for name, required, convert in steps:
                v = obj.get(name)
                if v is None:
                    if required:
                        raise Rejected("missing_required", f"{name} is required")
                    append(None)
                elif convert is None:
                    append(v)
                else:
                    append(convert(v))
            return tuple(out)

        return plan

    def _key_positions(self, keys: dict) -> list[tuple[int, Any]]:
        """(contract position, value) of each primary-key column in `keys`."""
        return [(self.names.index(name), value) for name, value in keys.items()]

    def _key_values(self, record: dict) -> dict:
        """The primary-key columns (target.key) of a change event's key record, checked."""
        record = _unwrap(record)
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
