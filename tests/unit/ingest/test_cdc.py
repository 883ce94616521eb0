"""Change events (Debezium's envelope) checked one by one: creates, snapshot reads and updates become the
row of their `after`, deletes and tombstones the primary key from the key record, each with the change's
op, source commit time and source log position; what is not a row change is a dead letter of its own
kind, whatever the bytes."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core.spec import SpecError
from lakehouse.ingest.change_events import source_position
from lakehouse.ingest.rejects import ERROR_KINDS, Rejected
from lakehouse.ingest.schema_store import parse_schema
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.wire import wire_value

FIELDS = [{"name": "id", "type": "long", "required": True},
          {"name": "email", "type": "string"},
          {"name": "balance", "type": "decimal(10,2)"},
          {"name": "updated_at", "type": "timestamp", "unit": "us"}]
SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": 1_764_000_000_000,
          "db": "shop", "schema": "public", "table": "accounts", "lsn": 24023128, "txId": 565, "snapshot": "false"}


@pytest.fixture
def cdc_spec(make_spec):
    return make_spec(fields=FIELDS, mode="cdc", table_key=["id"], partition_by=None,
                     source={"key": {"field": None}, "value_format": "json"}, publish={"view": None})


def key(i: int, wrapped: bool = False) -> bytes:
    payload = {"id": i}
    if wrapped:
        return json.dumps({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int64"}]},
                           "payload": payload}).encode()
    return json.dumps(payload).encode()


def event(op: str, before: dict | None, after: dict | None, wrapped: bool = False, **source) -> bytes:
    envelope = {"before": before, "after": after, "source": {**SOURCE, **source}, "op": op,
                "ts_ms": 1_764_000_000_100, "transaction": None}
    if wrapped:
        envelope = {"schema": {"type": "struct", "name": "shop.public.accounts.Envelope"}, "payload": envelope}
    return json.dumps(envelope).encode()


def row(i: int, email: str = "a@x", balance: str = "1.50") -> dict:
    return {"id": i, "email": email, "balance": balance, "updated_at": 1_764_000_000_000_123}


def test_a_cdc_spec_is_an_upsert_table_keyed_by_the_primary_key_from_record_keys(cdc_spec):
    assert cdc_spec.is_cdc and cdc_spec.target.mode == "upsert" and cdc_spec.source.key_format == "json"
    assert cdc_spec.tombstones_delete and cdc_spec.tombstone_table == f"{cdc_spec.target.table}__tombstones"


@pytest.mark.parametrize("overrides, where, why", [
    ({"source": {"key": {"format": "string", "field": None}}}, "source.key.format", "records holding the primary key"),
    ({"table_key": None}, "target.key", "cdc mode needs key columns"),
    ({"fanout": {"field": "email", "routes": {"x": "raw.other_{suffix}"}}}, "target.fanout", "mirrors one"),
    ({"source": {"key": {"field": "id"}}}, "source.key.field", "leave source.key.field out"),
])
def test_a_cdc_spec_refuses_what_a_change_stream_cannot_honour(make_spec, overrides, where, why):
    base = {"fields": FIELDS, "mode": "cdc", "table_key": ["id"], "partition_by": None,
            "source": {"key": {"field": None}}}
    for name, value in overrides.items():
        base[name] = {**base.get(name, {}), **value} if isinstance(value, dict) and name == "source" else value
    with pytest.raises(SpecError) as info:
        make_spec(**base)
    assert info.value.field == where and why in info.value.why


@pytest.mark.parametrize("wrapped", [False, True])
def test_creates_reads_and_updates_are_rows_and_deletes_and_tombstones_are_keys(cdc_spec, wrapped):
    validator = RecordValidator(cdc_spec)
    text, values, op = validator.check_change(key(7, wrapped), event("c", None, row(7), wrapped))
    assert (text, op) == ('{"id":7}', "upsert")
    assert values[:4] == (7, "a@x", Decimal("1.50"), 1_764_000_000_000_123)
    assert values[4] == {"op": "c", "source_ts": 1_764_000_000_000_000, "position": Decimal(24023128)}
    assert validator.check_change(key(7), event("r", None, row(7), snapshot="true"))[2] == "upsert"
    _, updated, op = validator.check_change(key(7), event("u", row(7), row(7, balance="9.99"), lsn=24023200))
    assert (updated[2], op, updated[4]["position"]) == (Decimal("9.99"), "upsert", Decimal(24023200))
    _, deleted, op = validator.check_change(key(7, wrapped), event("d", row(7), None, wrapped))
    assert (deleted[:4], op, deleted[4]["op"]) == ((7, None, None, None), "delete", "d")
    _, tombstone, op = validator.check_change(key(7), None)
    assert (tombstone[0], op, tombstone[4]) == (7, "delete", {"op": "d", "source_ts": None, "position": None})


@pytest.mark.parametrize("record_key, value, kind, detail", [
    (key(1), event("c", None, None), "bad_envelope", "has no `after` row"),
    (key(1), json.dumps({"id": 1}).encode(), "bad_envelope", "it has no `op`"),
    (key(1), event("x", None, row(1)), "bad_envelope", "not a Debezium operation"),
    (key(1), event("t", None, None), "unsupported_change", "truncate"),
    (key(1), event("m", None, None), "unsupported_change", "message"),
    (key(2), event("c", None, row(1)), "key_mismatch", "the key's id 2 differs"),
    (b'{"customer": 1}', event("c", None, row(1)), "bad_key", "no primary key column id"),
    (b'"1"', event("c", None, row(1)), "bad_key", ""),
    (None, event("c", None, row(1)), "null_key", ""),
    (key(1), event("c", None, row(1, balance="1.234")), "out_of_range", "more than 2 decimal places"),
    (key(1), event("c", None, row(1)).replace(b'"1.50"', b"1e99999999999999999999"), "out_of_range", "exponent"),
])
def test_what_is_not_a_row_change_is_a_dead_letter_of_its_own_kind(cdc_spec, record_key, value, kind, detail):
    with pytest.raises(Rejected) as info:
        RecordValidator(cdc_spec).check_change(record_key, value)
    assert info.value.kind == kind and detail in info.value.detail


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(envelope=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                             lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                                 st.sampled_from(["op", "after", "before", "source", "id", "ts_ms", "lsn",
                                                  "payload", "schema"]), inner, max_size=5), max_leaves=20),
       record_key=st.sampled_from([key(1), b'{"id": "x"}', b"[1]", b"\xff", None]))
def test_arbitrary_envelopes_get_a_verdict_never_an_escaping_error(cdc_spec, envelope, record_key):
    try:
        RecordValidator(cdc_spec).check_change(record_key, json.dumps(envelope).encode())
    except Rejected as rejected:
        assert rejected.kind in ERROR_KINDS


AVRO_VALUE = {"type": "record", "name": "Value", "namespace": "shop.public.accounts", "fields": [
    {"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}]}
AVRO_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.accounts", "fields": [
    {"name": "before", "type": ["null", AVRO_VALUE], "default": None},
    {"name": "after", "type": ["null", "shop.public.accounts.Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
        {"name": "connector", "type": "string"}, {"name": "ts_ms", "type": "long"},
        {"name": "lsn", "type": ["null", "long"], "default": None}]}},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
AVRO_KEY = {"type": "record", "name": "Key", "namespace": "shop.public.accounts", "fields": [{"name": "id", "type": "long"}]}


def avro_cdc_spec(make_spec, **overrides):
    """A cdc pipeline of Avro change events whose contract follows the writer schemas (key schema 1, envelope 2)."""
    folder = make_spec.directory / "schemas"
    folder.mkdir(exist_ok=True)
    (folder / "1.avsc").write_text(json.dumps(AVRO_KEY))
    (folder / "2.avsc").write_text(json.dumps(AVRO_ENVELOPE))
    return make_spec(mode="cdc", table_key=["id"], partition_by=None, contract={"fields": None, "from": "writer_schema"},
                     source={"value_format": "avro", "schemas": "schemas", "key": {"field": None},
                             **overrides.pop("source", {})}, publish={"view": None}, **overrides)


def avro_change(i: int, op: str, email: str | None, lsn: int) -> tuple[bytes, bytes]:
    row = None if email is None else {"id": i, "email": email}
    return (wire_value(1, parse_schema(json.dumps(AVRO_KEY)), {"id": i}),
            wire_value(2, parse_schema(json.dumps(AVRO_ENVELOPE)), {
                "before": row if op in ("u", "d") else None, "after": None if op == "d" else row, "op": op,
                "ts_ms": None, "source": {"connector": "postgresql", "ts_ms": 1_764_000_000_000, "lsn": lsn}}))


def test_avro_change_events_decode_through_the_wire_format(make_spec):
    spec = avro_cdc_spec(make_spec)
    assert [f.name for f in spec.contract.fields] == ["id", "email"] and spec.source.key_format == "avro"
    validator = RecordValidator(spec)
    encoded_key, change = avro_change(5, "c", "e@x", 77)
    assert validator.check_change(encoded_key, change) == (
        '{"id":5}', (5, "e@x", {"op": "c", "source_ts": 1_764_000_000_000_000, "position": Decimal(77)}), "upsert")


@pytest.mark.parametrize("source, position", [
    ({"lsn": 24023128}, 24023128),
    ({"file": "mysql-bin.000003", "pos": 154, "row": 2}, (3 * 10 ** 12 + 154) * 10 ** 6 + 2),
    ({"change_lsn": "0000002a:00000568:0002", "event_serial_no": 1}, int("0000002a000005680002", 16) * 10 ** 6 + 1),
    ({"scn": "1234567"}, 1234567),
    ({"sec": 1700000000, "ord": 3}, 1700000000 * 10 ** 9 + 3),
    ({"connector": "unknown"}, None),
    ({"lsn": -1}, None),
    ({"file": "binlog", "pos": "x"}, None),
])
def test_a_source_position_orders_the_changes_of_each_connector(source, position):
    assert source_position(source) == (None if position is None else Decimal(position))


def test_later_positions_of_one_connector_compare_greater():
    assert source_position({"file": "mysql-bin.000004", "pos": 4}) > source_position(
        {"file": "mysql-bin.000003", "pos": 999_999_999, "row": 50})
