"""Protobuf and JSON Schema values and record keys in the Confluent wire format; the gate that checks each
writer schema against the contract once; and the split of work between driver and tasks: tasks get the
writer schemas with the spec and report an id they were not given, only the driver talks to the registry
(confluent-kafka's MockSchemaRegistryClient, `mock://`: no Confluent-compatible registry installs here)."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core import errors
from lakehouse.core.schemas import compile_proto, proto_message, proto_pool
from lakehouse.core.spec import Contract, FieldSpec, SpecError
from lakehouse.ingest.rejects import ERROR_KINDS, Rejected
from lakehouse.ingest.schema_store import DESCRIPTOR_SET, SchemaStore, parse_schema, register_schema
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.wire import wire_json, wire_protobuf, wire_value
from lakehouse.ingest.writer_schemas import WriterSchemas

ORDER_PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  string order_id = 1;
  string customer_id = 2;
  double amount = 3;
  string currency = 4;
  Status status = 5;
  google.protobuf.Timestamp event_time = 6;
  enum Status { created = 0; paid = 1; shipped = 2; cancelled = 3; refunded = 4; }
  Line first_line = 7;
  message Line { string sku = 1; int32 qty = 2; }
}
"""
ORDER_JSON_SCHEMA = {
    "type": "object", "required": ["order_id", "customer_id", "amount", "currency", "status", "event_time"],
    "properties": {
        "order_id": {"type": "string"}, "customer_id": {"type": "string"}, "amount": {"type": "number"},
        "currency": {"type": "string"}, "status": {"type": "string"},
        "event_time": {"type": "string", "format": "date-time"}}}
EVENT_TIME = datetime(2026, 11, 25, 8, 0, 1, tzinfo=timezone.utc)
EVENT_US = int(EVENT_TIME.timestamp() * 1_000_000)
ROW = {"order_id": "ord-1", "customer_id": "cus-7", "amount": 12.5, "currency": "EUR", "status": "paid",
       "event_time": EVENT_US}


def spec_in(make_spec, fmt: str, files: dict[str, str], **overrides):
    folder = make_spec.directory / "schemas"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    source = {"value_format": fmt, "schemas": "schemas", **overrides.pop("source", {})}
    return make_spec(source=source, **overrides)


def proto_order(indexes=(0,), **changes):
    pool, name = proto_pool(compile_proto(ORDER_PROTO))
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(proto_message(pool, name, (0,)))
    message = cls(order_id="ord-1", customer_id="cus-7", amount=12.5, currency="EUR", status=1)
    message.event_time.FromDatetime(EVENT_TIME)
    for key, value in changes.items():
        setattr(message, key, value)
    return message


def verdict(validator, value, key="ord-1"):
    try:
        return validator.check(key, value)
    except Rejected as rejected:
        return rejected.kind


# --------------------------------------------------------------------------------------------- Protobuf

def test_a_protobuf_value_becomes_the_contract_row_with_enums_by_name_and_timestamps_as_instants(make_spec):
    spec = spec_in(make_spec, "protobuf", {"3.proto": ORDER_PROTO})
    validator = RecordValidator(spec)
    value = wire_protobuf(3, proto_order())
    assert validator.check("ord-1", value) == ROW
    assert validator.check_row("ord-1", value) == tuple(ROW.values())


def test_each_broken_protobuf_value_is_a_dead_letter_of_its_own_kind(make_spec):
    validator = RecordValidator(spec_in(make_spec, "protobuf", {"3.proto": ORDER_PROTO}))
    good = wire_protobuf(3, proto_order())
    assert verdict(validator, b'{"order_id": 1}') == "bad_wire_format"
    assert verdict(validator, b"\x00" + struct.pack(">I", 9) + good[5:]) == "unknown_schema"
    assert verdict(validator, good[:-4]) == "malformed_protobuf"  # truncated message
    assert verdict(validator, good[:5] + b"\x02\x0e" + good[6:]) == "malformed_protobuf"  # no message 7
    assert verdict(validator, good[:5] + b"\x7f") == "malformed_protobuf"  # truncated indexes
    assert verdict(validator, wire_protobuf(3, proto_order(currency="eur"))) == "pattern_mismatch"
    assert verdict(validator, wire_protobuf(3, proto_order(status=3)))["status"] == "cancelled"
    # a nested message selected by its index path decodes as that message
    nested = wire_protobuf(3, proto_order().first_line.__class__(sku="x", qty=2), indexes=(0, 0))
    assert verdict(validator, nested) == "missing_required"  # a Line is no Order


def test_an_enum_number_the_schema_does_not_know_is_a_bad_enum_not_a_crash(make_spec):
    validator = RecordValidator(spec_in(make_spec, "protobuf", {"3.proto": ORDER_PROTO}))
    assert verdict(validator, wire_protobuf(3, proto_order(status=42))) == "bad_enum"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=120))
def test_arbitrary_protobuf_payloads_get_a_verdict_never_an_escaping_error(make_spec, payload):
    validator = RecordValidator(spec_in(make_spec, "protobuf", {"3.proto": ORDER_PROTO}))
    outcome = verdict(validator, b"\x00" + struct.pack(">I", 3) + payload)
    assert isinstance(outcome, dict) or outcome in ERROR_KINDS


def test_a_registry_protobuf_schema_ships_to_tasks_as_descriptors_with_its_imports():
    registry = {"url": "mock://test-wire-proto"}
    schema_id = register_schema(registry, "orders-value", ORDER_PROTO, "PROTOBUF")
    driver = SchemaStore({}, registry)
    driver.resolve(schema_id)
    shipped = driver.shipped(schema_id)
    assert shipped[1] == "PROTOBUF" and shipped[2].startswith(DESCRIPTOR_SET)
    task = SchemaStore(dict([(shipped[0], shipped[1:])]))
    message_class, to_dict = task.get(schema_id, "PROTOBUF").parsed.reader((0,))
    assert to_dict(message_class.FromString(proto_order().SerializeToString()))["status"] == "paid"


# ------------------------------------------------------------------------------------------ JSON Schema

def test_a_json_schema_value_decodes_as_json_after_its_header_on_the_fast_path(make_spec):
    spec = spec_in(make_spec, "json_schema", {"5.json": json.dumps(ORDER_JSON_SCHEMA)})
    validator = RecordValidator(spec)
    document = {**ROW, "event_time": EVENT_TIME.isoformat()}
    value = wire_json(5, document)
    assert validator.check("ord-1", value) == ROW
    assert validator.check_row("ord-1", value) == tuple(ROW.values()) and validator.fallbacks == 0
    assert verdict(validator, value[:5] + b"{not json") == "malformed_json"
    assert verdict(validator, b"\x00" + struct.pack(">I", 6) + value[5:]) == "unknown_schema"
    assert validator.check_row("ord-1", wire_json(5, document)) is not None
    too_big = wire_json(5, {**document, "pad": "x" * spec.source.max_value_bytes})
    with pytest.raises(Rejected, match="oversize"):
        validator.check_row("ord-1", too_big)


# ------------------------------------------------------------------------------------------- record keys

def test_a_record_key_is_decoded_shown_as_json_and_compared_by_its_field(make_spec):
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "order_id", "type": "string"}]}
    spec = spec_in(make_spec, "json_schema", {"5.json": json.dumps(ORDER_JSON_SCHEMA),
                                             "6.avsc": json.dumps(key_schema)},
                   source={"key": {"field": "order_id", "format": "avro"}})
    validator = RecordValidator(spec)
    key = wire_value(6, parse_schema(json.dumps(key_schema)), {"order_id": "ord-1"})
    assert validator.check_key(key) == '{"order_id":"ord-1"}'
    value = wire_json(5, {**ROW, "event_time": EVENT_TIME.isoformat()})
    assert validator.check_row(validator.check_key(key), value) == tuple(ROW.values())
    other = wire_value(6, parse_schema(json.dumps(key_schema)), {"order_id": "ord-2"})
    assert verdict(validator, value, validator.check_key(other)) == "key_mismatch"
    with pytest.raises(Rejected) as info:
        validator.check_key(b"\x00\x00\x00\x00\x06\xff")
    assert info.value.kind == "bad_key" and "malformed_avro" in info.value.detail


# ----------------------------------------------------------------------------------- the schema gate

V1 = {"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "string"},
                                                     {"name": "amount", "type": "int"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
V3 = {**V1, "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "string"}]}


def followed(make_spec, *versions, policy="fail"):
    files = {f"{i}.avsc": json.dumps(v) for i, v in versions}
    return spec_in(make_spec, "avro", files, contract={"fields": None, "from": "writer_schema"}, partition_by=None,
                   key=None, schema_policy={"on_incompatible": policy})


def wire(schema_id, schema, record):
    return wire_value(schema_id, parse_schema(json.dumps(schema)), record)


def test_a_contract_from_the_writer_schemas_fits_every_version_in_the_folder(make_spec):
    spec = followed(make_spec, (1, V1), (2, V2))
    assert [(f.name, f.type, f.required) for f in spec.contract.fields] == [
        ("order_id", "string", True), ("amount", "int", True), ("note", "string", False)]
    with pytest.raises(SpecError, match="is int in the contract but string"):
        followed(make_spec, (1, V1), (3, V3))


def test_a_new_compatible_writer_schema_stops_the_task_for_the_driver_to_evolve_the_table(make_spec):
    spec = followed(make_spec, (1, V1))
    spec = replace(spec, source=replace(spec.source, schemas=(*spec.source.schemas, (2, "AVRO", json.dumps(V2)))))
    validator = RecordValidator(spec)
    assert validator.check(None, wire(1, V1, {"order_id": "a", "amount": 1}))
    with pytest.raises(errors.SchemaChangeError) as raised:
        validator.check(None, wire(2, V2, {"order_id": "a", "amount": 1, "note": "x"}))
    assert errors.marker_in(str(raised.value)) == ("schema-change", {"schema_id": "2"})
    accepted = RecordValidator(spec, writer_schemas=WriterSchemas(accepted=frozenset({2})))
    assert accepted.check(None, wire(2, V2, {"order_id": "a", "amount": 1, "note": "x"}))


def test_an_incompatible_writer_schema_stops_the_job_or_is_quarantined_by_policy(make_spec):
    for policy, expected in (("fail", errors.WriterSchemaIncompatibleError), ("quarantine", "schema_incompatible")):
        spec = followed(make_spec, (1, V1), policy=policy)
        spec = replace(spec, source=replace(spec.source, schemas=(*spec.source.schemas,
                                                                   (3, "AVRO", json.dumps(V3)))))
        validator = RecordValidator(spec)
        value = wire(3, V3, {"order_id": "a", "amount": "one"})
        if policy == "fail":
            with pytest.raises(expected, match="'amount' is int in the contract but string"):
                validator.check(None, value)
        else:
            assert verdict(validator, value, None) == expected
            assert validator.check(None, wire(1, V1, {"order_id": "a", "amount": 1}))  # the others flow


def test_a_declared_contract_takes_writer_types_it_can_read_and_refuses_the_rest(make_spec):
    spec = spec_in(make_spec, "avro", {"1.avsc": json.dumps(V1), "3.avsc": json.dumps(V3)}, partition_by=None,
                   key=None, fields=[{"name": "order_id", "type": "string", "required": True},
                                     {"name": "amount", "type": "long"}])
    validator = RecordValidator(spec)
    assert validator.check(None, wire(1, V1, {"order_id": "a", "amount": 7})) == {"order_id": "a", "amount": 7}
    with pytest.raises(errors.WriterSchemaIncompatibleError, match="writer schema 3"):
        validator.check(None, wire(3, V3, {"order_id": "a", "amount": "7"}))


# ------------------------------------------------------------- writer schemas between driver and tasks

def test_a_task_reports_an_id_it_was_not_shipped_and_dead_letters_one_no_registry_has(make_spec):
    spec = spec_in(make_spec, "avro", {"1.avsc": json.dumps(V1)}, partition_by=None, key=None,
                   fields=[{"name": "order_id", "type": "string", "required": True}])
    resolvable = RecordValidator(spec, writer_schemas=WriterSchemas(resolvable=True))
    with pytest.raises(errors.SchemaUnknownError) as raised:
        resolvable.check(None, wire(2, V2, {"order_id": "a", "amount": 1, "note": None}))
    assert errors.marker_in(str(raised.value)) == ("schema-unknown", {"schema_id": "2"})
    missing = RecordValidator(spec, writer_schemas=WriterSchemas(resolvable=True, missing=frozenset({2})))
    assert verdict(missing, wire(2, V2, {"order_id": "a", "amount": 1, "note": None})) == "unknown_schema"
    alone = RecordValidator(spec)  # no registry at all: the folder is all there is
    assert verdict(alone, wire(2, V2, {"order_id": "a", "amount": 1, "note": None})) == "unknown_schema"


def test_the_driver_fetches_every_version_of_a_subject_once():
    registry = {"url": "mock://test-wire-subjects"}
    ids = [register_schema(registry, "subject-value", json.dumps(v)) for v in (V1, V2)]
    store = SchemaStore({}, registry)
    assert store.subject_versions("subject-value") == sorted(ids)
    assert store.subject_versions("no-such-subject") == []
    assert [store.shipped(i)[1] for i in ids] == ["AVRO", "AVRO"]


def test_unit_timestamps_and_decimals_come_through_avro_logical_types(make_spec):
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3}},
        {"name": "at", "type": {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}}]}
    spec = followed(make_spec, (4, schema))
    assert [f.type_text for f in spec.contract.fields] == ["string", "decimal(9,3)", "timestamp"]
    row = RecordValidator(spec).check(None, wire(4, schema, {"order_id": "a", "price": Decimal("1.250"),
                                                              "at": EVENT_US}))
    assert row == {"order_id": "a", "price": Decimal("1.250"), "at": EVENT_US}


def test_contract_fields_do_not_mix_key_and_value_schemas_of_one_type(make_spec):
    with pytest.raises(SpecError, match="cannot be told apart"):
        spec_in(make_spec, "avro", {"1.avsc": json.dumps(V1)}, contract={"fields": None, "from": "writer_schema"},
                partition_by=None, source={"key": {"format": "avro", "field": None}})
    assert Contract((FieldSpec("a", "int"),)).from_writer_schema is False


def test_the_airflow_connection_gives_the_registry_with_its_credentials_to_hooks_and_submitted_jobs(monkeypatch,
                                                                                                   make_spec):
    from lakehouse_airflow.hooks import LakehouseHook, connection_environment

    spec = make_spec()
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", "http://from-the-environment:8081")
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SCHEMA_REGISTRY",
                       json.dumps({"conn_type": "http", "host": "registry.internal", "schema": "https", "port": 8443,
                                   "login": "lake house", "password": "p@ss:word"}))
    hook = LakehouseHook(spec.name)
    assert hook.platform.schema_registry() == {"url": "https://registry.internal:8443",
                                               "basic.auth.user.info": "lake house:p@ss:word"}
    env = connection_environment()
    assert env["LAKEHOUSE_SCHEMA_REGISTRY_URL"] == "https://lake%20house:p%40ss%3Aword@registry.internal:8443"
    assert "p@ss" not in repr(hook.platform)  # the configuration's repr hides the password
    monkeypatch.delenv("AIRFLOW_CONN_LAKEHOUSE_SCHEMA_REGISTRY")
    assert "LAKEHOUSE_SCHEMA_REGISTRY_URL" not in connection_environment()


def test_lakehouse_schemas_pulls_the_registry_versions_and_says_what_the_contract_makes_of_each(
        make_spec, monkeypatch, capsys):
    from lakehouse import cli

    registry = {"url": f"mock://test-wire-schemas-cli-{make_spec.directory.parent.name}"}
    spec = followed(make_spec, (1, V1))
    ids = [register_schema(registry, f"{spec.source.topic}-value", json.dumps(v)) for v in (V1, V2, V3)]
    assert ids == [1, 2, 3]
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", registry["url"])
    assert cli.main(["schemas", "--pipeline", spec.name, "--pull"]) == 2  # 3 lands in the folder: the spec breaks
    assert "writer schema 3: field 'amount' is int in the contract but string" in capsys.readouterr().err
    assert sorted(p.name for p in (make_spec.directory / "schemas").iterdir()) == ["1.avsc", "2.avsc", "3.avsc"]
    (make_spec.directory / "schemas" / "3.avsc").unlink()
    assert cli.main(["schemas", "--pipeline", spec.name, "--json"]) == 2  # the registry's 3 is incompatible
    listed = {r["schema_id"]: (r["where"], r["verdict"]) for r in json.loads(capsys.readouterr().out)}
    assert listed == {1: ("folder", "fits"), 2: ("folder", "fits"), 3: ("registry", "incompatible")}


def test_schemas_pull_fills_an_empty_folder_a_contract_from_the_writer_schemas_cannot_load_without(
        make_spec, monkeypatch, capsys):
    from lakehouse import cli
    from lakehouse.core.spec import load_pipeline

    registry = {"url": f"mock://test-wire-bootstrap-{make_spec.directory.parent.name}"}
    spec = followed(make_spec, (1, V1))
    (make_spec.directory / "schemas" / "1.avsc").unlink()  # a new pipeline: nothing pulled yet
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", registry["url"])
    with pytest.raises(SpecError, match=rf"`lakehouse schemas --pipeline {spec.name} --pull` fills it"):
        load_pipeline(spec.name)
    assert [register_schema(registry, f"{spec.source.topic}-value", json.dumps(v)) for v in (V1, V2)] == [1, 2]
    assert cli.main(["schemas", "--pipeline", spec.name, "--pull"]) == 0
    assert "pulled   2 (AVRO)" in capsys.readouterr().err
    assert sorted(p.name for p in (make_spec.directory / "schemas").iterdir()) == ["1.avsc", "2.avsc"]
    assert load_pipeline(spec.name).contract.names == ("order_id", "amount", "note")


# ------------------------------------------------------------------- the row plans agree with the reference

PLANNED = {"type": "record", "name": "P", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "serial", "type": ["null", "long"], "default": None},
    {"name": "price", "type": "double"},
    {"name": "code", "type": "string"},
    {"name": "flag", "type": ["null", "boolean"], "default": None},
    {"name": "raw", "type": "bytes"},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None}]}
PLANNED_CONTRACT = [
    {"name": "order_id", "type": "string", "required": True},
    {"name": "qty", "type": "long", "required": True, "min": 1},          # a bound: checked
    {"name": "serial", "type": "long", "required": True},                  # nullable in the writer: checked
    {"name": "price", "type": "double"},                                   # NaN and infinity: checked
    {"name": "code", "type": "string", "pattern": "[A-Z]{3}"},
    {"name": "flag", "type": "boolean"},
    {"name": "raw", "type": "binary"},
    {"name": "at", "type": "timestamp"},
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=st.fixed_dictionaries({
    "order_id": st.text(max_size=5), "qty": st.integers(-2 ** 31, 2 ** 31 - 1),
    "serial": st.none() | st.integers(-2 ** 63, 2 ** 63 - 1), "price": st.floats(),
    "code": st.sampled_from(["EUR", "eur", "EURO"]), "flag": st.none() | st.booleans(),
    "raw": st.binary(max_size=4),
    "at": st.none() | st.datetimes(timezones=st.just(timezone.utc))}),
    quarantine=st.sampled_from([frozenset(), frozenset({"code"})]))
def test_an_avro_row_plan_gives_the_reference_verdict_for_any_record(make_spec, record, quarantine):
    spec = spec_in(make_spec, "avro", {"4.avsc": json.dumps(PLANNED)}, fields=PLANNED_CONTRACT, partition_by=None,
                   key=None)
    value = wire(4, PLANNED, record)

    def outcome(call):
        try:
            return "row", call(None, value)
        except Rejected as rejected:
            return rejected.kind, rejected.detail

    validator = RecordValidator(spec, quarantined=quarantine)
    planned = outcome(validator.check_row)
    reference = outcome(validator.check)
    assert planned == (reference if reference[0] != "row" else ("row", tuple(reference[1].values())))
