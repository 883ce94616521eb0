"""Valid synthetic records for one spec that look like production traffic, reproducible from a seeded RNG.

A `RecordFactory` makes JSON-like values (see lakehouse_dev.record_formats for how each format writes them)
that honour every rule of the contract, nested fields included: types, enums, ranges, patterns
(lakehouse_dev.pattern_strings), max lengths, decimals within their precision and scale, timestamps with a
UTC offset or in their unit. Ids are reused as entities change (an order goes created -> paid -> shipped),
customers are drawn from a pool, amounts are log-normal, most event times are about now and some arrive
days late. Breaking such a record on purpose is lakehouse_dev.defects' role.
"""

from __future__ import annotations

import base64
import math
import re
import struct
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from random import Random
from typing import Any

from lakehouse.core.spec import FieldSpec, PipelineSpec
from lakehouse_dev import pattern_strings
from lakehouse_dev.record_formats import EPOCH_DATE, ProduceError, epoch

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


def _weighted(rng: Random, pairs: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([v for v, _ in pairs], weights=[w for _, w in pairs])[0]


def _float32(value: float) -> float:
    """`value` as a 32-bit float holds it (what an Avro or Protobuf float field sends)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


class RecordFactory:
    """Valid records (JSON-like values, see lakehouse_dev.record_formats) for one spec, reproducible from `rng`.

    Raises ProduceError at construction when the contract cannot be satisfied (a pattern it cannot
    generate, an int range with no integer in it, a decimal range no value of its scale fits).
    """

    def __init__(self, spec: PipelineSpec, rng: Random, now: Callable[[], datetime] | None = None):
        self.spec = spec
        self.rng = rng
        self.now = now or (lambda: datetime.now(UTC))
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
        self.columns = tuple((f.name, f.required, self.generators[f.name]) for f in self.fields)  # for `row`


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
        draw = self.rng.random
        for name, required, make in self.columns:
            if required or draw() < 0.85:
                record[name] = make(record)
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
        return (self.now() - lag).astimezone(UTC).isoformat(timespec="milliseconds")

    def _string_generator(self, f: FieldSpec, top: bool) -> Callable[[dict], str]:
        rng = self.rng
        limit = f.max_length
        fit = (lambda s: s[:limit]) if limit else (lambda s: s)
        name = f.name
        if f.pattern is not None:
            core = pattern_strings.pattern_core(f.pattern)
            if core == "[A-Z]{3}":
                return lambda rec: _weighted(rng, CURRENCIES)
            if core == "[A-Z]{2}":
                return lambda rec: _weighted(rng, COUNTRIES)
            if "@" in core:
                candidate = self._email({})
                if re.fullmatch(f.pattern, candidate) and (limit is None or len(candidate) <= limit):
                    return lambda rec: self._email(rec)
            matching = pattern_strings.matching(f.pattern, limit, rng, f"{self.spec.path}: field {name}")
            return lambda rec: matching()
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


_ASCII_FOLD = str.maketrans({"ä": "a", "ö": "o", "ü": "u", "é": "e", "è": "e", "ê": "e", "ø": "o", "å": "a",
                             "á": "a", "í": "i", "ó": "o", "ú": "u", "ñ": "n", "ç": "c", "ë": "e", "ł": "l",
                             "ß": "ss"})


def deep_copy(value: Any) -> Any:
    """A copy of a JSON-like value whose dicts and lists are new all the way down."""
    if isinstance(value, dict):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value
