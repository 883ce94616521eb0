"""Writer schemas as contract fields, and how a writer schema differs from a contract.

A pipeline in a wire format (Avro, Protobuf, JSON Schema) has writer schemas by id. This module
turns one into contract fields (`derive`), the fields a table of its records has:

    Avro                     Protobuf                          JSON Schema              contract
    record                   message                           object with properties   struct
    array / map              repeated / map<,>                 array / object with      list / map
                                                               additionalProperties
    enum                     enum                              string with enum         string + enum
    int, long                int32..., int64, uint32...        integer                  int, long
    float, double            float, double                     number                   float, double
    bytes, fixed             bytes                             (connect.type bytes)     binary
    decimal                  -                                 -                        decimal(P,S)
    uuid                     -                                 format uuid              uuid
    date, timestamp-*        google.type.Date, .Timestamp      format date, date-time   date, timestamp
    ["null", T]              optional, message fields, oneof,  ["null", T], oneOf null  optional
                             wrappers (StringValue, ...)

Debezium's Connect names (io.debezium.time.Timestamp, MicroTimestamp, Date, ZonedTimestamp,
io.debezium.data.Uuid) are honoured on Avro and JSON Schema. With `envelope="debezium"` the fields
are those of the change event's `after` record, the row.

`compare(contract, writer)` says what a writer schema means for a table that follows a contract:
fields the writer adds, types Iceberg can widen in place (`promotes`: int -> long, float -> double, a
decimal's precision), enum symbols added, fields the writer may now leave null, and incompatible changes. A
narrower writer type (an int where the contract has a long) changes nothing: its values fit.
`merge` applies the compatible ones. A contract derived from several schema versions is the merge of
all of them, oldest first (`follow`, one version at a time), so that records of every version fit it;
fields a version adds are optional, since records of the older versions lack them.

Errors are errors.SchemaTranslationError (a ConfigurationError) naming the field path and what is not supported.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from lakehouse.core.errors import PatternError, SchemaTranslationError
from lakehouse.core.patterns import contract_pattern
from lakehouse.core.spec_model import FieldSpec
from lakehouse.core.vocabulary import MAX_DECIMAL_PRECISION, WIDENINGS

ENVELOPE_FIELDS = ("before", "after", "op")  # what makes a record a Debezium change event
_DEBEZIUM_NAMES = {
    "io.debezium.time.Timestamp": FieldSpec("", "timestamp", unit="ms"),
    "org.apache.kafka.connect.data.Timestamp": FieldSpec("", "timestamp", unit="ms"),
    "io.debezium.time.MicroTimestamp": FieldSpec("", "timestamp", unit="us"),
    "io.debezium.time.ZonedTimestamp": FieldSpec("", "timestamp"),
    "io.debezium.time.Date": FieldSpec("", "date", unit="days"),
    "org.apache.kafka.connect.data.Date": FieldSpec("", "date", unit="days"),
    "io.debezium.data.Uuid": FieldSpec("", "uuid"),
}
_AVRO_PRIMITIVES = {"string": "string", "int": "int", "long": "long", "float": "float", "double": "double",
                    "boolean": "boolean", "bytes": "binary", "fixed": "binary"}


def _debezium(name: Any) -> FieldSpec | None:
    """The contract type a Kafka Connect / Debezium semantic type name stands for, None for any other
    value: the name comes from a writer schema, where a producer may put a list or an object."""
    return _DEBEZIUM_NAMES.get(name) if isinstance(name, str) else None


def _bound(value: Any) -> float | None:
    """A JSON Schema `minimum` / `maximum` as a contract bound: numbers only (not booleans), else none."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
MAX_SCHEMA_DEPTH = 32


# --------------------------------------------------------------------------------------------- Avro

def _avro_field(path: str, name: str, schema: Any, names: dict[str, Any], namespace: str, doc: str,
                depth: int) -> FieldSpec:
    spec, nullable = _avro_type(path, schema, names, namespace, depth)
    return replace(spec, name=name, required=not nullable, doc=doc or spec.doc)


def _avro_type(path: str, schema: Any, names: dict[str, Any], namespace: str, depth: int) -> tuple[FieldSpec, bool]:
    """The contract type of Avro `schema` at `path` (a FieldSpec named "" for now) and whether null is allowed."""
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaTranslationError(f"{path}: nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(schema, list):  # a union
        members = [m for m in schema if m != "null"]
        if not members:
            raise SchemaTranslationError(f"{path}: a union of only null holds no value")
        if len(members) > 1:
            raise SchemaTranslationError(f"{path}: a union of several types ({_avro_names(members)}) has no "
                                         f"single column type; use one type, optionally with null")
        spec, _ = _avro_type(path, members[0], names, namespace, depth + 1)
        return spec, len(members) < len(schema)
    if isinstance(schema, str):
        if schema in names:
            return _avro_type(path, names[schema], names, namespace, depth + 1)
        qualified = f"{namespace}.{schema}" if namespace and "." not in schema else schema
        if qualified in names:
            return _avro_type(path, names[qualified], names, namespace, depth + 1)
        schema = {"type": schema}
    if not isinstance(schema, dict):
        raise SchemaTranslationError(f"{path}: {str(schema)[:80]!r} is not an Avro schema")
    kind = schema.get("type")
    if isinstance(kind, (list, dict)):  # {"type": {"type": "array", ...}} nests a schema
        return _avro_type(path, kind, names, namespace, depth + 1)
    logical = schema.get("logicalType")
    connect = _debezium(schema.get("connect.name"))
    doc = schema.get("doc", "") if isinstance(schema.get("doc"), str) else ""
    if kind in ("record", "enum", "fixed"):
        full = schema.get("name", "")
        space = schema.get("namespace", namespace)
        if full and "." not in full and space:
            full = f"{space}.{full}"
        if full:
            names[full] = schema
            names.setdefault(full.rsplit(".", 1)[-1], schema)
        namespace = space or namespace
    if kind == "record":
        fields = []
        for f in schema.get("fields") or ():
            fields.append(_avro_field(f"{path}.{f['name']}" if path else f["name"], f["name"], f["type"], names,
                                      namespace, f.get("doc", ""), depth + 1))
        if not fields:
            raise SchemaTranslationError(f"{path or 'the record'}: a record without fields")
        return FieldSpec("", "struct", fields=tuple(fields), doc=doc), False
    if kind == "enum":
        return FieldSpec("", "string", enum=tuple(schema["symbols"]), doc=doc), False
    if kind == "array":
        items, nullable = _avro_type(f"{path}.element", schema["items"], names, namespace, depth + 1)
        return FieldSpec("", "list", items=replace(items, name="element", required=not nullable), doc=doc), False
    if kind == "map":
        values, nullable = _avro_type(f"{path}.value", schema["values"], names, namespace, depth + 1)
        return FieldSpec("", "map", values=replace(values, name="value", required=not nullable), doc=doc), False
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = schema.get("precision"), schema.get("scale", 0)
        if not isinstance(precision, int) or not 1 <= precision <= MAX_DECIMAL_PRECISION \
                or not isinstance(scale, int) or not 0 <= scale <= precision:
            raise SchemaTranslationError(f"{path}: decimal({precision}, {scale}) is not a decimal Iceberg holds "
                                         f"(precision 1 to {MAX_DECIMAL_PRECISION}, scale 0 to the precision)")
        return FieldSpec("", "decimal", precision=precision, scale=scale, doc=doc), False
    if logical == "uuid" and kind in ("string", "fixed"):
        return FieldSpec("", "uuid", doc=doc), False
    if logical == "date" and kind == "int":
        return FieldSpec("", "date", doc=doc), False
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros") \
            and kind == "long":
        return FieldSpec("", "timestamp", doc=doc), False
    if logical in ("time-millis", "time-micros"):
        raise SchemaTranslationError(f"{path}: time-of-day values ({logical}) have no contract type yet; "
                                     f"send them as a long or a string")
    if connect is not None and kind in ("int", "long", "string"):
        return replace(connect, doc=doc), False
    primitive = _AVRO_PRIMITIVES.get(kind) if isinstance(kind, str) else None
    if primitive is None:
        raise SchemaTranslationError(f"{path}: Avro type {str(kind)[:60]!r} has no contract type")
    return FieldSpec("", primitive, doc=doc), False


def _avro_names(members: list) -> str:
    return ", ".join(m if isinstance(m, str) else str(m.get("name") or m.get("type")) for m in members)[:200]


def avro_record(text: str) -> tuple[Any, dict[str, Any]]:
    """The parsed JSON of an Avro schema and its named types seen so far (a dict to fill)."""
    try:
        return json.loads(text), {}
    except ValueError as exc:
        raise SchemaTranslationError(f"not an Avro schema (invalid JSON): {exc}") from None


def _derive_avro(text: str, envelope: str | None) -> FieldSpec:
    schema, names = avro_record(text)
    spec, _ = _avro_type("", schema, names, "", 0)
    return spec


# --------------------------------------------------------------------------------------- JSON Schema

def _json_ref(root: dict, ref: str, path: str) -> dict:
    if not ref.startswith("#/"):
        raise SchemaTranslationError(f"{path}: only local references (#/...) are supported, not {ref[:80]!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SchemaTranslationError(f"{path}: reference {ref[:80]!r} does not resolve")
        node = node[part]
    if not isinstance(node, dict):
        raise SchemaTranslationError(f"{path}: reference {ref[:80]!r} is not a schema")
    return node


def _json_type(path: str, schema: Any, root: dict, depth: int) -> tuple[FieldSpec, bool]:
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaTranslationError(f"{path}: nests deeper than {MAX_SCHEMA_DEPTH} levels (a recursive $ref?)")
    if schema is True or schema == {}:
        raise SchemaTranslationError(f"{path}: a schema that allows any value has no column type")
    if not isinstance(schema, dict):
        raise SchemaTranslationError(f"{path}: {str(schema)[:80]!r} is not a JSON Schema")
    if "$ref" in schema:
        return _json_type(path, _json_ref(root, schema["$ref"], path), root, depth + 1)
    doc = schema.get("description") or schema.get("title") or ""
    doc = doc if isinstance(doc, str) else ""
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            options = schema[combinator]
            real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if len(real) != 1:
                raise SchemaTranslationError(f"{path}: {combinator} of {len(real)} non-null schemas has no single "
                                             f"column type")
            spec, nullable = _json_type(path, real[0], root, depth + 1)
            return replace(spec, doc=spec.doc or doc), nullable or len(real) < len(options)
    kind = schema.get("type")
    nullable = False
    if isinstance(kind, list):
        members = [k for k in kind if k != "null"]
        nullable = len(members) < len(kind)
        if len(members) != 1:
            raise SchemaTranslationError(f"{path}: type {kind!r} has no single column type")
        kind = members[0]
    connect = schema.get("connect.type")
    debezium = _debezium(schema.get("connect.name") or schema.get("title"))
    if debezium is not None and kind in ("integer", "string"):
        return replace(debezium, doc=doc), nullable
    if "enum" in schema and kind in ("string", None):
        symbols = [s for s in schema["enum"] if s is not None]
        if not all(isinstance(s, str) for s in symbols) or not symbols:
            raise SchemaTranslationError(f"{path}: an enum of non-string values has no column type")
        return FieldSpec("", "string", enum=tuple(symbols), doc=doc), nullable or None in schema["enum"]
    low, high = _bound(schema.get("minimum")), _bound(schema.get("maximum"))
    if kind == "string":
        fmt = schema.get("format")
        if connect == "bytes" or schema.get("contentEncoding") == "base64":
            return FieldSpec("", "binary", doc=doc), nullable
        if fmt == "date-time":
            return FieldSpec("", "timestamp", doc=doc), nullable
        if fmt == "date":
            return FieldSpec("", "date", doc=doc), nullable
        if fmt == "uuid":
            return FieldSpec("", "uuid", doc=doc), nullable
        max_length = schema.get("maxLength")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            try:  # the contract's patterns run on RE2 (lakehouse.core.spec.contract_pattern)
                contract_pattern(pattern)
            except PatternError as exc:
                raise SchemaTranslationError(f"{path}: pattern {pattern[:80]!r} {exc}") from None
        return FieldSpec("", "string", doc=doc,
                         max_length=max_length if isinstance(max_length, int) and max_length > 0 else None,
                         pattern=pattern if isinstance(pattern, str) else None), nullable
    if kind == "integer":
        return FieldSpec("", "int" if connect in ("int8", "int16", "int32") else "long", doc=doc, min=low,
                         max=high), nullable
    if kind == "number":
        return FieldSpec("", "float" if connect == "float32" else "double", doc=doc, min=low, max=high), nullable
    if kind == "boolean":
        return FieldSpec("", "boolean", doc=doc), nullable
    if kind == "array":
        items, item_nullable = _json_type(f"{path}.element", schema.get("items"), root, depth + 1)
        return FieldSpec("", "list", items=replace(items, name="element", required=not item_nullable),
                         doc=doc), nullable
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        if isinstance(properties, dict) and properties:
            required = set(schema.get("required") or ())
            fields = []
            for name, sub in properties.items():
                spec, sub_nullable = _json_type(f"{path}.{name}" if path else name, sub, root, depth + 1)
                fields.append(replace(spec, name=name, required=name in required and not sub_nullable))
            return FieldSpec("", "struct", fields=tuple(fields), doc=doc), nullable
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            values, value_nullable = _json_type(f"{path}.value", extra, root, depth + 1)
            return FieldSpec("", "map", values=replace(values, name="value", required=not value_nullable),
                             doc=doc), nullable
        raise SchemaTranslationError(f"{path or 'the schema'}: an object without properties or a schema for "
                                     f"additionalProperties has no column type")
    raise SchemaTranslationError(f"{path}: JSON Schema type {str(kind)[:60]!r} has no column type")


def _derive_json(text: str, envelope: str | None) -> FieldSpec:
    try:
        root = json.loads(text)
    except ValueError as exc:
        raise SchemaTranslationError(f"not a JSON Schema (invalid JSON): {exc}") from None
    if not isinstance(root, dict):
        raise SchemaTranslationError("a JSON Schema is an object")
    spec, _ = _json_type("", root, root, 0)
    return spec


# ------------------------------------------------------------------------------------------ Protobuf

_PROTO_LOCK = threading.Lock()
_PROTO_CACHE: dict[str, bytes] = {}
# protobuf's FieldDescriptor.TYPE_* numbers -> contract types
_PROTO_SCALARS = {1: "double", 2: "float", 3: "long", 4: "long", 5: "int", 6: "long", 7: "int", 8: "boolean",
                  9: "string", 12: "binary", 13: "long", 15: "int", 16: "long", 17: "int", 18: "long"}
PROTO_WRAPPERS = {"google.protobuf.DoubleValue": "double", "google.protobuf.FloatValue": "float",
                  "google.protobuf.Int64Value": "long", "google.protobuf.UInt64Value": "long",
                  "google.protobuf.Int32Value": "int", "google.protobuf.UInt32Value": "long",
                  "google.protobuf.BoolValue": "boolean", "google.protobuf.StringValue": "string",
                  "google.protobuf.BytesValue": "binary"}
PROTO_TIMESTAMP = "google.protobuf.Timestamp"
PROTO_DATE = "google.type.Date"


PROTOC_TIMEOUT_S = 60.0  # one .proto file of at most MAX_SCHEMA_BYTES compiles in well under a second


def compile_proto(text: str) -> bytes:
    """A `.proto` file's text compiled by protoc (grpcio-tools) into a serialized FileDescriptorSet that
    includes its imports of Google's well-known types; cached per text. Raises SchemaTranslationError
    with protoc's message when the text does not compile.

    protoc runs in a child process (`python -m grpc_tools.protoc`) whose output is captured: in-process it
    writes its diagnostics to fd 2, which would have to be redirected for the whole process while other
    threads log, and a protoc crash or a pathological file would take the caller down or hold it; the
    child is bounded by PROTOC_TIMEOUT_S. Imports resolve only among Google's well-known types (protoc
    refuses `..` and absolute paths), never from the host's files."""
    with _PROTO_LOCK:
        if text in _PROTO_CACHE:
            return _PROTO_CACHE[text]
        import importlib.resources
        import os
        import subprocess
        import sys
        import tempfile

        include = str(importlib.resources.files("grpc_tools") / "_proto")
        with tempfile.TemporaryDirectory(prefix="lakehouse-proto-") as scratch:
            with open(os.path.join(scratch, "writer_schema.proto"), "w", encoding="utf-8") as handle:
                handle.write(text)
            if not sys.executable:
                raise SchemaTranslationError("cannot compile .proto files: this Python has no executable path "
                                             "(sys.executable) to run protoc with")
            try:
                done = subprocess.run(
                    [sys.executable, "-P", "-m", "grpc_tools.protoc",  # -P: no module from the scratch folder
                     "-I.", f"-I{include}", "--include_imports",
                     "--descriptor_set_out=set.pb", "writer_schema.proto"],
                    cwd=scratch, stdin=subprocess.DEVNULL, capture_output=True, timeout=PROTOC_TIMEOUT_S,
                    check=False)
            except subprocess.TimeoutExpired:
                raise SchemaTranslationError(f"protoc did not compile the .proto file within {PROTOC_TIMEOUT_S:g} "
                                             f"s; simplify it") from None
            if done.returncode != 0:
                why = done.stderr.decode("utf-8", "replace").replace(scratch + os.sep, "").strip()
                raise SchemaTranslationError(f"not a .proto file protoc compiles: "
                                             f"{why[:500] or f'exit {done.returncode}'}")
            with open(os.path.join(scratch, "set.pb"), "rb") as handle:
                compiled = handle.read()
        if len(_PROTO_CACHE) < 256:
            _PROTO_CACHE[text] = compiled
        return compiled


def proto_pool(compiled: bytes, serialized_files: Iterable[bytes] = ()):
    """A DescriptorPool holding a compiled FileDescriptorSet (compile_proto), or serialized
    FileDescriptorProtos (a registry's `format=serialized` schemas, imports first); the pool and the
    name of the last file added, whose messages the wire format's indexes select."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    last = None
    files: list[descriptor_pb2.FileDescriptorProto] = []
    if compiled:
        found = descriptor_pb2.FileDescriptorSet()
        found.ParseFromString(compiled)
        files.extend(found.file)
    for data in serialized_files:
        proto = descriptor_pb2.FileDescriptorProto()
        proto.ParseFromString(data)
        files.append(proto)
    for proto in files:
        try:
            pool.Add(proto)
        except Exception as exc:  # noqa: BLE001 - a conflicting or broken descriptor
            raise SchemaTranslationError(f"descriptor {proto.name!r} does not load: {exc}") from None
        last = proto.name
    if last is None:
        raise SchemaTranslationError("no .proto file in the schema")
    return pool, last


def proto_message(pool, file_name: str, indexes: tuple[int, ...] = (0,)):
    """The message descriptor the Confluent wire format's message indexes select in file `file_name`
    (index path into top-level then nested messages; (0,) is the file's first message)."""
    file = pool.FindFileByName(file_name)
    messages = list(file.message_types_by_name.values())
    try:
        message = messages[indexes[0]]
        for index in indexes[1:]:
            message = message.nested_types[index]
    except IndexError:
        raise SchemaTranslationError(f"message index {list(indexes)} is not in {file_name}") from None
    return message


def _proto_type(path: str, fd, depth: int) -> tuple[FieldSpec, bool]:
    """The contract type of protobuf field `fd` (ignoring `repeated`) and whether it may be null."""
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaTranslationError(f"{path}: nests deeper than {MAX_SCHEMA_DEPTH} levels (a recursive message?)")
    presence = fd.has_presence
    if fd.type == 14:  # enum
        return FieldSpec("", "string", enum=tuple(v.name for v in fd.enum_type.values)), presence
    if fd.type in (10, 11):  # group, message
        name = fd.message_type.full_name
        if name in PROTO_WRAPPERS:
            return FieldSpec("", PROTO_WRAPPERS[name]), True
        if name == PROTO_TIMESTAMP:
            return FieldSpec("", "timestamp"), True
        if name == PROTO_DATE:
            return FieldSpec("", "date"), True
        return _proto_struct(path, fd.message_type, depth + 1), True
    scalar = _PROTO_SCALARS.get(fd.type)
    if scalar is None:
        raise SchemaTranslationError(f"{path}: protobuf type {fd.type} has no contract type")
    return FieldSpec("", scalar), presence


def _proto_field(path: str, fd, depth: int) -> FieldSpec:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        value_fd = fd.message_type.fields_by_name["value"]
        values, _ = _proto_type(f"{path}.value", value_fd, depth + 1)
        # a map value is never null on the wire (a missing message value reads as an empty one)
        return FieldSpec(fd.name, "map", values=replace(values, name="value", required=True), required=True)
    if fd.is_repeated:
        items, _ = _proto_type(f"{path}.element", fd, depth + 1)
        return FieldSpec(fd.name, "list", items=replace(items, name="element", required=True), required=True)
    spec, nullable = _proto_type(path, fd, depth)
    return replace(spec, name=fd.name, required=not nullable)


def _proto_struct(path: str, message, depth: int) -> FieldSpec:
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaTranslationError(f"{path}: nests deeper than {MAX_SCHEMA_DEPTH} levels (a recursive message?)")
    fields = tuple(_proto_field(f"{path}.{fd.name}" if path else fd.name, fd, depth + 1) for fd in message.fields)
    if not fields:
        raise SchemaTranslationError(f"{path or message.full_name}: a message without fields has no columns")
    return FieldSpec("", "struct", fields=fields)


def _derive_proto(text: str, envelope: str | None) -> FieldSpec:
    pool, name = proto_pool(compile_proto(text))
    return _proto_struct("", proto_message(pool, name), 0)


# ---------------------------------------------------------------------------------- derive, compare

_DERIVERS = {"AVRO": _derive_avro, "JSON": _derive_json, "PROTOBUF": _derive_proto}


def record_type(schema_type: str, text: str) -> FieldSpec:
    """The whole record of writer schema `text` (of `schema_type`: AVRO, JSON or PROTOBUF) as a struct
    FieldSpec; raises SchemaTranslationError."""
    if schema_type not in _DERIVERS:
        raise SchemaTranslationError(f"schema type {schema_type!r} is not one of {', '.join(_DERIVERS)}")
    record = _DERIVERS[schema_type](text, None)
    if record.type != "struct":
        raise SchemaTranslationError(f"the writer schema is a {record.type_text}, not a record")
    return record


def is_change_event(record: FieldSpec) -> bool:
    """Whether a record type is a Debezium change event envelope (before, after, op)."""
    names = {f.name for f in record.fields}
    return all(n in names for n in ENVELOPE_FIELDS)


def proto_record(message) -> FieldSpec:
    """A protobuf message descriptor as a struct FieldSpec (what `record_type` gives for a .proto file's
    first message); raises SchemaTranslationError."""
    return _proto_struct("", message, 0)


def derive(schema_type: str, text: str, envelope: str | None = None) -> tuple[FieldSpec, ...]:
    """The contract fields of writer schema `text`: the record's fields, or with `envelope="debezium"`
    those of the change event's `after` record. Raises SchemaTranslationError."""
    return row_fields(record_type(schema_type, text), envelope)


def row_fields(record: FieldSpec, envelope: str | None = None) -> tuple[FieldSpec, ...]:
    """The contract fields of a writer schema's record type: its own, or with `envelope="debezium"`
    those of the change event's `after` record. Raises SchemaTranslationError."""
    if envelope is not None:
        if not is_change_event(record):
            present = {f.name for f in record.fields}
            raise SchemaTranslationError(f"the writer schema is not a Debezium change event: it lacks "
                                         f"{', '.join(n for n in ENVELOPE_FIELDS if n not in present)}")
        after = next(f for f in record.fields if f.name == "after")
        if after.type != "struct":
            raise SchemaTranslationError(f"the change event's `after` is a {after.type_text}, not a record")
        record = after
    return record.fields


def promotes(narrow: FieldSpec, wide: FieldSpec) -> bool:
    """Whether a column of `narrow`'s type takes `wide`'s in place, without rewriting data: one of Iceberg's
    type promotions (vocabulary.WIDENINGS: int -> long, float -> double), or a decimal's precision grown at
    the same scale."""
    if narrow.type != wide.type:
        return (narrow.type, wide.type) in WIDENINGS
    return narrow.type == "decimal" and narrow.digits[1] == wide.digits[1] and wide.digits[0] > narrow.digits[0]


@dataclass
class SchemaDiff:
    """What a writer schema changes for a table that follows a contract (paths are dotted field paths)."""

    added: list[str] = field(default_factory=list)       # fields the writer has and the contract lacks
    widened: list[str] = field(default_factory=list)     # types Iceberg widens in place, enums grown
    relaxed: list[str] = field(default_factory=list)     # required contract fields the writer may leave null
    incompatible: list[str] = field(default_factory=list)  # explanations: changes no table can follow
    incompatible_paths: list[str] = field(default_factory=list)  # the fields they concern

    @property
    def evolves(self) -> bool:
        return bool(self.added or self.widened or self.relaxed)

    def changes(self) -> str:
        """The compatible changes, as the schema gate's error and `lakehouse schemas` name them: "adds a, b;
        widens c; may leave null d"."""
        return "; ".join(f"{what} {', '.join(paths)}" for what, paths in
                         (("adds", self.added), ("widens", self.widened), ("may leave null", self.relaxed)) if paths)


def _compare(path: str, have: FieldSpec, new: FieldSpec, diff: SchemaDiff, labels: tuple[str, str]) -> None:
    if promotes(have, new):
        diff.widened.append(path)
        return
    if have.type != new.type:
        # already wider (promotes(new, have)): an older writer's int fits a long, a contract's int a widened column
        if not promotes(new, have):
            diff.incompatible.append(f"field {path[1:]!r} is {have.type_text} in {labels[0]} but {new.type_text} in "
                                     f"{labels[1]}; Iceberg cannot change it in place")
            diff.incompatible_paths.append(path)
        return
    if have.type == "decimal":
        if new.scale != have.scale:
            diff.incompatible.append(f"field {path[1:]!r} is {have.type_text} in {labels[0]} but {new.type_text} "
                                     f"in {labels[1]}; a decimal's scale cannot change")
            diff.incompatible_paths.append(path)
        return
    if have.enum is not None and new.enum is not None and not set(new.enum) <= set(have.enum):
        diff.widened.append(path)
    if have.type in ("timestamp", "date") and have.unit != new.unit and new.unit is not None:
        diff.widened.append(path)  # both encodings are accepted from then on
    if have.type == "struct":
        current = {f.name: f for f in have.fields}
        for f in new.fields:
            child = f"{path}.{f.name}"
            if f.name in current:
                _compare(child, current[f.name], f, diff, labels)
                if current[f.name].required and not f.required:
                    diff.relaxed.append(child)
            else:
                diff.added.append(child)
        writer = {f.name for f in new.fields}
        diff.relaxed.extend(f"{path}.{f.name}" for f in have.fields if f.required and f.name not in writer)
    elif have.type == "list":
        _compare(f"{path}.element", have.element, new.element, diff, labels)
    elif have.type == "map":
        _compare(f"{path}.value", have.element, new.element, diff, labels)


def compare(contract: Iterable[FieldSpec], writer: Iterable[FieldSpec],
            labels: tuple[str, str] = ("the contract", "the writer schema")) -> SchemaDiff:
    """How fields `writer` differ from fields `contract` (see SchemaDiff); `labels` name the two sides
    in the explanations of incompatible changes."""
    diff = SchemaDiff()
    _compare("", FieldSpec("", "struct", fields=tuple(contract)), FieldSpec("", "struct", fields=tuple(writer)),
             diff, labels)

    def strip(items: list[str]) -> list[str]:  # the root's "" makes every path start with "."
        return [p[1:] for p in items]

    return SchemaDiff(strip(diff.added), strip(diff.widened), strip(diff.relaxed), diff.incompatible,
                      strip(diff.incompatible_paths))


def _merge(have: FieldSpec, new: FieldSpec) -> FieldSpec:
    if promotes(have, new):
        return replace(have, type=new.type, precision=new.precision)
    if have.type != new.type or have.type == "decimal":
        return have
    updates: dict[str, Any] = {}
    if have.enum is not None:
        updates["enum"] = None if new.enum is None else tuple(dict.fromkeys([*have.enum, *new.enum]))
    if have.type in ("timestamp", "date") and new.unit is not None and have.unit is None:
        updates["unit"] = new.unit
    if have.type == "struct":
        current = {f.name: f for f in have.fields}
        writer = {f.name: f for f in new.fields}
        merged = []
        for f in have.fields:
            if f.name in writer:
                child = _merge(f, writer[f.name])
                merged.append(replace(child, required=f.required and writer[f.name].required))
            else:
                merged.append(replace(f, required=False))
        merged.extend(replace(f, required=False) for f in new.fields if f.name not in current)
        updates["fields"] = tuple(merged)
    elif have.type == "list":
        updates["items"] = _merge(have.element, new.element)
    elif have.type == "map":
        updates["values"] = _merge(have.element, new.element)
    return replace(have, **updates)


def merge(contract: Iterable[FieldSpec], writer: Iterable[FieldSpec]) -> tuple[FieldSpec, ...]:
    """Contract fields `contract` with the compatible changes of `writer` applied: its added fields
    (optional, appended), widened types, grown enums, fields it may leave null made optional.
    Incompatible differences keep the contract's type (see `compare`)."""
    merged = _merge(FieldSpec("", "struct", fields=tuple(contract)), FieldSpec("", "struct", fields=tuple(writer)))
    return merged.fields


def follow(fields: tuple[FieldSpec, ...] | None, version: tuple[FieldSpec, ...]) -> tuple[FieldSpec, ...]:
    """The contract fields that fit the writer schema versions of `fields` (None before the first) and the
    newer `version` too: `version`'s own for the first, else `fields` merged with it (see `merge`).
    Raises SchemaTranslationError when `version` changes a field incompatibly (see `compare`).

    The one rule for folding writer-schema versions, oldest first, into the contract that fits all of
    them: a contract derived from a schema folder (lakehouse.core.spec_contract) and the contract the
    ingest job follows as it evolves the tables for new versions."""
    if fields is None:
        return version
    diff = compare(fields, version)
    if diff.incompatible:
        raise SchemaTranslationError("; ".join(diff.incompatible))
    return merge(fields, version)


# The writer types whose values a declared contract type takes (the record checks of
# lakehouse.ingest.checks convert them, and still refuse a value that does not fit).
_ACCEPTED = {
    "string": {"string", "uuid"},
    "int": {"int"},
    "long": {"int", "long"},
    "float": {"int", "long", "float", "double"},
    "double": {"int", "long", "float", "double"},
    "decimal": {"int", "long", "string", "decimal"},
    "boolean": {"boolean"},
    "timestamp": {"timestamp", "string"},
    "date": {"date", "string"},
    "uuid": {"uuid", "string", "binary"},
    "binary": {"binary", "string"},
}


def _conflicts(path: str, contract: FieldSpec, writer: FieldSpec, found: list[str]) -> None:
    if contract.type in ("struct", "list", "map") or writer.type in ("struct", "list", "map"):
        if contract.type != writer.type:
            found.append(f"{path} is {contract.type_text} in the contract but {writer.type_text} in the writer schema")
        elif contract.type == "struct":
            _struct_conflicts(path, contract.fields, writer.fields, found)
        elif contract.type == "list":
            _conflicts(f"{path}[]", contract.element, writer.element, found)
        else:
            _conflicts(f"{path}{{}}", contract.element, writer.element, found)
        return
    accepted = set(_ACCEPTED.get(contract.type, ()))
    if contract.unit is not None:  # epoch numbers
        accepted |= {"int", "long"}
    if writer.type not in accepted:
        found.append(f"{path} is {contract.type_text} in the contract but {writer.type_text} in the writer schema, "
                     f"whose values it cannot take")


def _struct_conflicts(path: str, contract: Iterable[FieldSpec], writer: Iterable[FieldSpec], found: list[str]) -> None:
    fields = {f.name: f for f in writer}
    for f in contract:
        here = f"{path}.{f.name}" if path else f.name
        if f.name not in fields:
            if f.required:
                found.append(f"{here} is required by the contract but the writer schema has no such field")
            continue
        _conflicts(here, f, fields[f.name], found)


def conflicts(contract: Iterable[FieldSpec], writer: Iterable[FieldSpec]) -> list[str]:
    """Why records of writer schema fields `writer` cannot satisfy a declared contract: a required field
    the writer lacks, a field whose writer type the contract type cannot take (see _ACCEPTED). Fields
    the contract does not declare are ignored. [] when the writer schema fits."""
    found: list[str] = []
    _struct_conflicts("", contract, writer, found)
    return found
