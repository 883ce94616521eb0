"""A realistic synthetic producer for any pipeline, driven by the spec's contract.

`produce(spec, count, ...)` sends `count` records to the spec's source topic in the spec's formats
(value_format json, avro, protobuf or json_schema; keys as text or records in `source.key.format`,
lakehouse_dev.record_formats) and returns a `ProduceReport`. Valid records honour every rule of the
contract, nested fields included (types, enums, ranges, patterns, max lengths, decimals within their
precision and scale, timestamps with a UTC offset or in their unit) and look like production traffic:
ids reused as entities change (an order goes created -> paid -> shipped), customers drawn from a pool,
amounts log-normal. A pipeline in `target.mode: cdc` gets a Debezium change stream instead
(lakehouse_dev.change_streams).

With `bad_ratio` > 0, about that share of the records is broken on purpose, one defect per record,
the kinds taken in turn from `BAD_KINDS`: those the spec and its formats can carry (no `bad_enum`
without an enum field, no `null_key` when keys are optional, no `wrong_type` in a typed Avro record,
a malformed payload of the value's own format). The kind names are the decoder's `error_kind` values,
and each broken record is checked against the reader's own verdict (lakehouse.ingest.validator's
RecordValidator, in the reader's order) before it is sent, so a report's `bad_by_kind` is what an
ingest dead-letters. Each broken record also carries a `fault` header naming its kind. Some defects
are hostile to the reader rather than the contract: a string that is not Unicode, an event time no
datetime holds, a Kafka timestamp past year 9999. (A header key that is not UTF-8 cannot be among
them: confluent-kafka's producer sends `str(key)` for a bytes key, and crashes on a str key with a
lone surrogate.)

`synthesize(...)` yields the same records without Kafka, for unit tests.
"""

from __future__ import annotations

import base64
import math
import re
import string
import struct
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from random import Random
from typing import Any, Callable, Iterator

from confluent_kafka import KafkaException, Producer

from lakehouse.core import config, errors
from lakehouse.core.spec import FieldSpec, PipelineSpec
from lakehouse.ingest.checks import FLOAT32_MAX
from lakehouse.ingest.reader import MAX_KAFKA_TIMESTAMP_MS, MIN_KAFKA_TIMESTAMP_MS
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev.re_internals import opcodes as sre_c
from lakehouse_dev.re_internals import parse as parse_pattern
from lakehouse_dev.record_formats import (
    CONTENT_TYPES,
    EPOCH_DATE,
    ProduceError,
    contract_avro_schema,
    dumps,
    epoch,
    key_writer,
    value_writer,
)

__all__ = ["BAD_KINDS", "FORMAT_KINDS", "ProduceError", "ProduceReport", "RateLimiter", "RecordFactory",
           "SyntheticRecord", "contract_avro_schema", "produce", "producer_config", "synthesize"]

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
SOURCE_HEADER = ("source", b"lakehouse-produce")
# librdkafka refuses to send a message above its message.max.bytes (1,000,000 by default) and
# Apache Kafka topics refuse ~1 MiB; an oversize record must still reach the topic to be tested.
MAX_SENDABLE_BYTES = 1_000_000
# Event times that parse but fall outside 0001-01-01..9999-12-31 in UTC: .NET's DateTime.MinValue
# and MaxValue written with a local offset, as services with unset clocks or "never" markers do.
_UNREPRESENTABLE_TIMES = ("0001-01-01T00:00:00+02:00", "0001-01-01T00:30:00+01:00",
                          "9999-12-31T23:59:59-05:00", "9999-12-31T23:30:00-01:00")

CURRENCIES = (("EUR", 40), ("USD", 30), ("GBP", 12), ("JPY", 8), ("CHF", 5), ("SEK", 5))
COUNTRIES = (("DE", 20), ("FR", 14), ("NL", 10), ("GB", 14), ("US", 18), ("SE", 6), ("ES", 8), ("IT", 6),
             ("CH", 2), ("JP", 2))
FIRST_NAMES = ("Anna", "Ben", "Chloé", "David", "Elif", "Finn", "Greta", "Hiro", "Inês", "Jonas", "Karin",
               "Lukas", "Maria", "Noah", "Olga", "Paul", "Quentin", "Rosa", "Søren", "Tomás", "Uma", "Zoë")
LAST_NAMES = ("Müller", "Smith", "Dubois", "de Vries", "Andersson", "García", "Rossi", "Tanaka", "Novak",
              "Schmidt", "Brown", "Martin", "Jansen", "Nilsson", "López", "Bianchi", "Sato", "Kowalski")
EMAIL_DOMAINS = ("example.com", "mail.example.org", "shop.example.net", "example.de")
WORDS = ("alpha", "basket", "cedar", "delta", "ember", "fjord", "granite", "harbor", "island", "juniper",
         "kestrel", "lumen", "meadow", "north", "orbit", "prairie", "quartz", "river", "summit", "tundra")
# An order's life: the next status and how likely it is; None closes the entity.
LIFECYCLE = {
    "created": (("paid", 0.85), ("cancelled", 0.15)),
    "paid": (("shipped", 0.9), ("refunded", 0.04), ("cancelled", 0.06)),
    "shipped": (("delivered", 0.9), ("refunded", 0.05), (None, 0.05)),
    "delivered": (("refunded", 0.03), (None, 0.97)),
}
_ID_PREFIXES = {"order": "ord", "customer": "cus", "user": "usr", "product": "prd", "account": "acc",
                "payment": "pay", "invoice": "inv", "session": "ses", "event": "evt"}
_MONEY_NAMES = ("amount", "price", "total", "value", "cost", "revenue")
_OPEN_ENTITIES_MAX = 5_000   # how many entities may receive updates; bounds memory on long runs
SELF_TEST_RECORDS = 50


@dataclass
class ProduceReport:
    """What a produce run sent: counts per defect kind (only kinds sent) and per partition; for a change
    stream also what the table must hold once every record is ingested (`changes`, a ChangeSummary)."""

    sent: int
    bad_by_kind: dict[str, int]
    per_partition: dict[int, int]
    seconds: float
    topic: str = ""
    changes: Any = None

    @property
    def bad(self) -> int:
        return sum(self.bad_by_kind.values())

    @property
    def valid(self) -> int:
        return self.sent - self.bad


@dataclass(frozen=True)
class SyntheticRecord:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    kind: str | None = None  # the defect, None for a valid record
    timestamp: int | None = None  # the Kafka timestamp (ms) to send; None: the producer's clock


# ---------------------------------------------------------------------------- rate limiting

class RateLimiter:
    """A token bucket: `acquire()` returns when one more message may go out at `rate` per second.

    The bucket starts full with `burst` tokens (default: 20 ms worth, at least 1)
    so sleeps are few and not shorter than the OS can honour; waits are sliced
    into at most `max_slice` seconds so the caller's `sleep` (the producer's poll)
    keeps serving delivery reports. `clock` and `sleep` are injectable so the
    schedule can be checked without waiting.
    """

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = time.sleep, max_slice: float = 0.05):
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate = float(rate)
        self.burst = max(1.0, float(burst) if burst is not None else self.rate * 0.02)
        self.clock = clock
        self.sleep = sleep
        self.max_slice = max_slice
        self.tokens = self.burst
        self.updated = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def acquire(self) -> float:
        """Take one token, sleeping until one is available; returns the seconds waited."""
        waited_from = self.clock()
        self._refill()
        # a tolerance: float rounding can leave 0.999999... tokens and a sleep too short to move the clock
        while self.tokens < 1.0 - 1e-9:
            self.sleep(min(self.max_slice, (1.0 - self.tokens) / self.rate))
            self._refill()
        self.tokens = max(0.0, self.tokens - 1.0)
        return self.clock() - waited_from


# ---------------------------------------------------------------------------- values from patterns

class _PatternUnsupported(Exception):
    pass


_PRINTABLE = string.ascii_letters + string.digits + "-_.+@#/ "
_CATEGORY_CHARS = {
    sre_c.CATEGORY_DIGIT: string.digits,
    sre_c.CATEGORY_NOT_DIGIT: string.ascii_letters + "-_.",
    sre_c.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    sre_c.CATEGORY_NOT_WORD: "-.+@ /",
    sre_c.CATEGORY_SPACE: " ",
    sre_c.CATEGORY_NOT_SPACE: string.ascii_letters + string.digits + "-_.",
}


def _from_pattern(pattern: str, rng: Random) -> str:
    """A random string built from the pattern's syntax tree (a candidate: the caller verifies it).

    Covers literals, classes, ranges, categories, alternation, groups, back
    references and repeats; raises _PatternUnsupported for lookarounds.
    """
    groups: dict[int, str] = {}

    def chars_of(items) -> str:
        negate = False
        pool: list[str] = []
        for op, av in items:
            if op is sre_c.NEGATE:
                negate = True
            elif op is sre_c.LITERAL:
                pool.append(chr(av))
            elif op is sre_c.RANGE:
                lo, hi = av
                pool.extend(chr(c) for c in range(lo, min(hi, lo + 200) + 1))
            elif op is sre_c.CATEGORY:
                pool.extend(_CATEGORY_CHARS.get(av, ""))
            else:
                raise _PatternUnsupported(str(op))
        if negate:
            excluded = set(pool)
            pool = [c for c in _PRINTABLE if c not in excluded]
        if not pool:
            raise _PatternUnsupported("empty character class")
        return "".join(pool)

    def walk(tokens) -> str:
        out: list[str] = []
        for op, av in tokens:
            if op is sre_c.LITERAL:
                out.append(chr(av))
            elif op is sre_c.NOT_LITERAL:
                out.append(rng.choice([c for c in string.ascii_letters if ord(c) != av]))
            elif op is sre_c.ANY:
                out.append(rng.choice(string.ascii_letters))
            elif op is sre_c.IN:
                out.append(rng.choice(chars_of(av)))
            elif op is sre_c.CATEGORY:
                out.append(rng.choice(_CATEGORY_CHARS.get(av) or string.ascii_letters))
            elif op is sre_c.BRANCH:
                out.append(walk(rng.choice(av[1])))
            elif op is sre_c.SUBPATTERN:
                text = walk(av[-1])
                if av[0] is not None:
                    groups[av[0]] = text
                out.append(text)
            elif op is sre_c.GROUPREF:
                out.append(groups.get(av, ""))
            elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
                lo, hi, sub = av
                hi = lo + 8 if hi is sre_c.MAXREPEAT else min(hi, lo + 8)
                out.extend(walk(sub) for _ in range(rng.randint(lo, hi)))
            elif op is sre_c.AT:
                continue  # anchors and word boundaries add no characters
            else:
                raise _PatternUnsupported(str(op))
        return "".join(out)

    try:
        tree = parse_pattern(pattern)
    except Exception as exc:  # the spec validated it with re.compile; be safe anyway
        raise _PatternUnsupported(str(exc)) from None
    return walk(tree)


def _core(pattern: str) -> str:
    """The pattern without its anchors, to recognise the common ones."""
    core = pattern
    for prefix in ("^", "\\A"):
        core = core[len(prefix):] if core.startswith(prefix) else core
    for suffix in ("$", "\\Z", "\\z"):
        core = core[: -len(suffix)] if core.endswith(suffix) else core
    return core


def _weighted(rng: Random, pairs: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([v for v, _ in pairs], weights=[w for _, w in pairs])[0]


# ---------------------------------------------------------------------------- records

def _prefer_non_key(paths: list[FieldPath], id_fields: tuple[str, ...]) -> list[FieldPath]:
    """Defects go into a field other than the key when possible, so the key stays consistent."""
    others = [p for p in paths if len(p.steps) > 1 or p.steps[0] not in id_fields]
    return others or paths


def _float32(value: float) -> float:
    """`value` as a 32-bit float holds it (what an Avro or Protobuf float field sends)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


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


class RecordFactory:
    """Valid and deliberately broken records (JSON-like values, see lakehouse_dev.record_formats) for one
    spec, reproducible from `rng`.

    Raises ProduceError at construction when the contract cannot be satisfied (a pattern it cannot
    generate, an int range with no integer in it, a decimal range no value of its scale fits).
    """

    def __init__(self, spec: PipelineSpec, rng: Random, now: Callable[[], datetime] | None = None):
        self.spec = spec
        self.rng = rng
        self.now = now or (lambda: datetime.now(timezone.utc))
        self.fields = spec.contract.fields
        self.key_field = spec.source.key_field
        # the fields that name an entity: values from a sequence (unique), left alone by defects
        self.id_fields = tuple(spec.target.key) if spec.source.envelope else \
            ((self.key_field,) if self.key_field else ())
        self.sequence = rng.randrange(1, 1_000_000)  # ids continue from a random point, like a live system
        self.open: dict[str, dict] = {}               # entity key -> its latest record
        self.open_keys: list[str] = []
        self.lifecycle_field = next(
            (f for f in self.fields if f.type == "string" and f.enum and "created" in f.enum), None)
        self.nested = any(f.nested for f in self.fields)
        self._generators: dict[int, Callable[[dict], Any]] = {}
        self.generators = {f.name: self._generator(f) for f in self.fields}

    # -- valid records ------------------------------------------------------------------

    def valid(self) -> dict:
        """The next valid record (a new dict the caller may change): a new entity, or
        (sometimes) the next state of an open one."""
        if self.key_field and self.open_keys and self.rng.random() < (0.45 if self.lifecycle_field else 0.3):
            record = self._update()
            if record is not None:
                return self._copy(record)
        record = self.row()
        if self.lifecycle_field is not None and self.key_field:
            record[self.lifecycle_field.name] = "created"  # later events of this entity move it on
        self._remember(record)
        return self._copy(record)

    def row(self) -> dict:
        """A new record: every required field and most optional ones, ids from the sequence."""
        record: dict = {}
        for f in self.fields:
            if f.required or self.rng.random() < 0.85:
                record[f.name] = self.generators[f.name](record)
        return record

    def changed(self, record: dict) -> dict:
        """A copy of `record` with some fields other than the ids given new values (a row's update)."""
        out = self._copy(record)
        others = [f for f in self.fields if f.name not in self.id_fields]
        for f in self.rng.sample(others, k=min(len(others), self.rng.randint(1, 3))):
            if f.required or self.rng.random() < 0.85:
                out[f.name] = self.generators[f.name](out)
            else:
                out.pop(f.name, None)
        for f in others:  # a row's modification time moves with every update
            if f.type == "timestamp" and re.search("updat|modif", f.name):
                out[f.name] = self.generators[f.name](out)
        return out

    def _copy(self, record: dict) -> dict:
        return deep_copy(record) if self.nested else dict(record)

    def _update(self) -> dict | None:
        """The next event of an open entity: a status transition, fresh timestamps and enums."""
        index = self.rng.randrange(len(self.open_keys))
        key = self.open_keys[index]
        record = self._copy(self.open[key])
        if self.lifecycle_field is not None:
            name = self.lifecycle_field.name
            choices = [(s, w) for s, w in LIFECYCLE.get(record.get(name), ())
                       if s is None or s in self.lifecycle_field.enum]
            nxt = self.rng.choices([s for s, _ in choices], weights=[w for _, w in choices])[0] if choices else None
            if nxt is None:
                self._forget(index)
                return None
            record[name] = nxt
        for f in self.fields:
            if f.type in ("timestamp", "date") or (f.enum and f is not self.lifecycle_field):
                if f.name != self.key_field and (f.required or f.name in record):
                    record[f.name] = self.generators[f.name](record)
        self.open[key] = record
        if self.lifecycle_field is not None and not LIFECYCLE.get(record[self.lifecycle_field.name]):
            self._forget(index)  # a terminal status: no further events for this entity
        return record

    def _remember(self, record: dict) -> None:
        if not self.key_field or self.key_field not in record:
            return
        key = str(record[self.key_field])
        if key not in self.open:
            if len(self.open_keys) >= _OPEN_ENTITIES_MAX:
                self._forget(self.rng.randrange(len(self.open_keys)))
            self.open_keys.append(key)
        self.open[key] = self._copy(record)

    def _forget(self, index: int) -> None:
        key = self.open_keys[index]
        self.open_keys[index] = self.open_keys[-1]
        self.open_keys.pop()
        self.open.pop(key, None)

    def state(self) -> tuple:
        """Everything `restore` needs to undo records made since (the RNG, ids, open entities)."""
        return self.rng.getstate(), self.sequence, deep_copy(self.open), list(self.open_keys)

    def restore(self, state: tuple) -> None:
        rng_state, self.sequence, self.open, self.open_keys = state
        self.rng.setstate(rng_state)

    def value(self, f: FieldSpec, record: dict | None = None, at_least_one: bool = False) -> Any:
        """A valid value of `f` (any field of the contract, nested ones included); a list or map with at
        least one entry when `at_least_one`."""
        made = self._generator(f)(record if record is not None else {})
        while at_least_one and isinstance(made, (list, dict)) and not made and f.type in ("list", "map"):
            made = self._generator(f)(record if record is not None else {})
        return made

    def _generator(self, f: FieldSpec, top: bool = True) -> Callable[[dict], Any]:
        """A function of the record built so far that returns a valid value for `f` (cached per field)."""
        if id(f) not in self._generators:
            self._generators[id(f)] = self._make_generator(f, top and f in self.fields)
        return self._generators[id(f)]

    def _make_generator(self, f: FieldSpec, top: bool) -> Callable[[dict], Any]:
        rng = self.rng
        name = f.name
        if f.enum is not None:
            values = list(f.enum)
            return lambda rec: rng.choice(values)
        if f.type == "string":
            return self._string_generator(f, top)
        if f.type in ("int", "long"):
            return self._integer_generator(f, top)
        if f.type in ("double", "float"):
            return self._float_generator(f)
        if f.type == "decimal":
            return self._decimal_generator(f)
        if f.type == "boolean":
            return lambda rec: rng.random() < 0.5
        if f.type == "timestamp":
            if f.unit is not None:
                return lambda rec: epoch(datetime.fromisoformat(self._timestamp()), f.unit)
            return lambda rec: self._timestamp()
        if f.type == "date":
            if f.unit == "days":
                return lambda rec: (self.now().date() - timedelta(days=rng.randint(0, 30)) - EPOCH_DATE).days
            return lambda rec: (self.now().date() - timedelta(days=rng.randint(0, 30))).isoformat()
        if f.type == "uuid":
            return lambda rec: str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if f.type == "binary":
            return lambda rec: base64.b64encode(rng.randbytes(rng.randint(4, 24))).decode("ascii")
        if f.type == "struct":
            children = [(c, self._generator(c, top=False)) for c in f.fields]

            def struct_value(rec: dict) -> dict:
                out: dict = {}
                for child, make in children:
                    if child.required or rng.random() < 0.85:
                        out[child.name] = make(out)
                return out
            return struct_value
        if f.type == "list":
            item = self._generator(f.items, top=False)
            return lambda rec: [item({}) for _ in range(rng.randint(0, 3))]
        if f.type == "map":
            entry = self._generator(f.values, top=False)
            return lambda rec: {key: entry({}) for key in rng.sample(WORDS, rng.randint(0, 3))}
        raise ProduceError(f"{self.spec.path}: field {name}: unsupported type {f.type}")  # pragma: no cover

    def _integer_generator(self, f: FieldSpec, top: bool) -> Callable[[dict], int]:
        rng = self.rng
        name = f.name
        lo = math.ceil(f.min) if f.min is not None else None
        hi = math.floor(f.max) if f.max is not None else None
        if lo is not None and hi is not None and lo > hi:
            raise ProduceError(f"{self.spec.path}: field {name}: no integer lies in [{f.min}, {f.max}]")
        bound = 2**31 - 1 if f.type == "int" else 2**63 - 1
        if top and name in self.id_fields:  # a primary key: the next id of the sequence, within the bounds
            first, last = max(lo if lo is not None else 1, -bound - 1), min(hi if hi is not None else bound, bound)

            def next_id(rec: dict) -> int:
                self.sequence += 1
                return first + (self.sequence - 1) % (last - first + 1)
            return next_id
        if name in ("quantity", "qty", "count", "items"):
            lo2, hi2 = max(lo if lo is not None else 1, 1), min(hi if hi is not None else 5, 5)
            if lo2 <= hi2:
                return lambda rec: rng.randint(lo2, hi2)
        if lo is None and hi is None:
            lo, hi = 0, 10_000
        elif lo is None:
            lo = hi - 10_000
        elif hi is None:
            hi = lo + 10_000
        lo, hi = max(lo, -bound - 1), min(hi, bound)
        return lambda rec: rng.randint(lo, hi)

    def _float_generator(self, f: FieldSpec) -> Callable[[dict], float]:
        rng = self.rng
        name = f.name
        lo, hi = f.min, f.max
        money = name in _MONEY_NAMES or name.endswith(("_amount", "_price", "_total"))
        single = f.type == "float"  # what a 32-bit float field keeps of it must stay within the bounds too

        def number(rec: dict) -> float:
            if lo is not None and hi is not None and not money:
                value = rng.uniform(lo, hi)
            elif money or lo is not None or hi is not None:
                # log-normal: most orders are small, a few are large (median ~40)
                spread = rng.lognormvariate(3.7, 1.0)
                value = (lo + spread) if lo is not None else (hi - spread) if hi is not None else spread
                if lo is not None and hi is not None and value > hi:
                    value = rng.uniform(lo, hi)  # a narrow range: don't pile values up on the bound
            else:
                value = rng.gauss(0.0, 100.0)
            value = round(value, 2)
            # clamp rather than redraw: a bound is a legal value and the loop stays bounded
            if lo is not None and value < lo:
                value = lo
            if hi is not None and value > hi:
                value = hi
            if single and not ((lo is None or _float32(value) >= lo) and (hi is None or _float32(value) <= hi)):
                value = _float32((lo + hi) / 2) if lo is not None and hi is not None else \
                    (math.ceil(lo) if lo is not None else math.floor(hi))
            return float(value)
        return number

    def _decimal_generator(self, f: FieldSpec) -> Callable[[dict], Decimal]:
        """Decimals of exactly `scale` places within `precision` and min/max; money log-normal."""
        rng = self.rng
        name = f.name
        quantum = Decimal(1).scaleb(-f.scale)
        largest = 10 ** f.precision - 1  # in units of the last place
        lo = -largest if f.min is None else max(-largest, math.ceil(Decimal(repr(f.min)) / quantum))
        hi = largest if f.max is None else min(largest, math.floor(Decimal(repr(f.max)) / quantum))
        if lo > hi:
            raise ProduceError(f"{self.spec.path}: field {name}: no decimal({f.precision},{f.scale}) lies in "
                               f"[{f.min}, {f.max}]")
        money = name in _MONEY_NAMES or name.endswith(("_amount", "_price", "_total"))
        typical = int(Decimal(100) / quantum)  # about 100 in the field's unit

        def decimal_value(rec: dict) -> Decimal:
            if money:
                units = int(Decimal(repr(round(rng.lognormvariate(3.7, 1.0), 2))) / quantum)
            elif rng.random() < 0.8:
                units = rng.randint(-typical, typical) if lo < 0 else rng.randint(0, typical)
            else:
                units = rng.randint(lo, hi)
            units = min(max(units + (lo if money and lo > 0 else 0), lo), hi)
            return Decimal(units).scaleb(-f.scale)
        return decimal_value

    def _timestamp(self) -> str:
        """Mostly now (a few seconds of transport delay), some late arrivals over the last 3 days."""
        if self.rng.random() < 0.85:
            lag = timedelta(seconds=self.rng.expovariate(1 / 2.0))
        else:
            lag = timedelta(seconds=self.rng.uniform(0, 3 * 86_400))
        return (self.now() - lag).astimezone(timezone.utc).isoformat(timespec="milliseconds")

    def _string_generator(self, f: FieldSpec, top: bool) -> Callable[[dict], str]:
        rng = self.rng
        limit = f.max_length
        fit = (lambda s: s[:limit]) if limit else (lambda s: s)
        name = f.name
        if f.pattern is not None:
            core = _core(f.pattern)
            if core == "[A-Z]{3}":
                return lambda rec: _weighted(rng, CURRENCIES)
            if core == "[A-Z]{2}":
                return lambda rec: _weighted(rng, COUNTRIES)
            if "@" in core:
                candidate = self._email({})
                if re.fullmatch(f.pattern, candidate) and (limit is None or len(candidate) <= limit):
                    return lambda rec: self._email(rec)
            compiled = re.compile(f.pattern)

            def from_pattern(rec: dict) -> str:
                for _ in range(50):
                    try:
                        value = _from_pattern(f.pattern, rng)
                    except _PatternUnsupported as exc:
                        raise ProduceError(f"{self.spec.path}: field {name}: cannot generate values for "
                                           f"pattern {f.pattern!r} ({exc})") from None
                    if compiled.fullmatch(value) and (limit is None or len(value) <= limit):
                        return value
                raise ProduceError(f"{self.spec.path}: field {name}: cannot generate values matching "
                                   f"{f.pattern!r} within max_length {limit}")
            return from_pattern
        stem = name[:-3] if name.endswith("_id") else name
        prefix = _ID_PREFIXES.get(stem, stem[:3] or "id")
        if top and name in self.id_fields:
            def next_id(rec: dict) -> str:
                self.sequence += 1
                value = f"{prefix}-{self.sequence:06d}"
                return value if limit is None or len(value) <= limit else str(self.sequence)[-limit:]
            return next_id
        if name.endswith("_id") or name == "id":
            # a pool of regulars and a long tail, so the same customers come back
            def pooled_id(rec: dict) -> str:
                n = rng.randint(1, 200) if rng.random() < 0.7 else rng.randint(1, 5_000)
                return fit(f"{prefix}-{n:05d}")
            return pooled_id
        if name in ("name", "full_name", "customer_name") or name.endswith("_name"):
            return lambda rec: fit(f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}")
        if "email" in name:
            return lambda rec: fit(self._email(rec))
        if "country" in name:
            return lambda rec: fit(_weighted(rng, COUNTRIES))
        if "currency" in name:
            return lambda rec: fit(_weighted(rng, CURRENCIES))
        return lambda rec: fit(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))))

    def _email(self, rec: dict) -> str:
        person = next((v for k, v in rec.items() if k.endswith("name") and isinstance(v, str) and " " in v), None)
        if person is None:
            person = f"{self.rng.choice(FIRST_NAMES)} {self.rng.choice(LAST_NAMES)}"
        local = re.sub(r"[^a-z0-9.]", "", person.lower().replace(" ", ".").translate(_ASCII_FOLD)) or "user"
        return f"{local}{self.rng.randint(1, 99)}@{self.rng.choice(EMAIL_DOMAINS)}"

    # -- broken records -----------------------------------------------------------------

    def paths(self, kind: str) -> list[FieldPath]:
        """The fields (nested ones included) whose change can make defect `kind`, the ids last resort."""
        if kind not in FIELD_KINDS:
            return []
        found = [p for p in self._all_paths() if FIELD_KINDS[kind](p.field)]
        if kind == "pattern_mismatch":
            found = [p for p in found if self._pattern_breaker(p.field, Random(0)) is not None]
        return _prefer_non_key(found, self.id_fields) if found else []

    def _all_paths(self) -> list[FieldPath]:
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

        for f in self.fields:
            walk(f, (f.name,), (f,))
        return out

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
        for step, spec in zip(path.steps[:-1], path.specs[:-1]):  # reach the field, making parents as needed
            at = next(iter(parent)) if step == _ANY_KEY else step
            child = parent.get(at) if isinstance(parent, dict) else parent[at]
            if not child or not isinstance(child, (dict, list)):
                child = self.value(spec, at_least_one=True)
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
            return self._pattern_breaker(f, rng)
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
            moment = self.now() - timedelta(seconds=rng.uniform(0, 3600))
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
        seconds = self.now().timestamp()
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

    def _pattern_breaker(self, f: FieldSpec, rng: Random) -> str | None:
        """A plausible string that fits max_length (checked first) but not the pattern, or None."""
        core = _core(f.pattern or "")
        if core == "[A-Z]{3}":
            options = ["eur", "EURO", "US$", "€"]
        elif core == "[A-Z]{2}":
            options = ["DEU", "de", "Germany"]
        elif "@" in core:
            options = ["anna.mueller.example.com", "anna@", "@example.com"]
        else:
            options = []
        options += ["?", "not a match!", "0", "-", "x" * 3]
        compiled = re.compile(f.pattern or "")
        fitting = [o for o in options if not compiled.fullmatch(o) and (f.max_length is None or len(o) <= f.max_length)]
        return rng.choice(fitting) if fitting else None


_ASCII_FOLD = str.maketrans({"ä": "a", "ö": "o", "ü": "u", "é": "e", "è": "e", "ê": "e", "ø": "o", "å": "a",
                             "á": "a", "í": "i", "ó": "o", "ú": "u", "ñ": "n", "ç": "c", "ë": "e", "ł": "l",
                             "ß": "ss"})


def deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------- checked against the reader

def verdict(validator: RecordValidator, key: bytes | None, value: bytes | None, timestamp: int | None) -> str | None:
    """The dead-letter kind the reader gives a record (lakehouse.ingest.reader.BatchBuilder.add's checks in
    its order: the Kafka timestamp, the key, the value), None when it takes it. Raises what the
    validator raises for a writer schema the contract does not take (a LakehouseError)."""
    if timestamp is not None and not MIN_KAFKA_TIMESTAMP_MS <= timestamp <= MAX_KAFKA_TIMESTAMP_MS:
        return "bad_kafka_timestamp"
    try:
        if validator.spec.is_cdc:
            validator.check_change(key, value)
        else:
            validator.check_row(validator.check_key(key), value)
    except Rejected as rejected:
        return rejected.kind
    return None


def reader_validator(spec: PipelineSpec, platform: config.PlatformConfig | None) -> RecordValidator:
    """The reference validator `verdict` asks, with the schema registry the ingest job's driver would use."""
    registry = platform.schema_registry() if platform is not None and spec.wire_formats else None
    return RecordValidator(spec, registry=registry)


def written(spec: PipelineSpec, write: Callable[[], Any]) -> Any:
    """`write()` of a valid record; ProduceError when the writer schema cannot hold it (a folder schema of
    other types than the contract's)."""
    try:
        return write()
    except ProduceError:
        raise
    except Exception as exc:  # noqa: BLE001 - fastavro's and protobuf's errors for a value the schema refuses
        raise ProduceError(f"{spec.path}: a valid record does not fit the writer schema: {type(exc).__name__}: "
                           f"{str(exc)[:300]}; the folder's schema and the contract disagree") from None


def attempts_failed(spec: PipelineSpec, kind: str, last: str | None) -> ProduceError:
    return ProduceError(f"{spec.path}: could not make a {kind} record that the reader rejects as {kind} "
                        f"(in {ATTEMPTS} attempts; the last was {'accepted' if last is None else last!r}); "
                        f"the generator needs a rule for this contract")


class RecordStream:
    """The records of one (append or upsert) spec in its formats: valid ones, and broken ones of the kinds
    the spec can carry, each checked against the reader before it is handed out.

    The kinds (`kinds`, an order of BAD_KINDS) and the fields each may break are found when the stream is
    made: a few records of each are checked against the reader, and what the value's writer schema
    cannot carry (a wrong type in a typed Avro record) is left out. Raises ProduceError when the
    contract cannot be generated, a valid record is refused or is larger than source.max_value_bytes,
    or the writer schemas cannot be found or registered.
    """

    def __init__(self, spec: PipelineSpec, rng: Random, platform: config.PlatformConfig | None = None,
                 now: Callable[[], datetime] | None = None):
        self.spec = spec
        self.rng = rng
        self.factory = RecordFactory(spec, rng, now=now)
        key_fields = (spec.contract.field(spec.source.key_field),) if spec.source.key_field else ()
        self.key_names = tuple(f.name for f in key_fields)
        self.values = value_writer(spec, platform, key_names=self.key_names)
        self.keys = key_writer(spec, platform, key_fields)
        self.validator = reader_validator(spec, platform)
        self.content_type = CONTENT_TYPES[self.values.fmt]
        self.paths: dict[str, list[FieldPath | None]] = {}
        self.kinds = self._self_test()

    def key_of(self, record: dict) -> bytes | None:
        if self.keys is None or any(record.get(name) is None for name in self.key_names):
            return None
        return self.keys.encode({name: record[name] for name in self.key_names})

    def records(self, count: int, bad_ratio: float) -> Iterator[SyntheticRecord]:
        turn = 0
        for _ in range(count):
            headers = [SOURCE_HEADER, ("trace_id", uuid.UUID(int=self.rng.getrandbits(128), version=4).hex.encode()),
                       ("content-type", self.content_type)]
            if bad_ratio and self.kinds and self.rng.random() < bad_ratio:
                kind = self.kinds[turn % len(self.kinds)]
                turn += 1
                key, value, timestamp = self.broken(kind)
                yield SyntheticRecord(key, value, headers + [(FAULT_HEADER, kind.encode())], kind, timestamp)
            else:
                record = self.factory.valid()
                yield SyntheticRecord(self.key_of(record), self.values.encode(record), headers, None)

    def broken(self, kind: str) -> tuple[bytes | None, bytes | None, int | None]:
        """Key, value and Kafka timestamp of a record the reader rejects as `kind`; ProduceError when none
        comes out in ATTEMPTS tries."""
        last = None
        for _ in range(ATTEMPTS):
            made = self._attempt(kind, self.rng.choice(self.paths[kind]))
            if made is not None:
                last = verdict(self.validator, *made)
                if last == kind:
                    return made
        raise attempts_failed(self.spec, kind, last)

    def _attempt(self, kind: str, path: FieldPath | None) -> tuple[bytes | None, bytes | None, int | None] | None:
        """One try at a record broken as `kind` (at `path`), unchecked; None when its formats cannot write it."""
        record = self.factory.valid()
        key = self.key_of(record)
        try:
            if kind in self.values.OWN_KINDS:
                return key, self.values.broken(kind, record, self.rng), None
            if kind == "null_value":
                return key, None, None
            if kind == "null_key":
                return None, self.values.encode(record), None
            if kind == "bad_key":
                if key is None:
                    return None
                own = self.keys.OWN_KINDS[0] if self.keys.OWN_KINDS else kind
                return self.keys.broken(own, record if self.keys.fmt == "string" else
                                        {n: record[n] for n in self.key_names}, self.rng), self.values.encode(record), None
            if kind == "bad_kafka_timestamp":
                return key, self.values.encode(record), self.factory.kafka_timestamp()
            if kind == "key_mismatch":  # the key of another entity
                if key is None:
                    return None
                other = {name: self.factory.value(self.factory.spec.contract.field(name)) for name in self.key_names}
                return self.key_of(other), self.values.encode(record), None
            self.factory.corrupt(kind, record, path)
            return key, self.values.encode(record), None
        except Exception:  # noqa: BLE001 - the writer schema cannot hold this defect (fastavro, protobuf errors)
            return None

    def _self_test(self) -> tuple[str, ...]:
        """Check a few valid records and each defect kind against the reader, on a copy of the state;
        returns the kinds this spec can carry (keeping, per kind, the fields that carry it)."""
        state = self.factory.state()
        try:
            for _ in range(SELF_TEST_RECORDS):
                record = self.factory.valid()
                key, value = written(self.spec, lambda: (self.key_of(record), self.values.encode(record)))
                if len(value) > self.spec.source.max_value_bytes:
                    raise ProduceError(f"{self.spec.path}: source.max_value_bytes is {self.spec.source.max_value_bytes} "
                                       f"but a valid record takes {len(value)} bytes")
                try:
                    refused = verdict(self.validator, key, value, None)
                except errors.LakehouseError as exc:
                    raise ProduceError(f"{self.spec.path}: the reader refuses the writer schema: {exc}") from None
                if refused is not None:
                    raise ProduceError(f"{self.spec.path}: generated a record the reader rejects as {refused} "
                                       f"({record!r:.300}); the generator needs a rule for this contract")
            kinds = []
            for kind in FORMAT_KINDS[self.values.fmt]:
                if kind == "oversize" and self.spec.source.max_value_bytes + 1024 >= MAX_SENDABLE_BYTES:
                    continue  # Kafka itself would refuse it
                candidates = self.factory.paths(kind) if kind in FIELD_KINDS else [None]
                kept = [p for p in candidates if any(self._carries(kind, p) for _ in range(3))]
                if kept:
                    self.paths[kind] = kept
                    kinds.append(kind)
            return tuple(kinds)
        finally:
            self.factory.restore(state)

    def _carries(self, kind: str, path: FieldPath | None) -> bool:
        made = self._attempt(kind, path)
        return made is not None and verdict(self.validator, *made) == kind


ATTEMPTS = 20


def _check_arguments(count: int, bad_ratio: float) -> None:
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 0.0 <= bad_ratio <= 1.0:
        raise ValueError(f"bad_ratio must be between 0 and 1, got {bad_ratio}")


def record_stream(spec: PipelineSpec, seed: int | None, now: Callable[[], datetime] | None,
            platform: config.PlatformConfig | None, connect_schemas: bool):
    """The record source of `spec`: a RecordStream, or for a change stream (target.mode cdc) a ChangeStream."""
    if platform is None and spec.wire_formats:
        platform = config.load()
    rng = Random(seed)
    if spec.source.envelope is not None:
        from lakehouse_dev.change_streams import ChangeStream

        return ChangeStream(spec, rng, platform, now=now, connect_schemas=connect_schemas)
    if connect_schemas:
        raise errors.ConfigurationError(f"Connect schemas (schemas.enable=true) belong to change streams; pipeline "
                                        f"{spec.name!r} is in target.mode {spec.target.mode}, not cdc")
    return RecordStream(spec, rng, platform, now=now)


def synthesize(spec: PipelineSpec, count: int, bad_ratio: float = 0.0, seed: int | None = None,
               now: Callable[[], datetime] | None = None, platform: config.PlatformConfig | None = None,
               connect_schemas: bool = False) -> Iterator[SyntheticRecord]:
    """The records `produce` would send, without Kafka: `count` of them, about `bad_ratio` broken.

    Each record is broken with probability `bad_ratio` (drawn from the seeded RNG); broken records
    take the kinds the spec can carry in turn. `connect_schemas` writes a change stream's JSON keys and
    values with their Kafka Connect schema (schemas.enable=true). Raises, before yielding anything,
    ValueError for a count below 0 or a ratio outside [0, 1], and ProduceError when the contract cannot
    be generated or the writer schemas cannot be found.
    """
    _check_arguments(count, bad_ratio)
    return record_stream(spec, seed, now, platform, connect_schemas).records(count, bad_ratio)


def producer_config(spec: PipelineSpec, platform: config.PlatformConfig) -> dict:
    """librdkafka settings: murmur2 like the Java client, idempotent, small linger; LAKEHOUSE_KAFKA_* win."""
    defaults = {
        "partitioner": "murmur2_random",   # same key -> same partition as Java clients and Kafka Connect
        "enable.idempotence": True,        # retries neither duplicate nor reorder a key's events
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 30_000,      # fail within 30 s instead of librdkafka's 5 minutes
        "message.max.bytes": max(MAX_SENDABLE_BYTES, spec.source.max_value_bytes + 64 * 1024),
    }
    return {**defaults, **platform.kafka()}


def accept_any_timestamp(topic: str, platform: config.PlatformConfig) -> None:
    """Let `topic` keep producers' timestamps however far ahead (message.timestamp.after.max.ms at its maximum,
    Apache Kafka's default before 4.0; 4.x refuses a whole batch holding a record more than an hour ahead):
    what a cluster configured so delivers, for the benchmark's and the tests' `bad_kafka_timestamp` records
    (the reader's own checks of Kafka timestamps)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(platform.kafka())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(
        "message.timestamp.after.max.ms", str(2 ** 63 - 1), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def _takes_future_timestamps(topic: str, platform: config.PlatformConfig) -> bool:
    """Whether `topic` keeps a producer's timestamp years ahead (CreateTime, no bound on how far ahead)."""
    from lakehouse.core import topics

    try:
        found = topics.describe_config(topic, ["message.timestamp.type", "message.timestamp.after.max.ms"], platform)
    except errors.TopicError as exc:
        raise ProduceError(str(exc)) from None
    bound = found["message.timestamp.after.max.ms"]
    return found["message.timestamp.type"] != "LogAppendTime" and (bound is None or int(bound) >= 2**62)


def produce(spec: PipelineSpec, count: int, rate: float | None = None, bad_ratio: float = 0.0,
            seed: int | None = None, platform: config.PlatformConfig | None = None,
            on_progress: Callable[[int], Any] | None = None, connect_schemas: bool = False) -> ProduceReport:
    """Send `count` synthetic records to the spec's source topic and wait until all are acknowledged.

    `rate` paces sends to about that many records per second (unlimited when
    None); `on_progress(sent)` is called about every second with the number of
    records acknowledged so far, and once at the end. A change stream's report
    says what its table must hold (`changes`). Returns a ProduceReport.
    Raises ProduceError when the topic does not exist, Kafka does not answer, or
    any record is not delivered (the first delivery error is quoted), and
    ValueError for a bad count, rate or ratio.
    """
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    _check_arguments(count, bad_ratio)
    platform = platform or config.load()
    topic = spec.source.topic
    stream = record_stream(spec, seed, None, platform, connect_schemas)  # argument and contract errors first
    producer = Producer(producer_config(spec, platform))
    try:
        existing = producer.list_topics(timeout=10).topics  # all topics: never triggers auto-creation
    except KafkaException as exc:
        raise ProduceError(f"cannot reach Kafka at {platform.bootstrap_servers}: {exc.args[0].str()}") from None
    if topic not in existing:
        raise ProduceError(f"topic {topic!r} of pipeline {spec.name!r} does not exist on "
                           f"{platform.bootstrap_servers}; create it first (lakehouse.topics.ensure_topics)")
    if not _takes_future_timestamps(topic, platform):
        # Apache Kafka refuses a batch holding a timestamp more than message.timestamp.after.max.ms ahead (an
        # hour by default since 4.0), or overwrites it (LogAppendTime): that defect never reaches a reader here
        stream.kinds = tuple(kind for kind in stream.kinds if kind != "bad_kafka_timestamp")

    delivered = 0
    per_partition: dict[int, int] = {}
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        nonlocal delivered
        if err is not None:
            failures.append(f"{err.str()} (partition {msg.partition()}, key {msg.key()!r})")
            return
        delivered += 1
        per_partition[msg.partition()] = per_partition.get(msg.partition(), 0) + 1

    def fail(queued: int) -> ProduceError:
        producer.purge()
        producer.flush(5)
        return ProduceError(f"delivery to topic {topic!r} on {platform.bootstrap_servers} failed for "
                            f"{len(failures)} record(s) after {delivered} of {queued} were delivered; "
                            f"first error: {failures[0]}")

    limiter = RateLimiter(rate, sleep=lambda s: producer.poll(s)) if rate else None
    bad_by_kind: dict[str, int] = {}
    started = last_progress = time.monotonic()
    queued = 0
    for record in stream.records(count, bad_ratio):
        if limiter is not None:
            limiter.acquire()
        stamped = {} if record.timestamp is None else {"timestamp": record.timestamp}
        while True:
            try:
                producer.produce(topic, value=record.value, key=record.key, headers=record.headers,
                                 on_delivery=on_delivery, **stamped)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
            except KafkaException as exc:
                raise ProduceError(f"cannot send to topic {topic!r}: {exc.args[0].str()}") from None
        queued += 1
        if record.kind is not None:
            bad_by_kind[record.kind] = bad_by_kind.get(record.kind, 0) + 1
        producer.poll(0)
        if failures:
            raise fail(queued)
        if on_progress is not None and time.monotonic() - last_progress >= 1.0:
            last_progress = time.monotonic()
            on_progress(delivered)

    remaining = producer.flush(60)
    if failures:
        raise fail(queued)
    if remaining:
        raise ProduceError(f"{remaining} record(s) to topic {topic!r} were not acknowledged by "
                           f"{platform.bootstrap_servers} within 60 s of the last send")
    if on_progress is not None:
        on_progress(delivered)
    return ProduceReport(sent=delivered, bad_by_kind=bad_by_kind, per_partition=dict(sorted(per_partition.items())),
                         seconds=time.monotonic() - started, topic=topic,
                         changes=getattr(stream, "summary", lambda: None)())
