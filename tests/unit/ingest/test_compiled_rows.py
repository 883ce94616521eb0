"""Avro and Protobuf values take a compiled row: an optimisation, never a second opinion.

`RecordValidator.check_row` reads an Avro or Protobuf value through a function compiled per writer schema
(lakehouse.ingest.compiled_rows) and gives exactly what the reference `RecordValidator.check`
gives: the same row values, down to their types and float bits, or the same rejection kind and detail.
The values here are written byte by byte, so that they can be anything a producer could send: valid
records, values of the wrong range, broken UTF-8, varints past 64 bits, union and enum indexes out of
range, truncated and padded payloads, unknown schema ids.
"""

from __future__ import annotations

import json
import struct
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.ingest.checks import MAX_TIMESTAMP_US, MIN_TIMESTAMP_US
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.schema_store import DESCRIPTOR_SET, parse_schema
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.wire import wire_value

FIELDS = [
    {"name": "order_id", "type": "string", "required": True, "max_length": 12},
    {"name": "label", "type": "string", "max_length": 5},
    {"name": "currency", "type": "string", "required": True, "pattern": "^[A-Z]{3}$"},
    {"name": "status", "type": "string", "enum": ["created", "paid", "shipped"]},
    {"name": "kind", "type": "string", "enum": ["a", "b"]},
    {"name": "qty", "type": "int", "required": True, "min": 1, "max": 1000},
    {"name": "serial", "type": "long"},
    {"name": "small", "type": "int"},
    {"name": "grade", "type": "long", "enum": [1, 2, 3]},
    {"name": "price", "type": "double", "min": 0},
    {"name": "ratio", "type": "float"},
    {"name": "flag", "type": "boolean"},
    {"name": "blob", "type": "binary"},
    {"name": "at_us", "type": "timestamp", "required": True},
    {"name": "at_ms", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "ref", "type": "uuid"},
    {"name": "cost", "type": "decimal(9,2)"},
    {"name": "note", "type": "string"},
    {"name": "code", "type": "long"},
]
TIMESTAMP_MICROS = {"type": "long", "logicalType": "timestamp-micros"}
TIMESTAMP_MILLIS = {"type": "long", "logicalType": "timestamp-millis"}
# every contract field, the order shuffled, with fields the contract does not have between them
AVRO_FIELDS = [
    ("currency", "string"), ("order_id", "string"), ("label", "string"),
    ("status", {"type": "enum", "name": "Status", "symbols": ["created", "paid", "shipped"]}),
    ("kind", "string"), ("extra_text", "string"), ("qty", "int"), ("serial", "long"), ("small", "int"),
    ("grade", "int"), ("price", "double"), ("ratio", "float"), ("flag", "boolean"), ("blob", "bytes"),
    ("at_us", TIMESTAMP_MICROS), ("at_ms", ["null", TIMESTAMP_MILLIS]), ("extra_at", TIMESTAMP_MILLIS),
    ("day", {"type": "int", "logicalType": "date"}), ("ref", {"type": "string", "logicalType": "uuid"}),
    ("cost", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}),
    ("note", ["null", "string"]), ("code", ["long", "null"]), ("fixed4", {"type": "fixed", "name": "F4", "size": 4}),
]
SCHEMA_1 = {"type": "record", "name": "Item", "namespace": "shop",
            "fields": [{"name": name, "type": kind} for name, kind in AVRO_FIELDS]}
# the same record read with an older writer: fewer fields, `status` a string, `qty` nullable
SCHEMA_2 = {"type": "record", "name": "Item", "namespace": "shop",
            "fields": [{"name": "order_id", "type": "string"}, {"name": "currency", "type": "string"},
                       {"name": "status", "type": ["null", "string"]}, {"name": "qty", "type": ["null", "int"]},
                       {"name": "at_us", "type": TIMESTAMP_MICROS}]}
UNKNOWN_SCHEMA = 77


@pytest.fixture(scope="module")
def avro_validator(tmp_path_factory):
    return _validator(tmp_path_factory.mktemp("avro"), "avro", {"1.avsc": json.dumps(SCHEMA_1),
                                                               "2.avsc": json.dumps(SCHEMA_2)}, FIELDS)


def _validator(folder, fmt, files, fields):
    """A RecordValidator of a pipeline in `fmt` with contract `fields` and writer schemas `files`."""
    import yaml

    from lakehouse.core.config import REPO_ROOT
    from lakehouse.core.spec import load_spec

    schemas = folder / "schemas"
    schemas.mkdir()
    for name, text in files.items():
        (schemas / name).write_text(text)
    raw = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "orders.yaml").read_text())
    raw["source"].update(value_format=fmt, schemas="schemas", key={"field": "order_id", "required": False})
    raw["contract"] = {"fields": fields}
    raw["target"]["partition_by"] = []
    raw["schema_policy"] = {"on_additive": "evolve", "on_incompatible": "quarantine"}
    path = folder / "items.yaml"
    path.write_text(yaml.safe_dump(raw))
    return RecordValidator(load_spec(path))


def outcome(validator: RecordValidator, check, key: bytes | None, value: bytes | None) -> tuple:
    """What one path makes of a record: its typed values (type and repr, so -0.0 is not 0.0), or the
    rejection's kind and detail."""
    try:
        row = check(validator.check_key(key), value)
    except Rejected as rejected:
        return ("rejected", rejected.kind, rejected.detail)
    values = [row[name] for name in validator.names] if isinstance(row, dict) else list(row)
    return ("row", [(type(v).__name__, repr(v)) for v in values])


def assert_same_verdict(validator: RecordValidator, key: bytes | None, value: bytes) -> tuple:
    fast = outcome(validator, validator.check_row, key, value)
    assert fast == outcome(validator, validator.check, key, value), (key, value)
    return fast


# ------------------------------------------------------------------------------- Avro, byte by byte

def varint(n: int) -> bytes:
    """`n` as Avro writes a long (zig-zag, then 7 bits a byte), for any size of `n`."""
    n = 2 * n if n >= 0 else -2 * n - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def text(value: str | bytes) -> bytes:
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return varint(len(data)) + data


EDGES = [0, 1, -1, 63, 64, -64, -65, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**62 - 1, 2**62, -2**62, -2**62 - 1,
         2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**64, 2**70]
longs = st.one_of(st.integers(-3, 1100), st.sampled_from(EDGES), st.integers(-2**63, 2**63 - 1),
                  st.integers(-2**72, 2**72)).map(varint)
texts = st.one_of(st.sampled_from(["ord-1", "ord-2", "EUR", "eur", "USD1", "paid", "lost", "a", "b", "new", "",
                                   "toolong", "é", "€€€", "ab\x00"]),
                  st.text(max_size=14), st.binary(max_size=6)).map(text)
broken_lengths = st.tuples(st.integers(-3, 30), st.binary(max_size=5)).map(lambda t: varint(t[0]) + t[1])
strings = st.one_of(texts, texts, texts, broken_lengths)
instants = st.one_of(st.integers(-2**40, 2**53), st.integers(MIN_TIMESTAMP_US - 2, MIN_TIMESTAMP_US + 2),
                     st.integers(MAX_TIMESTAMP_US - 2, MAX_TIMESTAMP_US + 2),
                     st.integers(MIN_TIMESTAMP_US // 1000 - 2, MIN_TIMESTAMP_US // 1000 + 2),
                     st.integers(MAX_TIMESTAMP_US // 1000 - 2, MAX_TIMESTAMP_US // 1000 + 2)).map(varint)
MIN_DAYS, MAX_DAYS = (date.min - date(1970, 1, 1)).days, (date.max - date(1970, 1, 1)).days
days = st.one_of(st.integers(-1000, 30000), st.sampled_from([MIN_DAYS - 1, MIN_DAYS, MAX_DAYS, MAX_DAYS + 1]),
                 st.integers(-2**40, 2**40)).map(varint)
uuids = st.one_of(st.uuids().map(str), st.sampled_from(["not-a-uuid", str(uuid.UUID(int=0)).upper()]),
                  st.text(max_size=36)).map(text)
decimals = st.one_of(st.integers(-10**9, 10**9).map(lambda n: n.to_bytes(8, "big", signed=True)),
                     st.binary(max_size=10)).map(text)


def union(index: int, branch: st.SearchStrategy) -> st.SearchStrategy:
    """A union value: its branch `index` with `branch`'s bytes, null's (no bytes), or an index out of range."""
    return st.one_of(branch.map(lambda b: varint(index) + b), st.just(varint(1 - index)),
                     st.sampled_from([varint(2), varint(-1)]))


AVRO_VALUES = {
    "string": strings, "int": longs, "long": longs, "boolean": st.sampled_from([b"\x00", b"\x01", b"\x02", b"\xff"]),
    "double": st.one_of(st.floats(), st.sampled_from([-0.0, 1e300, 5e-324])).map(lambda x: struct.pack("<d", x)),
    "float": st.floats(width=32).map(lambda x: struct.pack("<f", x)), "bytes": st.binary(max_size=6).map(text),
}


def avro_field(kind) -> st.SearchStrategy:
    if isinstance(kind, list):
        index = kind.index("null")
        return union(1 - index, avro_field(kind[1 - index]))
    if isinstance(kind, str):
        return AVRO_VALUES[kind]
    logical = kind.get("logicalType")
    if logical in ("timestamp-micros", "timestamp-millis"):
        return instants
    if logical in ("date", "uuid", "decimal"):
        return {"date": days, "uuid": uuids, "decimal": decimals}[logical]
    return {"enum": st.integers(-2, 4).map(varint), "fixed": st.binary(min_size=4, max_size=4)}[kind["type"]]


def payload(schema: dict) -> st.SearchStrategy:
    """Payloads of `schema`: a valid record with up to three fields written any way, or every field so."""
    good = {f["name"]: avro_field_bytes(f) for f in schema["fields"]}

    def written(bad: list[str]) -> st.SearchStrategy:
        return st.tuples(*(avro_field(f["type"]) if f["name"] in bad else st.just(good[f["name"]])
                           for f in schema["fields"])).map(b"".join)

    names = [f["name"] for f in schema["fields"]]
    return st.one_of(st.lists(st.sampled_from(names), max_size=3, unique=True).flatmap(written),
                     written(names))


def avro_field_bytes(f: dict) -> bytes:
    """Field `f` of a valid record (avro_item's), as fastavro writes it."""
    one = {"type": "record", "name": "One", "namespace": "shop", "fields": [f]}
    return wire_value(0, parse_schema(json.dumps(one)), {f["name"]: GOOD_ITEM[f["name"]]})[5:]


def header(schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id)


def mutated(value: bytes) -> st.SearchStrategy:
    """`value` as it was, cut short, with bytes after it, or with one byte changed."""
    return st.one_of(
        st.just(value), st.just(value),
        st.integers(0, max(len(value) - 1, 0)).map(lambda at: value[:at]),
        st.binary(min_size=1, max_size=3).map(lambda extra: value + extra),
        st.tuples(st.integers(0, max(len(value) - 1, 0)), st.integers(0, 255)).map(
            lambda t: value[:t[0]] + bytes([t[1]]) + value[t[0] + 1:]))


keys = st.sampled_from([None, b"ord-1", b"ord-2", b"ord-10"])


GOOD_ITEM = {"currency": "EUR", "order_id": "ord-1", "label": "new", "status": "paid", "kind": "a",
             "extra_text": "x" * 200, "qty": 5, "serial": 2**40, "small": 7, "grade": 2, "price": 9.5, "ratio": 0.25,
             "flag": True, "blob": b"\x00\xff", "at_us": datetime(2026, 11, 21, 10, 0, 0, 250, tzinfo=timezone.utc),
             "at_ms": datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=timezone.utc), "extra_at": 0,
             "day": date(2026, 11, 21), "ref": uuid.UUID(int=7), "cost": Decimal("12.34"), "note": "hi",
             "code": -3, "fixed4": b"abcd"}


def avro_item(schema: dict = SCHEMA_1, **changes) -> bytes:
    """A valid record of `schema` (fastavro writes it), with fields replaced."""
    item = {**GOOD_ITEM, **changes}
    schema_id = 1 if schema is SCHEMA_1 else 2
    return wire_value(schema_id, parse_schema(json.dumps(schema)),
                      {f["name"]: item[f["name"]] for f in schema["fields"]})


avro_values = st.one_of(
    payload(SCHEMA_1).map(lambda p: header(1) + p), payload(SCHEMA_1).map(lambda p: header(1) + p),
    payload(SCHEMA_2).map(lambda p: header(2) + p),
    payload(SCHEMA_1).map(lambda p: header(UNKNOWN_SCHEMA) + p)).flatmap(mutated)


def avro_with(**written: bytes) -> bytes:
    """A record of SCHEMA_1 with the fields of `written` written as those bytes, the others valid."""
    return header(1) + b"".join(written.get(f["name"], avro_field_bytes(f)) for f in SCHEMA_1["fields"])


def warmed(validator: RecordValidator) -> RecordValidator:
    """`validator` once each writer schema admitted (its first record compiles its row)."""
    for value in (avro_item(), avro_item(SCHEMA_2)):
        assert validator.check_row(b"ord-1".decode(), value)[0] == "ord-1"
    return validator


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=keys, value=avro_values)
def test_any_avro_value_gets_the_reference_verdict(avro_validator, key, value):
    assert_same_verdict(warmed(avro_validator), key, value)


AVRO_CASES = {
    "a valid record": avro_item(),
    "another writer schema's record": avro_item(SCHEMA_2, status=None),
    "optional fields null": avro_item(at_ms=None, note=None, code=None),
    "the smallest and largest timestamps": avro_item(at_us=MIN_TIMESTAMP_US, at_ms=MAX_TIMESTAMP_US // 1000),
    "a timestamp past year 9999": avro_item(at_us=MAX_TIMESTAMP_US + 1),
    "a millisecond timestamp past year 9999": avro_item(at_ms=MAX_TIMESTAMP_US // 1000 + 1),
    "an unread field's timestamp past year 9999": avro_item(extra_at=MAX_TIMESTAMP_US // 1000 + 1),
    "the first and last dates": avro_item(day=MIN_DAYS), "a date past year 9999": avro_item(day=MAX_DAYS + 1),
    "an int past 32 bits for an int field": avro_item(small=2**31),
    "the largest long": avro_item(serial=2**63 - 1), "the smallest long": avro_item(serial=-2**63),
    "an int below the minimum": avro_item(qty=0), "an int outside the enum": avro_item(grade=4),
    "a negative double below the minimum": avro_item(price=-0.5), "-0.0 at a minimum of 0": avro_item(price=-0.0),
    "NaN": avro_item(price=float("nan")), "infinity": avro_item(ratio=float("inf")),
    "a string too long": avro_item(label="toolong"), "a key field too long": avro_item(order_id="ord-1234567890"),
    "a pattern mismatch": avro_item(currency="eur"), "a string outside the enum": avro_item(kind="c"),
    "non-ASCII text": avro_item(label="é€"), "a decimal past its precision":  # 12.34's unscaled bytes (0x04d2) replaced by 10**10's
        avro_item().replace(text(b"\x04\xd2"), text((10**10).to_bytes(5, "big", signed=True))),
    "a key that differs": avro_item(order_id="ord-2"),
    "bytes left over": avro_item() + b"\x00",
    "cut short": avro_item()[:-1],
    "a negative length": avro_with(extra_text=varint(-3) + b"xy"),
    "a length past the end": avro_with(fixed4=b"", note=varint(1) + varint(40) + b"hi"),
    "a union index out of range": avro_with(note=varint(2) + text("hi")),
    "a negative union index": avro_with(at_ms=varint(-1)),
    "an enum index out of range": avro_with(status=varint(3)),
    "a varint of 10 bytes": avro_with(serial=varint(-2**63)),
    "a varint past 64 bits": avro_with(serial=b"\xff" * 10 + b"\x01"),
    "invalid UTF-8 in an unread field": avro_with(extra_text=text(b"\xc3\x28")),
    "a surrogate encoded in UTF-8": avro_with(label=text(b"\xed\xa0\x80")),
    "a boolean byte 2": avro_with(flag=b"\x02"),
    "an unknown schema id": header(UNKNOWN_SCHEMA) + avro_item()[5:],
    "no header": b"{}",
}


@pytest.mark.parametrize("value", AVRO_CASES.values(), ids=AVRO_CASES.keys())
def test_each_avro_corner_gets_the_reference_verdict(avro_validator, value):
    assert_same_verdict(warmed(avro_validator), b"ord-1", value)


def test_valid_avro_records_take_the_compiled_row(tmp_path):
    validator = _validator(tmp_path, "avro", {"1.avsc": json.dumps(SCHEMA_1), "2.avsc": json.dumps(SCHEMA_2)}, FIELDS)
    values = [avro_item(order_id=f"ord-{i}", qty=i, at_ms=None if i % 2 else i) for i in range(1, 200)]
    values += [avro_item(SCHEMA_2, order_id=f"ord-{i}", status=None) for i in range(1, 50)]
    for value in values:
        verdict = assert_same_verdict(validator, None, value)
        assert verdict[0] == "row"
    assert validator.fallbacks == 2  # the first record of each writer schema, which admits it


def test_a_quarantined_field_is_refused_on_the_compiled_row_too(tmp_path):
    validator = _validator(tmp_path, "avro", {"1.avsc": json.dumps(SCHEMA_1)}, FIELDS)
    quarantined = RecordValidator(validator.spec, quarantined=frozenset({"note"}))
    assert assert_same_verdict(quarantined, None, avro_item(note=None))[0] == "row"
    assert assert_same_verdict(quarantined, None, avro_item(note=None))[0] == "row"
    assert assert_same_verdict(quarantined, None, avro_item())[1] == "schema_incompatible"
    assert quarantined.fallbacks == 2  # the first record, and the one the quarantine refuses


# ---------------------------------------------------------------------------------------- Protobuf

ITEM_PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Item {
  string currency = 1;
  string order_id = 2;
  optional string label = 3;
  Status status = 4;
  string kind = 5;
  int32 qty = 6;
  uint64 serial = 7;
  sint64 small = 8;
  google.protobuf.Int64Value grade = 9;
  double price = 10;
  float ratio = 11;
  bool flag = 12;
  bytes blob = 13;
  google.protobuf.Timestamp at_us = 14;
  google.protobuf.Timestamp at_ms = 15;
  google.protobuf.Timestamp extra_at = 16;
  google.protobuf.StringValue note = 17;
  optional int64 code = 18;
  repeated Line lines = 19;
  map<string, int32> counts = 20;
  Line first = 21;
  enum Status { created = 0; paid = 1; shipped = 2; lost = 3; }
  message Line { string sku = 1; int32 n = 2; google.protobuf.Timestamp at = 3; }
}
"""
PROTO_FIELDS = [
    *(f for f in FIELDS if f["name"] not in ("day", "ref", "cost", "small")),
    {"name": "small", "type": "long", "min": -5},
    {"name": "lines", "type": "list", "items": {"type": "struct", "required": True, "fields": [
        {"name": "sku", "type": "string", "required": True}, {"name": "n", "type": "int", "required": True},
        {"name": "at", "type": "timestamp"}]}},
    {"name": "counts", "type": "map", "values": {"type": "int", "required": True}},
]


@pytest.fixture(scope="module")
def proto(tmp_path_factory):
    validator = _validator(tmp_path_factory.mktemp("protobuf"), "protobuf", {"1.proto": ITEM_PROTO}, PROTO_FIELDS)
    message_class, _ = validator.decoder.store.get(1, "PROTOBUF").parsed.reader((0,))
    return validator, message_class


TIMESTAMP_SECONDS = (-62135596800, 253402300799)  # google.protobuf.Timestamp's range: years 1 to 9999
seconds = st.one_of(st.integers(-2**40, 2**40), st.sampled_from([s + d for s in TIMESTAMP_SECONDS for d in (-1, 0, 1)]),
                    st.integers(-2**63, 2**63 - 1))
nanos = st.one_of(st.integers(0, 999_999_999), st.sampled_from([-1, 999, 1000, 999_999_999, 1_000_000_000]),
                  st.integers(-2**31, 2**31 - 1))
proto_texts = st.one_of(st.sampled_from(["ord-1", "ord-2", "EUR", "eur", "a", "b", "new", "toolong", "", "é"]),
                        st.text(max_size=14))
int32s = st.one_of(st.integers(-3, 1100), st.integers(-2**31, 2**31 - 1))
int64s = st.one_of(st.integers(-3, 5), st.integers(-2**63, 2**63 - 1))
uint64s = st.one_of(st.integers(0, 5), st.integers(2**63 - 2, 2**64 - 1), st.integers(0, 2**64 - 1))
maybe = st.none

PROTO_VALUES = {
    "currency": proto_texts, "order_id": proto_texts, "label": st.one_of(maybe(), proto_texts),
    "status": st.integers(-1, 5), "kind": proto_texts, "qty": int32s, "serial": uint64s, "small": int64s,
    "grade": st.one_of(maybe(), int64s), "price": st.floats(), "ratio": st.floats(width=32), "flag": st.booleans(),
    "blob": st.binary(max_size=4), "at_us": st.one_of(maybe(), st.tuples(seconds, nanos)),
    "at_ms": st.one_of(maybe(), st.tuples(seconds, nanos)), "extra_at": st.one_of(maybe(), st.tuples(seconds, nanos)),
    "note": st.one_of(maybe(), proto_texts), "code": st.one_of(maybe(), int64s),
    "lines": st.lists(st.tuples(proto_texts, int32s, st.one_of(maybe(), st.tuples(seconds, nanos))), max_size=2),
    "counts": st.dictionaries(proto_texts, int32s, max_size=2),
    "first": st.one_of(maybe(), st.tuples(proto_texts, int32s, st.one_of(maybe(), st.tuples(seconds, nanos)))),
}
WRAPPED = {"grade", "note"}


def proto_message(message_class, values: dict) -> bytes:
    """The message of `values` (None: the field unset), serialized."""
    message = message_class()
    for name, value in values.items():
        if value is None:
            continue
        if name in ("at_us", "at_ms", "extra_at"):
            getattr(message, name).seconds, getattr(message, name).nanos = value
        elif name in WRAPPED:
            getattr(message, name).value = value
        elif name in ("lines", "first"):
            for sku, n, at in value if name == "lines" else [value]:
                line = message.lines.add() if name == "lines" else message.first
                line.sku, line.n = sku, n
                if at is not None:
                    line.at.seconds, line.at.nanos = at
        elif name == "counts":
            message.counts.update(value)
        else:
            setattr(message, name, value)
    return message.SerializeToString()


GOOD_PROTO = {"currency": "EUR", "order_id": "ord-1", "label": "new", "status": 1, "kind": "a", "qty": 5,
              "serial": 2**40, "small": -5, "grade": 2, "price": 9.5, "ratio": 0.25, "flag": True, "blob": b"\x00",
              "at_us": (1_763_719_200, 999_999_999), "at_ms": (-1, 0), "extra_at": (0, 1), "note": "hi", "code": -3,
              "lines": [("sku-1", 2, (5, 0))], "counts": {"x": 1}, "first": ("sku-2", 3, None)}
# a valid record with up to three fields of any value, or every field so
proto_records = st.one_of(
    st.lists(st.sampled_from(sorted(PROTO_VALUES)), max_size=3, unique=True).flatmap(
        lambda bad: st.fixed_dictionaries({name: PROTO_VALUES[name] if name in bad else st.just(GOOD_PROTO[name])
                                           for name in PROTO_VALUES})),
    st.fixed_dictionaries(PROTO_VALUES))
indexes = st.sampled_from([b"\x00", b"\x00", b"\x00", b"\x02\x00", b"\x02\x02", b"", b"\x7f"])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=keys, record=proto_records, schema_id=st.sampled_from([1, 1, 1, UNKNOWN_SCHEMA]), index=indexes,
       data=st.data())
def test_any_protobuf_value_gets_the_reference_verdict(proto, key, record, schema_id, index, data):
    validator, message_class = proto
    good = proto_message(message_class, GOOD_PROTO)
    assert validator.check_row("ord-1", header(1) + b"\x00" + good)[0] == "ord-1"
    value = data.draw(mutated(header(schema_id) + index + proto_message(message_class, record)))
    assert_same_verdict(validator, key, value)


def test_valid_protobuf_records_take_the_compiled_row(tmp_path):
    validator = _validator(tmp_path, "protobuf", {"1.proto": ITEM_PROTO}, PROTO_FIELDS)
    message_class, _ = validator.decoder.store.get(1, "PROTOBUF").parsed.reader((0,))
    for i in range(1, 200):
        value = header(1) + b"\x00" + proto_message(message_class, {
            "currency": "EUR", "order_id": f"ord-{i}", "label": None if i % 2 else "new", "status": i % 3,
            "kind": "ab"[i % 2], "qty": i, "serial": 2**40, "small": -i % 7, "grade": None if i % 3 else 2,
            "price": i / 4, "ratio": 0.5, "flag": bool(i % 2), "blob": b"\x00", "at_us": (1_763_719_200 + i, i * 1000),
            "at_ms": None if i % 2 else (-1, 999_999_999), "extra_at": (0, 0), "note": "hi", "code": i,
            "lines": [("sku-1", 2, (5, 0))], "counts": {"x": 1}, "first": None})
        assert assert_same_verdict(validator, f"ord-{i}".encode(), value)[0] == "row"
    assert validator.fallbacks == 1  # the first record, which admits the writer schema


PROTO_CASES = {
    "a valid record": {},
    "optional fields unset": {"label": None, "grade": None, "note": None, "code": None, "at_ms": None, "first": None},
    "no timestamp": {"at_us": None},
    "the first and last instants": {"at_us": (TIMESTAMP_SECONDS[0], 0), "at_ms": (TIMESTAMP_SECONDS[1], 999_999_999)},
    "a second before year 1": {"at_us": (TIMESTAMP_SECONDS[0] - 1, 999_999_999)},
    "a second after year 9999": {"at_us": (TIMESTAMP_SECONDS[1] + 1, 0)},
    "a billion nanoseconds": {"at_us": (0, 1_000_000_000)},
    "negative nanoseconds": {"at_ms": (5, -1)},
    "an unread timestamp out of range": {"extra_at": (0, -1)},
    "a nested timestamp out of range": {"lines": [("sku-1", 2, (TIMESTAMP_SECONDS[1] + 1, 0))]},
    "an enum number the schema lacks": {"status": 9},
    "an enum name the contract lacks": {"status": 3},
    "a uint64 past a long": {"serial": 2**63},
    "an int below the minimum": {"qty": 0}, "a long below the minimum": {"small": -6},
    "a wrapped long outside the enum": {"grade": 4},
    "a string too long": {"label": "toolong"}, "a key field too long": {"order_id": "ord-1234567890"},
    "a pattern mismatch": {"currency": "eur"}, "non-ASCII text": {"note": "é€"},
    "NaN": {"price": float("nan")}, "a float past float32": {"ratio": float("inf")},
    "a key that differs": {"order_id": "ord-2"},
}


@pytest.mark.parametrize("changes", PROTO_CASES.values(), ids=PROTO_CASES.keys())
def test_each_protobuf_corner_gets_the_reference_verdict(proto, changes):
    validator, message_class = proto
    value = header(1) + b"\x00" + proto_message(message_class, {**GOOD_PROTO, **changes})
    assert_same_verdict(validator, None, header(1) + b"\x00" + proto_message(message_class, GOOD_PROTO))
    assert_same_verdict(validator, b"ord-1", value)


def date_proto_text() -> str:
    """A writer schema whose message holds a google.type.Date, as a descriptor set (the protoc here has no
    google/type/date.proto to import): what the driver ships for a registry's schema."""
    import base64

    from google.protobuf import descriptor_pb2

    found = descriptor_pb2.FileDescriptorSet()
    date_file = found.file.add(name="google/type/date.proto", package="google.type", syntax="proto3")
    message = date_file.message_type.add(name="Date")
    for number, name in enumerate(["year", "month", "day"], 1):
        message.field.add(name=name, number=number, type=5, label=1)  # int32
    item_file = found.file.add(name="item.proto", package="shop", syntax="proto3",
                               dependency=["google/type/date.proto"])
    message = item_file.message_type.add(name="Item")
    message.field.add(name="order_id", number=1, type=9, label=1)  # string
    message.field.add(name="day", number=2, type=11, type_name=".google.type.Date", label=1)
    return DESCRIPTOR_SET + base64.b64encode(found.SerializeToString()).decode("ascii")


def test_a_google_type_date_becomes_epoch_days_on_the_compiled_row_and_a_bad_one_the_reference_verdict(tmp_path):
    validator = _validator(tmp_path, "protobuf", {"1.proto": date_proto_text()},
                           [{"name": "order_id", "type": "string", "required": True}, {"name": "day", "type": "date"}])
    message_class, _ = validator.decoder.store.get(1, "PROTOBUF").parsed.reader((0,))

    def value(year: int, month: int, day: int) -> bytes:
        message = message_class(order_id="ord-1")
        message.day.year, message.day.month, message.day.day = year, month, day
        return header(1) + b"\x00" + message.SerializeToString()

    days = [assert_same_verdict(validator, b"ord-1", value(*ymd)) for ymd in [(2026, 11, 27), (1, 1, 1), (9999, 12, 31)]]
    assert [row[1][1] for row in days] == [("int", str(n)) for n in (20784, MIN_DAYS, MAX_DAYS)]
    assert validator.fallbacks == 1  # the first record, which admits the writer schema
    for ymd in [(0, 1, 1), (2026, 2, 30), (10000, 1, 1), (2026, 13, 1)]:
        assert assert_same_verdict(validator, b"ord-1", value(*ymd))[1] == "bad_date"


def test_a_truncated_avro_value_gets_the_same_detail_every_time(avro_validator):
    fields = SCHEMA_1["fields"]
    price = [f["name"] for f in fields].index("price")  # a double, cut after 3 of its 8 bytes
    cut = header(1) + b"".join(avro_field_bytes(f) for f in fields[:price]) + avro_field_bytes(fields[price])[:3]
    details = {outcome(avro_validator, avro_validator.check, b"ord-1", cut) for _ in range(3)}
    assert details == {("rejected", "malformed_avro", "value does not decode with writer schema 1: EOFError: "
                                                      "cannot read double")}


@pytest.mark.parametrize("size", ['4) or __import__("pathlib").Path(MARK).touch() or (4', "4", 4.0, True, -1, 4])
def test_a_writer_schema_is_never_code_on_the_compiled_row(tmp_path, size):
    """The compiled row is generated source text; a writer schema (from a registry or a folder: hostile input)
    whose fixed size is not a plain non-negative int is never written into it: the row plan (fastavro) gives
    the verdict instead, and nothing of the schema runs."""
    mark = tmp_path / "ran"
    fields = [{"name": "order_id", "type": "string"}, {"name": "qty", "type": "long"},
              {"name": "blob", "type": {"type": "fixed", "name": "F", "size": size}}]
    text_ = json.dumps({"type": "record", "name": "Item", "fields": fields}).replace("MARK", json.dumps(str(mark))[1:-1])
    validator = _validator(tmp_path, "avro", {"1.avsc": text_}, [{"name": "order_id", "type": "string",
                                                                   "required": True}])
    good = header(1) + text("ord-1") + varint(6) + b"abcd"
    for _ in range(3):  # the first record admits the writer schema; the later ones would take a compiled row
        verdict = assert_same_verdict(validator, None, good)
    assert not mark.exists()
    if type(size) is int and size == 4:  # a plain size: the record is a row, on the compiled row after the first
        assert verdict[0] == "row" and validator.fallbacks == 1
