"""The wire formats' decoders: Avro, Protobuf and JSON Schema values (or record keys) in the Confluent wire
format (lakehouse.ingest.wire), each decoded with its writer schema (lakehouse.ingest.schema_store) into a
mapping of field name to Python value for the contract checks (lakehouse.ingest.checks): Avro's logical types
and Protobuf's well-known types arrive as datetimes, dates, Decimals and UUIDs, which the checks accept. What
each failure becomes:

    value without the wire format's header      dead letter `bad_wire_format`
    a schema id the folder and registry lack     dead letter `unknown_schema`
    a payload that does not decode with it       dead letter `malformed_avro` / `malformed_protobuf` /
                                                 `malformed_json`
    a registry that does not answer              SchemaRegistryUnavailableError: the batch is
                                                 retried, then the job stops; nothing is dead-lettered

Before the first record of a writer schema is decoded, a `SchemaGate` (lakehouse.ingest.writer_schemas) is
asked whether the contract takes it: a new compatible schema of a contract that follows the writer
schemas stops the task so the driver evolves the table first (lakehouse.ingest.job), an incompatible
one follows `schema_policy`. Avro and Protobuf decoders also give each admitted writer schema's compiled row
(lakehouse.ingest.compiled_rows), RecordValidator.check_row's fast path.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

from lakehouse.core.errors import SchemaTranslationError
from lakehouse.core.spec import FORMAT_SCHEMA_TYPES, PipelineSpec
from lakehouse.ingest import compiled_rows
from lakehouse.ingest.compiled_rows import RowContract
from lakehouse.ingest.json_decode import JsonDecoder
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.schema_store import SchemaStore, WriterSchema
from lakehouse.ingest.wire import HEADER, MAGIC, message_indexes, split_header


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
        RecordValidator.check_row (lakehouse.ingest.compiled_rows), or None when its values take the reference
        path only."""
        return None

    def compile_change(self, writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
        """`compile_row` for a change stream's values (Debezium envelopes): a compiled change for
        RecordValidator.check_change, or None."""
        return None

    def compile_record(self, writer: WriterSchema) -> tuple[bytes, Callable] | None:
        """`compile_row` for a change stream's keys: (the bytes each value starts with, a function giving the
        record a value decodes to, or None where it cannot vouch for it), or None."""
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
        return compiled_rows.avro_row(writer, contract)

    def compile_change(self, writer: WriterSchema, contract: RowContract) -> tuple[bytes, Callable] | None:
        return compiled_rows.avro_change(writer, contract)

    def compile_record(self, writer: WriterSchema) -> tuple[bytes, Callable] | None:
        return compiled_rows.avro_record(writer)


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
        return compiled_rows.proto_row(writer, contract)


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


WIRE_DECODERS = {"avro": AvroDecoder, "protobuf": ProtobufDecoder, "json_schema": JsonSchemaDecoder}


def wire_decoder(fmt: str, spec: PipelineSpec, store: SchemaStore,
                 gate: Callable[[WriterSchema], str | None] | None = None, what: str = "value") -> WireDecoder:
    """The decoder of wire format `fmt` (one of FORMAT_SCHEMA_TYPES' keys) over `store`."""
    if fmt not in FORMAT_SCHEMA_TYPES:
        raise ValueError(f"{fmt!r} is not a wire format")
    if fmt == "json_schema":
        return JsonSchemaDecoder(store, gate, what, decimals=spec.contract.has_decimals)
    decoder: WireDecoder = WIRE_DECODERS[fmt](store, gate, what)
    return decoder
