"""confluent-kafka's internals the Protobuf wire format relies on, and the only module that touches them
(confluent-kafka 2.16.1).

A Protobuf writer schema from the schema registry comes as serialized descriptors whose imports are other
subjects (the schema's references). confluent-kafka's ProtobufDeserializer resolves them with helpers it keeps
private: `_str_to_proto` (the registry's base64 descriptor text to a FileDescriptorProto), `_init_pool` (a
descriptor pool with the well-known types) and `_resolve_named_schema` (each reference fetched from the
registry and added to the pool, depth first). The product decodes with its own reader, so it calls them the
way the deserializer does. tests/test_adapters.py pins the version and their signatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf.descriptor_pb2 import FileDescriptorProto
    from google.protobuf.descriptor_pool import DescriptorPool

WRITTEN_AGAINST = ("confluent-kafka", "2.16.1")
INTERNALS = frozenset({"_str_to_proto", "_init_pool", "_resolve_named_schema"})


def serialized_descriptor(name: str, schema_str: str) -> FileDescriptorProto:
    """The FileDescriptorProto named `name` of a registry schema's text in the serialized form (base64); raises
    (confluent-kafka's SerializationError, binascii.Error) when the text is not that form (e.g. .proto text)."""
    from confluent_kafka.schema_registry.common.protobuf import _str_to_proto

    return _str_to_proto(name, schema_str)


def pool_with_references(schema: Any, client: Any) -> DescriptorPool:
    """A descriptor pool holding the well-known types and every schema `schema` references, resolved through
    the registry `client` (a SchemaRegistryClient); raises the client's SchemaRegistryError."""
    from confluent_kafka.schema_registry._sync.protobuf import _resolve_named_schema
    from confluent_kafka.schema_registry.common.protobuf import _init_pool
    from google.protobuf.descriptor_pool import DescriptorPool

    pool = DescriptorPool()
    _init_pool(pool)
    _resolve_named_schema(schema, client, pool)
    return pool
