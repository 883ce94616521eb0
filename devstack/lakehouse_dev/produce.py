"""A realistic synthetic producer for any pipeline, driven by the spec's contract.

`produce(spec, count, ...)` sends `count` JSON records to the spec's source topic
and returns a `ProduceReport`. Valid records honour every rule of the contract
(types, enums, ranges, patterns, max lengths, timestamps with a UTC offset) and
look like production traffic: ids reused as entities change (an order goes
created -> paid -> shipped), customers drawn from a pool, amounts log-normal.

With `bad_ratio` > 0, about that share of the records is broken on purpose, one
defect per record, the kinds taken in turn from `BAD_KINDS` (those the spec can
express: no `bad_enum` without an enum field, no `null_key` when keys are
optional, ...). The kind names are the decoder's `error_kind` values, so a test
can compare what was sent with what was dead-lettered. Each broken record also
carries a `fault` header naming its kind, to make a dead letter self-explaining.
Some defects are hostile to the reader rather than the contract: a string that is
not Unicode, an event time no datetime holds, a Kafka timestamp past year 9999.
(A header key that is not UTF-8 cannot be among them: confluent-kafka's producer
sends `str(key)` for a bytes key, and crashes on a str key with a lone surrogate.)

`synthesize(...)` yields the same records without Kafka, for unit tests.
"""

from __future__ import annotations

import json
import math
import re
import string
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from random import Random
from typing import Any, Callable, Iterator

from confluent_kafka import KafkaException, Producer

from lakehouse.core import config
from lakehouse.core.errors import LakehouseError
from lakehouse.core.spec import FieldSpec, PipelineSpec

try:  # the regular-expression parser behind `re`, used to generate strings matching a pattern
    from re import _constants as sre_c
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# The defects `produce` can inject, in the order they are taken in turn. These strings
# are the decoder's error kinds (lakehouse.ingest.records.ERROR_KINDS): keep them identical.
BAD_KINDS = (
    "malformed_json",    # truncated JSON text
    "not_utf8",          # bytes that are not UTF-8 (a Latin-1 string inside the JSON)
    "not_an_object",     # a JSON array or number instead of an object
    "missing_required",  # a required field dropped
    "wrong_type",        # e.g. amount as "abc", a string field as a number
    "bad_enum",          # a value outside the field's enum
    "out_of_range",      # e.g. a negative amount where min is 0
    "pattern_mismatch",  # e.g. currency "eur" where the pattern is ^[A-Z]{3}$
    "bad_timestamp",     # "yesterday", a timestamp without UTC offset, epoch millis
    "oversize",          # a value larger than source.max_value_bytes
    "null_value",        # a tombstone (value None)
    "null_key",          # no key although the spec requires one
    "bad_string",        # a string cut inside a surrogate pair, sent as the JSON escape "Zo\ud83d"
    "timestamp_out_of_range",  # ISO-8601, but year 0 or 10000 in UTC: "0001-01-01T00:00:00+02:00"
    "bad_kafka_timestamp",     # a valid value sent with a Kafka timestamp in microseconds, not millis
    "bad_wire_format",   # Avro pipelines: a JSON value instead of the Confluent wire format
    "unknown_schema",    # Avro pipelines: a schema id nobody registered
    "malformed_avro",    # Avro pipelines: a record cut short
)
AVRO_ONLY_KINDS = ("bad_wire_format", "unknown_schema", "malformed_avro")
# what an Avro record can carry of the other defects (a typed writer schema cannot hold wrong types,
# unparsable timestamps, strings that are not Unicode or JSON that is not an object)
AVRO_KINDS = (*AVRO_ONLY_KINDS, "bad_enum", "out_of_range", "pattern_mismatch", "null_value", "null_key",
              "bad_kafka_timestamp")
AVRO_TYPES = {"string": "string", "int": "int", "long": "long", "double": "double", "boolean": "boolean",
              "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
              "date": {"type": "int", "logicalType": "date"}}
FAULT_HEADER = "fault"
SOURCE_HEADER = ("source", b"lakehouse-produce")
# librdkafka refuses to send a message above its message.max.bytes (1,000,000 by default) and
# Apache Kafka topics refuse ~1 MiB; an oversize record must still reach the topic to be tested.
_MAX_SENDABLE_BYTES = 1_000_000
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
_SELF_TEST_RECORDS = 50


class ProduceError(LakehouseError, RuntimeError):
    """Records could not be generated or delivered; the message says which and why."""


@dataclass
class ProduceReport:
    """What a produce run sent: counts per defect kind (only kinds sent) and per partition."""

    sent: int
    bad_by_kind: dict[str, int]
    per_partition: dict[int, int]
    seconds: float
    topic: str = ""

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
        tree = sre_parse.parse(pattern)
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


def _conforms(f: FieldSpec, value: Any) -> bool:
    """Whether `value` satisfies field `f` of the contract as JSON would carry it."""
    if value is None:
        return not f.required
    if f.type == "string":
        if not isinstance(value, str):
            return False
        if f.enum is not None and value not in f.enum:
            return False
        if f.max_length is not None and len(value) > f.max_length:
            return False
        return f.pattern is None or re.fullmatch(f.pattern, value) is not None
    if f.type in ("int", "long", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if f.type != "double" and not isinstance(value, int):
            return False
        if f.type == "int" and not -(2**31) <= value < 2**31:
            return False
        if f.type == "long" and not -(2**63) <= value < 2**63:
            return False
        if f.type == "double" and not math.isfinite(value):
            return False
        if f.enum is not None and value not in f.enum:
            return False
        return (f.min is None or value >= f.min) and (f.max is None or value <= f.max)
    if f.type == "boolean":
        return isinstance(value, bool)
    if f.type == "timestamp":
        try:
            return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None
        except ValueError:
            return False
    if f.type == "date":
        try:
            return isinstance(value, str) and bool(date.fromisoformat(value))
        except ValueError:
            return False
    return False


# ---------------------------------------------------------------------------- records

def _dumps(obj: Any) -> str:
    # compact and UTF-8, as most service producers emit; names like "Søren" stay multi-byte
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _prefer_non_key(fields: list[FieldSpec], key_field: str | None) -> list[FieldSpec]:
    """Defects go into a field other than the key when possible, so the key stays consistent."""
    others = [f for f in fields if f.name != key_field]
    return others or fields


class RecordFactory:
    """Valid and deliberately broken records for one spec, reproducible from `rng`.

    Raises ProduceError at construction when the contract cannot be satisfied
    (a pattern it cannot generate, an int range with no integer in it).
    """

    def __init__(self, spec: PipelineSpec, rng: Random, now: Callable[[], datetime] | None = None):
        self.spec = spec
        self.rng = rng
        self.now = now or (lambda: datetime.now(timezone.utc))
        self.fields = spec.contract.fields
        self.key_field = spec.source.key_field
        self.sequence = rng.randrange(1, 1_000_000)  # ids continue from a random point, like a live system
        self.open: dict[str, dict] = {}               # entity key -> its latest record
        self.open_keys: list[str] = []
        self.lifecycle_field = next(
            (f for f in self.fields if f.type == "string" and f.enum and "created" in f.enum), None)
        self.generators = {f.name: self._generator(f) for f in self.fields}
        avro = spec.source.value_format == "avro"
        self.kinds = tuple(k for k in BAD_KINDS if (k in AVRO_KINDS if avro else k not in AVRO_ONLY_KINDS)
                           and (k in AVRO_ONLY_KINDS or self._applicable(k)))
        self._self_test()

    # -- valid records ------------------------------------------------------------------

    def valid(self) -> dict:
        """The next valid record (a new dict the caller may change): a new entity, or
        (sometimes) the next state of an open one."""
        if self.key_field and self.open_keys and self.rng.random() < (0.45 if self.lifecycle_field else 0.3):
            record = self._update()
            if record is not None:
                return dict(record)
        record = {}
        for f in self.fields:
            if f.required or self.rng.random() < 0.85:
                record[f.name] = self.generators[f.name](record)
        if self.lifecycle_field is not None and self.key_field:
            record[self.lifecycle_field.name] = "created"  # later events of this entity move it on
        self._remember(record)
        return dict(record)

    def _update(self) -> dict | None:
        """The next event of an open entity: a status transition, fresh timestamps and enums."""
        index = self.rng.randrange(len(self.open_keys))
        key = self.open_keys[index]
        record = dict(self.open[key])
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
        self.open[key] = dict(record)

    def _forget(self, index: int) -> None:
        key = self.open_keys[index]
        self.open_keys[index] = self.open_keys[-1]
        self.open_keys.pop()
        self.open.pop(key, None)

    def key_of(self, record: dict) -> bytes | None:
        if not self.key_field or record.get(self.key_field) is None:
            return None
        return str(record[self.key_field]).encode("utf-8")

    def _generator(self, f: FieldSpec) -> Callable[[dict], Any]:
        """A function of the record built so far that returns a valid value for `f`."""
        rng = self.rng
        name = f.name
        if f.enum is not None:
            values = list(f.enum)
            return lambda rec: rng.choice(values)
        if f.type == "string":
            return self._string_generator(f)
        if f.type in ("int", "long"):
            lo = math.ceil(f.min) if f.min is not None else None
            hi = math.floor(f.max) if f.max is not None else None
            if lo is not None and hi is not None and lo > hi:
                raise ProduceError(f"{self.spec.path}: field {name}: no integer lies in [{f.min}, {f.max}]")
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
            bound = 2**31 - 1 if f.type == "int" else 2**63 - 1
            lo, hi = max(lo, -bound - 1), min(hi, bound)
            return lambda rec: rng.randint(lo, hi)
        if f.type == "double":
            lo, hi = f.min, f.max
            money = name in _MONEY_NAMES or name.endswith(("_amount", "_price", "_total"))

            def double(rec: dict) -> float:
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
                return value
            return double
        if f.type == "boolean":
            return lambda rec: rng.random() < 0.5
        if f.type == "timestamp":
            return lambda rec: self._timestamp()
        if f.type == "date":
            return lambda rec: (self.now().date() - timedelta(days=rng.randint(0, 30))).isoformat()
        raise ProduceError(f"{self.spec.path}: field {name}: unsupported type {f.type}")  # pragma: no cover

    def _timestamp(self) -> str:
        """Mostly now (a few seconds of transport delay), some late arrivals over the last 3 days."""
        if self.rng.random() < 0.85:
            lag = timedelta(seconds=self.rng.expovariate(1 / 2.0))
        else:
            lag = timedelta(seconds=self.rng.uniform(0, 3 * 86_400))
        return (self.now() - lag).astimezone(timezone.utc).isoformat(timespec="milliseconds")

    def _string_generator(self, f: FieldSpec) -> Callable[[dict], str]:
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
        if name == self.key_field:
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

    def _self_test(self) -> None:
        """Generate a few records on a copy of the state and check them, to fail before sending anything."""
        state = self.rng.getstate()
        sequence, open_, keys = self.sequence, dict(self.open), list(self.open_keys)
        try:
            for _ in range(_SELF_TEST_RECORDS):
                record = self.valid()
                size = len(_dumps(record).encode("utf-8"))
                if size > self.spec.source.max_value_bytes:
                    raise ProduceError(f"{self.spec.path}: source.max_value_bytes is "
                                       f"{self.spec.source.max_value_bytes} but a valid record takes {size} bytes")
                for f in self.fields:
                    if f.name in record and not _conforms(f, record[f.name]):
                        raise ProduceError(f"{self.spec.path}: field {f.name}: generated {record[f.name]!r}, "
                                           f"which breaks its own contract; the generator needs a rule for it")
        finally:
            self.rng.setstate(state)
            self.sequence, self.open, self.open_keys = sequence, open_, keys

    # -- broken records -----------------------------------------------------------------

    def _candidates(self, kind: str) -> list[FieldSpec]:
        fields = list(self.fields)
        if kind == "missing_required":
            found = [f for f in fields if f.required]
        elif kind == "wrong_type":
            # timestamp/date fields reject a non-string as bad_timestamp/bad_date, not wrong_type
            found = [f for f in fields if f.type in ("string", "int", "long", "double", "boolean")]
        elif kind == "bad_enum":
            found = [f for f in fields if f.enum]
        elif kind == "out_of_range":
            found = [f for f in fields if f.type in ("int", "long", "double") and not f.enum
                     and (f.min is not None or f.max is not None or f.type != "double")]
        elif kind == "pattern_mismatch":
            found = [f for f in fields if f.type == "string" and f.pattern and not f.enum
                     and self._pattern_breaker(f, Random(0)) is not None]
        elif kind == "bad_timestamp" or kind == "timestamp_out_of_range":
            found = [f for f in fields if f.type == "timestamp"]
        elif kind == "bad_string":
            found = [f for f in fields if f.type == "string"]
        else:
            return []
        return _prefer_non_key(found, self.key_field) if found else []

    def _applicable(self, kind: str) -> bool:
        src = self.spec.source
        if kind in ("malformed_json", "not_utf8", "not_an_object", "bad_kafka_timestamp"):
            return True
        if kind == "oversize":
            return src.max_value_bytes + 1024 < _MAX_SENDABLE_BYTES
        if kind == "null_value":
            # an upsert pipeline keyed by the record key reads a tombstone as a delete, not a defect
            tgt = self.spec.target
            return not (tgt.mode == "upsert" and self.key_field is not None and tgt.key == (self.key_field,))
        if kind == "null_key":
            return src.key_required
        return bool(self._candidates(kind))

    def bad(self, kind: str) -> tuple[bytes | None, bytes | None, int | None]:
        """Key, value and Kafka timestamp (None: the producer's clock) of a record that is valid
        except for the one defect `kind`."""
        if kind == "bad_kafka_timestamp":
            record = self.valid()
            return self.key_of(record), _dumps(record).encode("utf-8"), self._kafka_timestamp()
        return (*self._bad_value(kind), None)

    def _kafka_timestamp(self) -> int:
        """A timestamp past what a batch can carry (year 9999), as clients with the unit wrong send."""
        seconds = self.now().timestamp()
        return self.rng.choice([int(seconds * 1_000_000), int(seconds * 1_000_000_000), 2**63 - 1])

    def _bad_value(self, kind: str) -> tuple[bytes | None, bytes | None]:
        """Key and value of a record whose value breaks the contract in the one way `kind`."""
        rng = self.rng
        record = self.valid()
        key = self.key_of(record)
        if kind == "malformed_json":
            text = _dumps(record)
            return key, text[: rng.randint(1, len(text) - 1)].encode("utf-8")
        if kind == "not_utf8":
            # a legacy client that wrote one string in Latin-1: "café" as b"caf\xe9"
            return key, _dumps(record).encode("utf-8")[:-1] + b',"note":"caf\xe9"}'
        if kind == "not_an_object":
            return key, (_dumps([record]) if rng.random() < 0.5 else str(rng.randint(0, 999))).encode("utf-8")
        if kind == "null_value":
            return key, None
        if kind == "null_key":
            return None, _dumps(record).encode("utf-8")
        if kind == "oversize":
            limit = self.spec.source.max_value_bytes
            base = len(_dumps({**record, "comment": ""}).encode("utf-8"))
            padding = limit - base + 1 + rng.randint(0, 512)
            text = (" ".join(WORDS) + " ") * (padding // 100 + 1)
            return key, _dumps({**record, "comment": text[:max(padding, 0)]}).encode("utf-8")

        f = rng.choice(self._candidates(kind))
        if kind == "missing_required":
            record.pop(f.name, None)
        elif kind == "wrong_type":
            current = record.get(f.name)
            if f.type == "string":
                record[f.name] = rng.choice([rng.randint(1, 99_999), round(rng.uniform(1, 999), 2)])
            elif f.type == "boolean":
                record[f.name] = rng.choice(["yes", "true", 1])
            else:  # a number sent as text, e.g. amount "12.50", or plain garbage
                record[f.name] = str(current) if current is not None and rng.random() < 0.5 else "abc"
        elif kind == "bad_enum":
            if f.type == "string":
                current = record.get(f.name) or f.enum[0]
                options = [v for v in (current.upper(), "pending", "unknown", "n/a") if v not in f.enum]
                record[f.name] = rng.choice(options) if options else f"not-{current}"
            else:
                record[f.name] = max(f.enum) + rng.randint(1, 10)
        elif kind == "out_of_range":
            record[f.name] = self._out_of_range(f)
        elif kind == "pattern_mismatch":
            record[f.name] = self._pattern_breaker(f, rng)
        elif kind == "bad_string":
            # a UTF-16 client cut the text inside an emoji; json escapes the surrogate left behind
            current = record.get(f.name)
            text = current if isinstance(current, str) and current else "Zoë"
            record[f.name] = text[:max(1, len(text) // 2)] + "\ud83d"
            return key, json.dumps(record, separators=(",", ":")).encode("ascii")
        elif kind == "timestamp_out_of_range":
            record[f.name] = rng.choice(_UNREPRESENTABLE_TIMES)
        elif kind == "bad_timestamp":
            moment = self.now() - timedelta(seconds=rng.uniform(0, 3600))
            record[f.name] = rng.choice([
                "yesterday",
                moment.replace(tzinfo=None).isoformat(timespec="seconds"),   # no UTC offset
                moment.strftime("%d/%m/%Y %H:%M:%S"),
                int(moment.timestamp() * 1000),                            # epoch millis
            ])
        else:
            raise ValueError(f"unknown defect kind {kind!r} (known: {', '.join(BAD_KINDS)})")
        return key, _dumps(record).encode("utf-8")

    def _out_of_range(self, f: FieldSpec) -> int | float:
        rng = self.rng
        integral = f.type in ("int", "long")
        if f.min is not None and (f.max is None or rng.random() < 0.5):
            if integral:
                return math.ceil(f.min) - rng.randint(1, 100)
            return round(f.min - rng.choice([0.01, 1.0, round(rng.uniform(1, 500), 2)]), 2)
        if f.max is not None:
            if integral:
                return math.floor(f.max) + rng.randint(1, 100)
            return round(f.max + rng.choice([0.01, 1.0, round(rng.uniform(1, 500), 2)]), 2)
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


def contract_avro_schema(spec: PipelineSpec) -> dict:
    """An Avro record schema for the spec's contract: optional fields nullable with a null default,
    timestamps as timestamp-micros, dates as date."""
    fields = [{"name": f.name, "type": AVRO_TYPES[f.type] if f.required else ["null", AVRO_TYPES[f.type]],
               **({} if f.required else {"default": None})} for f in spec.contract.fields]
    return {"type": "record", "name": spec.name, "namespace": "lakehouse.produce", "fields": fields}


class AvroValues:
    """Values of an Avro pipeline in the Confluent wire format: the newest schema of the spec's schema
    folder, or the contract's schema registered under `<topic>-value` in the schema registry."""

    def __init__(self, spec: PipelineSpec, platform: config.PlatformConfig):
        from lakehouse.ingest.formats import parse_schema, register_avro_schema

        avro = [(schema_id, text) for schema_id, schema_type, text in spec.source.schemas if schema_type == "AVRO"]
        if avro:
            self.schema_id, text = max(avro)
        elif platform.schema_registry():
            text = json.dumps(contract_avro_schema(spec))
            self.schema_id = register_avro_schema(platform.schema_registry(), f"{spec.source.topic}-value", text)
        else:
            raise ProduceError(f"pipeline {spec.name!r} is Avro without source.schemas: set "
                               f"LAKEHOUSE_SCHEMA_REGISTRY_URL to register its schema")
        self.parsed = parse_schema(text)
        self.types = {f.name: f.type for f in spec.contract.fields}

    def encode(self, record: dict) -> bytes:
        """`record` (as RecordFactory makes it: ISO-8601 times and dates) as an Avro value."""
        from lakehouse.ingest.formats import wire_value

        typed = dict(record)
        for name, kind in self.types.items():
            value = typed.get(name)
            if isinstance(value, str) and kind == "timestamp":
                typed[name] = datetime.fromisoformat(value)
            elif isinstance(value, str) and kind == "date":
                typed[name] = date.fromisoformat(value)
        return wire_value(self.schema_id, self.parsed, typed)

    def broken(self, kind: str, record: dict) -> bytes:
        """A value with the Avro-level defect `kind` (AVRO_ONLY_KINDS), made from a valid `record`."""
        good = self.encode(record)
        if kind == "bad_wire_format":
            return _dumps(record).encode("utf-8")
        if kind == "unknown_schema":
            return b"\x00" + (2 ** 31 - 1).to_bytes(4, "big") + good[5:]
        return good[:-2]  # malformed_avro: cut short


def synthesize(spec: PipelineSpec, count: int, bad_ratio: float = 0.0, seed: int | None = None,
               now: Callable[[], datetime] | None = None,
               platform: config.PlatformConfig | None = None) -> Iterator[SyntheticRecord]:
    """The records `produce` would send, without Kafka: `count` of them, about `bad_ratio` broken.

    Each record is broken with probability `bad_ratio` (drawn from the seeded
    RNG); broken records take the applicable kinds of BAD_KINDS in turn.
    Raises, before yielding anything, ValueError for a count below 0 or a ratio
    outside [0, 1], and ProduceError when the contract cannot be generated.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 0.0 <= bad_ratio <= 1.0:
        raise ValueError(f"bad_ratio must be between 0 and 1, got {bad_ratio}")
    rng = Random(seed)
    factory = RecordFactory(spec, rng, now=now)
    avro = AvroValues(spec, platform or config.load()) if spec.source.value_format == "avro" else None
    return _records(factory, rng, count, bad_ratio, avro)


def _records(factory: RecordFactory, rng: Random, count: int, bad_ratio: float,
             avro: AvroValues | None = None) -> Iterator[SyntheticRecord]:
    turn = 0
    content_type = b"application/vnd.confluent.avro" if avro else b"application/json"
    for _ in range(count):
        headers = [SOURCE_HEADER, ("trace_id", uuid.UUID(int=rng.getrandbits(128), version=4).hex.encode()),
                   ("content-type", content_type)]
        if bad_ratio and rng.random() < bad_ratio:
            kind = factory.kinds[turn % len(factory.kinds)]
            turn += 1
            if kind in AVRO_ONLY_KINDS:
                record = factory.valid()
                key, value, timestamp = factory.key_of(record), avro.broken(kind, record), None
            else:
                key, value, timestamp = factory.bad(kind)
                if avro is not None and value is not None:  # the same defect inside an Avro record
                    try:
                        value = avro.encode(json.loads(value))
                    except (ValueError, TypeError, OverflowError):  # e.g. past the Avro type's range
                        kind, value = "malformed_avro", avro.broken("malformed_avro", factory.valid())
            yield SyntheticRecord(key, value, headers + [(FAULT_HEADER, kind.encode())], kind, timestamp)
        else:
            record = factory.valid()
            value = avro.encode(record) if avro else _dumps(record).encode("utf-8")
            yield SyntheticRecord(factory.key_of(record), value, headers, None)


def producer_config(spec: PipelineSpec, platform: config.PlatformConfig) -> dict:
    """librdkafka settings: murmur2 like the Java client, idempotent, small linger; LAKEHOUSE_KAFKA_* win."""
    defaults = {
        "partitioner": "murmur2_random",   # same key -> same partition as Java clients and Kafka Connect
        "enable.idempotence": True,        # retries neither duplicate nor reorder a key's events
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 30_000,      # fail within 30 s instead of librdkafka's 5 minutes
        "message.max.bytes": max(_MAX_SENDABLE_BYTES, spec.source.max_value_bytes + 64 * 1024),
    }
    return {**defaults, **platform.kafka()}


def produce(spec: PipelineSpec, count: int, rate: float | None = None, bad_ratio: float = 0.0,
            seed: int | None = None, platform: config.PlatformConfig | None = None,
            on_progress: Callable[[int], Any] | None = None) -> ProduceReport:
    """Send `count` synthetic records to the spec's source topic and wait until all are acknowledged.

    `rate` paces sends to about that many records per second (unlimited when
    None); `on_progress(sent)` is called about every second with the number of
    records acknowledged so far, and once at the end. Returns a ProduceReport.
    Raises ProduceError when the topic does not exist, Kafka does not answer, or
    any record is not delivered (the first delivery error is quoted), and
    ValueError for a bad count, rate or ratio.
    """
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    platform = platform or config.load()
    topic = spec.source.topic
    records = synthesize(spec, count, bad_ratio=bad_ratio, seed=seed, platform=platform)  # argument errors first
    producer = Producer(producer_config(spec, platform))
    try:
        existing = producer.list_topics(timeout=10).topics  # all topics: never triggers auto-creation
    except KafkaException as exc:
        raise ProduceError(f"cannot reach Kafka at {platform.bootstrap_servers}: {exc.args[0].str()}") from None
    if topic not in existing:
        raise ProduceError(f"topic {topic!r} of pipeline {spec.name!r} does not exist on "
                           f"{platform.bootstrap_servers}; create it first (lakehouse.topics.ensure_topics)")

    delivered = 0
    per_partition: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        nonlocal delivered
        if err is not None:
            errors.append(f"{err.str()} (partition {msg.partition()}, key {msg.key()!r})")
            return
        delivered += 1
        per_partition[msg.partition()] = per_partition.get(msg.partition(), 0) + 1

    def fail(queued: int) -> ProduceError:
        producer.purge()
        producer.flush(5)
        return ProduceError(f"delivery to topic {topic!r} on {platform.bootstrap_servers} failed for "
                            f"{len(errors)} record(s) after {delivered} of {queued} were delivered; "
                            f"first error: {errors[0]}")

    limiter = RateLimiter(rate, sleep=lambda s: producer.poll(s)) if rate else None
    bad_by_kind: dict[str, int] = {}
    started = last_progress = time.monotonic()
    queued = 0
    for record in records:
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
        if errors:
            raise fail(queued)
        if on_progress is not None and time.monotonic() - last_progress >= 1.0:
            last_progress = time.monotonic()
            on_progress(delivered)

    remaining = producer.flush(60)
    if errors:
        raise fail(queued)
    if remaining:
        raise ProduceError(f"{remaining} record(s) to topic {topic!r} were not acknowledged by "
                           f"{platform.bootstrap_servers} within 60 s of the last send")
    if on_progress is not None:
        on_progress(delivered)
    return ProduceReport(sent=delivered, bad_by_kind=bad_by_kind, per_partition=dict(sorted(per_partition.items())),
                         seconds=time.monotonic() - started, topic=topic)
