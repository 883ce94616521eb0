"""Writer schemas by id, each parsed once per id and process: `SchemaStore`, and the schema registry's client.

A pipeline in a wire format (lakehouse.ingest.wire) names its writer schemas by id. They come from the folder
beside the spec that `source.schemas` names (`<id>.avsc`, `<id>.proto`, `<id>.json`, read with the spec; for
air-gapped use and the embedded stack) and a Confluent-compatible registry (LAKEHOUSE_SCHEMA_REGISTRY_URL).
Only the driver talks to the registry: it fetches the subjects' versions when the job starts, and an id a task
meets that it was not given stops the task with a `schema-unknown` marker, the driver fetches it and writes the
batch again. Tasks get every writer schema with the spec (`SourceSpec.schemas`), so executors need neither the
registry's address nor its credentials. A schema id the folder and registry lack, or a schema that does not
parse, is Rejected("unknown_schema"); a registry that does not answer is SchemaRegistryUnavailableError (the
batch is retried, then the job stops; nothing is dead-lettered), one that refuses the credentials
SchemaRegistryAccessError.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lakehouse.core import errors, schemas
from lakehouse.core.adapters import confluent_kafka_internals
from lakehouse.core.errors import SchemaRegistryUnavailableError, SchemaTranslationError
from lakehouse.core.spec import FieldSpec, PipelineSpec, SchemaSource
from lakehouse.ingest.proto_values import proto_reader
from lakehouse.ingest.rejects import Rejected

log = logging.getLogger("lakehouse.ingest.schema_store")


# ------------------------------------------------------------------------------------ the registry's client

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


def register_schema(registry: dict, subject: str, text: str, schema_type: str = "AVRO") -> int:
    """Register writer schema `text` (AVRO, PROTOBUF as .proto text, or JSON) under `subject` (or find it
    there); its id."""
    from confluent_kafka.schema_registry import Schema

    schema_id: int = registry_client(registry).register_schema(subject, Schema(text, schema_type))
    return schema_id


def register_avro_schema(registry: dict, subject: str, text: str) -> int:
    """Register the Avro schema `text` under `subject` (or find it there); its id."""
    return register_schema(registry, subject, text, "AVRO")


# ------------------------------------------------------------------------------------ writer schemas

def parse_schema(text: str) -> Any:
    """An Avro schema's JSON text, parsed for fastavro; raises ValueError for an invalid schema."""
    from fastavro import parse_schema as parse

    try:
        return parse(json.loads(text))
    except Exception as exc:  # noqa: BLE001 - fastavro raises several types for a bad schema
        raise ValueError(f"not an Avro schema: {exc}") from None


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
            self._messages[indexes] = (message_factory.GetMessageClass(descriptor), proto_reader(descriptor, {}))
        return self._messages[indexes]


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


def schema_store(spec: PipelineSpec | SchemaSource, registry: dict | None = None, resolvable: bool = False,
                 missing: frozenset[int] = frozenset()) -> SchemaStore:
    """The writer schemas of a pipeline in a wire format: the spec's own, then the `registry`'s (the
    driver's store). A task's store has no registry; `resolvable` says the driver has one (see
    SchemaStore). ConfigurationError when there are none at all."""
    declared = {schema_id: (schema_type, text) for schema_id, schema_type, text in spec.source.schemas}
    return SchemaStore(declared, registry, resolvable, missing)
