"""Avro values in the Confluent wire format: decoded against the contract, or dead-lettered with the
right kind; writer schemas from a folder beside the spec or a schema registry (confluent-kafka's own
MockSchemaRegistryClient, `mock://`: no Confluent-compatible registry installs on these machines);
a registry that does not answer is an outage, never a dead letter. Hostile bytes never escape as
anything but a verdict."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core import config, errors
from lakehouse.core.spec import SpecError, load_spec, read_schema_folder
from lakehouse.ingest.rejects import ERROR_KINDS, Rejected
from lakehouse.ingest.schema_store import parse_schema, register_avro_schema, schema_store
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.wire import wire_value

SHIPPED = config.REPO_ROOT / "include" / "pipelines" / "orders.yaml"
ORDER_SCHEMA = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "customer_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "status", "type": "string"},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
# version 2 adds an optional field: old and new writers' records both decode
ORDER_SCHEMA_V2 = {**ORDER_SCHEMA, "fields": [*ORDER_SCHEMA["fields"],
                                              {"name": "coupon", "type": ["null", "string"], "default": None}]}
EVENT_TIME = datetime(2026, 11, 24, 8, 30, 15, 123000, tzinfo=timezone.utc)
EVENT_US = int(EVENT_TIME.timestamp() * 1_000_000)


def order(i: int = 1, **changes) -> dict:
    return {"order_id": f"ord-{i}", "customer_id": "cus-7", "amount": 12.5, "currency": "EUR",
            "status": "paid", "event_time": EVENT_TIME, **changes}


@pytest.fixture
def schemas(tmp_path):
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "1.avsc").write_text(json.dumps(ORDER_SCHEMA))
    (folder / "2.avsc").write_text(json.dumps(ORDER_SCHEMA_V2))
    return folder


@pytest.fixture
def avro_spec(schemas):
    return with_schemas(load_spec(SHIPPED), schemas)


def with_schemas(spec, folder):
    """`spec` as an Avro pipeline whose writer schemas are the `<id>.avsc` files of `folder`."""
    return replace(spec, source=replace(spec.source, value_format="avro", schemas=read_schema_folder(folder)))


def verdict(validator: RecordValidator, value: bytes):
    try:
        return validator.check("ord-1", value)
    except Rejected as rejected:
        return rejected.kind


def test_an_avro_record_becomes_the_contract_row_whichever_compatible_writer_schema_wrote_it(avro_spec):
    validator = RecordValidator(avro_spec)
    v1 = wire_value(1, parse_schema(json.dumps(ORDER_SCHEMA)), order())
    v2 = wire_value(2, parse_schema(json.dumps(ORDER_SCHEMA_V2)), {**order(), "coupon": "WINTER"})
    expected = {"order_id": "ord-1", "customer_id": "cus-7", "amount": 12.5, "currency": "EUR", "status": "paid",
                "event_time": EVENT_US}
    assert validator.check("ord-1", v1) == expected
    assert validator.check("ord-1", v2) == expected
    assert validator.check_row("ord-1", v1) == tuple(expected.values())  # the batch path gives the same verdict


def test_each_broken_avro_value_is_a_dead_letter_of_its_own_kind(avro_spec):
    validator = RecordValidator(avro_spec)
    v1 = parse_schema(json.dumps(ORDER_SCHEMA))
    good = wire_value(1, v1, order())
    assert verdict(validator, json.dumps({"order_id": "ord-1"}).encode()) == "bad_wire_format"
    assert verdict(validator, b"\x00\x00\x00") == "bad_wire_format"
    assert verdict(validator, b"\x00" + struct.pack(">I", 99) + good[5:]) == "unknown_schema"
    assert verdict(validator, good[:-3]) == "malformed_avro"             # truncated
    assert verdict(validator, good + b"\x00") == "malformed_avro"        # trailing bytes
    assert verdict(validator, wire_value(1, v1, order(amount=-1.0))) == "out_of_range"
    assert verdict(validator, wire_value(1, v1, order(currency="eur"))) == "pattern_mismatch"
    assert verdict(validator, wire_value(1, v1, order(status="lost"))) == "bad_enum"
    assert {"bad_wire_format", "unknown_schema", "malformed_avro"} <= set(ERROR_KINDS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=200), schema_id=st.sampled_from([1, 2, 3, 2 ** 32 - 1]))
def test_arbitrary_bytes_after_a_header_get_a_verdict_never_an_escaping_error(avro_spec, payload, schema_id):
    validator = RecordValidator(avro_spec)
    outcome = verdict(validator, b"\x00" + struct.pack(">I", schema_id) + payload)
    assert isinstance(outcome, dict) or outcome in ERROR_KINDS


def test_writer_schemas_come_from_the_registry_and_an_unknown_id_is_a_dead_letter():
    registry = {"url": "mock://test-formats-registry"}
    schema_id = register_avro_schema(registry, "orders-value", json.dumps(ORDER_SCHEMA))
    spec = load_spec(SHIPPED)
    spec = replace(spec, source=replace(spec.source, value_format="avro"))
    validator = RecordValidator(spec, registry=registry)
    assert validator.check("ord-1", wire_value(schema_id, parse_schema(json.dumps(ORDER_SCHEMA)), order()))
    assert verdict(validator, b"\x00" + struct.pack(">I", schema_id + 1000) + b"\x00") == "unknown_schema"


def test_a_registry_that_does_not_answer_is_a_retryable_outage_not_a_dead_letter(free_tcp_port):
    spec = load_spec(SHIPPED)
    spec = replace(spec, source=replace(spec.source, value_format="avro"))
    validator = RecordValidator(spec, registry={"url": f"http://127.0.0.1:{free_tcp_port}", "timeout": 2})
    with pytest.raises(errors.SchemaRegistryUnavailableError, match="schema registry") as raised:
        validator.check("ord-1", b"\x00" + struct.pack(">I", 1) + b"\x02")
    assert errors.transient_cause(raised.value)  # the ingest job retries the batch, then stops
    assert errors.marker_in(str(raised.value))[0] == "retryable"  # as a Spark task reports it


@pytest.mark.parametrize("status", [401, 403])
def test_a_registry_that_refuses_the_credentials_stops_at_once_naming_them(status):
    """Not an outage: waiting does not fix a wrong password, so no retry budget is spent on it."""
    import http.server
    import threading

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            body = json.dumps({"error_code": status * 100 + 1, "message": "Unauthorized"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = load_spec(SHIPPED)
        spec = replace(spec, source=replace(spec.source, value_format="avro"))
        registry = {"url": f"http://127.0.0.1:{server.server_address[1]}", "basic.auth.user.info": "me:wrong"}
        validator = RecordValidator(spec, registry=registry)
        with pytest.raises(errors.SchemaRegistryAccessError, match=f"HTTP {status}.*LAKEHOUSE_SCHEMA_REGISTRY_URL"):
            validator.check("ord-1", b"\x00" + struct.pack(">I", 1) + b"\x02")
        with pytest.raises(errors.SchemaRegistryAccessError, match="the subjects' versions"):
            schema_store(spec, registry).subject_versions("orders-value")
    finally:
        server.shutdown()
    assert not errors.transient_cause(errors.SchemaRegistryAccessError("x"))


def test_an_avro_pipeline_needs_a_schema_folder_or_a_registry(tmp_path):
    spec = load_spec(SHIPPED)
    spec = replace(spec, source=replace(spec.source, value_format="avro"))
    with pytest.raises(errors.ConfigurationError, match="LAKEHOUSE_SCHEMA_REGISTRY_URL"):
        RecordValidator(spec)


def test_the_spec_names_a_schema_folder_beside_it_and_refuses_one_that_is_not_there(tmp_path, schemas):
    text = SHIPPED.read_text().replace("value_format: json", "value_format: avro\n  schemas: schemas")
    (tmp_path / "orders.yaml").write_text(text)
    loaded = load_spec(tmp_path / "orders.yaml").source.schemas  # read with the spec: tasks need no folder
    assert [(schema_id, kind) for schema_id, kind, _ in loaded] == [(1, "AVRO"), (2, "AVRO")]
    assert json.loads(loaded[1][2]) == ORDER_SCHEMA_V2
    (tmp_path / "orders.yaml").write_text(text.replace("schemas: schemas", "schemas: missing"))
    with pytest.raises(SpecError, match="source.schemas"):
        load_spec(tmp_path / "orders.yaml")
    (tmp_path / "orders.yaml").write_text(SHIPPED.read_text().replace("value_format: json",
                                                                      "value_format: json\n  schemas: schemas"))
    with pytest.raises(SpecError, match="value_format 'json' and key format 'string' have none"):
        load_spec(tmp_path / "orders.yaml")
    for hostile in ('"a\\0b"', "x" * 5000, "[1, 2]", '"/etc"', '"../../.."', '"\\ud800"'):
        (tmp_path / "orders.yaml").write_text(text.replace("schemas: schemas", f"schemas: {hostile}"))
        with pytest.raises(SpecError, match="source.schemas"):
            load_spec(tmp_path / "orders.yaml")


def test_registry_credentials_travel_as_basic_auth_and_never_in_the_shown_configuration(monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", "https://ingest:s3cr%40t@registry.example:8081")
    platform = config.load(fresh=True)
    assert platform.schema_registry() == {"url": "https://registry.example:8081",
                                          "basic.auth.user.info": "ingest:s3cr@t"}
    assert "s3cr" not in repr(platform)
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", "http://ingest:pw@[::1]:8081/registry")
    assert config.load(fresh=True).schema_registry() == {"url": "http://[::1]:8081/registry",
                                                         "basic.auth.user.info": "ingest:pw"}
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", "registry:8081")
    with pytest.raises(errors.ConfigurationError, match="LAKEHOUSE_SCHEMA_REGISTRY_URL"):
        config.load(fresh=True)


def test_the_producer_writes_avro_the_reader_reads_back_and_each_defect_as_the_kind_it_claims(avro_spec, schemas):
    """`lakehouse produce` on an Avro pipeline: values in the wire format with the newest schema of the
    folder; every broken record is rejected with exactly the kind its `fault` header names."""
    from lakehouse_dev.synthesis import synthesize

    (schemas / "3.avsc").write_text(json.dumps(contract_avro_schema_of(avro_spec)))
    avro_spec = with_schemas(avro_spec, schemas)
    validator = RecordValidator(avro_spec)
    seen = set()
    for record in synthesize(avro_spec, 400, bad_ratio=0.4, seed=11):
        try:
            outcome = validator.check(validator.check_key(record.key), record.value)
        except Rejected as rejected:
            outcome = rejected.kind
        if record.kind is None:
            assert isinstance(outcome, dict), (outcome, record)
            assert record.value[:5] == b"\x00\x00\x00\x00\x03"  # the newest writer schema of the folder
        elif record.kind != "bad_kafka_timestamp":  # the reader, not the validator, checks Kafka timestamps
            assert outcome == record.kind, (record.kind, outcome)
        seen.add(record.kind)
    assert {"bad_wire_format", "unknown_schema", "malformed_avro", None, "out_of_range", "pattern_mismatch", "bad_enum",
            "null_value"} <= seen


def contract_avro_schema_of(spec):
    from lakehouse_dev.record_formats import contract_avro_schema

    return contract_avro_schema(spec)
