"""The defects a synthetic record can carry on purpose, and how a valid record is broken in each way.

`BAD_KINDS` are the decoder's error kinds (lakehouse.ingest.rejects.ERROR_KINDS) a producer can inject, in
the order they are taken in turn; `FORMAT_KINDS` what each value format can carry of them; `FIELD_KINDS`
those made by changing one field, and which fields each can change. A `RecordBreaker` breaks the valid
records of a lakehouse_dev.record_factory.RecordFactory one defect at a time, at a `FieldPath` (a field,
nested ones included). Whether the reader then rejects the record as that kind is checked by the streams
(lakehouse_dev.verdicts); the defects a format breaks its own way (JSON text that does not parse, a wire
format's header) are its writer's (lakehouse_dev.record_formats).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from random import Random
from typing import Any

from lakehouse.core.spec import FieldSpec
from lakehouse.ingest.checks import FLOAT32_MAX
from lakehouse_dev import pattern_strings
from lakehouse_dev.record_factory import WORDS, RecordFactory
from lakehouse_dev.record_formats import dumps

# The defects `produce` can inject, in the order they are taken in turn. These strings
# are the decoder's error kinds (lakehouse.ingest.rejects.ERROR_KINDS): keep them identical.
BAD_KINDS = (
    "malformed_json",    # truncated JSON text
    "not_utf8",          # bytes that are not UTF-8 (a Latin-1 string inside the JSON)
    "not_an_object",     # a JSON array or number instead of an object
    "missing_required",  # a required field dropped (or null: a list's element, a map's value)
    "wrong_type",        # e.g. amount as "abc", a string field as a number, a struct as text
    "bad_enum",          # a value outside the field's enum (an enum number the .proto does not know)
    "out_of_range",      # e.g. a negative amount where min is 0, a decimal with too many digits
    "pattern_mismatch",  # e.g. currency "eur" where the pattern is ^[A-Z]{3}$
    "bad_timestamp",     # "yesterday", a timestamp without UTC offset, epoch millis without a unit
    "oversize",          # a value larger than source.max_value_bytes
    "null_value",        # a tombstone (value None)
    "null_key",          # no key although the spec requires one
    "bad_string",        # a string cut inside a surrogate pair, sent as the JSON escape "Zo\ud83d"
    "timestamp_out_of_range",  # ISO-8601, but year 0 or 10000 in UTC: "0001-01-01T00:00:00+02:00"
    "bad_kafka_timestamp",     # a valid value sent with a Kafka timestamp in microseconds, not millis
    "bad_wire_format",   # wire formats: a plain JSON value (or magic byte 1) instead of the Confluent header
    "unknown_schema",    # wire formats: a schema id nobody registered
    "malformed_avro",    # Avro: a record cut short, or bytes after it
    "malformed_protobuf",  # Protobuf: a field cut short, or message indexes the .proto lacks
    "bad_date",          # "31/12/2026", "2026-02-30", days outside years 1 to 9999
    "bad_uuid",          # "not-a-uuid", 32 hex digits without dashes
    "bad_key",           # a key that does not decode: Latin-1 text, a record key without its header
    "key_mismatch",      # the key of another entity (a change event's key naming another row)
    "bad_envelope",      # change streams: no Debezium envelope (an application's row), an op Debezium has not
    "unsupported_change",  # change streams: a logical decoding message (op m), no row to apply
)
# What each value format can carry of them (kinds its writer schema cannot hold are left out per spec,
# checked against the reader when the producer starts). JSON Schema's payload is JSON text.
_JSON_TEXT = ("malformed_json", "not_utf8", "not_an_object", "oversize", "bad_string")
_WIRE = ("bad_wire_format", "unknown_schema")
_EVERY_FORMAT = ("missing_required", "bad_enum", "out_of_range", "pattern_mismatch", "timestamp_out_of_range",
                 "bad_date", "bad_uuid", "null_value", "null_key", "bad_key", "key_mismatch", "bad_kafka_timestamp")
FORMAT_KINDS = {
    "json": (*_JSON_TEXT, *_EVERY_FORMAT, "wrong_type", "bad_timestamp"),
    "json_schema": (*_JSON_TEXT, *_EVERY_FORMAT, "wrong_type", "bad_timestamp", *_WIRE),
    "avro": (*_EVERY_FORMAT, *_WIRE, "malformed_avro"),
    "protobuf": (*_EVERY_FORMAT, *_WIRE, "malformed_protobuf"),
}
FORMAT_KINDS = {fmt: tuple(k for k in BAD_KINDS if k in kinds) for fmt, kinds in FORMAT_KINDS.items()}
FAULT_HEADER = "fault"
# librdkafka refuses to send a message above its message.max.bytes (1,000,000 by default) and
# Apache Kafka topics refuse ~1 MiB; an oversize record must still reach the topic to be tested.
MAX_SENDABLE_BYTES = 1_000_000
# Event times that parse but fall outside 0001-01-01..9999-12-31 in UTC: .NET's DateTime.MinValue
# and MaxValue written with a local offset, as services with unset clocks or "never" markers do.
_UNREPRESENTABLE_TIMES = ("0001-01-01T00:00:00+02:00", "0001-01-01T00:30:00+01:00",
                          "9999-12-31T23:59:59-05:00", "9999-12-31T23:30:00-01:00")

_ANY_KEY = "<any key>"  # a path step into a map: its first entry


@dataclass(frozen=True)
class FieldPath:
    """Where a field sits in a record: the steps from the top (field names, 0 for a list's first element,
    _ANY_KEY for a map's first value) and the spec at each step."""

    steps: tuple
    specs: tuple[FieldSpec, ...]

    @property
    def field(self) -> FieldSpec:
        return self.specs[-1]

    def __str__(self) -> str:
        return ".".join("[0]" if s == 0 else "{}" if s == _ANY_KEY else str(s) for s in self.steps)


# the defects made by changing one field of a valid record, and the fields each can change
FIELD_KINDS = {
    "missing_required": lambda f: f.required,
    "wrong_type": lambda f: f.type in ("string", "int", "long", "float", "double", "decimal", "boolean", "binary",
                                       "struct", "list", "map"),  # timestamps, dates, uuids have their own kinds
    "bad_enum": lambda f: f.enum is not None,
    "out_of_range": lambda f: not f.enum and (f.type in ("int", "long", "float", "decimal")
                                              or (f.type == "double" and (f.min is not None or f.max is not None))),
    "pattern_mismatch": lambda f: f.type == "string" and f.pattern is not None and not f.enum,
    "bad_timestamp": lambda f: f.type == "timestamp",
    "timestamp_out_of_range": lambda f: f.type == "timestamp",
    "bad_date": lambda f: f.type == "date",
    "bad_uuid": lambda f: f.type == "uuid",
    "bad_string": lambda f: f.type == "string",
}


def field_paths(fields: tuple[FieldSpec, ...]) -> list[FieldPath]:
    """Every field of a contract, nested ones included, parents before their children."""
    out: list[FieldPath] = []

    def walk(f: FieldSpec, steps: tuple, specs: tuple) -> None:
        out.append(FieldPath(steps, specs))
        if f.type == "struct":
            for child in f.fields:
                walk(child, steps + (child.name,), specs + (child,))
        elif f.type == "list":
            walk(f.items, steps + (0,), specs + (f.items,))
        elif f.type == "map":
            walk(f.values, steps + (_ANY_KEY,), specs + (f.values,))

    for f in fields:
        walk(f, (f.name,), (f,))
    return out


def _prefer_non_key(paths: list[FieldPath], id_fields: tuple[str, ...]) -> list[FieldPath]:
    """Defects go into a field other than the key when possible, so the key stays consistent."""
    others = [p for p in paths if len(p.steps) > 1 or p.steps[0] not in id_fields]
    return others or paths


class RecordBreaker:
    """Breaks valid records of `factory` (its spec, its RNG, its clock) in one way each, reproducibly."""

    def __init__(self, factory: RecordFactory):
        self.factory = factory
        self.spec = factory.spec
        self.rng = factory.rng

    def paths(self, kind: str) -> list[FieldPath]:
        """The fields (nested ones included) whose change can make defect `kind`, the ids last resort."""
        if kind not in FIELD_KINDS:
            return []
        found = [p for p in field_paths(self.factory.fields) if FIELD_KINDS[kind](p.field)]
        if kind == "pattern_mismatch":
            found = [p for p in found if _mismatch(p.field, Random(0)) is not None]
        return _prefer_non_key(found, self.factory.id_fields) if found else []

    def corrupt(self, kind: str, record: dict, path: FieldPath | None = None) -> None:
        """Break `record` (a valid one) in the one way `kind`: at `path` for a field's defect (one of
        `paths(kind)`), or padded past source.max_value_bytes for `oversize`."""
        rng = self.rng
        if kind == "oversize":
            limit = self.spec.source.max_value_bytes
            base = len(dumps({**record, "comment": ""}).encode("utf-8"))
            padding = limit - base + 1 + rng.randint(0, 512)
            text = (" ".join(WORDS) + " ") * (padding // 100 + 1)
            record["comment"] = text[:max(padding, 0)]
            return
        if kind not in FIELD_KINDS or path is None:
            raise ValueError(f"unknown defect kind {kind!r} (known: {', '.join(BAD_KINDS)})")
        parent: Any = record
        # reach the field, making parents as needed
        for step, spec in zip(path.steps[:-1], path.specs[:-1], strict=True):
            at = next(iter(parent)) if step == _ANY_KEY else step
            child = parent.get(at) if isinstance(parent, dict) else parent[at]
            if not child or not isinstance(child, (dict, list)):
                child = self.factory.value(spec, at_least_one=True)
                parent[at] = child
            parent = child
        step, f = path.steps[-1], path.field
        at = next(iter(parent)) if step == _ANY_KEY else step
        current = parent.get(at) if isinstance(parent, dict) else parent[at]
        if kind == "missing_required":
            if isinstance(step, str) and step != _ANY_KEY:
                parent.pop(at, None)
            else:  # a list's element or a map's value
                parent[at] = None
            return
        parent[at] = self._broken_value(kind, f, current)

    def _broken_value(self, kind: str, f: FieldSpec, current: Any) -> Any:
        rng = self.rng
        if kind == "wrong_type":
            if f.type == "string":
                return rng.choice([rng.randint(1, 99_999), round(rng.uniform(1, 999), 2)])
            if f.type == "boolean":
                return rng.choice(["yes", "true", 1])
            if f.type == "decimal":  # European decimal comma, or garbage
                return str(current).replace(".", ",") if "." in str(current) else "abc"
            if f.type == "binary":
                return rng.choice(["not base64!", rng.randint(1, 99_999)])
            if f.type in ("struct", "map"):
                return rng.choice(["n/a", ["a", "b"]]) if f.type == "struct" else ["a", "b"]
            if f.type == "list":
                return ",".join(WORDS[:3])
            # a number sent as text, e.g. amount "12.50", or plain garbage
            return str(current) if current is not None and rng.random() < 0.5 else "abc"
        if kind == "bad_enum":
            if f.type == "string":
                current = current if isinstance(current, str) else f.enum[0]
                options = [v for v in (current.upper(), "pending", "unknown", "n/a") if v not in f.enum]
                return rng.choice(options) if options else f"not-{current}"
            return max(f.enum) + rng.randint(1, 10)
        if kind == "out_of_range":
            return self._out_of_range(f)
        if kind == "pattern_mismatch":
            return _mismatch(f, rng)
        if kind == "bad_string":
            # a UTF-16 client cut the text inside an emoji; JSON escapes the surrogate left behind
            text = current if isinstance(current, str) and current else "Zoë"
            return text[:max(1, len(text) // 2)] + "\ud83d"
        if kind == "timestamp_out_of_range":
            if f.unit is not None:  # a number of the unit past year 9999 (or before year 1)
                beyond = {"s": 10**12, "ms": 10**15, "us": 10**18}[f.unit]
                return beyond * rng.choice([1, -1]) + rng.randint(0, 1000)
            return rng.choice(_UNREPRESENTABLE_TIMES)
        if kind == "bad_timestamp":
            moment = self.factory.now() - timedelta(seconds=rng.uniform(0, 3600))
            options = ["yesterday", moment.replace(tzinfo=None).isoformat(timespec="seconds"),  # no UTC offset
                       moment.strftime("%d/%m/%Y %H:%M:%S")]
            if f.unit is None:
                options.append(int(moment.timestamp() * 1000))  # epoch millis where text is expected
            return rng.choice(options)
        if kind == "bad_date":
            options = ["31/12/2026", "2026-02-30", "yesterday"]
            if f.unit == "days":
                options.append(rng.choice([1, -1]) * (10**7 + rng.randint(0, 1000)))  # past year 9999
            return rng.choice(options)
        if kind == "bad_uuid":
            value = uuid.UUID(int=rng.getrandbits(128), version=4)
            return rng.choice(["not-a-uuid", value.hex, "{" + str(value) + "}", str(value)[:-1] + "g"])
        raise ValueError(f"unknown defect kind {kind!r} (known: {', '.join(BAD_KINDS)})")

    def kafka_timestamp(self) -> int:
        """A timestamp past what a batch can carry (year 9999), as clients with the unit wrong send."""
        seconds = self.factory.now().timestamp()
        return self.rng.choice([int(seconds * 1_000_000), int(seconds * 1_000_000_000), 2**63 - 1])

    def _out_of_range(self, f: FieldSpec) -> int | float | Decimal:
        rng = self.rng
        if f.type == "decimal":
            quantum = Decimal(1).scaleb(-f.scale)
            if f.min is not None and rng.random() < 0.4:
                return (Decimal(repr(f.min)) - quantum * rng.randint(1, 100)).quantize(quantum)
            if f.max is not None and rng.random() < 0.4:
                return (Decimal(repr(f.max)) + quantum * rng.randint(1, 100)).quantize(quantum)
            if rng.random() < 0.5:  # more integer digits than the precision leaves
                return Decimal(10 ** (f.precision - f.scale) + rng.randint(0, 999)).quantize(quantum)
            return Decimal(rng.randint(1, 999)).scaleb(-(f.scale + 1))  # one place more than the scale
        integral = f.type in ("int", "long")
        if f.min is not None and (f.max is None or rng.random() < 0.5):
            if integral:
                return math.ceil(f.min) - rng.randint(1, 100)
            return round(f.min - rng.choice([0.01, 1.0, round(rng.uniform(1, 500), 2)]), 2)
        if f.max is not None:
            if integral:
                return math.floor(f.max) + rng.randint(1, 100)
            return round(f.max + rng.choice([0.01, 1.0, round(rng.uniform(1, 500), 2)]), 2)
        if f.type == "float":  # past what 32 bits hold
            return rng.choice([1, -1]) * FLOAT32_MAX * rng.uniform(2, 100)
        return 2**31 + rng.randint(0, 1000) if f.type == "int" else 2**63 + rng.randint(0, 1000)


def _mismatch(f: FieldSpec, rng: Random) -> str | None:
    """A near miss of `f`'s pattern within its max_length (lakehouse_dev.pattern_strings), or None."""
    return pattern_strings.mismatching(f.pattern or "", f.max_length, rng)
