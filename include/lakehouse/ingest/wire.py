"""The Confluent wire format: a value (or a record key) is one magic byte 0, the writer schema's id (4 bytes,
big-endian) and the payload, as Confluent's serializers (and the Iceberg Kafka Connect sink's converters) write
it; Protobuf payloads start with the message indexes that select the message in the schema's file (zig-zag
varints; a single 0 for the first message). Reading the header and the message indexes, and writing values in
the format (for producers and tests). The payload's decoders are lakehouse.ingest.wire_decoders'.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

from lakehouse.ingest.rejects import Rejected

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id
MAX_MESSAGE_INDEXES = 64  # nesting of the selected message in a .proto file; more is a corrupt payload


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
    `indexes` in the schema's file (for producers and tests). Map entries are written in key order
    (`deterministic`), so the same message is the same bytes in every process."""
    head = b"\x00" if indexes == (0,) else _zigzag(len(indexes)) + b"".join(_zigzag(i) for i in indexes)
    body: bytes = message.SerializeToString(deterministic=True)
    return HEADER.pack(MAGIC, schema_id) + head + body


def wire_json(schema_id: int, document: Any) -> bytes:
    """A JSON document in the wire format with JSON Schema writer schema `schema_id`."""
    return HEADER.pack(MAGIC, schema_id) + json.dumps(document, separators=(",", ":")).encode()
