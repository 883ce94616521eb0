"""Record formats besides JSON: Avro in the Confluent wire format, writer schemas by id.

A value is one magic byte 0, the writer schema's id (4 bytes, big-endian) and the Avro binary
encoding of one record, as Confluent's serializers (and the Iceberg Kafka Connect sink's
converters) write it. `AvroDecoder` turns it into a mapping of field name to value for the
contract checks (lakehouse.ingest.records); Avro's logical types arrive as Python values
(timestamp-millis/micros as aware datetimes, date as dates), which the checks accept.

Writer schemas come from a `SchemaStore`, once per id and process (a Spark task keeps its own):
from the folder beside the spec that `source.schemas` names (`<id>.avsc` files, read with the spec and
shipped to the tasks with it; for air-gapped use and the embedded stack) or from a Confluent-compatible registry (LAKEHOUSE_SCHEMA_REGISTRY_URL). What
each failure becomes:

    value without the wire format's header      dead letter `bad_wire_format`
    a schema id the folder or registry lacks     dead letter `unknown_schema`
    bytes that do not decode with that schema    dead letter `malformed_avro`
    a registry that does not answer              SchemaRegistryUnavailableError: the batch is
                                                 retried, then the job stops; nothing is dead-lettered
"""

from __future__ import annotations

import io
import json
import struct
import threading
from typing import Any

from lakehouse.core import errors
from lakehouse.core.errors import SchemaRegistryUnavailableError
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.records import Rejected

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id


def wire_value(schema_id: int, parsed_schema: Any, record: dict) -> bytes:
    """`record` in the Confluent wire format with writer schema `schema_id` (for producers and tests)."""
    from fastavro import schemaless_writer

    out = io.BytesIO()
    out.write(HEADER.pack(MAGIC, schema_id))
    schemaless_writer(out, parsed_schema, record)
    return out.getvalue()


def register_avro_schema(registry: dict, subject: str, text: str) -> int:
    """Register the Avro schema `text` under `subject` (or find it there); its id."""
    from confluent_kafka.schema_registry import Schema

    return registry_client(registry).register_schema(subject, Schema(text, "AVRO"))


def parse_schema(text: str, *references: Any) -> Any:
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


# schema type -> a function parsing a writer schema's text (ValueError when it is not one); the wire
# formats' decoders below add theirs
SCHEMA_PARSERS: dict[str, Any] = {"AVRO": parse_schema}


class SchemaStore:
    """Writer schemas by id, from the spec (`source.schemas`, read from its folder) or a registry, each
    parsed once."""

    def __init__(self, declared: dict[int, tuple[str, str]] | None = None, registry: dict | None = None):
        if not declared and registry is None:
            raise errors.ConfigurationError(
                "a pipeline in a wire format (Avro, Protobuf, JSON Schema) needs its writer schemas: set "
                "source.schemas in the spec (a folder of <schema id>.avsc, .proto or .json files) or "
                "LAKEHOUSE_SCHEMA_REGISTRY_URL")
        self.declared = declared or None
        self.registry = registry
        self._parsed: dict[tuple[int, str], Any] = {}
        self._unknown: dict[tuple[int, str], str] = {}

    def parsed(self, schema_id: int, schema_type: str = "AVRO") -> Any:
        """The writer schema `schema_id`, parsed as a `schema_type` schema (SCHEMA_PARSERS); raises
        Rejected("unknown_schema") when the folder or the registry has none, or one of another type or
        one that does not parse, SchemaRegistryUnavailableError when the registry does not answer."""
        found = self._parsed.get((schema_id, schema_type))
        if found is not None:
            return found
        if (schema_id, schema_type) in self._unknown:
            raise Rejected("unknown_schema", self._unknown[schema_id, schema_type])
        try:
            kind, text, references = self._declared(schema_id) if self.declared else self._from_registry(schema_id)
            if kind != schema_type:
                raise Rejected("unknown_schema", f"writer schema {schema_id} is {kind}, not {schema_type}")
            parsed = SCHEMA_PARSERS[schema_type](text, *references)
        except Rejected as rejected:
            self._unknown[schema_id, schema_type] = rejected.detail
            raise
        except ValueError as exc:
            self._unknown[schema_id, schema_type] = f"writer schema {schema_id}: {exc}"
            raise Rejected("unknown_schema", self._unknown[schema_id, schema_type]) from None
        self._parsed[schema_id, schema_type] = parsed
        return parsed

    def _declared(self, schema_id: int) -> tuple[str, str, tuple]:
        try:
            return (*self.declared[schema_id], ())
        except KeyError:
            raise Rejected("unknown_schema", f"writer schema {schema_id} is not among the pipeline's "
                                             f"source.schemas ({', '.join(map(str, sorted(self.declared)))})") from None

    def _from_registry(self, schema_id: int) -> tuple[str, str, tuple]:
        """(schema type, text, references) of `schema_id` in the registry; references are the
        confluent-kafka Schema's (name, subject, version), for Protobuf imports."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = registry_client(self.registry).get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise Rejected("unknown_schema", f"the schema registry has no schema {schema_id}") from None
            raise self._unavailable(schema_id, f"HTTP {exc.http_status_code} {exc.error_message}") from None
        except Exception as exc:  # noqa: BLE001 - connection refused, timeouts, TLS: the registry is not there
            raise self._unavailable(schema_id, f"{type(exc).__name__}: {exc}") from None
        return schema.schema_type or "AVRO", schema.schema_str, ()

    def _unavailable(self, schema_id: int, why: str) -> SchemaRegistryUnavailableError:
        return SchemaRegistryUnavailableError(
            f"the schema registry did not give writer schema {schema_id}: {why[:300]} "
            f"{errors.task_marker('retryable', why='schema-registry-unavailable')}")


class AvroDecoder:
    """Confluent wire-format Avro values to mappings of field name to value."""

    def __init__(self, schemas: SchemaStore):
        from fastavro import schemaless_reader

        self.schemas = schemas
        self._read = schemaless_reader

    def decode(self, value: bytes) -> dict:
        if len(value) < HEADER.size or value[0] != MAGIC:
            raise Rejected("bad_wire_format", "value does not start with the wire format's magic byte 0 and a "
                                              "4-byte schema id (not Avro from a Confluent-compatible serializer)")
        schema_id = int.from_bytes(value[1:HEADER.size], "big")
        parsed = self.schemas.parsed(schema_id, "AVRO")
        buffer = io.BytesIO(value)
        buffer.seek(HEADER.size)
        try:
            record = self._read(buffer, parsed, None)
        except Exception as exc:  # noqa: BLE001 - truncated, a bad union index, bad UTF-8, ...
            raise Rejected("malformed_avro", f"does not decode with writer schema {schema_id}: "
                                             f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if buffer.tell() != len(value):
            raise Rejected("malformed_avro", f"{len(value) - buffer.tell()} bytes left over after the record "
                                             f"(writer schema {schema_id})")
        if not isinstance(record, dict):
            raise Rejected("not_an_object", f"writer schema {schema_id} is not a record schema")
        return record


def schema_store(spec: PipelineSpec, registry: dict | None) -> SchemaStore:
    """The writer schemas of a pipeline in a wire format: the spec's own, else the registry's
    (ConfigurationError when it has neither)."""
    declared = {schema_id: (schema_type, text) for schema_id, schema_type, text in spec.source.schemas}
    return SchemaStore(declared, None if declared else registry)


def avro_decoder(spec: PipelineSpec, registry: dict | None) -> AvroDecoder:
    return AvroDecoder(schema_store(spec, registry))
