"""Compiled rows: RecordValidator.check_row's fast path for Avro and Protobuf values.

Per admitted writer schema, one function is generated from the writer schema and the contract: it reads a
value (header included) straight into the contract row, a tuple in contract order with the values `check`
gives, or returns None when it cannot vouch for the verdict: the record is rejected, or unusual in a way the
reference might read differently (a varint past 63 bits, a negative length, a union or enum index out of range,
a timestamp or date outside the contract's range, bytes missing or left over). None means "ask the reference",
never "rejected". Straight-line generated code: per field, a function call would cost more than reading the
field (tests/unit/ingest/test_compiled_rows.py holds it to the reference's verdicts).

The row reads the writer's fields as fastavro and the Protobuf reader (lakehouse.ingest.proto_values) give them
(every Avro field, in the contract or not, since the reference rejects a record any of whose fields does not
decode; the Protobuf fields whose reading can reject: well-known types, messages that hold them) and checks each
contract field inline where the writer's type lets a comparison stand in for the contract's check (a range, an
enum, a length), with the contract's own check otherwise. Timestamps and dates go to epoch microseconds and days
without the datetime in between.

`avro_row` and `proto_row` give a writer schema's row with the bytes its values start with, or None when its
values take the reference path only (the wire-format decoders' `compile_row`, lakehouse.ingest.wire_decoders).
For a change stream, `avro_change` reads a Debezium envelope straight into (op, the `after` row's contract values,
the `_cdc` value) and `avro_record` a key into the dict fastavro gives (RecordValidator.check_change). What the
change is not read from (`before`, most of `source`, `transaction`) is skipped, not unread: its strings are still
decoded, its enum indexes and logical values still checked (the reference's fastavro refuses them), and runs of
numbers are passed with one regular expression, as a change event holds three times the values an append does.
"""

from __future__ import annotations

import logging
import re
import struct
import sys
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

from lakehouse.core import schemas
from lakehouse.core.errors import SchemaTranslationError
from lakehouse.core.spec import MAX_MATCHED_CHARS, FieldSpec, contract_pattern
from lakehouse.ingest.change_events import SOURCE_FIELDS, epoch_ms_to_us, source_position
from lakehouse.ingest.checks import (
    FLOAT32_MAX,
    INT32,
    INT64,
    MAX_TIMESTAMP_US,
    MIN_TIMESTAMP_US,
    lone_surrogate,
    number_interval,
)
from lakehouse.ingest.proto_values import proto_date, proto_field, proto_timestamp
from lakehouse.ingest.schema_store import WriterSchema
from lakehouse.ingest.wire import HEADER, MAGIC

log = logging.getLogger("lakehouse.ingest.compiled_rows")


class RowContract:
    """What a compiled row checks, from a RecordValidator: the contract `fields`, their reference checks
    (in contract order), the `quarantined` field names, the key field's position in the contract,
    `key_of`, which turns a key's text into what the key field must equal (None: the text itself), and
    the largest value (`source.max_value_bytes`)."""

    def __init__(self, fields: tuple[FieldSpec, ...], checks: tuple[Callable[[Any], Any], ...],
                 quarantined: frozenset[str], key_index: int | None, key_of: Callable[[str], Any] | None,
                 max_bytes: int):
        self.fields, self.checks, self.quarantined = fields, checks, quarantined
        self.key_index, self.key_of, self.max_bytes = key_index, key_of, max_bytes


class _Unsupported(Exception):
    """A writer schema the compiled rows do not read; its records take the reference path."""


class _Source:
    """The text of one generated row function and the constants it refers to."""

    def __init__(self):
        self.lines: list[str] = []
        self.names: dict[str, Any] = {}

    def add(self, depth: int, *lines: str) -> None:
        self.lines.extend("    " * depth + line for line in lines)

    def const(self, value: Any) -> str:
        name = f"_k{len(self.names)}"
        self.names[name] = value
        return name

    def function(self, name: str) -> Callable:
        namespace = dict(self.names)
        exec(compile("\n".join(self.lines), f"<{name}>", "exec"), namespace)  # our own text, never a record's
        row: Callable = namespace["row"]
        return row


_MIN_DAYS = (date.min - date(1970, 1, 1)).days
_MAX_DAYS = (date.max - date(1970, 1, 1)).days


def _convert(src: _Source, depth: int, var: str, f: FieldSpec, check: str, kind: str | None) -> int:
    """Code turning `var`, a non-null value of writer kind `kind`, into contract field `f`'s value, or returning
    None where the reference would reject it. Kinds: text (a str of valid Unicode), proto_text (what a
    Protobuf string field gives), integer, real (a float), boolean, bytes, micros and days (a timestamp or
    date already in the contract's form, inside its range); None: anything else, for the field's own check.
    The number of lines added."""
    before = len(src.lines)
    conditions = []
    if f.type == "string" and kind in ("text", "proto_text"):
        if kind == "proto_text":
            conditions.append(f"type({var}) is str and ({var}.isascii() or {src.const(lone_surrogate)}({var}) is None)")
        if f.enum is not None:
            conditions.append(f"{var} in {src.const(frozenset(f.enum))}")
        if f.max_length is not None:
            conditions.append(f"len({var}) <= {f.max_length!r}")
        if f.pattern:  # the field's check's pattern (RE2), up to MAX_MATCHED_CHARS; once per value: up to 1024
            # short values that passed (currency codes) are kept
            known = src.const(set())
            conditions += [f"len({var}) <= {MAX_MATCHED_CHARS}", f"{src.const(contract_pattern(f.pattern))}({var})"]
            src.add(depth, f"if {var} not in {known}:", f"    if not ({' and '.join(conditions)}):",
                    "        return None", f"    if len({known}) < 1024 and len({var}) <= 64:",
                    f"        {known}.add({var})")
            return len(src.lines) - before
    elif f.type in ("int", "long") and kind == "integer":
        interval = number_interval(f, *(INT32 if f.type == "int" else INT64), integral=True)
        if interval is None:
            src.add(depth, "return None")
            return len(src.lines) - before
        conditions.append(f"{interval[0]!r} <= {var} <= {interval[1]!r}")
        if f.enum is not None:
            conditions.append(f"{var} in {src.const(frozenset(f.enum))}")
    elif f.type in ("double", "float") and kind == "real":
        limit = FLOAT32_MAX if f.type == "float" else sys.float_info.max
        interval = number_interval(f, -limit, limit, integral=False)
        if interval is None:
            src.add(depth, "return None")
            return len(src.lines) - before
        conditions.append(f"{src.const(interval[0])} <= {var} <= {src.const(interval[1])}")
    elif (f.type, kind) in (("boolean", "boolean"), ("binary", "bytes"), ("timestamp", "micros"), ("date", "days")):
        pass
    else:
        src.add(depth, f"{var} = {check}({var})")
    if conditions:
        src.add(depth, f"if not ({' and '.join(conditions)}):", "    return None")
    return len(src.lines) - before


def _compile_row(src: _Source, contract: RowContract, read: Callable[[_Source, int], None],
                 fields: dict[str, tuple[str, str | None, bool]]) -> None:
    """The row function's text around `read` (which reads the writer's value into variables): each contract
    field from `fields` (its name -> variable, writer kind, whether it may be null), checked, the key
    compared with its field, the tuple returned. Any exception (a Rejected of a check, a decoding error)
    makes it None."""
    src.add(0, "def row(key_text, value):", "    try:", f"        if len(value) > {contract.max_bytes!r}:",
            "            return None")
    read(src, 2)
    values = _contract_values(src, 2, contract, fields)
    if contract.key_index is not None:
        var, kind, _ = fields.get(contract.fields[contract.key_index].name, ("None", None, True))
        expected = "key_text" if contract.key_of is None else f"{src.const(contract.key_of)}(key_text)"
        got = var if kind == "text" else f"str({var})"  # a str is its own str()
        src.add(2, "if key_text is not None:", f"    if {expected} != {got}:", "        return None")
    src.add(2, f"return ({''.join(v + ', ' for v in values)})")
    src.add(1, "except Exception:", "    return None")


def _contract_values(src: _Source, depth: int, contract: RowContract,
                     fields: dict[str, tuple[str, str | None, bool]]) -> list[str]:
    """Code checking each contract field read into `fields` (its name -> variable, writer kind, whether it may be
    null) and turning it into its contract value, returning None where the reference would reject it; the
    expressions of the row's values, in contract order."""
    values = []
    for j, (f, check) in enumerate(zip(contract.fields, contract.checks, strict=True)):
        if f.name not in fields:
            if f.required:
                raise _Unsupported(f"{f.name} is required and the writer schema lacks it")
            values.append("None")
            continue
        var, kind, nullable = fields[f.name]
        if f.name in contract.quarantined:
            src.add(depth, f"if {var} is not None:", "    return None")
            values.append("None")
            continue
        out = var
        if j == contract.key_index:  # the key compares the value as written
            out = f"c{j}"
            src.add(depth, f"{out} = {var}")
        values.append(out)
        if nullable and f.required:
            src.add(depth, f"if {out} is None:", "    return None")
        elif nullable:
            src.add(depth, f"if {out} is not None:")
            if _convert(src, depth + 1, out, f, src.const(check), kind) == 0:
                src.lines.pop()  # nothing to check: no `if`
            continue
        _convert(src, depth, out, f, src.const(check), kind)
    return values


# ---- Avro

_AVRO_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_AVRO_MICROS = {"long-timestamp-micros": 1, "long-local-timestamp-micros": 1, "long-timestamp-millis": 1000,
                "long-local-timestamp-millis": 1000}


def _avro_branches(node: Any, named: dict) -> list[dict]:
    """The alternatives of Avro type `node` of a parsed schema, each a dict with a primitive, enum or fixed
    `type`: one for a plain type, one per member of a union. _Unsupported for records, arrays, maps."""
    members = node if isinstance(node, list) else [node]
    found = []
    for member in members:
        if isinstance(member, str):
            member = {"type": member} if member in _AVRO_PRIMITIVES else named.get(member)
        if not isinstance(member, dict) or not (member.get("type") in _AVRO_PRIMITIVES or (
                member.get("type") == "enum" and isinstance(member.get("symbols"), list))
                or (member.get("type") == "fixed" and type(member.get("size")) is int and member["size"] >= 0)):
            raise _Unsupported(f"Avro type {str(member)[:80]}")
        found.append(member)
    return found


def _avro_logical(node: dict) -> str | None:
    """fastavro's name of the logical type it converts `node`'s values with (e.g. long-timestamp-micros)."""
    from fastavro.logical_readers import LOGICAL_READERS

    logical = f"{node['type']}-{node.get('logicalType')}"
    return logical if node.get("logicalType") is not None and logical in LOGICAL_READERS else None


def _avro_kind(node: dict, logical: str | None, shortcut: bool) -> str | None:
    if logical is not None:
        if shortcut:
            return "days" if logical == "int-date" else "micros"
        return None
    kind = node["type"]
    if kind == "enum":
        return "text" if all(type(s) is str and s.isascii() for s in node["symbols"]) else None
    return {"string": "text", "int": "integer", "long": "integer", "float": "real", "double": "real",
            "boolean": "boolean", "bytes": "bytes", "fixed": "bytes"}.get(kind)


def _avro_varint(src: _Source, depth: int, var: str, zigzag: bool = True) -> None:
    """Code reading the varint at `at` into `var` (zig-zag decoded unless not `zigzag`), unrolled: at most 9
    bytes (63 bits); a longer one is left to the reference (fastavro's 64-bit arithmetic wraps past 64 bits)."""
    src.add(depth, f"{var} = value[at]", f"if {var} < 128:", "    at += 1", "else:")
    for length in range(2, 10):
        depth += 1
        src.add(depth, f"byte = value[at + {length - 1}]", f"{var} {'=' if length == 2 else '|='} "
                f"{'(' + var + ' & 127) | ' if length == 2 else ''}(byte & 127) << {7 * (length - 1)}",
                "if byte < 128:", f"    at += {length}", "else:")
    src.add(depth + 1, "return None")
    if zigzag:
        src.add(depth - 8, f"{var} = ({var} >> 1) ^ -({var} & 1)")


def _avro_length(src: _Source, depth: int) -> None:
    """Code reading a length at `at` into `stop`, where the bytes end; a negative one (odd before the
    zig-zag) is left to the reference. A `stop` past the end makes the row's last check fail."""
    _avro_varint(src, depth, "n", zigzag=False)
    src.add(depth, "if n & 1:", "    return None", "stop = at + (n >> 1)")


def _avro_read(src: _Source, depth: int, node: dict, var: str, shortcut: bool) -> None:
    """Code reading one value of `node` (no union) at `at` into `var` as fastavro gives it; with `shortcut`,
    a timestamp or date logical type as epoch microseconds or days inside the contract's range."""
    kind = node["type"]
    if kind == "null":
        src.add(depth, f"{var} = None")
    elif kind == "boolean":
        src.add(depth, f"{var} = value[at] != 0", "at += 1")  # fastavro: any byte but 0 is true
    elif kind in ("int", "long"):
        _avro_varint(src, depth, var)
    elif kind in ("float", "double"):
        unpack = src.const(struct.Struct("<f" if kind == "float" else "<d").unpack_from)
        src.add(depth, f"{var} = {unpack}(value, at)[0]", f"at += {4 if kind == 'float' else 8}")
    elif kind in ("bytes", "string"):
        _avro_length(src, depth)
        src.add(depth, f"{var} = value[at:stop]{'.decode()' if kind == 'string' else ''}", "at = stop")
    elif kind == "enum":
        _avro_varint(src, depth, var)
        symbols = node["symbols"]
        src.add(depth, f"if not 0 <= {var} < {len(symbols)}:", "    return None",
                f"{var} = {src.const(tuple(symbols))}[{var}]")
    else:  # fixed
        src.add(depth, f"stop = at + {node['size']}", f"{var} = value[at:stop]", "at = stop")
    logical = _avro_logical(node)
    if logical is None:
        return
    if not shortcut:
        from fastavro.logical_readers import LOGICAL_READERS

        src.add(depth, f"{var} = {src.const(LOGICAL_READERS[logical])}({var}, {src.const(node)}, None)")
    elif logical == "int-date":  # fastavro: date.fromordinal, which holds years 1 to 9999
        src.add(depth, f"if not {_MIN_DAYS} <= {var} <= {_MAX_DAYS}:", "    return None")
    else:  # fastavro: the epoch plus a timedelta, inside datetime's range (the contract's)
        if _AVRO_MICROS[logical] != 1:
            src.add(depth, f"{var} *= {_AVRO_MICROS[logical]}")
        src.add(depth, f"if not {MIN_TIMESTAMP_US} <= {var} <= {MAX_TIMESTAMP_US}:", "    return None")


def _avro_union(src: _Source, depth: int, branches: list, index: str, read: Callable[[int, Any], None]) -> None:
    """Code reading a union's branch index into `index`, then its branch: `read(depth, branch)` under an `if` per
    branch; an index out of range returns None."""
    _avro_varint(src, depth, index)
    for i, branch in enumerate(branches):
        src.add(depth, f"{'if' if i == 0 else 'elif'} {index} == {i}:")
        read(depth + 1, branch)
    src.add(depth, "else:", "    return None")


def _avro_row(writer: WriterSchema, contract: RowContract) -> Callable[[str | None, bytes], tuple | None]:
    """The compiled row of Avro writer schema `writer` (see above); _Unsupported for a writer schema with
    records, arrays or maps, which the reference reads."""
    schema = writer.parsed
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        raise _Unsupported("not a record schema")
    named = schema.get("__named_schemas") or {}
    written = [(f["name"], _avro_branches(f["type"], named)) for f in schema["fields"]]
    if len({name for name, _ in written}) != len(written):
        raise _Unsupported("a field name twice")
    wanted = {f.name: f for f in contract.fields}
    key_name = None if contract.key_index is None else contract.fields[contract.key_index].name
    src = _Source()
    fields: dict[str, tuple[str, str | None, bool]] = {}
    plan = []
    for i, (name, branches) in enumerate(written):
        f = wanted.get(name)
        logicals = [_avro_logical(b) for b in branches]
        values = [(b, logical) for b, logical in zip(branches, logicals, strict=True) if b["type"] != "null"]
        # timestamps and dates straight to the contract's numbers, unless the key compares their text
        shortcut = f is not None and name != key_name and bool(values) and all(
            (f.type == "timestamp" and logical in _AVRO_MICROS) or (f.type == "date" and logical == "int-date")
            for _, logical in values)
        plan.append((f"w{i}", branches, shortcut, isinstance(schema["fields"][i]["type"], list)))
        if f is not None:
            kinds = {_avro_kind(b, logical, shortcut) for b, logical in values}
            fields[name] = (f"w{i}", kinds.pop() if len(kinds) == 1 else None, len(values) < len(branches))

    def read(src: _Source, depth: int) -> None:
        src.add(depth, "at = 5")
        for var, branches, shortcut, is_union in plan:
            if not is_union:
                _avro_read(src, depth, branches[0], var, shortcut)
                continue
            def branch(at: int, member: dict, var: str = var, shortcut: bool = shortcut) -> None:
                _avro_read(src, at, member, var, shortcut)

            _avro_union(src, depth, branches, "u", branch)
        src.add(depth, "if at != len(value):", "    return None")

    _compile_row(src, contract, read, fields)
    return src.function(f"avro row of writer schema {writer.schema_id}")


# ---- Avro change events (Debezium's envelope)

def _avro_node(node: Any, named: dict) -> Any:
    """Avro type `node` of a parsed schema with a name resolved: a dict, or a list for a union."""
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return {"type": node}
        if node not in named:
            raise _Unsupported(f"Avro type {node[:80]}")
        return named[node]
    return node


def _avro_any(src: _Source, depth: int, node: Any, var: str, named: dict,
              records: tuple[str, ...] = (), keep: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Code reading one value of `node` at `at` as fastavro reads it (logical types converted), into `var`: a
    primitive, enum or fixed as its value; a record as 1, its fields into `{var}_{j}` (the field names -> their
    variables are returned; with `keep`, only the fields it keeps: the others are skipped, `_avro_skip`); a
    union's null branch as None. _Unsupported for arrays, maps, a union of two records and a record inside
    itself."""
    node = _avro_node(node, named)
    if isinstance(node, list):
        fields: dict[str, str] = {}

        def branch(at: int, member: Any) -> None:
            nonlocal fields
            found = _avro_any(src, at, member, var, named, records, keep)
            if found and fields:
                raise _Unsupported("a union of two records")
            fields = fields or found

        _avro_union(src, depth, node, f"u_{var}", branch)
        return fields
    if not isinstance(node, dict):
        raise _Unsupported(f"Avro type {str(node)[:80]}")
    if node.get("type") == "record" and isinstance(node.get("fields"), list):
        name = str(node.get("name"))
        if name in records:
            raise _Unsupported(f"record {name} inside itself")
        kept = _avro_fields(src, depth, node["fields"], var, named, (*records, name),
                            lambda field: keep is None or keep(field), {})
        src.add(depth, f"{var} = 1")
        return {name: variable for name, (variable, _) in kept.items()}
    _avro_branches(node, named)  # a primitive, enum or fixed, else _Unsupported
    _avro_read(src, depth, node, var, False)
    return {}


def _avro_fields(src: _Source, depth: int, fields: list[dict], var: str, named: dict, records: tuple[str, ...],
                 wanted: Callable[[str], bool], keeps: Mapping[str, Callable[[str], bool]],
                 ) -> dict[str, tuple[str, dict[str, str]]]:
    """Code reading a record's `fields` one after another: those `wanted` keeps into `{var}_{j}` (`_avro_any`,
    with `keeps`' filter of their own fields where it names them), the others skipped (`_avro_skip`, the ones
    between two kept fields at once). The kept fields' names -> their variables and, for a record, its fields'."""
    found: dict[str, tuple[str, dict[str, str]]] = {}
    skipped: list[Any] = []
    for j, f in enumerate(fields):
        if not wanted(f["name"]):
            skipped.append(f["type"])
            continue
        _avro_skip(src, depth, skipped, named, records)
        skipped = []
        found[f["name"]] = (f"{var}_{j}", _avro_any(src, depth, f["type"], f"{var}_{j}", named, records,
                                                      keeps.get(f["name"])))
    _avro_skip(src, depth, skipped, named, records)
    return found


# a varint as the compiled rows read one: at most 9 bytes (_avro_varint)
_AVRO_VARINT = rb"[\x80-\xff]{0,8}[\x00-\x7f]"
_AVRO_PATTERNS = {"null": b"", "boolean": b".", "int": _AVRO_VARINT, "long": _AVRO_VARINT, "float": b".{4}",
                  "double": b".{8}"}


def _avro_flat(nodes: list[Any], named: dict, records: tuple[str, ...]) -> list[Any]:
    """`nodes` (Avro types, one after another) with each record replaced by its fields' types, at any depth."""
    flat: list[Any] = []
    for node in nodes:
        node = _avro_node(node, named)
        if isinstance(node, dict) and node.get("type") == "record" and isinstance(node.get("fields"), list):
            name = str(node.get("name"))
            if name in records:
                raise _Unsupported(f"record {name} inside itself")
            flat.extend(_avro_flat([f["type"] for f in node["fields"]], named, (*records, name)))
        else:
            flat.append(node)
    return flat


def _avro_pattern(node: Any, named: dict, records: tuple[str, ...]) -> bytes | None:
    """A regular expression (DOTALL) matching exactly the encodings of `node` that the compiled rows read without
    a check that can fail (nulls, booleans, numbers, fixed, records and unions of them, no logical type); None
    for a node whose reading decides more (strings, bytes, enums, logical types, a union past 63 branches)."""
    flat = _avro_flat([node], named, records)
    parts = []
    for node in flat:
        if isinstance(node, list):
            branches = [_avro_pattern(branch, named, records) for branch in node]
            known = [b for b in branches if b is not None]
            if len(branches) > 64 or len(known) < len(branches):
                return None
            parts.append(b"(?:" + b"|".join(re.escape(bytes([2 * i])) + b for i, b in enumerate(known)) + b")")
        elif isinstance(node, dict) and _avro_logical(node) is None and node.get("type") in _AVRO_PATTERNS:
            parts.append(_AVRO_PATTERNS[node["type"]])
        elif isinstance(node, dict) and node.get("type") == "fixed" and _avro_logical(node) is None:
            _avro_branches(node, named)
            parts.append(b".{%d}" % node["size"])
        else:
            return None
    return b"".join(parts)


def _avro_skip(src: _Source, depth: int, nodes: list[Any], named: dict, records: tuple[str, ...]) -> None:
    """Code reading values of `nodes`, one after another, that nothing uses: past them, returning None where
    fastavro would refuse one (a string not UTF-8, an enum index out of range, a logical value it cannot convert)
    or could read it otherwise, as `_avro_any`, without keeping a value. Runs of nodes `_avro_pattern` matches
    are passed with one regular expression (a varint unrolled costs a microsecond where it is long)."""
    pending: list[bytes] = []

    def flush() -> None:
        if any(pending):
            match = src.const(re.compile(b"".join(pending), re.DOTALL).match)
            src.add(depth, f"skipped = {match}(value, at)", "if skipped is None:", "    return None",
                    "at = skipped.end()")
        pending.clear()

    for node in _avro_flat(nodes, named, records):
        pattern = _avro_pattern(node, named, records)
        if pattern is not None:
            pending.append(pattern)
            continue
        flush()
        if isinstance(node, list):
            def branch(at: int, member: Any) -> None:
                before = len(src.lines)
                _avro_skip(src, at, [member], named, records)
                if len(src.lines) == before:
                    src.add(at, "pass")

            _avro_union(src, depth, node, "u_skip", branch)
        elif _avro_logical(node) is None and node.get("type") in ("string", "bytes"):
            _avro_length(src, depth)
            src.add(depth, *(["value[at:stop].decode()"] if node["type"] == "string" else []), "at = stop")
        else:  # an enum, a logical type: read as `_avro_any` does
            _avro_branches(node, named)
            _avro_read(src, depth, node, "skipped", False)
    flush()


def _avro_record_of(node: Any, named: dict) -> dict | None:
    """The record `node` is, or the one record of a union of it and null; None for anything else."""
    branches = [_avro_node(b, named) for b in (node if isinstance(node, list) else [node])]
    records = [b for b in branches if isinstance(b, dict) and b.get("type") == "record"]
    others = [b for b in branches if b not in records and not (isinstance(b, dict) and b.get("type") == "null")]
    return records[0] if len(records) == 1 and not others else None


def _avro_record(writer: WriterSchema) -> Callable[[bytes], dict | None]:
    """The compiled record of Avro writer schema `writer`, a record of plain values (a change event's key): the
    dict fastavro reads from a value (header included), or None where it would not read one."""
    schema = writer.parsed
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        raise _Unsupported("not a record schema")
    named = schema.get("__named_schemas") or {}
    names = [f["name"] for f in schema["fields"]]
    if len(set(names)) != len(names) or set(names) == {"schema", "payload"}:  # the reference would unwrap those
        raise _Unsupported("a field name twice, or Kafka Connect's schemas")
    for f in schema["fields"]:
        _avro_branches(f["type"], named)  # plain values only
    src = _Source()
    src.add(0, "def row(value):", "    try:", "        at = 5")
    fields = _avro_any(src, 2, schema, "k", named)
    src.add(2, "if at != len(value):", "    return None",
            "return {" + ", ".join(f"{name!r}: {fields[name]}" for name in names) + "}")
    src.add(1, "except Exception:", "    return None")
    return src.function(f"avro record of writer schema {writer.schema_id}")


def _avro_change(writer: WriterSchema, contract: RowContract) -> Callable[[bytes], tuple | None]:
    """The compiled change of Avro writer schema `writer`, a Debezium envelope: (op, the contract values of its
    `after` or None for a delete, its `_cdc` value) as RecordValidator.check_change reads a value of it, or None
    where that would reject it or could read it otherwise. _Unsupported for an envelope it does not read."""
    schema = writer.parsed
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        raise _Unsupported("not a record schema")
    named = schema.get("__named_schemas") or {}
    types = {f["name"]: f["type"] for f in schema["fields"]}
    if len(types) != len(schema["fields"]) or "op" not in types or "after" not in types:
        raise _Unsupported("no envelope: a field name twice, or no op or after")
    wrapper = {"schema", "payload"}  # Kafka Connect's JSON with schemas, which the reference unwraps
    value = _avro_record_of(types["after"], named)
    source = _avro_record_of(types["source"], named) if "source" in types else None
    if set(types) == wrapper or value is None or {f["name"] for f in value["fields"]} == wrapper \
            or ("source" in types and source is None):
        raise _Unsupported("not an envelope the compiled change reads")
    # what the `_cdc` value reads must be plain values (a record would read as 1 here, a dict there)
    plain = [types["op"], *([types["ts_ms"]] if "ts_ms" in types else []),
             *[f["type"] for f in (source or {}).get("fields", []) if f["name"] in SOURCE_FIELDS]]
    for node in plain:
        _avro_branches(node, named)
    src = _Source()
    src.add(0, "def row(value):", "    try:", f"        if len(value) > {contract.max_bytes!r}:",
            "            return None", "        at = 5")
    # what the change is read from: the op, the `after` row's contract fields, the source's position fields and
    # the event's ts_ms where the source's may be missing; the rest (`before`, `transaction`, ...) is skipped
    wanted = {"op", "after", "source"}
    if source is None or isinstance(_avro_node(types["source"], named), list) \
            or "ts_ms" not in {f["name"] for f in source["fields"]}:
        wanted.add("ts_ms")
    keeps = {"after": {f.name for f in contract.fields}.__contains__, "source": SOURCE_FIELDS.__contains__}
    read = _avro_fields(src, 2, schema["fields"], "e", named, (), wanted.__contains__, keeps)
    envelope = {name: variable for name, (variable, _) in read.items()}
    found = {name: fields for name, (_, fields) in read.items()}
    src.add(2, "if at != len(value):", "    return None", f"op = {envelope['op']}")
    # the `_cdc` value: the source's commit time (else the event's) and its position in the source's log
    event_ts = envelope.get("ts_ms", "None")
    if source is None:
        src.add(2, f"meta = {{'op': op, 'source_ts': {src.const(epoch_ms_to_us)}({event_ts}), 'position': None}}")
    else:
        kept = found["source"]
        given = "{" + ", ".join(f"{name!r}: {kept[name]}" for name in SOURCE_FIELDS if name in kept) + "}"
        src.add(2, f"if {envelope['source']} is None:",
                f"    meta = {{'op': op, 'source_ts': {src.const(epoch_ms_to_us)}({event_ts}), 'position': None}}",
                "else:",
                f"    meta = {{'op': op, 'source_ts': {src.const(epoch_ms_to_us)}({kept.get('ts_ms', event_ts)}), "
                f"'position': {src.const(source_position)}({given})}}")
    src.add(2, "if op == 'd':", "    return (op, None, meta)",
            "if not (op == 'c' or op == 'r' or op == 'u'):", "    return None",
            f"if {envelope['after']} is None:", "    return None")
    after = found["after"]
    fields: dict[str, tuple[str, str | None, bool]] = {}
    for f in value["fields"]:
        if f["name"] not in after:
            continue
        branches = _avro_branches(f["type"], named)
        kinds = {_avro_kind(b, _avro_logical(b), False) for b in branches if b["type"] != "null"}
        fields[f["name"]] = (after[f["name"]], kinds.pop() if len(kinds) == 1 else None,
                             any(b["type"] == "null" for b in branches))
    values = _contract_values(src, 2, contract, fields)
    src.add(2, f"return (op, ({''.join(v + ', ' for v in values)}), meta)")
    src.add(1, "except Exception:", "    return None")
    return src.function(f"avro change of writer schema {writer.schema_id}")


# ---- Protobuf

_PROTO_KINDS = {1: "real", 2: "real", 3: "integer", 4: "integer", 5: "integer", 6: "integer", 7: "integer",
                8: "boolean", 9: "proto_text", 12: "bytes", 13: "integer", 15: "integer", 16: "integer",
                17: "integer", 18: "integer"}
_WRAPPER_KINDS = {"double": "real", "float": "real", "long": "integer", "int": "integer", "boolean": "boolean",
                  "string": "proto_text", "binary": "bytes"}


def _proto_may_reject(descriptor, seen: set) -> bool:
    """Whether reading a message of `descriptor` as the reference does may reject it: it holds, at any
    depth, a google.protobuf.Timestamp or a google.type.Date whose value may be out of range."""
    if descriptor.full_name in (schemas.PROTO_TIMESTAMP, schemas.PROTO_DATE):
        return True
    if descriptor.full_name in seen:
        return False
    seen.add(descriptor.full_name)
    return any(fd.message_type is not None and _proto_may_reject(fd.message_type, seen) for fd in descriptor.fields)


def _proto_row(writer: WriterSchema, contract: RowContract) -> Callable[[str | None, bytes], tuple | None]:
    """The compiled row of the first message of Protobuf writer schema `writer` (see above): the message
    parsed by protobuf as the reference does, its contract fields read off it with attribute reads."""
    import keyword

    message_class, _ = writer.parsed.reader((0,))
    descriptor = message_class.DESCRIPTOR
    wanted = {f.name: f for f in contract.fields}
    key_name = None if contract.key_index is None else contract.fields[contract.key_index].name
    src = _Source()
    src.names.update(_parse=message_class.FromString)
    fields: dict[str, tuple[str, str | None, bool]] = {}
    reads = []
    for i, fd in enumerate(descriptor.fields):
        f = wanted.get(fd.name)
        var = f"w{i}"
        name = fd.name
        get = f"m.{name}" if name.isidentifier() and not keyword.iskeyword(name) else f"getattr(m, {name!r})"
        message = fd.message_type
        map_entry = message is not None and message.GetOptions().map_entry
        if fd.is_repeated or map_entry or (message is not None and message.full_name not in schemas.PROTO_WRAPPERS
                                           and message.full_name not in (schemas.PROTO_TIMESTAMP, schemas.PROTO_DATE)):
            if f is not None or (message is not None and _proto_may_reject(message, set())):
                reads.append(f"{var} = {src.const(proto_field(fd, {}))}(m)")
            if f is not None:
                fields[name] = (var, None, True)
            continue
        if f is None:
            if message is not None and message.full_name in (schemas.PROTO_TIMESTAMP, schemas.PROTO_DATE):
                reads.append(f"{var} = {src.const(proto_field(fd, {}))}(m)")  # the reference rejects a bad one
            continue
        shortcut = name != key_name and message is not None and (
            (message.full_name == schemas.PROTO_TIMESTAMP and f.type == "timestamp")
            or (message.full_name == schemas.PROTO_DATE and f.type == "date"))
        if message is None and fd.type == 14:  # enum: by name; a number the schema does not know is the reference's
            names = {v.number: v.name for v in fd.enum_type.values}
            value = f"{src.const(names)}.get({get})"
            kind = "text" if all(n.isascii() for n in names.values()) else None
            after = [f"if {var} is None:", "    return None"]
        elif message is None:
            value, kind, after = get, _PROTO_KINDS.get(fd.type), []
        elif message.full_name in schemas.PROTO_WRAPPERS:
            value, kind, after = f"{get}.value", _WRAPPER_KINDS[schemas.PROTO_WRAPPERS[message.full_name]], []
        elif not shortcut:
            convert = proto_timestamp if message.full_name == schemas.PROTO_TIMESTAMP else proto_date
            value, kind, after = f"{src.const(convert)}({get})", None, []
        elif message.full_name == schemas.PROTO_TIMESTAMP:  # ToDatetime's range, then epoch microseconds
            value, kind = get, "micros"
            after = [f"s = {var}.seconds", f"ns = {var}.nanos",
                     "if not (-62135596800 <= s <= 253402300799 and 0 <= ns < 1000000000):", "    return None",
                     f"{var} = s * 1000000 + ns // 1000"]
        else:  # google.type.Date to epoch days (date() refuses what the reference refuses)
            value, kind = get, "days"
            after = [(f"{var} = {src.const(date)}({var}.year, {var}.month, {var}.day).toordinal() - "
                      f"{date(1970, 1, 1).toordinal()}")]
        if fd.has_presence:
            reads.append(f"if m.HasField({name!r}):")
            reads.extend(f"    {line}" for line in [f"{var} = {value}", *after])
            reads.extend(["else:", f"    {var} = None"])
        else:
            reads.extend([f"{var} = {value}", *after])
        fields[name] = (var, kind, fd.has_presence)

    def read(src: _Source, depth: int) -> None:
        src.add(depth, "m = _parse(value[6:])", *reads)

    _compile_row(src, contract, read, fields)
    return src.function(f"protobuf row of writer schema {writer.schema_id}")


# ---- a writer schema's compiled row

def _avro_compiled(writer: WriterSchema, what: str, make: Callable[[], Callable]) -> tuple[bytes, Callable] | None:
    """(the header each value of Avro writer schema `writer` starts with, its compiled `what` made by `make`), or
    None when its values take the reference path only."""
    try:
        return HEADER.pack(MAGIC, writer.schema_id), make()
    except _Unsupported:
        return None
    except Exception:  # a bug here costs speed, never a record
        log.exception("the %s of Avro writer schema %d did not compile; its values take the reference path", what,
                      writer.schema_id)
        return None


def avro_row(writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
    """Avro writer schema `writer`'s header and compiled row (`_avro_row`), or None."""
    return _avro_compiled(writer, "row", lambda: _avro_row(writer, contract))


def avro_change(writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
    """Avro writer schema `writer`'s header and compiled change (`_avro_change`), or None."""
    return _avro_compiled(writer, "change", lambda: _avro_change(writer, contract))


def avro_record(writer: WriterSchema) -> tuple[bytes, Callable] | None:
    """Avro writer schema `writer`'s header and compiled record (`_avro_record`), or None."""
    return _avro_compiled(writer, "record", lambda: _avro_record(writer))


def proto_row(writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
    """(the bytes each value of the first message of Protobuf writer schema `writer` starts with: the header and
    the single 0 byte of its message indexes, its compiled row), or None when its records take the reference
    path only."""
    try:
        return HEADER.pack(MAGIC, writer.schema_id) + b"\x00", _proto_row(writer, contract)
    except (_Unsupported, SchemaTranslationError):
        return None
    except Exception:  # a bug here costs speed, never a record
        log.exception("the row of Protobuf writer schema %d did not compile; its records take the row plan",
                      writer.schema_id)
        return None
