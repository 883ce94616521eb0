"""The JSON fast path: `JsonFastPath.for_spec(spec).decode_row(key_text, value)` decodes, a few times
faster, the JSON values the reference (`RecordValidator.check`: JsonDecoder, then the contract's
checks) accepts, into the same row; for anything else it returns None, "ask the reference".
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from datetime import date, datetime
from typing import Annotated, Any, Literal

import msgspec

from lakehouse.core.spec import MAX_MATCHED_CHARS, FieldSpec, PipelineSpec, contract_pattern
from lakehouse.ingest.checks import (
    EPOCH,
    EPOCH_DATE,
    FLOAT32_MAX,
    INT32,
    INT64,
    MAX_TIMESTAMP_US,
    MIN_TIMESTAMP_US,
    ONE_MICROSECOND,
    number_interval,
)

# The reference decoder and msgspec both give up at Python's recursion limit (1000 by
# default), at depths that differ and depend on the caller's stack; values that could nest
# deeper than this go to the reference.
_MAX_FAST_NESTING = 100
_DOUBLE_MAX = sys.float_info.max


class _NotMirrored(Exception):
    """The contract has a rule the fast path does not reproduce exactly; use the reference."""


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
        interval = number_interval(f, *(INT32 if f.type == "int" else INT64), integral=True)
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
        interval = number_interval(f, -largest, largest, integral=False)
        if interval is None:
            return None
        return Annotated[float, msgspec.Meta(ge=interval[0], le=interval[1])]
    if f.type == "boolean":
        return bool
    if f.type in ("timestamp", "date"):
        return str
    raise _NotMirrored(f.type)  # pragma: no cover - spec validation rejects unknown types


def checked_type(f: FieldSpec) -> Any:
    """`_fast_type` of `f`, or Any where msgspec does not mirror the field's rules: the value as JSON gives it,
    for the reference's own check (lakehouse.ingest.change_fast_path)."""
    try:
        return _fast_type(f)
    except _NotMirrored:
        return Any


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


def reads_alike(max_bytes: int) -> Callable[[bytes], bool]:
    """Whether msgspec and the reference's json read a value of bytes alike (so that msgspec may decide
    for it), as far as the bytes show: at most `max_bytes` of them, valid UTF-8 everywhere (msgspec checks
    only the strings it keeps), nesting no deeper than _MAX_FAST_NESTING and no integer literal longer than
    Python's digit limit (json refuses it, msgspec reads it)."""
    digit_limit = sys.get_int_max_str_digits() or math.inf
    long_digit_run = re.compile(rb"(?<![0-9])[0-9]{%d}" % (digit_limit + 1)) if digit_limit < math.inf else None

    def alike(value: bytes) -> bool:
        size = len(value)
        if size > max_bytes:
            return False
        if not value.isascii():
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return False
        return size <= 2 * _MAX_FAST_NESTING or not (
            value.count(b"[") + value.count(b"{") > _MAX_FAST_NESTING
            or long_digit_run is not None and size > digit_limit and long_digit_run.search(value))

    return alike


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
    alike = reads_alike(max_bytes)
    small = min(max_bytes, 2 * _MAX_FAST_NESTING)  # short ASCII values read alike: no call for them

    def decode_row(key_text: str | None, value: bytes | None) -> tuple | None:
        """The row the reference would return for this record, or None to ask the reference."""
        if value is None:
            return None
        if (len(value) > small or not value.isascii()) and not alike(value):
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
                    micros = (moment - EPOCH) // ONE_MICROSECOND  # exact, like parse_timestamp
                    if not min_us <= micros <= max_us:
                        return None
                    row[i] = micros
            for i in dates:
                text = row[i]
                if text is not None:
                    row[i] = (date_fromisoformat(text) - EPOCH_DATE).days
        except Exception:  # noqa: BLE001 - not ISO-8601 (or worse): the reference says how
            return None
        return tuple(row)

    return decode_row


