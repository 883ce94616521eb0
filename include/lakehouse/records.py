"""Decode and validate one Kafka record against a pipeline's contract.

The path of a record: `RecordValidator.check(key, value)` either returns the
typed row (a dict of contract columns) or raises `Rejected(kind, detail)`, which
the reader turns into a dead letter. Decoders are a seam: JSON today; Avro or
JSON-Schema with a schema registry register another `Decoder` under their
`value_format` name.
"""

from __future__ import annotations

import json
import math
import re
from datetime import date, datetime, timezone
from typing import Any, Callable, Protocol

from lakehouse.spec import FieldSpec, PipelineSpec

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# The reasons a record can be dead-lettered; stored in the dead-letter table's error_kind.
ERROR_KINDS = (
    "malformed_json",      # value is not parseable JSON
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
    "oversize",            # value larger than source.max_value_bytes
    "null_value",          # tombstone where the pipeline has no use for one
    "null_key",            # no key where the spec requires one
    "bad_key",             # key bytes are not UTF-8
    "key_mismatch",        # key differs from the key field in the value
    "schema_incompatible", # carries a field the table cannot take under the quarantine policy
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


def _reject_constant(name: str) -> float:
    raise Rejected("out_of_range", f"{name} is not a finite number")


class JsonDecoder:
    _decoder = json.JSONDecoder(parse_constant=_reject_constant)

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


DECODERS: dict[str, Callable[[PipelineSpec], Decoder]] = {"json": lambda spec: JsonDecoder()}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_timestamp(value: Any, name: str) -> int:
    """Microseconds since the epoch for an ISO-8601 timestamp that carries a UTC offset."""
    if not isinstance(value, str):
        raise Rejected("bad_timestamp", f"{name} must be an ISO-8601 string, got {_show(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise Rejected("bad_timestamp", f"{name} {_show(value)} is not ISO-8601") from None
    if parsed.tzinfo is None:
        raise Rejected("bad_timestamp", f"{name} {_show(value)} has no UTC offset")
    delta = parsed - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _field_checker(f: FieldSpec) -> Callable[[Any], Any]:
    """A function that returns the typed value of field `f` or raises Rejected."""
    name = f.name
    pattern = re.compile(f.pattern) if f.pattern else None
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
            if enum is not None and v not in enum:
                raise Rejected("bad_enum", f"{name} {_show(v)} is not one of {', '.join(sorted(enum))}")
            if f.max_length is not None and len(v) > f.max_length:
                raise Rejected("too_long", f"{name} has {len(v)} characters, at most {f.max_length} allowed")
            if pattern is not None and not pattern.fullmatch(v):
                raise Rejected("pattern_mismatch", f"{name} {_show(v)} does not match {f.pattern}")
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
    elif f.type == "double":
        def check(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise Rejected("wrong_type", f"{name} must be a number, got {type(v).__name__} {_show(v)}")
            number = float(v)
            if not math.isfinite(number):
                raise Rejected("out_of_range", f"{name} {_show(v)} is not a finite double")
            bounds(number)
            return number
    elif f.type == "boolean":
        def check(v: Any) -> Any:
            if not isinstance(v, bool):
                raise Rejected("wrong_type", f"{name} must be true or false, got {type(v).__name__} {_show(v)}")
            return v
    elif f.type == "timestamp":
        def check(v: Any) -> Any:
            return parse_timestamp(v, name)
    elif f.type == "date":
        def check(v: Any) -> Any:
            if not isinstance(v, str):
                raise Rejected("bad_date", f"{name} must be an ISO-8601 date string, got {_show(v)}")
            try:
                return (date.fromisoformat(v) - date(1970, 1, 1)).days
            except ValueError:
                raise Rejected("bad_date", f"{name} {_show(v)} is not an ISO-8601 date") from None
    else:  # pragma: no cover - spec validation rejects unknown types
        raise ValueError(f"unsupported field type {f.type}")
    return check


class RecordValidator:
    """Checks records against a spec's contract and source rules.

    `check` returns the row as a dict of contract columns in their Arrow-ready
    form (timestamps as epoch microseconds, dates as epoch days), or None for a
    tombstone that an upsert pipeline turns into a delete.
    """

    def __init__(self, spec: PipelineSpec, quarantined: frozenset[str] = frozenset()):
        self.spec = spec
        self.decoder = DECODERS[spec.source.value_format](spec)
        self.fields = [(f.name, f.required, _field_checker(f)) for f in spec.contract.fields]
        self.quarantined = quarantined
        self.max_value_bytes = spec.source.max_value_bytes
        self.key_field = spec.source.key_field
        self.key_required = spec.source.key_required
        self.tombstone_deletes = spec.target.mode == "upsert" and self.key_field is not None \
            and spec.target.key == (self.key_field,)

    def check_key(self, key: bytes | None) -> str | None:
        if key is None:
            if self.key_required:
                raise Rejected("null_key", "record has no key; the pipeline requires one")
            return None
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejected("bad_key", f"key is not UTF-8 at byte {exc.start}") from None

    def check(self, key_text: str | None, value: bytes | None) -> dict | None:
        if value is None:
            if self.tombstone_deletes and key_text is not None:
                return None
            raise Rejected("null_value", "record has no value (tombstone)")
        if len(value) > self.max_value_bytes:
            raise Rejected("oversize", f"value has {len(value)} bytes, at most {self.max_value_bytes} allowed")
        obj = self.decoder.decode(value)
        row = {}
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
        if self.key_field is not None and key_text is not None and key_text != str(obj.get(self.key_field)):
            raise Rejected("key_mismatch",
                           f"key {_show(key_text)} differs from {self.key_field} {_show(obj.get(self.key_field))}")
        return row
