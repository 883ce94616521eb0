"""Wire formats besides plain JSON: Avro, Protobuf and JSON Schema, with writer schemas by id.

A value (or a record key) in the Confluent wire format is one magic byte 0, the writer schema's id
(4 bytes, big-endian) and the payload, as Confluent's serializers (and the Iceberg Kafka Connect
sink's converters) write it; Protobuf payloads start with the message indexes that select the
message in the schema's file (zig-zag varints; a single 0 for the first message). A decoder turns a
value into a mapping of field name to Python value for the contract checks
(lakehouse.ingest.checks): Avro's logical types and Protobuf's well-known types arrive as datetimes,
dates, Decimals and UUIDs, which the checks accept.

Writer schemas come from a `SchemaStore`, each parsed once per id and process: the folder beside
the spec that `source.schemas` names (`<id>.avsc`, `<id>.proto`, `<id>.json`, read with the spec; for
air-gapped use and the embedded stack) and a Confluent-compatible registry
(LAKEHOUSE_SCHEMA_REGISTRY_URL). Only the driver talks to the registry: it fetches the subjects'
versions when the job starts, and an id a task meets that it was not given stops the task with a
`schema-unknown` marker, the driver fetches it and writes the batch again. Tasks get every writer
schema with the spec (`SourceSpec.schemas`), so executors need neither the registry's address nor its
credentials. What each failure becomes:

    value without the wire format's header      dead letter `bad_wire_format`
    a schema id the folder and registry lack     dead letter `unknown_schema`
    a payload that does not decode with it       dead letter `malformed_avro` / `malformed_protobuf` /
                                                 `malformed_json`
    a registry that does not answer              SchemaRegistryUnavailableError: the batch is
                                                 retried, then the job stops; nothing is dead-lettered

Before the first record of a writer schema is decoded, a `SchemaGate` (lakehouse.ingest.writer_schemas) is
asked whether the contract takes it: a new compatible schema of a contract that follows the writer
schemas stops the task so the driver evolves the table first (lakehouse.ingest.job), an incompatible
one follows `schema_policy`.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from typing import Any

from lakehouse.core import errors, schemas
from lakehouse.core.adapters import confluent_kafka_internals
from lakehouse.core.errors import SchemaRegistryUnavailableError, SchemaTranslationError
from lakehouse.core.spec import FORMAT_SCHEMA_TYPES, FieldSpec, PipelineSpec, SchemaSource
from lakehouse.ingest.checks import (
    FLOAT32_MAX,
    INT32,
    INT64,
    MAX_TIMESTAMP_US,
    MIN_TIMESTAMP_US,
    lone_surrogate,
    number_interval,
)
from lakehouse.ingest.json_decode import JsonDecoder
from lakehouse.ingest.rejects import Rejected

log = logging.getLogger("lakehouse.ingest.formats")
MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id
MAX_MESSAGE_INDEXES = 64  # nesting of the selected message in a .proto file; more is a corrupt payload


# ------------------------------------------------------------------------------------ the wire format

def split_header(value: bytes, what: str = "value") -> tuple[int, int]:
    """(schema id, offset of the payload) of a wire-format `value`; Rejected("bad_wire_format") without
    the header."""
    if len(value) < HEADER.size or value[0] != MAGIC:
        raise Rejected("bad_wire_format", f"{what} does not start with the wire format's magic byte 0 and a "
                                          f"4-byte schema id (not from a Confluent-compatible serializer)")
    return int.from_bytes(value[1:HEADER.size], "big"), HEADER.size


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """A zig-zag varint of `data` at `at`: (value, next offset); ValueError when truncated or too long."""
    shift = result = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated message indexes")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def message_indexes(value: bytes, at: int) -> tuple[tuple[int, ...], int]:
    """The Protobuf message indexes after the header: (indexes, offset of the message)."""
    count, at = _varint(value, at)
    if count == 0:
        return (0,), at
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise ValueError(f"{count} message indexes")
    indexes = []
    for _ in range(count):
        index, at = _varint(value, at)
        if index < 0:
            raise ValueError(f"negative message index {index}")
        indexes.append(index)
    return tuple(indexes), at


def wire_value(schema_id: int, parsed_schema: Any, record: dict) -> bytes:
    """`record` as Avro in the wire format with writer schema `schema_id` (for producers and tests)."""
    from fastavro import schemaless_writer

    out = io.BytesIO()
    out.write(HEADER.pack(MAGIC, schema_id))
    schemaless_writer(out, parsed_schema, record)
    return out.getvalue()


def wire_protobuf(schema_id: int, message: Any, indexes: tuple[int, ...] = (0,)) -> bytes:
    """A protobuf `message` in the wire format with writer schema `schema_id`, its message selected by
    `indexes` in the schema's file (for producers and tests)."""
    head = b"\x00" if indexes == (0,) else _zigzag(len(indexes)) + b"".join(_zigzag(i) for i in indexes)
    return HEADER.pack(MAGIC, schema_id) + head + message.SerializeToString()


def wire_json(schema_id: int, document: Any) -> bytes:
    """A JSON document in the wire format with JSON Schema writer schema `schema_id`."""
    return HEADER.pack(MAGIC, schema_id) + json.dumps(document, separators=(",", ":")).encode()


def register_schema(registry: dict, subject: str, text: str, schema_type: str = "AVRO") -> int:
    """Register writer schema `text` (AVRO, PROTOBUF as .proto text, or JSON) under `subject` (or find it
    there); its id."""
    from confluent_kafka.schema_registry import Schema

    return registry_client(registry).register_schema(subject, Schema(text, schema_type))


def register_avro_schema(registry: dict, subject: str, text: str) -> int:
    """Register the Avro schema `text` under `subject` (or find it there); its id."""
    return register_schema(registry, subject, text, "AVRO")


def parse_schema(text: str) -> Any:
    """An Avro schema's JSON text, parsed for fastavro; raises ValueError for an invalid schema."""
    from fastavro import parse_schema as parse

    try:
        return parse(json.loads(text))
    except Exception as exc:  # noqa: BLE001 - fastavro raises several types for a bad schema
        raise ValueError(f"not an Avro schema: {exc}") from None


_CLIENTS: dict[tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def registry_client(registry: dict):
    """One confluent-kafka SchemaRegistryClient per process and registry settings (its HTTP connections
    and its own cache shared by every task of a Python worker)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = tuple(sorted(registry.items()))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = SchemaRegistryClient.new_client(dict(registry))
        return _CLIENTS[key]


# ------------------------------------------------------------------------------------ writer schemas

@dataclass
class WriterSchema:
    """One writer schema, parsed for decoding: `parsed` is fastavro's schema (AVRO), the JSON document
    (JSON) or a ProtoSchema (PROTOBUF); `text` is the Avro or JSON Schema source (None for Protobuf).
    The contract fields it translates to are computed on first use (`fields`)."""

    schema_id: int
    schema_type: str
    parsed: Any
    text: str | None = None
    _fields: dict[str | None, tuple[FieldSpec, ...]] = field(default_factory=dict)

    def fields(self, envelope: str | None = None) -> tuple[FieldSpec, ...]:
        """The contract fields of the schema's records (the `after` row of a change event with
        `envelope`); raises SchemaTranslationError."""
        if envelope not in self._fields:
            if self.schema_type == "PROTOBUF":
                record = schemas.proto_record(self.parsed.message((0,)))
            else:
                record = schemas.record_type(self.schema_type, self.source)
            self._fields[envelope] = schemas.row_fields(record, envelope)
        return self._fields[envelope]

    @property
    def source(self) -> str:
        """`text`, which every Avro and JSON Schema has (SchemaTranslationError for a schema without it)."""
        if self.text is None:
            raise SchemaTranslationError(f"writer schema {self.schema_id} ({self.schema_type}) has no schema text")
        return self.text


class ProtoSchema:
    """A Protobuf writer schema: its descriptor pool and file, and per message index path the message
    class and the function turning a message into a mapping of field name to value."""

    def __init__(self, pool, file_name: str):
        self.pool, self.file_name = pool, file_name
        self._messages: dict[tuple[int, ...], tuple[Any, Callable[[Any], dict]]] = {}

    def message(self, indexes: tuple[int, ...]):
        """The message descriptor `indexes` select; raises SchemaTranslationError when there is none."""
        return schemas.proto_message(self.pool, self.file_name, indexes)

    def reader(self, indexes: tuple[int, ...]) -> tuple[Any, Callable[[Any], dict]]:
        if indexes not in self._messages:
            from google.protobuf import message_factory

            descriptor = self.message(indexes)
            self._messages[indexes] = (message_factory.GetMessageClass(descriptor), _proto_reader(descriptor, {}))
        return self._messages[indexes]


def _proto_reader(descriptor, readers: dict) -> Callable[[Any], dict]:
    """A function turning a message of `descriptor` into {field name: value} (nested messages as dicts,
    repeated fields as lists, maps as dicts with text keys, enums by name, well-known types as Python
    values, fields without a value as None)."""
    if descriptor.full_name in readers:
        return lambda message: readers[descriptor.full_name](message)  # a recursive message type
    fields = []
    readers[descriptor.full_name] = None
    for fd in descriptor.fields:
        fields.append((fd.name, _proto_field(fd, readers)))

    def read(message) -> dict:
        return {name: get(message) for name, get in fields}

    readers[descriptor.full_name] = read
    return read


def _proto_field(fd, readers: dict) -> Callable[[Any], Any]:
    name = fd.name
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        convert = _proto_value(fd.message_type.fields_by_name["value"], readers)
        return lambda message: {str(k): convert(v) for k, v in getattr(message, name).items()}
    convert = _proto_value(fd, readers)
    if fd.is_repeated:
        return lambda message: [convert(v) for v in getattr(message, name)]
    if fd.has_presence:
        return lambda message: convert(getattr(message, name)) if message.HasField(name) else None
    return lambda message: convert(getattr(message, name))


def _proto_value(fd, readers: dict) -> Callable[[Any], Any]:
    if fd.type == 14:  # enum: by name; a number the schema does not know stays visible as its text
        names = {v.number: v.name for v in fd.enum_type.values}
        return lambda number: names.get(number, str(number))
    if fd.type not in (10, 11):
        return lambda v: v
    full_name = fd.message_type.full_name
    if full_name in schemas.PROTO_WRAPPERS:
        return lambda wrapper: wrapper.value
    if full_name == schemas.PROTO_TIMESTAMP:
        return _proto_timestamp
    if full_name == schemas.PROTO_DATE:
        return _proto_date
    return _proto_reader(fd.message_type, readers)


def _proto_timestamp(ts) -> datetime:
    try:
        return ts.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        raise Rejected("timestamp_out_of_range", f"google.protobuf.Timestamp {ts.seconds}s {ts.nanos}ns is not "
                                                 f"a time a table can hold") from None


def _proto_date(d) -> date:
    try:
        return date(d.year, d.month, d.day)
    except ValueError:
        raise Rejected("bad_date", f"google.type.Date {d.year}-{d.month}-{d.day} is not a date") from None


# A Protobuf writer schema the driver resolved from the registry travels to the tasks as a serialized
# FileDescriptorSet (its imports included), base64 after this first line; .proto source never starts with '#'.
DESCRIPTOR_SET = "#descriptor-set base64\n"


def _parse_declared(schema_type: str, text: str) -> Any:
    """A writer schema's text parsed for decoding; ValueError when it does not parse."""
    if schema_type == "AVRO":
        return parse_schema(text)
    if schema_type == "JSON":
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("a JSON Schema is an object")
        return document
    if text.startswith(DESCRIPTOR_SET):
        pool, name = schemas.proto_pool(base64.b64decode(text[len(DESCRIPTOR_SET):]))
    else:
        pool, name = schemas.proto_pool(schemas.compile_proto(text))
    return ProtoSchema(pool, name)


def _parsed(schema_id: int, parse: Callable[[], Any]) -> Any:
    """`parse()` of writer schema `schema_id`'s text: a text that does not parse (ValueError,
    SchemaTranslationError) is Rejected("unknown_schema"). Only the parsing goes through here, never a
    registry call, whose refusals (a ConfigurationError, so a ValueError too) must stop the job."""
    try:
        return parse()
    except (ValueError, SchemaTranslationError) as exc:
        raise Rejected("unknown_schema", f"writer schema {schema_id} does not parse: {str(exc)[:300]}") from None


def _asked(schema_id: int) -> str:
    """What a registry call asked for: a writer schema, or (id 0) the versions of the topic's subjects."""
    return f"writer schema {schema_id}" if schema_id else "the subjects' versions"


def _descriptor_set_text(pool, file_name: str) -> str:
    """The file `file_name` of `pool` and every file it imports, as DESCRIPTOR_SET text."""
    from google.protobuf import descriptor_pb2

    found = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(file) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        file.CopyToProto(found.file.add())

    add(pool.FindFileByName(file_name))
    return DESCRIPTOR_SET + base64.b64encode(found.SerializeToString()).decode("ascii")


class SchemaStore:
    """Writer schemas by id, each parsed once: the spec's (`source.schemas`: the folder's, and those the
    driver resolved), then a registry's when `registry` is set (the driver's store only).

    A task's store has no registry: an id it was not given raises SchemaUnknownError for the driver to
    resolve, unless `missing` (ids the driver found in no registry) holds it or `resolvable` is False
    (no registry is configured): then its records are dead letters (`unknown_schema`).
    """

    def __init__(self, declared: dict[int, tuple[str, str]] | None = None, registry: dict | None = None,
                 resolvable: bool = False, missing: frozenset[int] = frozenset()):
        if not declared and registry is None and not resolvable:
            raise errors.ConfigurationError(
                "a pipeline in a wire format (Avro, Protobuf, JSON Schema) needs its writer schemas: set "
                "source.schemas in the spec (a folder of <schema id>.avsc, .proto or .json files) or "
                "LAKEHOUSE_SCHEMA_REGISTRY_URL")
        self.declared = declared or {}
        self.registry = registry
        self.resolvable = resolvable and registry is None
        self.missing = missing
        self._found: dict[int, WriterSchema] = {}
        self._unknown: dict[int, str] = {}
        self._lock = threading.Lock()  # Spark's Python workers may run tasks in threads

    def get(self, schema_id: int, schema_type: str) -> WriterSchema:
        """Writer schema `schema_id`, which must be of `schema_type`. Raises Rejected("unknown_schema")
        when it is nowhere to be found, of another type, or does not parse; SchemaUnknownError when the
        driver may resolve it; SchemaRegistryUnavailableError when the registry does not answer,
        SchemaRegistryAccessError when it refuses the credentials."""
        with self._lock:
            found = self._found.get(schema_id)
            if found is None:
                if schema_id in self._unknown:
                    raise Rejected("unknown_schema", self._unknown[schema_id])
                try:
                    found = self._load(schema_id)
                except Rejected as rejected:
                    self._unknown[schema_id] = rejected.detail
                    raise
                self._found[schema_id] = found
        if found.schema_type != schema_type:
            raise Rejected("unknown_schema", f"writer schema {schema_id} is {found.schema_type}, not {schema_type}")
        return found

    def resolve(self, schema_id: int) -> WriterSchema:
        """Writer schema `schema_id` of whatever type, loaded (see `get` for what it raises)."""
        with self._lock:
            if schema_id not in self._found:
                self._found[schema_id] = self._load(schema_id)
            return self._found[schema_id]

    def parsed(self, schema_id: int, schema_type: str = "AVRO") -> Any:
        """The parsed form of writer schema `schema_id` (see WriterSchema.parsed and `get`)."""
        return self.get(schema_id, schema_type).parsed

    def shipped(self, schema_id: int) -> tuple[int, str, str]:
        """Writer schema `schema_id` as `SourceSpec.schemas` carries it to the tasks: (id, type, text)."""
        found = self._found[schema_id]
        if found.schema_type == "PROTOBUF":
            return schema_id, "PROTOBUF", found.text or _descriptor_set_text(found.parsed.pool,
                                                                             found.parsed.file_name)
        return schema_id, found.schema_type, found.source

    def _load(self, schema_id: int) -> WriterSchema:
        if schema_id in self.declared:
            schema_type, text = self.declared[schema_id]
            parsed = _parsed(schema_id, lambda: _parse_declared(schema_type, text))
            return WriterSchema(schema_id, schema_type, parsed,
                                None if schema_type == "PROTOBUF" and not text.startswith(DESCRIPTOR_SET) else text)
        if self.registry is not None:
            return self._from_registry(schema_id)
        if self.resolvable and schema_id not in self.missing:
            raise errors.SchemaUnknownError(f"writer schema {schema_id} was not shipped to the task; the driver "
                                            f"resolves it {errors.task_marker('schema-unknown', schema_id=schema_id)}")
        where = "nor in the schema registry" if self.resolvable else "and no schema registry is configured"
        raise Rejected("unknown_schema", f"writer schema {schema_id} is neither among the pipeline's source.schemas "
                                         f"({', '.join(map(str, sorted(self.declared))) or 'none'}) {where}")

    def _client(self):
        """The registry's client (ConfigurationError for a store without a registry: a task's)."""
        if self.registry is None:
            raise errors.ConfigurationError("no schema registry is configured: set LAKEHOUSE_SCHEMA_REGISTRY_URL")
        return registry_client(self.registry)

    def _from_registry(self, schema_id: int) -> WriterSchema:
        client = self._client()
        schema = self.ask(schema_id, lambda: client.get_schema(schema_id))
        schema_type = schema.schema_type or "AVRO"
        if schema_type == "PROTOBUF":
            serialized = self.ask(schema_id, lambda: client.get_schema(schema_id, fmt="serialized"))
            return WriterSchema(schema_id, schema_type, self._registry_proto(client, schema_id, serialized))
        if schema_type not in ("AVRO", "JSON"):
            raise Rejected("unknown_schema", f"writer schema {schema_id} is {schema_type}")
        parsed = _parsed(schema_id, lambda: _parse_declared(schema_type, schema.schema_str))
        return WriterSchema(schema_id, schema_type, parsed, schema.schema_str)

    def ask(self, schema_id: int, call: Callable[[], Any]) -> Any:
        """`call()` of the registry client: Rejected("unknown_schema") for a 404,
        SchemaRegistryUnavailableError when the registry does not answer or fails."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call()
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise Rejected("unknown_schema", f"writer schema {schema_id} is neither among the pipeline's "
                                                 f"source.schemas nor in the schema registry") from None
            raise self._refused(schema_id, exc) from None
        except Exception as exc:  # noqa: BLE001 - connection refused, timeouts, TLS: the registry is not there
            raise self._unavailable(schema_id, f"{type(exc).__name__}: {exc}") from None

    def _registry_proto(self, client, schema_id: int, schema) -> ProtoSchema:
        """A Protobuf schema from the registry: serialized descriptors (`format=serialized`) with imports
        resolved through the registry's references (confluent-kafka's own resolution), or, from a
        registry that keeps the .proto text only, that text compiled."""
        import binascii

        try:
            descriptor = confluent_kafka_internals.serialized_descriptor(f"writer_schema_{schema_id}.proto",
                                                                         schema.schema_str)
        except (binascii.Error, ValueError, Exception):  # noqa: BLE001 - not base64 descriptors: .proto text
            compiled = _parsed(schema_id, lambda: schemas.proto_pool(schemas.compile_proto(schema.schema_str)))
            return ProtoSchema(*compiled)
        pool = self.ask(schema_id, lambda: confluent_kafka_internals.pool_with_references(schema, client))
        _parsed(schema_id, lambda: pool.Add(descriptor))
        return ProtoSchema(pool, descriptor.name)

    def subject_versions(self, subject: str) -> list[int]:
        """The ids of every version of `subject` in the registry, oldest first ([] for an unknown subject),
        each loaded into the store. Raises SchemaRegistryUnavailableError when the registry does not answer."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        client = self._client()
        try:
            ids = [client.get_version(subject, version).schema_id for version in client.get_versions(subject)]
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return []
            raise self._refused(0, exc) from None
        except Exception as exc:  # noqa: BLE001 - connection refused, timeouts, TLS: the registry is not there
            raise self._unavailable(0, f"{type(exc).__name__}: {exc}") from None
        found = []
        for schema_id in ids:
            try:
                with self._lock:
                    if schema_id not in self._found:
                        self._found[schema_id] = self._load(schema_id)
                found.append(schema_id)
            except Rejected as exc:
                log.warning("writer schema %d of subject %s is left out: %s", schema_id, subject, exc)
        return sorted(found)

    def _refused(self, schema_id: int, exc) -> errors.LakehouseError:
        """A registry's error answer: credentials it refuses stop the job (SchemaRegistryAccessError),
        anything else is an outage the job retries."""
        why = f"HTTP {exc.http_status_code} {exc.error_message}"
        if exc.http_status_code in (401, 403):
            return errors.SchemaRegistryAccessError(
                f"the schema registry refused to give {_asked(schema_id)}: {why[:300]}. Check the credentials in "
                f"LAKEHOUSE_SCHEMA_REGISTRY_URL (https://USER:PASSWORD@host) or the Airflow connection "
                f"lakehouse_schema_registry, and that they may read the topic's subjects; nothing was read")
        return self._unavailable(schema_id, why)

    def _unavailable(self, schema_id: int, why: str) -> SchemaRegistryUnavailableError:
        return SchemaRegistryUnavailableError(
            f"the schema registry did not give {_asked(schema_id)}: {why[:300]} "
            f"{errors.task_marker('retryable', why='schema-registry-unavailable')}")


# ------------------------------------------------------------------------------------------ decoders

class WireDecoder:
    """Decodes one wire format's values (or keys: `what`) to mappings of field name to value.

    `gate(writer_schema)` is asked once per writer schema before its first record is decoded; it
    raises to stop the task, or returns a reason to dead-letter the schema's records with (a
    quarantined, incompatible schema), or None.
    """

    schema_type = ""
    malformed = ""

    def __init__(self, store: SchemaStore, gate: Callable[[WriterSchema], str | None] | None = None,
                 what: str = "value"):
        self.store = store
        self.gate = gate
        self.what = what
        self._admitted: dict[int, WriterSchema] = {}  # per decoder: no lock on the way of every record
        self._refused: dict[int, str] = {}

    def writer(self, value: bytes) -> tuple[WriterSchema, int]:
        """The writer schema of `value` (admitted by the gate) and where its payload starts."""
        if len(value) >= HEADER.size and value[0] == MAGIC:
            writer = self._admitted.get(int.from_bytes(value[1:HEADER.size], "big"))
            if writer is not None:
                return writer, HEADER.size
        schema_id, at = split_header(value, self.what)
        if schema_id in self._refused:
            raise Rejected("schema_incompatible", self._refused[schema_id])
        writer = self.store.get(schema_id, self.schema_type)
        refused = self.gate(writer) if self.gate is not None else None
        if refused is not None:
            self._refused[schema_id] = refused
            raise Rejected("schema_incompatible", refused)
        self._admitted[schema_id] = writer
        return writer, at

    def decode(self, value: bytes) -> dict:
        return self.decode_with_writer(value)[1]

    def decode_with_writer(self, value: bytes) -> tuple[WriterSchema, dict]:
        """(writer schema, record) of `value`; see `decode`."""
        writer, at = self.writer(value)
        try:
            record = self.read(writer, value, at)
        except Rejected:
            raise
        except Exception as exc:  # noqa: BLE001 - truncated, a bad union index, bad UTF-8, ...
            raise Rejected(self.malformed, f"{self.what} does not decode with writer schema {writer.schema_id}: "
                                           f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(record, dict):
            raise Rejected("not_an_object", f"writer schema {writer.schema_id} is not a record schema")
        return writer, record

    def read(self, writer: WriterSchema, value: bytes, at: int) -> Any:
        raise NotImplementedError

    def compile_row(self, writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
        """(the bytes each value of admitted writer schema `writer` starts with, its compiled row) for
        RecordValidator.check_row (see "compiled rows" below), or None when its values take the reference
        path only."""
        return None


_BUFFER_NAME = re.compile(r" from <_io\.BytesIO object at 0x[0-9a-fA-F]+>")


class AvroDecoder(WireDecoder):
    """Avro: fastavro reads the payload with the writer schema; every byte must belong to the record."""

    schema_type, malformed = "AVRO", "malformed_avro"

    def __init__(self, *args, **kwargs):
        from fastavro import schemaless_reader

        super().__init__(*args, **kwargs)
        self._read = schemaless_reader

    def read(self, writer: WriterSchema, value: bytes, at: int) -> Any:
        buffer = io.BytesIO(value)
        buffer.seek(at)
        try:
            record = self._read(buffer, writer.parsed, None)
        except EOFError as exc:  # fastavro names the buffer by its address: the detail would differ per read
            raise EOFError(_BUFFER_NAME.sub("", str(exc))) from None
        if buffer.tell() != len(value):
            raise Rejected("malformed_avro", f"{len(value) - buffer.tell()} bytes left over after the record "
                                             f"(writer schema {writer.schema_id})")
        return record

    def compile_row(self, writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
        try:
            return HEADER.pack(MAGIC, writer.schema_id), avro_row(writer, contract)
        except _Unsupported:
            return None
        except Exception:  # a bug here costs speed, never a record
            log.exception("the row of Avro writer schema %d did not compile; its records take the row plan",
                          writer.schema_id)
            return None


class ProtobufDecoder(WireDecoder):
    """Protobuf: the message indexes select the message class, protobuf parses it."""

    schema_type, malformed = "PROTOBUF", "malformed_protobuf"

    def read(self, writer: WriterSchema, value: bytes, at: int) -> Any:
        indexes, at = message_indexes(value, at)
        try:
            message_class, to_dict = writer.parsed.reader(indexes)
        except SchemaTranslationError as exc:
            raise Rejected("malformed_protobuf", f"{self.what}: {exc} (writer schema {writer.schema_id})") from None
        return to_dict(message_class.FromString(value[at:]))

    def compile_row(self, writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
        """The row of the schema's first message, for values whose message indexes are the single 0 byte."""
        try:
            return HEADER.pack(MAGIC, writer.schema_id) + b"\x00", proto_row(writer, contract)
        except (_Unsupported, SchemaTranslationError):
            return None
        except Exception:  # a bug here costs speed, never a record
            log.exception("the row of Protobuf writer schema %d did not compile; its records take the row plan",
                          writer.schema_id)
            return None


class JsonSchemaDecoder(WireDecoder):
    """JSON Schema: the payload is a JSON document, decoded as plain JSON values are."""

    schema_type, malformed = "JSON", "malformed_json"

    def __init__(self, *args, decimals: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.json = JsonDecoder(decimals)

    def read(self, writer: WriterSchema, value: bytes, at: int) -> Any:
        return self.json.decode(value[at:])

    def payload(self, value: bytes) -> bytes:
        """The JSON document of `value` once its header names an admitted writer schema (Rejected otherwise):
        what the JSON fast path decodes."""
        _, at = self.writer(value)
        return value[at:]


# ----------------------------------------------------------------------------------- compiled rows
#
# RecordValidator.check_row's fast path for Avro and Protobuf values. Per admitted writer schema, one
# function is generated from the writer schema and the contract: it reads a value (header included)
# straight into the contract row, a tuple in contract order with the values `check` gives, or returns
# None when it cannot vouch for the verdict: the record is rejected, or unusual in a way the reference
# might read differently (a varint past 63 bits, a negative length, a union or enum index out of range,
# a timestamp or date outside the contract's range, bytes missing or left over). None means "ask the
# reference", never "rejected". Straight-line generated code: per field, a function call would cost
# more than reading the field (tests/unit/ingest/test_wire_rows.py holds it to the reference's verdicts).
#
# The row reads the writer's fields as fastavro and the Protobuf reader above give them (every Avro field,
# in the contract or not, since the reference rejects a record any of whose fields does not decode; the
# Protobuf fields whose reading can reject: well-known types, messages that hold them) and checks each
# contract field inline where the writer's type lets a comparison stand in for the contract's check (a
# range, an enum, a length), with the contract's own check otherwise. Timestamps and dates go to epoch
# microseconds and days without the datetime in between.

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
        return namespace["row"]


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
    if f.type == "string" and kind in ("text", "proto_text") and f.pattern:
        # the field's check, once per value: up to 1024 short values that passed it (currency codes) are kept
        known = src.const(set())
        src.add(depth, f"if {var} not in {known}:", f"    {var} = {check}({var})",
                f"    if len({known}) < 1024 and len({var}) <= 64:", f"        {known}.add({var})")
        return len(src.lines) - before
    if f.type == "string" and kind in ("text", "proto_text"):
        if kind == "proto_text":
            conditions.append(f"type({var}) is str and ({var}.isascii() or {src.const(lone_surrogate)}({var}) is None)")
        if f.enum is not None:
            conditions.append(f"{var} in {src.const(frozenset(f.enum))}")
        if f.max_length is not None:
            conditions.append(f"len({var}) <= {f.max_length!r}")
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
    values = []
    for j, (f, check) in enumerate(zip(contract.fields, contract.checks, strict=True)):
        if f.name not in fields:
            if f.required:
                raise _Unsupported(f"{f.name} is required and the writer schema lacks it")
            values.append("None")
            continue
        var, kind, nullable = fields[f.name]
        if f.name in contract.quarantined:
            src.add(2, f"if {var} is not None:", "    return None")
            values.append("None")
            continue
        out = var
        if j == contract.key_index:  # the key compares the value as written
            out = f"c{j}"
            src.add(2, f"{out} = {var}")
        values.append(out)
        if nullable and f.required:
            src.add(2, f"if {out} is None:", "    return None")
        elif nullable:
            src.add(2, f"if {out} is not None:")
            if _convert(src, 3, out, f, src.const(check), kind) == 0:
                src.lines.pop()  # nothing to check: no `if`
            continue
        _convert(src, 2, out, f, src.const(check), kind)
    if contract.key_index is not None:
        var, kind, _ = fields.get(contract.fields[contract.key_index].name, ("None", None, True))
        expected = "key_text" if contract.key_of is None else f"{src.const(contract.key_of)}(key_text)"
        got = var if kind == "text" else f"str({var})"  # a str is its own str()
        src.add(2, "if key_text is not None:", f"    if {expected} != {got}:", "        return None")
    src.add(2, f"return ({''.join(v + ', ' for v in values)})")
    src.add(1, "except Exception:", "    return None")


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


def avro_row(writer: WriterSchema, contract: RowContract) -> Callable[[str | None, bytes], tuple | None]:
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
            _avro_varint(src, depth, "u")
            for index, branch in enumerate(branches):
                src.add(depth, f"{'if' if index == 0 else 'elif'} u == {index}:")
                _avro_read(src, depth + 1, branch, var, shortcut)
            src.add(depth, "else:", "    return None")
        src.add(depth, "if at != len(value):", "    return None")

    _compile_row(src, contract, read, fields)
    return src.function(f"avro row of writer schema {writer.schema_id}")


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


def proto_row(writer: WriterSchema, contract: RowContract) -> Callable[[str | None, bytes], tuple | None]:
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
                reads.append(f"{var} = {src.const(_proto_field(fd, {}))}(m)")
            if f is not None:
                fields[name] = (var, None, True)
            continue
        if f is None:
            if message is not None and message.full_name in (schemas.PROTO_TIMESTAMP, schemas.PROTO_DATE):
                reads.append(f"{var} = {src.const(_proto_field(fd, {}))}(m)")  # the reference rejects a bad one
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
            convert = _proto_timestamp if message.full_name == schemas.PROTO_TIMESTAMP else _proto_date
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


WIRE_DECODERS = {"avro": AvroDecoder, "protobuf": ProtobufDecoder, "json_schema": JsonSchemaDecoder}


def schema_store(spec: PipelineSpec | SchemaSource, registry: dict | None = None, resolvable: bool = False,
                 missing: frozenset[int] = frozenset()) -> SchemaStore:
    """The writer schemas of a pipeline in a wire format: the spec's own, then the `registry`'s (the
    driver's store). A task's store has no registry; `resolvable` says the driver has one (see
    SchemaStore). ConfigurationError when there are none at all."""
    declared = {schema_id: (schema_type, text) for schema_id, schema_type, text in spec.source.schemas}
    return SchemaStore(declared, registry, resolvable, missing)


def wire_decoder(fmt: str, spec: PipelineSpec, store: SchemaStore,
                 gate: Callable[[WriterSchema], str | None] | None = None, what: str = "value") -> WireDecoder:
    """The decoder of wire format `fmt` (one of FORMAT_SCHEMA_TYPES' keys) over `store`."""
    if fmt not in FORMAT_SCHEMA_TYPES:
        raise ValueError(f"{fmt!r} is not a wire format")
    if fmt == "json_schema":
        return JsonSchemaDecoder(store, gate, what, decimals=spec.contract.has_decimals)
    return WIRE_DECODERS[fmt](store, gate, what)


@dataclass(frozen=True)
class SchemaReport:
    """One writer schema of a pipeline, as `lakehouse schemas` shows it: where it is and whether the
    contract takes it (`verdict`: fits, evolves, incompatible or untranslatable, with `why`)."""

    schema_id: int
    schema_type: str
    where: str  # folder | registry
    verdict: str
    why: str = ""


def _subjects(spec: PipelineSpec | SchemaSource) -> list[str]:
    """The registry subjects of a pipeline's writer schemas under Confluent's default naming."""
    found = [f"{spec.source.topic}-value"]
    if spec.source.key_format in FORMAT_SCHEMA_TYPES:
        found.append(f"{spec.source.topic}-key")
    return found


def describe_schemas(spec: PipelineSpec, registry: dict | None) -> list[SchemaReport]:
    """Every writer schema of the pipeline (its folder's, and the registry subjects' versions when a registry
    is configured), each with what the contract makes of it. Raises SchemaRegistryUnavailableError."""
    store = schema_store(spec, registry)
    ids = sorted(store.declared)
    if registry is not None:
        ids = sorted({*ids, *(i for subject in _subjects(spec) for i in store.subject_versions(subject))})
    value_type = FORMAT_SCHEMA_TYPES.get(spec.source.value_format)
    found = []
    for schema_id in ids:
        writer = store.resolve(schema_id)
        where = "folder" if schema_id in store.declared else "registry"
        if writer.schema_type != value_type:
            found.append(SchemaReport(schema_id, writer.schema_type, where, "key", "a key schema (or another format)"))
            continue
        try:
            fields = writer.fields(spec.source.envelope)
        except SchemaTranslationError as exc:
            found.append(SchemaReport(schema_id, writer.schema_type, where, "untranslatable", str(exc)))
            continue
        if spec.contract.from_writer_schema:
            diff = schemas.compare(spec.contract.fields, fields)
            if diff.incompatible:
                verdict, why = "incompatible", "; ".join(diff.incompatible)
            elif diff.evolves:
                verdict, why = "evolves", diff.changes()
            else:
                verdict, why = "fits", ""
        else:
            conflicts = schemas.conflicts(spec.contract.fields, fields)
            verdict, why = ("incompatible", "; ".join(conflicts)) if conflicts else ("fits", "")
        found.append(SchemaReport(schema_id, writer.schema_type, where, verdict, why))
    return found


_EXTENSIONS = {"AVRO": ".avsc", "PROTOBUF": ".proto", "JSON": ".json"}


def pull_schemas(spec: PipelineSpec | SchemaSource, registry: dict) -> list[tuple[int, str, str]]:
    """Write every version of the pipeline's registry subjects that its `source.schemas` folder lacks into
    the folder (`<id>.avsc`, `.proto`, `.json`); (id, type, path) of each file written. `spec` may be a
    SchemaSource, the source section of a spec that does not load until its folder holds schemas. A
    Protobuf schema the registry keeps only as descriptors is left out (logged). Raises
    ConfigurationError without a folder, SchemaRegistryUnavailableError when the registry does not answer."""
    from pathlib import Path

    if spec.source.schemas_dir is None:
        raise errors.ConfigurationError(f"{spec.path}: source.schemas names no folder to pull the writer schemas "
                                        f"into; add e.g. `schemas: schemas` under source")
    folder = Path(spec.source.schemas_dir)
    folder.mkdir(parents=True, exist_ok=True)
    store = schema_store(spec, registry)
    client = registry_client(registry)
    written = []
    for subject in _subjects(spec):
        for schema_id in store.subject_versions(subject):
            if schema_id in store.declared:
                continue
            schema = store.ask(schema_id, partial(client.get_schema, schema_id))
            schema_type = schema.schema_type or "AVRO"
            if schema_type == "PROTOBUF":
                try:
                    schemas.compile_proto(schema.schema_str)
                except SchemaTranslationError:
                    log.warning("writer schema %d is kept as descriptors in the registry, not .proto text; not "
                                "pulled (the ingest job fetches it when it meets it)", schema_id)
                    continue
            path = folder / f"{schema_id}{_EXTENSIONS[schema_type]}"
            path.write_text(schema.schema_str, encoding="utf-8")
            written.append((schema_id, schema_type, str(path)))
    return written
