"""The contract of a spec (`contract.fields`, or `contract.from: writer_schema`), checked field by field.

`read_contract` returns the contract's `Columns`: the valid fields, and which names were declared with a
mistake, so that `target.key`, `partition_by`, a fan-out field or `source.key.field` naming one of those
is not reported a second time as "not a contract field".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lakehouse.core import schemas as translate
from lakehouse.core.errors import PatternError, SchemaTranslationError
from lakehouse.core.naming import FIELD_NAME
from lakehouse.core.patterns import MAX_MATCHED_CHARS, contract_pattern
from lakehouse.core.spec_model import Contract, FieldSpec, SourceSpec
from lakehouse.core.spec_reader import INVALID, Reader, Refused, ok
from lakehouse.core.vocabulary import (
    CAPS,
    DATE_UNITS,
    ELEMENT_KEYS,
    FIELD_KEYS,
    FIELD_TYPES,
    FORMAT_SCHEMA_TYPES,
    INT64,
    MAX_CONTRACT_DEPTH,
    MAX_DECIMAL_PRECISION,
    RESERVED_COLUMNS,
    TIMESTAMP_UNITS,
)
from lakehouse.core.wording import did_you_mean, shown

_DECIMAL = re.compile(r"decimal\( *([0-9]{1,3}) *, *([0-9]{1,3}) *\)")


@dataclass
class Columns:
    """The contract's top-level fields as the rest of the spec refers to them: `names` every declared
    one, `contract` the valid ones, `broken` those declared with a mistake (reported already), and
    `complete` False when some field's name could not be read (or the contract not at all), so that a
    name not found might be that one."""

    contract: Contract | Refused
    names: tuple[str, ...] = ()
    broken: frozenset[str] = frozenset()
    complete: bool = True

    @classmethod
    def unknown(cls) -> Columns:
        return cls(INVALID, complete=False)

    def lookup(self, r: Reader, name: Any, where: str, prefix: str = "") -> FieldSpec | Refused:
        """The valid field `name`; records "not a contract field" (with the nearest name) when no field is
        declared so, and returns INVALID silently for a field declared with a mistake."""
        if name is INVALID or self.contract is INVALID:
            return INVALID
        if isinstance(name, str) and name in self.broken:
            return INVALID
        if name not in self.names:
            if not self.complete:
                return INVALID
            return r.problem(where, f"{prefix}{shown(name)} is not a contract field{did_you_mean(name, self.names)}")
        return self.contract.field(name)

    @property
    def timestamp_known(self) -> bool | None:
        """Whether the contract has a top-level timestamp field; None when that cannot be told (a field
        with a mistake might be it)."""
        if self.contract is not INVALID and any(f.type == "timestamp" for f in self.contract.fields):
            return True
        return False if self.complete and not self.broken and self.contract is not INVALID else None


# ------------------------------------------------------------------------------------------- contract

def read_contract(r: Reader, raw: dict | Refused, derived: tuple[FieldSpec, ...] | Refused | None) -> Columns:
    """The contract: the declared `fields`, or with `from: writer_schema` the `derived` fields."""
    if raw is INVALID:
        return Columns.unknown()
    if raw.get("from") is not None:
        if raw.get("fields") is not None:
            r.problem("contract.fields", "a contract derived from the writer schema declares no fields; "
                                         "remove `from` to declare them instead")
        if derived is None or derived is INVALID:
            return Columns.unknown()
        for path, _ in (p for top in derived for p in top.walk()):
            if path in RESERVED_COLUMNS:
                r.problem("contract.from", f"the writer schema's field {path!r} is reserved for source "
                                           f"coordinates; rename it in the schema")
        return Columns(Contract(derived, from_writer_schema=True), tuple(f.name for f in derived))
    items = r.required(raw, "fields", "contract")
    read = _fields(r, items, "contract.fields", top=True, depth=0)
    if read is INVALID:
        return Columns.unknown()
    valid = tuple(spec for name, spec in read if ok(name, spec))
    return Columns(Contract(valid), names=tuple(name for name, _ in read if ok(name)),
                   broken=frozenset(name for name, spec in read if ok(name) and not ok(spec)),
                   complete=all(ok(name) for name, _ in read))


def _fields(r: Reader, items: Any, where: str, top: bool, depth: int) -> list[tuple[Any, Any]] | Refused:
    """(name, FieldSpec) of each field of the list `items` at `where`, INVALID in place of what has a
    mistake; a field declared twice (or twice but for case) is reported and left out."""
    if items is INVALID:
        return INVALID
    if not isinstance(items, list) or not items:
        return r.problem(where, "must be a non-empty list of fields")
    fields: list[tuple[Any, Any]] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        item = r.mapping(item, f"{where}[{i}]", FIELD_KEYS)
        name = r.string(r.required(item, "name", f"{where}[{i}]"), f"{where}[{i}].name", FIELD_NAME,
                        "letters, digits and underscores, not starting with a digit, at most 128 characters")
        if item is INVALID or name is INVALID:
            fields.append((INVALID, INVALID))
            continue
        here = f"{where}[{name}]"
        line = r.document.line_of(f"{where}[{i}]")  # not by name: the first of two fields named alike
        if name.lower() in seen:
            r.problem(here, "is declared twice" if seen[name.lower()] == name
                      else f"differs from field {seen[name.lower()]!r} only in case, which Spark cannot tell apart",
                      line)
            continue
        if top and name in RESERVED_COLUMNS:
            r.problem(here, f"{name!r} is reserved for source coordinates", line)
            continue
        seen[name.lower()] = name
        fields.append((name, _field(r, item, here, name, depth)))
    return fields


def _nested_fields(r: Reader, items: Any, where: str, depth: int) -> tuple[FieldSpec, ...] | Refused:
    """The fields of a struct, INVALID when any has a mistake."""
    read = _fields(r, items, where, top=False, depth=depth)
    if read is INVALID or not all(ok(name, spec) for name, spec in read):
        return INVALID
    return tuple(spec for _, spec in read)


def _field_type(r: Reader, item: dict, where: str) -> tuple[Any, int | None, int | None]:
    """(type, precision, scale) of a field: one of FIELD_TYPES, a decimal with both."""
    type_text = r.string(r.required(item, "type", where), f"{where}.type")
    if type_text is INVALID:
        return INVALID, None, None
    decimal = _DECIMAL.fullmatch(type_text)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if not 1 <= precision <= MAX_DECIMAL_PRECISION or scale > precision:
            why = (f"decimal({precision},{scale}) needs a precision from 1 to {MAX_DECIMAL_PRECISION} and a scale "
                   f"from 0 to the precision")
            return r.problem(f"{where}.type", why), None, None
        return "decimal", precision, scale
    if type_text == "decimal":
        return r.problem(f"{where}.type", "a decimal needs its precision and scale, e.g. decimal(12,2)"), None, None
    return r.choice(type_text, f"{where}.type", FIELD_TYPES), None, None


def _field(r: Reader, item: dict, where: str, name: str, depth: int) -> FieldSpec | Refused:
    """One field (or a list's element, a map's value) of the contract, checked; INVALID when it has a
    mistake (every mistake of it recorded)."""
    if depth >= MAX_CONTRACT_DEPTH:
        return r.problem(where, f"nests deeper than {MAX_CONTRACT_DEPTH} levels")
    mark = r.mark()
    ftype, precision, scale = _field_type(r, item, where)
    required = r.boolean(item.get("required", False), f"{where}.required")
    doc = r.text(item.get("doc"), f"{where}.doc")
    if ftype is INVALID:  # what else a field may hold depends on its type
        return INVALID
    type_text = item["type"]
    for key, owner in (("fields", "struct"), ("items", "list"), ("values", "map")):
        if item.get(key) is not None and ftype != owner:
            r.problem(f"{where}.{key}", f"only a {owner} has {key}, not a {type_text}")
    nested: dict[str, Any] = {}
    if ftype == "struct":
        nested["fields"] = _nested_fields(r, r.required(item, "fields", where), f"{where}.fields", depth + 1)
    for key, child in (("items", "element"), ("values", "value")):
        if ftype == {"items": "list", "values": "map"}[key]:
            raw = r.mapping(r.required(item, key, where), f"{where}.{key}", ELEMENT_KEYS)
            nested[key] = INVALID if raw is INVALID else _field(r, raw, f"{where}.{key}", child, depth + 1)
    enum = _enum(r, item.get("enum"), f"{where}.enum", ftype)
    lo, hi = item.get("min"), item.get("max")
    for key, bound in (("min", lo), ("max", hi)):
        if bound is not None and ftype not in ("int", "long", "float", "double", "decimal"):
            r.problem(f"{where}.{key}", f"ranges apply to numeric fields, not {ftype}")
            lo, hi = (INVALID, hi) if key == "min" else (lo, INVALID)
    lo = None if lo is None else r.number(lo, f"{where}.min")
    hi = None if hi is None else r.number(hi, f"{where}.max")
    if ok(lo, hi) and lo is not None and hi is not None and lo > hi:
        r.problem(f"{where}.min", f"{lo} is greater than max {hi}")
    pattern = item.get("pattern")
    if pattern is not None:
        if ftype != "string":
            r.problem(f"{where}.pattern", f"patterns apply to string fields, not {ftype}")
        elif r.string(pattern, f"{where}.pattern") is not INVALID:
            try:
                contract_pattern(pattern)
            except PatternError as exc:
                r.problem(f"{where}.pattern", str(exc))
    max_length = item.get("max_length")
    if max_length is not None:
        if ftype != "string":
            r.problem(f"{where}.max_length", f"applies to string fields, not {ftype}")
        else:
            max_length = r.integer(max_length, f"{where}.max_length", 1, CAPS["source.max_value_bytes"])
            if ok(max_length) and pattern is not None and max_length > MAX_MATCHED_CHARS:
                r.problem(f"{where}.max_length", f"a field with a pattern holds at most {MAX_MATCHED_CHARS} "
                                                 f"characters (longer values are refused before matching); lower "
                                                 f"max_length or drop the pattern")
    unit = item.get("unit")
    if unit is not None:
        units = {"timestamp": TIMESTAMP_UNITS, "date": DATE_UNITS}.get(ftype)
        if units is None:
            r.problem(f"{where}.unit", f"applies to timestamp and date fields, not {ftype}")
        else:
            unit = r.choice(unit, f"{where}.unit", units)
    if r.failed_since(mark):
        return INVALID
    return FieldSpec(name=name, type=ftype, required=required, enum=enum, min=lo, max=hi, pattern=pattern,
                     max_length=max_length, doc=doc, precision=precision, scale=scale, unit=unit, **nested)


def _enum(r: Reader, enum: Any, where: str, ftype: str) -> tuple | None | Refused:
    """The allowed values of a string, int or long field, each of the field's type."""
    if enum is None:
        return None
    if not isinstance(enum, list) or not enum:
        return r.problem(where, "must be a non-empty list")
    if ftype not in ("string", "int", "long"):
        return r.problem(where, f"is only allowed for string, int and long fields, not {ftype}")
    mark = r.mark()
    for value in enum:
        if ftype == "string":
            fits = isinstance(value, str)
        else:
            fits = isinstance(value, int) and not isinstance(value, bool) and INT64[0] <= value <= INT64[1]
        if not fits:
            r.problem(where, f"{shown(value)} is not a {ftype}")
    return INVALID if r.failed_since(mark) else tuple(enum)


def derive_contract(r: Reader, name: Any, source: SourceSpec) -> tuple[FieldSpec, ...] | Refused:
    """`contract.from: writer_schema`: the fields that fit every value writer schema of `source.schemas`
    (lakehouse.core.schemas.derive, merged oldest id first), checked as declared fields are."""
    value_format, key_format, envelope, schemas = (source.value_format, source.key_format, source.envelope,
                                                   source.schemas)
    if not ok(value_format, key_format, envelope, schemas):
        return INVALID
    schema_type = FORMAT_SCHEMA_TYPES.get(value_format)
    if schema_type is None:
        return r.problem("contract.from", f"value_format {value_format!r} carries no writer schema; declare "
                                          f"contract.fields instead")
    if not schemas:
        return r.problem("contract.from", "a contract derived from the writer schema needs the writer schemas "
                                          "beside the spec: set source.schemas to a folder of <schema id>.avsc, "
                                          ".proto or .json files (`lakehouse schemas --pipeline "
                                          f"{name if ok(name) else '<name>'} --pull` fills it from the schema "
                                          "registry)")
    if envelope is None and FORMAT_SCHEMA_TYPES.get(key_format) == schema_type:
        return r.problem("contract.from", f"the keys and values are both {schema_type} records, so the folder's "
                                          f"schemas cannot be told apart; declare contract.fields instead")
    fields: tuple[FieldSpec, ...] | None = None
    for schema_id, found_type, text in schemas:
        if found_type != schema_type:
            continue
        try:
            record = translate.record_type(schema_type, text)
            if envelope is not None and not translate.is_change_event(record):
                continue  # the change stream's key schema
            fields = translate.follow(fields, translate.derive(schema_type, text, envelope))
        except SchemaTranslationError as exc:
            return r.problem("contract.from", f"writer schema {schema_id}: {exc}")
    if fields is None:
        return r.problem("contract.from", f"source.schemas holds no {schema_type} "
                                          f"{'change event ' if envelope else ''}schema to derive the contract from")
    mark = r.mark()
    for top in fields:
        for path, f in top.walk():
            if not FIELD_NAME.fullmatch(f.name):
                r.problem("contract.from", f"the writer schema's field {path[:200]!r} is not a column name "
                                           f"(letters, digits and underscores); rename it in the schema")
        _check_case(r, top)
    _check_case(r, FieldSpec("", "struct", fields=fields))
    return INVALID if r.failed_since(mark) else fields


def _check_case(r: Reader, f: FieldSpec) -> None:
    """Record each struct of derived field `f` that has fields differing only in case."""
    for path, spec in f.walk():
        if spec.type == "struct":
            lowered = [c.name.lower() for c in spec.fields]
            if len(set(lowered)) < len(lowered):
                r.problem("contract.from", f"the writer schema's record {path or '(top)'} has fields that differ "
                                           f"only in case, which Spark cannot tell apart")
