"""The contract's checks of one field: `field_checker(f)` is a function that takes a decoded value of
contract field `f` (JSON's, or a wire format's: datetimes, dates, Decimals, UUIDs, bytes) and returns it
in the form Arrow takes it (timestamps as epoch microseconds, dates as epoch days, decimals exact), or
raises Rejected naming the field and why. With the bounds those checks hold values to: the integer
types' (INT32, INT64), a float's (FLOAT32_MAX), the instants a timestamp may be (TIMESTAMP_RANGE), and
the interval a number field's min and max let through (`number_interval`), which the JSON fast path and
the wire formats' compiled rows reproduce.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import math
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from lakehouse.core.spec import MAX_MATCHED_CHARS, FieldSpec, contract_pattern
from lakehouse.ingest.rejects import Rejected, show

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_DATE = date(1970, 1, 1)
ONE_MICROSECOND = timedelta(microseconds=1)
# The instants Python's datetime can hold in UTC: pyspark turns collected timestamps into
# datetimes, so a value outside breaks whoever reads it, even though Arrow and Iceberg hold more.
MIN_TIMESTAMP_US = (datetime.min.replace(tzinfo=UTC) - EPOCH) // ONE_MICROSECOND
MAX_TIMESTAMP_US = (datetime.max.replace(tzinfo=UTC) - EPOCH) // ONE_MICROSECOND
TIMESTAMP_RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"

def parse_timestamp(value: Any, name: str) -> int:
    """Microseconds since the epoch for an ISO-8601 timestamp that carries a UTC offset.

    The instant must lie in TIMESTAMP_RANGE: "9999-12-31T23:30:00-01:00" parses, but is
    in year 10000 once in UTC.
    """
    if isinstance(value, datetime):  # Avro's timestamp-millis/micros logical types (aware, UTC)
        parsed = value
    elif not isinstance(value, str):
        raise Rejected("bad_timestamp", f"{name} must be an ISO-8601 string, got {show(value)}")
    else:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise Rejected("bad_timestamp", f"{name} {show(value)} is not ISO-8601") from None
    if parsed.tzinfo is None:
        raise Rejected("bad_timestamp", f"{name} {show(value)} has no UTC offset")
    delta = parsed - EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if not MIN_TIMESTAMP_US <= micros <= MAX_TIMESTAMP_US:
        raise Rejected("timestamp_out_of_range", f"{name} {show(value)} is outside {TIMESTAMP_RANGE} in UTC")
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


def field_checker(f: FieldSpec, path: str | None = None) -> Callable[[Any], Any]:
    """A function that returns the typed value of field `f` (named `path` in messages, its dotted path when
    nested) in the form Arrow takes it, or raises Rejected."""
    name = path or f.name
    matches = contract_pattern(f.pattern) if f.pattern else None
    matched: set[str] = set()  # up to 1024 short values that matched (currency codes): no RE2 call for them
    enum = frozenset(f.enum) if f.enum else None

    def bounds(number: float) -> None:
        if f.min is not None and number < f.min:
            raise Rejected("out_of_range", f"{name} {show(number)} is below the minimum {f.min:g}")
        if f.max is not None and number > f.max:
            raise Rejected("out_of_range", f"{name} {show(number)} is above the maximum {f.max:g}")

    if f.type == "string":
        def check(v: Any) -> Any:
            if not isinstance(v, str):
                raise Rejected("wrong_type", f"{name} must be a string, got {type(v).__name__} {show(v)}")
            at = None if v.isascii() else lone_surrogate(v)
            if at is not None:
                raise Rejected("bad_string", f"{name} holds a lone surrogate {v[at]!r} at character {at}, "
                                             f"which is not Unicode")
            if enum is not None and v not in enum:
                raise Rejected("bad_enum", f"{name} {show(v)} is not one of {', '.join(sorted(enum))}")
            if f.max_length is not None and len(v) > f.max_length:
                raise Rejected("too_long", f"{name} has {len(v)} characters, at most {f.max_length} allowed")
            if matches is not None and v not in matched:
                if len(v) > MAX_MATCHED_CHARS:  # bounded before matching, whatever the pattern
                    raise Rejected("too_long", f"{name} has {len(v)} characters; a field with a pattern is "
                                               f"matched up to {MAX_MATCHED_CHARS}")
                if not matches(v):
                    raise Rejected("pattern_mismatch", f"{name} {show(v)} does not match {f.pattern}")
                if len(matched) < 1024 and len(v) <= 64:
                    matched.add(v)
            return v
    elif f.type in ("int", "long"):
        lo, hi = INT32 if f.type == "int" else INT64

        def check(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, int):
                raise Rejected("wrong_type", f"{name} must be an integer, got {type(v).__name__} {show(v)}")
            if not lo <= v <= hi:
                raise Rejected("out_of_range", f"{name} {show(v)} does not fit a {f.type}")
            if enum is not None and v not in enum:
                raise Rejected("bad_enum", f"{name} {v} is not one of {', '.join(map(str, sorted(enum)))}")
            bounds(v)
            return v
    elif f.type in ("double", "float"):
        limit = FLOAT32_MAX if f.type == "float" else math.inf

        def check(v: Any) -> Any:
            if isinstance(v, bool) or not isinstance(v, (int, float, Decimal)):
                raise Rejected("wrong_type", f"{name} must be a number, got {type(v).__name__} {show(v)}")
            try:
                number = float(v)
            except OverflowError:  # an integer literal of 310+ digits: no double holds it
                raise Rejected("out_of_range", f"{name} {show(v)} is not a finite {f.type}") from None
            if not math.isfinite(number) or abs(number) > limit:
                raise Rejected("out_of_range", f"{name} {show(v)} is not a finite {f.type}")
            bounds(number)
            return number
    elif f.type == "decimal":
        return _decimal_checker(f, name)
    elif f.type == "boolean":
        def check(v: Any) -> Any:
            if not isinstance(v, bool):
                raise Rejected("wrong_type", f"{name} must be true or false, got {type(v).__name__} {show(v)}")
            return v
    elif f.type == "timestamp":
        per_unit = None if f.unit is None else _EPOCH_UNITS_US.get(f.unit)

        def check(v: Any) -> Any:
            if per_unit is not None and type(v) is int:
                micros = v * per_unit
                if not MIN_TIMESTAMP_US <= micros <= MAX_TIMESTAMP_US:
                    raise Rejected("timestamp_out_of_range", f"{name} {show(v)} {f.unit} since the epoch is "
                                                             f"outside {TIMESTAMP_RANGE}")
                return micros
            if type(v) is datetime and v.tzinfo is None:  # Avro's local-timestamp types: wall time, read as UTC
                v = v.replace(tzinfo=UTC)
            return parse_timestamp(v, name)
    elif f.type == "date":
        def check(v: Any) -> Any:
            if type(v) is date:  # Avro's date logical type
                return (v - EPOCH_DATE).days
            if f.unit == "days" and type(v) is int:
                if not _MIN_DAYS <= v <= _MAX_DAYS:
                    raise Rejected("bad_date", f"{name} {v} days since the epoch is outside years 1 to 9999")
                return v
            if not isinstance(v, str):
                raise Rejected("bad_date", f"{name} must be an ISO-8601 date string, got {show(v)}")
            try:
                return (date.fromisoformat(v) - EPOCH_DATE).days
            except ValueError:
                raise Rejected("bad_date", f"{name} {show(v)} is not an ISO-8601 date") from None
    elif f.type == "uuid":
        def check(v: Any) -> Any:
            if isinstance(v, UUID):  # Avro's uuid logical type
                return str(v)
            if type(v) is bytes and len(v) == 16:
                return str(UUID(bytes=v))
            if not isinstance(v, str) or len(v) != 36 or v[8] + v[13] + v[18] + v[23] != "----":
                raise Rejected("bad_uuid", f"{name} {show(v)} is not a UUID (8-4-4-4-12 hexadecimal digits)")
            try:
                return str(UUID(v))
            except ValueError:
                raise Rejected("bad_uuid", f"{name} {show(v)} is not a UUID (8-4-4-4-12 hexadecimal digits)") \
                    from None
    elif f.type == "binary":
        def check(v: Any) -> Any:
            if isinstance(v, (bytes, bytearray)):
                return bytes(v)
            if isinstance(v, str):  # JSON carries bytes as base64 (Kafka Connect's JSON converter does)
                try:
                    return base64.b64decode(v, validate=True)
                except (ValueError, binascii.Error):
                    raise Rejected("wrong_type", f"{name} is not base64 text: {show(v)}") from None
            raise Rejected("wrong_type", f"{name} must be bytes (base64 text in JSON), got {type(v).__name__}")
    elif f.type == "struct":
        return _struct_checker(f, name)
    elif f.type in ("list", "map"):
        return _collection_checker(f, name)
    else:  # pragma: no cover - spec validation rejects unknown types
        raise ValueError(f"unsupported field type {f.type}")
    return check


_MIN_DAYS = (date.min - EPOCH_DATE).days
_MAX_DAYS = (date.max - EPOCH_DATE).days


def _decimal_checker(f: FieldSpec, name: str) -> Callable[[Any], Decimal]:
    """decimal(P,S): exact values only. A value with more than S decimal places (other than trailing
    zeros) or more than P-S integer digits is out_of_range, never rounded."""
    precision, scale = f.digits
    quantum = Decimal(1).scaleb(-scale)
    integer_digits = precision - scale
    lo = None if f.min is None else Decimal(repr(f.min))
    hi = None if f.max is None else Decimal(repr(f.max))
    # plain text with at most P-S integer digits and S decimal places (what Debezium's string mode writes): of the
    # checks below, only the bounds can fail it
    plain = re.compile(rf"-?[0-9]{{1,{integer_digits}}}(?:\.[0-9]{{0,{scale}}})?").fullmatch \
        if integer_digits >= 1 and scale >= 0 else None

    def check(v: Any) -> Decimal:
        if plain is not None and type(v) is str and plain(v) is not None:
            exact = Decimal(v).quantize(quantum, context=_DECIMAL_CONTEXT)
            if (lo is None or exact >= lo) and (hi is None or exact <= hi):
                return exact
        if isinstance(v, bool):
            raise Rejected("wrong_type", f"{name} must be a decimal number, got bool {show(v)}")
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
                                         f"{show(v)}")
        if not d.is_finite():
            raise Rejected("out_of_range", f"{name} {show(v)} is not a finite decimal")
        if d and d.adjusted() >= integer_digits:
            raise Rejected("out_of_range", f"{name} {show(v)} does not fit decimal({f.precision},{f.scale})")
        try:
            exact = d.quantize(quantum, context=_DECIMAL_CONTEXT)
        except decimal.InvalidOperation:
            raise Rejected("out_of_range", f"{name} {show(v)} does not fit decimal({f.precision},{f.scale})") \
                from None
        if exact != d:
            raise Rejected("out_of_range", f"{name} {show(v)} has more than {f.scale} decimal places; "
                                           f"decimal({f.precision},{f.scale}) would round it")
        if lo is not None and exact < lo:
            raise Rejected("out_of_range", f"{name} {show(v)} is below the minimum {f.min:g}")
        if hi is not None and exact > hi:
            raise Rejected("out_of_range", f"{name} {show(v)} is above the maximum {f.max:g}")
        return exact

    return check


def _struct_checker(f: FieldSpec, name: str) -> Callable[[Any], dict]:
    children = [(c.name, c.required, field_checker(c, f"{name}.{c.name}")) for c in f.fields]

    def check(v: Any) -> dict:
        if not isinstance(v, dict):
            raise Rejected("wrong_type", f"{name} must be an object, got {type(v).__name__} {show(v)}")
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


def _collection_checker(f: FieldSpec, name: str) -> Callable[[Any], Any]:
    """A list's or a map's check (`f.type` "list" or "map"): each element, a map's value, checked by its own
    checker (`f.element`), a null one kept unless the elements are required, a rejected one named by where it
    is (`lines[3].sku`, not `lines[].sku`; `attrs['color']`). A map's keys must be text, valid Unicode."""
    keyed = f.type == "map"
    placeholder = f"{name}{{}}" if keyed else f"{name}[]"
    check_element = field_checker(f.element, placeholder)
    required = f.element.required
    accepted: Any = dict if keyed else (list, tuple)  # Any: a checked value stays Any (a list or a dict)
    expected = "an object (a map)" if keyed else "a list"
    elements = "the map's values" if keyed else "the list's elements"

    def check(v: Any) -> Any:
        if not isinstance(v, accepted):
            raise Rejected("wrong_type", f"{name} must be {expected}, got {type(v).__name__} {show(v)}")
        out: Any = {} if keyed else [None] * len(v)  # each element stored at its key or index
        for at, item in v.items() if keyed else enumerate(v):
            if keyed:
                if not isinstance(at, str):
                    raise Rejected("wrong_type", f"{name} has a key that is not text: {show(at)}")
                if not at.isascii() and lone_surrogate(at) is not None:
                    raise Rejected("bad_string", f"{name} has a key with a lone surrogate, which is not Unicode")
            if item is None:
                if required:
                    raise Rejected("missing_required", f"{name}[{show(at) if keyed else at}] is null; {elements} "
                                                       f"are required")
            else:
                try:
                    item = check_element(item)
                except Rejected as rejected:  # name the element: `lines[3].sku`, not `lines[].sku`
                    raise Rejected(rejected.kind, rejected.detail.replace(
                        placeholder, f"{name}[{show(at) if keyed else at}]", 1)) from None
            out[at] = item
        return out

    return check


def number_interval(f: FieldSpec, lo: float, hi: float, integral: bool) -> tuple[float, float] | None:
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
