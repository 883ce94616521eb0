"""Row plans of Avro and Protobuf writer schemas: `row_plan(...)` is `RecordValidator.check_fields` as a
tuple for the records of one writer schema, with the check of a field left out where the writer's type
guarantees it passes and Avro's timestamps converted directly. Equivalent to the contract's checks field
by field; the reader takes it for the values a compiled row (lakehouse.ingest.compiled_rows) does not read.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from lakehouse.core import errors
from lakehouse.core.spec import FieldSpec, PipelineSpec
from lakehouse.ingest.checks import EPOCH, ONE_MICROSECOND
from lakehouse.ingest.rejects import Rejected, quarantined

# a contract field's check: (name, required, check), as RecordValidator.fields holds them
FieldCheck = tuple[str, bool, Callable[[Any], Any]]


def row_plan(spec: PipelineSpec, fields: list[FieldCheck], quarantined: frozenset[str],
             writer) -> Callable[[dict], tuple] | None:
    """The row plan of writer schema `writer` (a schema_store.WriterSchema) for `spec`'s contract, whose fields'
    checks are `fields` and whose `quarantined` fields refuse every value: `check_fields` as a tuple, with
    the check of a field left out where the writer's type guarantees it passes (an int into a long, an
    unconstrained string from Avro, which decodes UTF-8 strictly, bytes, booleans) and timestamps
    converted directly. None when the writer schema does not translate (the reference then checks every
    field)."""
    try:
        written = {f.name: f for f in writer.fields(spec.source.envelope)}
    except errors.SchemaTranslationError:
        return None
    steps: list[tuple[str, bool, Callable[[Any], Any] | None]] = []  # convert None: the value as it is
    for f, (name, required, check) in zip(spec.contract.fields, fields, strict=True):
        w = written.get(name)
        convert: Callable[[Any], Any] | None = check
        if name in quarantined:
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
            return (v - EPOCH) // ONE_MICROSECOND
        return check(v)
    return convert


def _quarantined(name: str) -> Callable[[Any], Any]:
    def refuse(v: Any) -> Any:
        raise quarantined(name)
    return refuse

