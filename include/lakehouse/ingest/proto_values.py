"""A Protobuf message as a mapping of field name to Python value, the way the wire-format decoders give
records to the contract checks (lakehouse.ingest.checks): nested messages as dicts, repeated fields as lists,
maps as dicts with text keys, enums by name, well-known types (wrappers, google.protobuf.Timestamp,
google.type.Date) as Python values. A writer schema's message reader is made once (ProtoSchema.reader,
lakehouse.ingest.schema_store); the compiled rows (lakehouse.ingest.compiled_rows) reuse its field readers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

from lakehouse.core import schemas
from lakehouse.ingest.rejects import Rejected


def proto_reader(descriptor, readers: dict) -> Callable[[Any], dict]:
    """A function turning a message of `descriptor` into {field name: value} (nested messages as dicts,
    repeated fields as lists, maps as dicts with text keys, enums by name, well-known types as Python
    values, fields without a value as None)."""
    if descriptor.full_name in readers:
        return lambda message: readers[descriptor.full_name](message)  # a recursive message type
    fields = []
    readers[descriptor.full_name] = None
    for fd in descriptor.fields:
        fields.append((fd.name, proto_field(fd, readers)))

    def read(message) -> dict:
        return {name: get(message) for name, get in fields}

    readers[descriptor.full_name] = read
    return read


def proto_field(fd, readers: dict) -> Callable[[Any], Any]:
    """A function reading field `fd` of a message as `proto_reader` gives it (`readers`: the message readers made
    so far, by full name, for recursive message types)."""
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
        return proto_timestamp
    if full_name == schemas.PROTO_DATE:
        return proto_date
    return proto_reader(fd.message_type, readers)


def proto_timestamp(ts) -> datetime:
    """A google.protobuf.Timestamp as an aware datetime; Rejected("timestamp_out_of_range") outside its range."""
    try:
        when: datetime = ts.ToDatetime(tzinfo=UTC)
        return when
    except (ValueError, OverflowError, OSError):
        raise Rejected("timestamp_out_of_range", f"google.protobuf.Timestamp {ts.seconds}s {ts.nanos}ns is not "
                                                 f"a time a table can hold") from None


def proto_date(d) -> date:
    """A google.type.Date as a date; Rejected("bad_date") for one that is no date."""
    try:
        return date(d.year, d.month, d.day)
    except ValueError:
        raise Rejected("bad_date", f"google.type.Date {d.year}-{d.month}-{d.day} is not a date") from None
