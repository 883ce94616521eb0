"""Protobuf and JSON Schema topics on the real embedded broker, Spark and catalog: typed rows, broken values
dead-lettered by kind, exactly once through kill -9 at every point of a batch; writer schemas from the registry
(the stack's Apicurio Registry, its Confluent-compatible API behind basic auth, reached by the ingest job's
driver) shipped to the tasks, a new writer schema adding fields or widening types (Avro and Protobuf) while the job
runs, and a restart during a registry outage after a widening."""

from __future__ import annotations

import json
import struct

import pytest
from tests.unit.ingest.test_wire_formats import EVENT_TIME, ORDER_PROTO, proto_order

from e2e import (  # noqa: F401 (fixture)
    assert_exactly_once,
    FORMAT_KILL_POINTS,
    killed_at_every_point_then_resumed,
    pipeline,
    rows,
    run_cli,
    send,
    table,
)
from lakehouse.core import config, events
from lakehouse.ingest.schema_store import parse_schema, register_schema
from lakehouse.ingest.wire import wire_json, wire_protobuf, wire_value

pytestmark = pytest.mark.slow


def protobuf_pipeline(pipeline, make_spec, **overrides):
    folder = make_spec.directory / "schemas"
    folder.mkdir(exist_ok=True)
    (folder / "3.proto").write_text(ORDER_PROTO)
    return pipeline(source={"value_format": "protobuf", "schemas": "schemas", "partitions": 2}, **overrides)


def protobuf_orders(count: int) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    broken_kinds = ("bad_wire_format", "unknown_schema", "malformed_protobuf")
    records, broken = [], dict.fromkeys(broken_kinds, 0)
    for i in range(count):
        value = wire_protobuf(3, proto_order(order_id=f"ord-{i}", amount=float(i % 300)))
        if i % 10 == 9:
            kind = broken_kinds[(i // 10) % 3]
            broken[kind] += 1
            value = {"bad_wire_format": lambda v: b"\x01" + v[1:], "unknown_schema": lambda v: v[:1] + struct.pack(">I", 8) + v[5:],
                     "malformed_protobuf": lambda v: v[:-3]}[kind](value)
        records.append((f"ord-{i}".encode(), value))
    return records, broken


def test_a_protobuf_topic_lands_typed_with_broken_values_dead_lettered_by_kind(platform, pipeline, make_spec, spark):
    spec = protobuf_pipeline(pipeline, make_spec)
    records, broken = protobuf_orders(300)
    send(platform, spec.source.topic, records)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 300
    landed = {r["order_id"]: r for r in rows(platform, spec, spec.target.table)}
    assert len(landed) == 300 - sum(broken.values())
    assert landed["ord-4"]["status"] == "paid" and landed["ord-4"]["event_time"] == EVENT_TIME
    letters = rows(platform, spec, spec.dead_letter_table)
    assert {k: sum(1 for r in letters if r["error_kind"] == k) for k in broken} == broken


def test_kill_9_while_decoding_or_writing_a_batch_neither_loses_nor_duplicates_a_protobuf_record(platform, pipeline,
                                                                                         make_spec, spark):
    spec = protobuf_pipeline(pipeline, make_spec, trigger={"max_records_per_batch": 80})
    records, _ = protobuf_orders(500)
    send(platform, spec.source.topic, records)
    killed_at_every_point_then_resumed(platform, spec, points=FORMAT_KILL_POINTS)
    assert assert_exactly_once(platform, spec) == 500


V1 = {"type": "object", "required": ["order_id", "amount"], "properties": {
    "order_id": {"type": "string"}, "amount": {"type": "number"},
    "event_time": {"type": "string", "format": "date-time"}}}
V2 = {**V1, "properties": {**V1["properties"], "coupon": {"type": ["string", "null"]},
                           "lines": {"type": "array", "items": {"type": "object", "required": ["sku"], "properties": {
                               "sku": {"type": "string"}, "qty": {"type": "integer"}}}}}}


def test_registry_writer_schemas_reach_the_tasks_and_a_new_one_evolves_the_table_while_ingesting(
        platform, pipeline, make_spec, spark, monkeypatch, registry_url):
    """The folder holds version 1 (the contract follows the writer schemas); the registry holds version 1 under
    the topic's subject and version 2 under a record-name subject, so the job meets version 2 first in a
    record: the task reports it, the driver fetches it, evolves the table and writes the batch again."""
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", registry_url)
    registry = config.load(fresh=True).schema_registry()
    folder = make_spec.directory / "schemas"
    folder.mkdir()
    unique = make_spec.directory.parent.name
    v1 = register_schema(registry, f"placeholder-{unique}-value", json.dumps(V1), "JSON")
    (folder / f"{v1}.json").write_text(json.dumps(V1))
    spec = pipeline(source={"value_format": "json_schema", "schemas": "schemas", "partitions": 1, "key": None},
                    contract={"fields": None, "from": "writer_schema"}, partition_by=None, publish={"view": None})
    v2 = register_schema(registry, f"shop.Order-{unique}", json.dumps(V2), "JSON")
    ghost = 2 ** 30 + v2  # registered nowhere
    when = EVENT_TIME.isoformat()
    send(platform, spec.source.topic, [
        (None, wire_json(v1, {"order_id": "a", "amount": 1.5, "event_time": when})),
        (None, wire_json(v2, {"order_id": "b", "amount": 2, "coupon": "WINTER",
                              "lines": [{"sku": "x", "qty": 2}]})),
        (None, wire_json(ghost, {"order_id": "c", "amount": 3})),
        (None, wire_json(v2, {"order_id": "d", "amount": 4, "lines": [{"qty": 1}]})),  # sku required
    ])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_exactly_once(platform, spec) == 4

    landed = {r["order_id"]: r for r in rows(platform, spec, spec.target.table)}
    assert landed["a"]["coupon"] is None and landed["a"]["event_time"] == EVENT_TIME
    assert landed["b"]["coupon"] == "WINTER" and landed["b"]["lines"] == [{"sku": "x", "qty": 2}]
    letters = {r["_kafka"]["offset"]: (r["error_kind"], r["error_detail"])
               for r in rows(platform, spec, spec.dead_letter_table)}
    assert letters[2][0] == "unknown_schema" and letters[3] == ("missing_required", "lines[0].sku is required")
    assert table(platform, spec, spec.target.table).schema().find_field("lines.element.sku") is not None
    evolved = events.recent(spec.name, kind="schema", platform=platform, catalog=spec.catalog)
    assert [e["details"]["schema_id"] for e in evolved] == [v2]
    assert "added coupon, lines" in evolved[0]["message"]


def test_a_new_writer_schema_file_in_the_folder_evolves_the_table_at_the_next_run(platform, pipeline, make_spec,
                                                                                   spark):
    folder = make_spec.directory / "schemas"
    folder.mkdir()
    (folder / "1.json").write_text(json.dumps(V1))
    spec = pipeline(source={"value_format": "json_schema", "schemas": "schemas", "partitions": 1, "key": None},
                    contract={"fields": None, "from": "writer_schema"}, partition_by=None, publish={"view": None})
    send(platform, spec.source.topic, [(None, wire_json(1, {"order_id": "a", "amount": 1}))])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    (folder / "2.json").write_text(json.dumps(V2))  # the air-gapped path: a reviewed file, no registry
    send(platform, spec.source.topic, [(None, wire_json(2, {"order_id": "b", "amount": 2, "coupon": "X"}))])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert {r["order_id"]: r["coupon"] for r in rows(platform, spec, spec.target.table)} == {"a": None, "b": "X"}



def test_kill_9_while_decoding_or_writing_a_batch_neither_loses_nor_duplicates_a_json_schema_record(platform, pipeline,
                                                                                            make_spec, spark):
    folder = make_spec.directory / "schemas"
    folder.mkdir()
    (folder / "1.json").write_text(json.dumps(V1))
    (folder / "2.json").write_text(json.dumps(V2))
    spec = pipeline(source={"value_format": "json_schema", "schemas": "schemas", "partitions": 2},
                    contract={"fields": None, "from": "writer_schema"}, partition_by=None, publish={"view": None},
                    trigger={"max_records_per_batch": 80})
    records = []
    for i in range(500):
        document = {"order_id": f"ord-{i}", "amount": i % 90}
        value = wire_json(2, {**document, "coupon": "X"}) if i % 2 else wire_json(1, document)
        records.append((f"ord-{i}".encode(), value[:-2] if i % 25 == 24 else value))  # truncated: a dead letter
    send(platform, spec.source.topic, records)
    killed_at_every_point_then_resumed(platform, spec, points=FORMAT_KILL_POINTS)
    assert assert_exactly_once(platform, spec) == 500
    assert len(rows(platform, spec, spec.dead_letter_table)) == 20

WIDENING = {
    "avro": ("AVRO", "avsc",
             json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
                 {"name": "order_id", "type": "string"}, {"name": "qty", "type": "int"},
                 {"name": "price", "type": "float"}]}),
             json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
                 {"name": "order_id", "type": "string"}, {"name": "qty", "type": "long"},
                 {"name": "price", "type": "double"}, {"name": "coupon", "type": ["null", "string"], "default": None}]})),
    "protobuf": ("PROTOBUF", "proto",
                 'syntax = "proto3";\npackage shop;\n'
                 "message Order { string order_id = 1; int32 qty = 2; float price = 3; }\n",
                 'syntax = "proto3";\npackage shop;\n'
                 "message Order { string order_id = 1; int64 qty = 2; double price = 3; optional string coupon = 4; }\n"),
}


def widening_encoder(fmt: str, text: str):
    """(schema id, record dict) -> wire bytes for writer schema `text` of format `fmt`."""
    if fmt == "avro":
        parsed = parse_schema(text)
        return lambda schema_id, record: wire_value(schema_id, parsed, record)
    from google.protobuf import message_factory

    from lakehouse.core.schemas import compile_proto, proto_message, proto_pool

    pool, name = proto_pool(compile_proto(text))
    cls = message_factory.GetMessageClass(proto_message(pool, name, (0,)))
    return lambda schema_id, record: wire_protobuf(schema_id, cls(**record))


@pytest.mark.parametrize("fmt", sorted(WIDENING))
def test_a_widening_writer_schema_evolves_the_table_and_a_restart_during_a_registry_outage_resumes(
        fmt, platform, pipeline, make_spec, spark, monkeypatch, free_tcp_port, registry_url):
    """Version 1 (int qty, float price) is in the folder; version 2 (long qty, double price, a coupon) only
    in the registry, under a record-name subject. The job meets version 2 in a record and widens the table in
    place (values past 2^31 land). Restarted while the registry is down, with only version 1 records to read,
    the job resumes: the widened table still holds the folder's narrower contract."""
    schema_type, suffix, v1_text, v2_text = WIDENING[fmt]
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", registry_url)
    registry = config.load(fresh=True).schema_registry()
    unique = make_spec.directory.parent.name
    v1 = register_schema(registry, f"placeholder-{unique}-value", v1_text, schema_type)
    v2 = register_schema(registry, f"shop.Order-{unique}", v2_text, schema_type)
    folder = make_spec.directory / "schemas"
    folder.mkdir()
    (folder / f"{v1}.{suffix}").write_text(v1_text)
    spec = pipeline(source={"value_format": fmt, "schemas": "schemas", "partitions": 1, "key": None},
                    contract={"fields": None, "from": "writer_schema"}, partition_by=None, publish={"view": None})
    old, new = widening_encoder(fmt, v1_text), widening_encoder(fmt, v2_text)
    send(platform, spec.source.topic, [
        (None, old(v1, {"order_id": "a", "qty": 2, "price": 1.5})),
        (None, new(v2, {"order_id": "b", "qty": 2 ** 40, "price": 0.1, "coupon": "WINTER"})),
        (None, old(v1, {"order_id": "c", "qty": -(2 ** 31), "price": 2.25})),
    ])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    schema = table(platform, spec, spec.target.table).schema()
    assert (str(schema.find_type("qty")), str(schema.find_type("price"))) == ("long", "double")
    evolved = events.recent(spec.name, kind="schema", platform=platform, catalog=spec.catalog)
    assert [e["details"]["schema_id"] for e in evolved] == [v2]
    assert sorted(evolved[0]["details"]["widened"]) == ["price", "qty"] and evolved[0]["details"]["added"] == ["coupon"]

    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", f"http://127.0.0.1:{free_tcp_port}")  # nobody listens
    send(platform, spec.source.topic, [(None, old(v1, {"order_id": "d", "qty": 7, "price": 3.5}))])
    resumed = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert assert_exactly_once(platform, spec) == 4
    landed = {r["order_id"]: (r["qty"], r["price"], r["coupon"]) for r in rows(platform, spec, spec.target.table)}
    assert landed == {"a": (2, 1.5, None), "b": (2 ** 40, 0.1, "WINTER"), "c": (-(2 ** 31), 2.25, None),
                      "d": (7, 3.5, None)}
    assert rows(platform, spec, spec.dead_letter_table) == []
