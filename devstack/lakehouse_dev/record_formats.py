"""How `lakehouse produce` writes a record's value and key in each format, and breaks them the format's way.

lakehouse_dev.record_factory makes records as JSON-like values (timestamps as ISO-8601 text, or numbers since
the epoch for a field with a `unit`; dates likewise; decimals as Decimal; binary as base64 text; uuids as
text; structs, lists and maps as dicts and lists). A `ValueWriter` turns one into Kafka bytes:

    json          compact UTF-8 JSON; decimals as JSON numbers, digit for digit
    avro          the Confluent wire format (magic byte 0, schema id, payload) with an Avro writer schema
    protobuf      the wire format with a .proto writer schema, the file's first message (message index 0)
    json_schema   the wire format with a JSON Schema writer schema, the JSON document after the header;
                  decimals as JSON text, since JSON Schema has no decimal type the platform reads

Keys are written the same way from a key record (`source.key.format`), or as the key field's text.
A value is rendered for its writer schema's own types, so a folder schema written by hand (a
timestamp-millis where the contract says nothing of units, a google.protobuf.Timestamp) gets what it
declares.

Writer schemas: the newest schema of the format's type in the spec's `source.schemas` folder (told
apart from the key's when both are of one type: a key schema's fields are the key's), or, when the
folder has none and a schema registry is configured, the contract's own schema (`avro_schema`,
`proto_schema`, `json_schema`) registered under `<topic>-value` / `<topic>-key`.

Each writer also breaks values its own way (`OWN_KINDS`, the decoder's error kinds): JSON text that
does not parse, is not UTF-8 or is no object; for the wire formats a value without the header, a schema
id nobody registered, and a payload that does not decode.
"""

from __future__ import annotations

import base64
import json
import re
import uuid as uuid_module
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from random import Random
from typing import Any, Iterable

import msgspec

from lakehouse.core import config, schemas
from lakehouse.core.errors import LakehouseError, SchemaTranslationError
from lakehouse.core.spec import FORMAT_SCHEMA_TYPES, FieldSpec, PipelineSpec
from lakehouse.ingest import schema_store, wire

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
EPOCH_DATE = date(1970, 1, 1)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a schema id no registry hands out in practice (ids count up from 1), for `unknown_schema`
UNKNOWN_SCHEMA_ID = 2**31 - 1
CONTENT_TYPES = {"json": b"application/json", "avro": b"application/vnd.confluent.avro",
                 "protobuf": b"application/vnd.confluent.protobuf",
                 "json_schema": b"application/vnd.confluent.jsonschema+json"}


class ProduceError(LakehouseError, RuntimeError):
    """Records could not be generated or delivered; the message says which and why."""


# ------------------------------------------------------------------------------------------ JSON text

_JSON = msgspec.json.Encoder(decimal_format="number")


def dumps(obj: Any) -> str:
    """Compact UTF-8 JSON, as most service producers write it ("Søren" stays multi-byte); decimals are
    JSON numbers with their digits. A string holding a lone surrogate (which UTF-8 cannot carry) is
    written as JSON's escape of it, the whole text then ASCII."""
    try:
        return _JSON.encode(obj).decode("utf-8")
    except UnicodeEncodeError:
        pass
    lone: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, str) and re.search("[\ud800-\udfff]", value):
            token = f"lone-surrogate-{len(lone)}-{uuid_module.uuid4().hex}"
            lone[json.dumps(token)] = json.dumps(value)  # json escapes the surrogate as \udXXX
            return token
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = ascii_json(_JSON.encode(mark(obj)).decode("utf-8"))
    for token, escaped in lone.items():
        text = text.replace(token, escaped)
    return text


def ascii_json(text: str) -> str:
    """JSON text with every non-ASCII character written as its \\u escape (surrogate pairs above U+FFFF)."""
    def escape(match: re.Match) -> str:
        code = ord(match.group())
        if code > 0xFFFF:
            code -= 0x10000
            return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
        return f"\\u{code:04x}"

    return re.sub(r"[^\x00-\x7f]", escape, text)


# ------------------------------------------------------------------------------- contract -> schemas

def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", text) if part) or "Record"


def avro_schema(fields: Iterable[FieldSpec], name: str, namespace: str = "lakehouse.produce") -> dict:
    """An Avro record schema for contract `fields`: optional fields nullable with a null default;
    decimal(P,S) as bytes with the decimal logical type, uuid as a string with the uuid logical type,
    binary as bytes, timestamps as timestamp-micros (timestamp-millis for unit ms, a long for unit s),
    dates as date; structs as records (named after their path), lists as arrays, maps as maps."""
    def typed(f: FieldSpec, path: str) -> Any:
        if f.type == "struct":
            return {"type": "record", "name": path, "fields": [field(c, f"{path}_{_camel(c.name)}") for c in f.fields]}
        if f.type == "list":
            return {"type": "array", "items": nullable(f.items, f"{path}_Element")}
        if f.type == "map":
            return {"type": "map", "values": nullable(f.values, f"{path}_Value")}
        if f.type == "decimal":
            return {"type": "bytes", "logicalType": "decimal", "precision": f.precision, "scale": f.scale}
        if f.type == "uuid":
            return {"type": "string", "logicalType": "uuid"}
        if f.type == "timestamp":
            if f.unit == "s":
                return "long"
            return {"type": "long", "logicalType": "timestamp-millis" if f.unit == "ms" else "timestamp-micros"}
        if f.type == "date":
            return {"type": "int", "logicalType": "date"}
        return {"binary": "bytes"}.get(f.type, f.type)

    def nullable(f: FieldSpec, path: str) -> Any:
        return typed(f, path) if f.required else ["null", typed(f, path)]

    def field(f: FieldSpec, path: str) -> dict:
        return {"name": f.name, "type": nullable(f, path), **({} if f.required else {"default": None})}

    top = _camel(name)
    return {"type": "record", "name": top, "namespace": namespace,
            "fields": [field(f, f"{top}_{_camel(f.name)}") for f in fields]}


def contract_avro_schema(spec: PipelineSpec) -> dict:
    """The Avro record schema of the spec's contract (see avro_schema)."""
    return avro_schema(spec.contract.fields, spec.name)


_PROTO_SCALARS = {"string": "string", "int": "int32", "long": "int64", "float": "float", "double": "double",
                  "boolean": "bool", "decimal": "string", "uuid": "string", "binary": "bytes"}


def proto_schema(fields: Iterable[FieldSpec], name: str, package: str = "lakehouse.produce") -> str:
    """A proto3 file whose first message holds contract `fields`: optional scalars with `optional`
    (presence), decimals and uuids as strings, binary as bytes, timestamps as google.protobuf.Timestamp
    (int64 for a unit), dates as ISO text (int32 days for unit days; google.type.Date is not among the
    imports protoc has here), string enums as enums when their symbols are identifiers no other name of
    the message uses, structs as nested messages, lists as repeated fields, maps as maps. Raises
    ProduceError for what proto3 cannot hold: a list or map of lists or maps."""
    uses_timestamp = False

    def scalar(f: FieldSpec, where: str) -> str:
        nonlocal uses_timestamp
        if f.type == "timestamp":
            if f.unit is not None:
                return "int64"
            uses_timestamp = True
            return "google.protobuf.Timestamp"
        if f.type == "date":
            return "int32" if f.unit == "days" else "string"
        if f.type in ("list", "map"):
            raise ProduceError(f"{where}: protobuf cannot hold a {f.type_text} inside a list or map; "
                               f"declare a struct around it")
        return _PROTO_SCALARS[f.type]

    def message(message_name: str, members: Iterable[FieldSpec], indent: str, where: str) -> list[str]:
        members = list(members)
        lines = [f"{indent}message {message_name} {{"]
        taken = {f.name for f in members}
        nested: list[str] = []
        for number, f in enumerate(members, start=1):
            here = f"{where}.{f.name}" if where else f.name
            inner = indent + "  "
            label = ""
            if f.type == "struct":
                kind = _camel(f.name)
                nested += message(kind, f.fields, inner, here)
            elif f.type == "list":
                label = "repeated "
                kind = _camel(f.name) if f.items.type == "struct" else scalar(f.items, here)
                if f.items.type == "struct":
                    nested += message(kind, f.items.fields, inner, here)
            elif f.type == "map":
                value = _camel(f.name) if f.values.type == "struct" else scalar(f.values, here)
                if f.values.type == "struct":
                    nested += message(value, f.values.fields, inner, here)
                kind = f"map<string, {value}>"
            elif f.type == "string" and f.enum and _enum_fits(f.enum, taken) and _camel(f.name) not in taken:
                kind = _camel(f.name)
                taken |= set(f.enum) | {kind}
                label = "" if f.required else "optional "
                nested.append(f"{inner}enum {kind} {{ "
                              + " ".join(f"{symbol} = {i};" for i, symbol in enumerate(f.enum)) + " }")
            else:
                kind = scalar(f, here)
                label = "" if f.required or kind == "google.protobuf.Timestamp" else "optional "
            taken.add(kind)
            lines.append(f"{inner}{label}{kind} {f.name} = {number};")
        return lines + nested + [f"{indent}}}"]

    body = message(_camel(name), fields, "", "")
    head = ['syntax = "proto3";', f"package {package};"]
    if uses_timestamp:
        head.append('import "google/protobuf/timestamp.proto";')
    return "\n".join(head + body) + "\n"


def _enum_fits(symbols: tuple, taken: set[str]) -> bool:
    return all(isinstance(s, str) and _NAME.fullmatch(s) and s not in taken for s in symbols) \
        and len(set(symbols)) == len(symbols)


def json_schema(fields: Iterable[FieldSpec], title: str) -> dict:
    """A JSON Schema (draft 7) for contract `fields`, as Confluent's JSON Schema converter writes them:
    optional fields as a oneOf with null; ints with connect.type int32, floats float32; decimals as text;
    uuid, date-time and date formats; binary as base64 text; timestamps with a unit and dates in days as
    integers named as Kafka Connect names them; string enums, patterns, lengths and number bounds kept."""
    def typed(f: FieldSpec) -> dict:
        if f.type == "struct":
            return obj(f.fields)
        if f.type == "list":
            return {"type": "array", "items": nullable(f.items)}
        if f.type == "map":
            return {"type": "object", "additionalProperties": nullable(f.values)}
        if f.type == "string":
            out: dict[str, Any] = {"type": "string"}
            if f.enum:
                out["enum"] = list(f.enum)
            if f.max_length is not None:
                out["maxLength"] = f.max_length
            if f.pattern is not None:
                out["pattern"] = f.pattern
            return out
        if f.type in ("int", "long", "float", "double", "decimal"):
            if f.type == "decimal":
                return {"type": "string", "description": f"decimal({f.precision},{f.scale}) as text"}
            out = {"type": "integer" if f.type in ("int", "long") else "number"}
            if f.type in ("int", "float"):
                out["connect.type"] = "int32" if f.type == "int" else "float32"
            if f.enum:
                out["enum"] = list(f.enum)
            out.update({k: v for k, v in (("minimum", f.min), ("maximum", f.max)) if v is not None})
            return out
        if f.type == "boolean":
            return {"type": "boolean"}
        if f.type == "uuid":
            return {"type": "string", "format": "uuid"}
        if f.type == "binary":
            return {"type": "string", "contentEncoding": "base64"}
        if f.type == "timestamp":
            named = {"ms": "org.apache.kafka.connect.data.Timestamp", "us": "io.debezium.time.MicroTimestamp"}
            if f.unit is None:
                return {"type": "string", "format": "date-time"}
            return {"type": "integer", "connect.type": "int64", **({"title": named[f.unit]} if f.unit in named else {})}
        if f.unit == "days":  # date
            return {"type": "integer", "connect.type": "int32", "title": "org.apache.kafka.connect.data.Date"}
        return {"type": "string", "format": "date"}

    def nullable(f: FieldSpec) -> dict:
        return typed(f) if f.required else {"oneOf": [{"type": "null"}, typed(f)]}

    def obj(members: Iterable[FieldSpec]) -> dict:
        members = list(members)
        out = {"type": "object", "properties": {f.name: nullable(f) for f in members}}
        required = [f.name for f in members if f.required]
        return {**out, "required": required} if required else out

    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": title, **obj(fields)}


def contract_schema(fmt: str, fields: Iterable[FieldSpec], name: str) -> str:
    """The writer schema text of wire format `fmt` for contract `fields` (avro_schema, proto_schema, json_schema)."""
    if fmt == "avro":
        return json.dumps(avro_schema(fields, name))
    if fmt == "protobuf":
        return proto_schema(fields, name)
    return json.dumps(json_schema(fields, _camel(name)))


# -------------------------------------------------------------------------- rendering for the writer

def instant(value: Any, unit: str | None) -> datetime:
    """A timestamp field's value (ISO-8601 text, or a number of `unit` since the epoch) as an aware
    datetime; ValueError or OverflowError when it is neither."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and unit in _PER_SECOND:
        return _EPOCH + timedelta(microseconds=value * (1_000_000 // _PER_SECOND[unit]))
    if isinstance(value, str):
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is not None:
            return parsed
    raise ValueError(f"{value!r} is not a timestamp")


def epoch(moment: datetime, unit: str) -> int:
    """`moment` as a whole number of `unit` (s, ms, us) since the epoch."""
    micros = (moment - _EPOCH) // timedelta(microseconds=1)
    return micros // (1_000_000 // _PER_SECOND[unit])


def day(value: Any) -> date:
    """A date field's value (ISO-8601 text or days since the epoch) as a date; ValueError otherwise."""
    if isinstance(value, date):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return EPOCH_DATE + timedelta(days=value)
    return date.fromisoformat(value)


_DEBEZIUM_UNITS = {"io.debezium.time.Timestamp": "ms", "org.apache.kafka.connect.data.Timestamp": "ms",
                   "io.debezium.time.MicroTimestamp": "us"}


def _avro_primitive(kind: str, node: dict, value: Any, f: FieldSpec | None) -> Any:
    """`value` of contract field `f` as Avro primitive `kind` (with `node`'s logical type) takes it.
    A value that does not convert is passed on as it is: fastavro then refuses it."""
    if f is None:
        return value
    logical, connect = node.get("logicalType"), node.get("connect.name")
    try:
        if f.type == "timestamp":
            moment = instant(value, f.unit)
            if logical in ("timestamp-millis", "timestamp-micros"):
                return moment
            if logical in ("local-timestamp-millis", "local-timestamp-micros"):
                return moment.astimezone(timezone.utc).replace(tzinfo=None)
            if kind in ("long", "int"):
                return epoch(moment, _DEBEZIUM_UNITS.get(connect, f.unit or "us"))
            return value if isinstance(value, str) else moment.isoformat()
        if f.type == "date":
            d = day(value)
            return d if logical == "date" else (d - EPOCH_DATE).days if kind in ("int", "long") else d.isoformat()
        if f.type == "decimal":
            number = Decimal(str(value))
            return str(number) if kind == "string" else float(number) if kind in ("float", "double") else number
        if f.type == "binary" and isinstance(value, str):
            return value if kind == "string" else base64.b64decode(value, validate=True)
        if f.type == "uuid" and kind in ("bytes", "fixed") and isinstance(value, str):
            return uuid_module.UUID(value).bytes
    except (ValueError, TypeError, ArithmeticError, OverflowError):
        return value
    return value


def avro_renderer(node: Any, f: FieldSpec | None, names: dict[str, Any], namespace: str = "") -> Callable[[Any], Any]:
    """A function giving a value (of contract field `f`, or None when the contract does not describe it) in
    the form fastavro writes for Avro schema `node` (parsed JSON): datetimes, dates, Decimals, bytes where
    the writer's types ask for them. The schema is walked once, here, not for every value. `names` holds
    the schema's named types (avro_names); those met are added to it; a reference to one is compiled when
    first used (a recursive type refers to itself)."""
    if isinstance(node, list):  # a union: the first branch that is not null
        members = [m for m in node if m != "null"]
        if not members:
            return _as_is
        return _unless_none(avro_renderer(members[0], f, names, namespace))
    if isinstance(node, str):
        found = names.get(node) or names.get(f"{namespace}.{node}")
        if found is not None:
            compiled: list[Callable[[Any], Any]] = []

            def named(value: Any) -> Any:
                if not compiled:
                    compiled.append(avro_renderer(found, f, names, namespace))
                return compiled[0](value)
            return _unless_none(named)
        return _primitive_renderer(node, {}, f)
    kind = node.get("type")
    if isinstance(kind, (list, dict)):
        return _unless_none(avro_renderer(kind, f, names, namespace))
    if kind in ("record", "enum", "fixed"):
        space = node.get("namespace", namespace)
        full = node["name"] if "." in node["name"] else f"{space}.{node['name']}" if space else node["name"]
        names[full] = names[node["name"]] = node
        namespace = space
    if kind == "record":
        children = {c.name: c for c in f.fields} if f is not None and f.type == "struct" else {}
        fields = [(fld["name"], avro_renderer(fld["type"], children.get(fld["name"]), names, namespace))
                  for fld in node["fields"]]
        plain = [(name, render is _as_is, render) for name, render in fields]  # most values go as they are

        def record(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            return {name: value[name] if as_is else render(value[name]) for name, as_is, render in plain
                    if name in value}
        return _unless_none(record)
    if kind == "array":
        item = avro_renderer(node["items"], f.items if f is not None and f.type == "list" else None, names,
                             namespace)
        return _unless_none(lambda value: [item(v) for v in value] if isinstance(value, list) else value)
    if kind == "map":
        entry = avro_renderer(node["values"], f.values if f is not None and f.type == "map" else None, names,
                              namespace)
        return _unless_none(lambda value: {k: entry(v) for k, v in value.items()} if isinstance(value, dict)
                            else value)
    return _primitive_renderer(kind, node, f)


# the contract types `_avro_primitive` converts; it passes a value of any other type on as it is
_CONVERTED_TYPES = frozenset({"timestamp", "date", "decimal", "binary", "uuid"})


def _primitive_renderer(kind: str, node: dict, f: FieldSpec | None) -> Callable[[Any], Any]:
    """`_avro_primitive` of Avro primitive `kind` for field `f`, or the value as it is where that would not
    change it (no contract field, a type it does not convert: most of an envelope's values)."""
    if f is None or f.type not in _CONVERTED_TYPES:
        return _as_is
    return _unless_none(lambda value: _avro_primitive(kind, node, value, f))


def _as_is(value: Any) -> Any:
    return value


def _unless_none(render: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`render`, None left None."""
    if render is _as_is:
        return _as_is
    return lambda value: None if value is None else render(value)


# protobuf's FieldDescriptor.TYPE_* numbers of the integer types
_PROTO_INTEGERS = frozenset({3, 4, 5, 6, 7, 13, 15, 16, 17, 18})


def avro_names(node: Any, names: dict[str, Any] | None = None, namespace: str = "") -> dict[str, Any]:
    """Every named type (record, enum, fixed) of Avro schema `node`, by full and short name, so that
    `avro_renderer` resolves a reference met before its definition."""
    names = {} if names is None else names
    if isinstance(node, list):
        for member in node:
            avro_names(member, names, namespace)
    elif isinstance(node, dict):
        kind = node.get("type")
        if kind in ("record", "enum", "fixed"):
            space = node.get("namespace", namespace)
            full = node["name"] if "." in node["name"] else f"{space}.{node['name']}" if space else node["name"]
            names[full] = names[node["name"]] = node
            namespace = space
        if isinstance(kind, (list, dict)):
            avro_names(kind, names, namespace)
        for fld in node.get("fields") or ():
            avro_names(fld["type"], names, namespace)
        for key in ("items", "values"):
            if key in node:
                avro_names(node[key], names, namespace)
    return names


def _proto_scalar(fd, value: Any, f: FieldSpec | None) -> Any:
    """`value` of contract field `f` as protobuf field `fd` (not a message) takes it; passed on as it is
    when it does not convert (protobuf then refuses it)."""
    try:
        if fd.type == 14:  # enum: by name, or a number the schema does not know for a name it does not know
            if isinstance(value, str):
                numbers = {v.name: v.number for v in fd.enum_type.values}
                if value in numbers:
                    return numbers[value]
                return max(numbers.values(), default=0) + 1 + sum(map(ord, value)) % 100
            return value
        if f is None:
            return value
        if f.type == "timestamp" and fd.type in _PROTO_INTEGERS:
            return epoch(instant(value, f.unit), f.unit or "us") if not isinstance(value, int) else value
        if f.type == "date" and fd.type in _PROTO_INTEGERS and not isinstance(value, int):
            return (day(value) - EPOCH_DATE).days
        if f.type == "decimal":
            return str(value) if fd.type == 9 else float(value) if fd.type in (1, 2) else value
        if f.type == "binary" and fd.type == 12 and isinstance(value, str):
            return base64.b64decode(value, validate=True)
        if f.type == "uuid" and fd.type == 12 and isinstance(value, str):
            return uuid_module.UUID(value).bytes
    except (ValueError, TypeError, ArithmeticError, OverflowError):
        return value
    return value


def fill_proto(message, record: dict, f: FieldSpec | None) -> None:
    """Set the fields of protobuf `message` from `record` (values of the struct field `f`, or None when the
    contract does not describe it): Timestamps from instants (set second by second when outside the years
    1 to 9999, as a buggy writer would), wrappers, nested messages, repeated fields and maps. Raises
    TypeError or ValueError when a value does not fit its protobuf field."""
    children = {c.name: c for c in f.fields} if f is not None and f.type == "struct" else {}
    for fd in message.DESCRIPTOR.fields:
        value = record.get(fd.name)
        if value is None:
            continue
        child = children.get(fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            target = getattr(message, fd.name)
            value_fd = fd.message_type.fields_by_name["value"]
            values = child.values if child is not None and child.type == "map" else None
            for k, v in value.items():
                if value_fd.message_type is not None:
                    _set_message(target[k], v, values)
                elif v is not None:
                    target[k] = _proto_scalar(value_fd, v, values)
        elif fd.is_repeated:
            target = getattr(message, fd.name)
            items = child.items if child is not None and child.type == "list" else None
            for v in value:
                if fd.message_type is not None:
                    _set_message(target.add(), v, items)
                else:
                    target.append(_proto_scalar(fd, v, items))
        elif fd.message_type is not None:
            _set_message(getattr(message, fd.name), value, child)
        else:
            setattr(message, fd.name, _proto_scalar(fd, value, child))


def _set_message(target, value: Any, f: FieldSpec | None) -> None:
    name = target.DESCRIPTOR.full_name
    target.SetInParent()
    if name == schemas.PROTO_TIMESTAMP:
        moment = instant(value, f.unit if f is not None else None)
        micros = (moment - _EPOCH) // timedelta(microseconds=1)
        target.seconds, target.nanos = micros // 1_000_000, micros % 1_000_000 * 1000
    elif name in schemas.PROTO_WRAPPERS:
        target.value = _proto_scalar(target.DESCRIPTOR.fields_by_name["value"], value, f)
    elif isinstance(value, dict):
        fill_proto(target, value, f)
    else:
        raise TypeError(f"{value!r} is no {name} message")


# --------------------------------------------------------------------------------------------- writers

class JsonWriter:
    """Plain JSON (value_format or key format json). Its own defects are JSON text's."""

    fmt = "json"
    OWN_KINDS = ("malformed_json", "not_utf8", "not_an_object")

    def payload(self, record: Any) -> bytes:
        return dumps(record).encode("utf-8")

    def encode(self, record: Any) -> bytes:
        return self.payload(record)

    def broken(self, kind: str, record: dict, rng: Random) -> bytes:
        """A value with defect `kind` (OWN_KINDS) made from a valid `record`."""
        text = dumps(record)
        if kind == "malformed_json":  # truncated: the producer's buffer was cut
            return self._framed(text[: rng.randint(1, len(text) - 1)].encode("utf-8"))
        if kind == "not_utf8":  # a legacy client that wrote one string in Latin-1: "café" as b"caf\xe9"
            return self._framed(text.encode("utf-8")[:-1] + b',"note":"caf\xe9"}')
        if kind == "not_an_object":
            return self._framed((dumps([record]) if rng.random() < 0.5 else str(rng.randint(0, 999))).encode())
        raise ValueError(f"{kind!r} is not a defect of {self.fmt}")

    def _framed(self, payload: bytes) -> bytes:
        return payload


class WireWriter:
    """A wire format (Confluent's header before the payload) with writer schema `schema_id`."""

    fmt = ""
    malformed = ""

    def __init__(self, schema_id: int, text: str, fields: tuple[FieldSpec, ...]):
        self.schema_id = schema_id
        self.text = text
        self.struct = FieldSpec("", "struct", fields=fields)
        self.OWN_KINDS = ("bad_wire_format", "unknown_schema", self.malformed)

    def header(self, schema_id: int | None = None) -> bytes:
        return wire.HEADER.pack(wire.MAGIC, self.schema_id if schema_id is None else schema_id)

    def encode(self, record: dict) -> bytes:
        raise NotImplementedError

    def broken(self, kind: str, record: dict, rng: Random) -> bytes:
        """A value with the wire format's own defect `kind` (OWN_KINDS) made from a valid `record`."""
        good = self.encode(record)
        if kind == "bad_wire_format":  # a producer configured with a plain serializer, or magic byte 1
            return dumps(record).encode("utf-8") if rng.random() < 0.7 else b"\x01" + good[1:]
        if kind == "unknown_schema":
            return self.header(UNKNOWN_SCHEMA_ID - rng.randrange(100)) + good[wire.HEADER.size:]
        if kind == self.malformed:
            return self.corrupt(good, rng)
        raise ValueError(f"{kind!r} is not a defect of {self.fmt}")

    def corrupt(self, good: bytes, rng: Random) -> bytes:
        raise NotImplementedError


class AvroWriter(WireWriter):
    fmt, malformed = "avro", "malformed_avro"

    def __init__(self, schema_id: int, text: str, fields: tuple[FieldSpec, ...]):
        super().__init__(schema_id, text, fields)
        self.node = json.loads(text)
        self.parsed = schema_store.parse_schema(text)
        self.render = avro_renderer(self.node, self.struct, avro_names(self.node))

    def encode(self, record: dict) -> bytes:
        return wire.wire_value(self.schema_id, self.parsed, self.render(record))

    def corrupt(self, good: bytes, rng: Random) -> bytes:
        # cut short (the record's last bytes lost), or trailing bytes after a complete record
        return good[:-rng.randint(1, 2)] if rng.random() < 0.5 and len(good) > 7 else good + b"\x02\x00"


class ProtobufWriter(WireWriter):
    fmt, malformed = "protobuf", "malformed_protobuf"

    def __init__(self, schema_id: int, text: str, fields: tuple[FieldSpec, ...]):
        from google.protobuf import message_factory

        super().__init__(schema_id, text, fields)
        if text.startswith(schema_store.DESCRIPTOR_SET):
            pool, name = schemas.proto_pool(base64.b64decode(text[len(schema_store.DESCRIPTOR_SET):]))
        else:
            pool, name = schemas.proto_pool(schemas.compile_proto(text))
        self.message_class = message_factory.GetMessageClass(schemas.proto_message(pool, name))

    def encode(self, record: dict) -> bytes:
        message = self.message_class()
        fill_proto(message, record, self.struct)
        return wire.wire_protobuf(self.schema_id, message)

    def corrupt(self, good: bytes, rng: Random) -> bytes:
        if rng.random() < 0.5:  # a length-delimited field 15 that promises 127 bytes and ends
            return good + b"\x7a\x7f\x01"
        return good[:wire.HEADER.size] + b"\x02\x0e" + good[wire.HEADER.size + 1:]  # message index 7


class JsonSchemaWriter(WireWriter, JsonWriter):
    """JSON Schema: the JSON document after the header. Decimals are JSON text (contract_schema declares
    them so; a declared decimal column takes a JSON Schema string, not a number). Its own defects are the
    wire format's and JSON text's."""

    fmt, malformed = "json_schema", "malformed_json"

    def __init__(self, schema_id: int, text: str, fields: tuple[FieldSpec, ...]):
        WireWriter.__init__(self, schema_id, text, fields)
        self.OWN_KINDS = ("bad_wire_format", "unknown_schema", *JsonWriter.OWN_KINDS)

    def payload(self, record: Any) -> bytes:
        return dumps(decimals_as_text(record)).encode("utf-8")

    def encode(self, record: dict) -> bytes:
        return self.header() + self.payload(record)

    def broken(self, kind: str, record: dict, rng: Random) -> bytes:
        if kind in JsonWriter.OWN_KINDS:
            return JsonWriter.broken(self, kind, decimals_as_text(record), rng)
        return WireWriter.broken(self, kind, record, rng)

    def _framed(self, payload: bytes) -> bytes:
        return self.header() + payload


_HOLDING_DECIMALS = (Decimal, dict, list)  # the values decimals_as_text changes; any other stays as it is


def decimals_as_text(value: Any) -> Any:
    """`value` (JSON-like) with every Decimal in it as its text; dicts and lists new, all the way down."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: decimals_as_text(v) if isinstance(v, _HOLDING_DECIMALS) else v for k, v in value.items()}
    if isinstance(value, list):
        return [decimals_as_text(v) if isinstance(v, _HOLDING_DECIMALS) else v for v in value]
    return value


class TextKeyWriter:
    """A key as UTF-8 text: the key field's value (key format string)."""

    fmt = "string"
    OWN_KINDS = ()

    def __init__(self, field: str):
        self.field = field

    def encode(self, record: dict) -> bytes:
        return str(record[self.field]).encode("utf-8")

    def broken(self, kind: str, record: dict, rng: Random) -> bytes:
        # a legacy client that wrote the key in Latin-1
        return (str(record[self.field]) + "-é").encode("latin-1", errors="replace")


WIRE_WRITERS = {"avro": AvroWriter, "protobuf": ProtobufWriter, "json_schema": JsonSchemaWriter}


def _schema_fields(schema_type: str, text: str) -> set[str] | None:
    """The top-level field names of a writer schema's record, None when it does not translate."""
    try:
        return {f.name for f in schemas.record_type(schema_type, text).fields}
    except SchemaTranslationError:
        return None


def _is_change_event(schema_type: str, text: str) -> bool:
    try:
        return schemas.is_change_event(schemas.record_type(schema_type, text))
    except SchemaTranslationError:
        return False


def writer_schema(spec: PipelineSpec, platform: config.PlatformConfig, fmt: str, what: str,
                  text_for_registry: str, key_names: Iterable[str] = ()) -> tuple[int, str]:
    """(id, text) of the writer schema a `what` ("value" or "key") in wire format `fmt` is written with:
    the newest of its type in the spec's schema folder, else `text_for_registry` registered under
    `<topic>-<what>` in the schema registry. A folder schema is a key's when its fields are `key_names`
    (or, for a change stream, when it is no change event). Raises ProduceError when there is neither."""
    schema_type = FORMAT_SCHEMA_TYPES[fmt]
    keys = set(key_names)
    shared = FORMAT_SCHEMA_TYPES.get(spec.source.value_format) == FORMAT_SCHEMA_TYPES.get(spec.source.key_format)

    def mine(text: str) -> bool:
        if not shared:
            return True
        if spec.source.envelope is not None:
            return _is_change_event(schema_type, text) == (what == "value")
        return (_schema_fields(schema_type, text) == keys) == (what == "key")

    found = [(schema_id, text) for schema_id, found_type, text in spec.source.schemas
             if found_type == schema_type and mine(text)]
    if found:
        return max(found)
    registry = platform.schema_registry()
    if registry is None:
        where = f"source.schemas ({spec.source.schemas_dir}) holds no {schema_type} schema for the {what}s" \
            if spec.source.schemas_dir else "the spec has no source.schemas"
        raise ProduceError(f"pipeline {spec.name!r} writes {fmt} {what}s but {where}; add one, or set "
                           f"LAKEHOUSE_SCHEMA_REGISTRY_URL to register the contract's schema")
    subject = f"{spec.source.topic}-{what}"
    try:
        return schema_store.register_schema(registry, subject, text_for_registry, schema_type), text_for_registry
    except Exception as exc:  # noqa: BLE001 - the registry client raises its own errors and connection errors
        raise ProduceError(f"cannot register the {what} schema of pipeline {spec.name!r} under {subject!r} in the "
                           f"schema registry: {type(exc).__name__}: {str(exc)[:300]}") from None


def value_writer(spec: PipelineSpec, platform: config.PlatformConfig, fmt: str | None = None,
                 fields: tuple[FieldSpec, ...] | None = None, key_names: Iterable[str] = ()):
    """The writer of the spec's values (`fmt`, default value_format; `fields`, default the contract)."""
    fmt = fmt or spec.source.value_format
    fields = spec.contract.fields if fields is None else fields
    if fmt == "json":
        return JsonWriter()
    schema_id, text = writer_schema(spec, platform, fmt, "value", contract_schema(fmt, fields, spec.name), key_names)
    return WIRE_WRITERS[fmt](schema_id, text, fields)


def key_writer(spec: PipelineSpec, platform: config.PlatformConfig, key_fields: tuple[FieldSpec, ...]):
    """The writer of the spec's keys: the key field's text (key format string), or a record of `key_fields`
    in the key format; None when the pipeline's records carry no key."""
    fmt = spec.source.key_format
    if not key_fields:
        return None
    if fmt == "string":
        return TextKeyWriter(key_fields[0].name)
    if fmt == "json":
        return JsonWriter()
    names = [f.name for f in key_fields]
    text = contract_schema(fmt, key_fields, f"{spec.name}_key")
    schema_id, text = writer_schema(spec, platform, fmt, "key", text, names)
    return WIRE_WRITERS[fmt](schema_id, text, key_fields)


