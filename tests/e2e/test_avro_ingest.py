"""An Avro topic (Confluent wire format, writer schemas from the folder beside the spec) ingested on the
real embedded broker, Spark and catalog: rows typed by the contract, every broken value a dead letter
of its own kind, two writer schema versions in one topic, and exactly once through kill -9 at every point of
a batch."""

from __future__ import annotations

import json
import struct
from datetime import datetime, timedelta, timezone

import pytest
from tests.unit.ingest.test_avro_values import ORDER_SCHEMA, ORDER_SCHEMA_V2

from e2e import (  # noqa: F401 (fixture)
    assert_exactly_once,
    FORMAT_KILL_POINTS,
    killed_at_every_point_then_resumed,
    pipeline,
    rows,
    run_cli,
    send,
)
from lakehouse.core.catalog import open_catalog
from lakehouse.ingest.schema_store import parse_schema
from lakehouse.ingest.wire import wire_value

pytestmark = pytest.mark.slow
START = datetime(2026, 11, 24, 6, 0, tzinfo=timezone.utc)
BROKEN = {
    "bad_wire_format": lambda good: b'{"order_id": "ord-x"}',
    "unknown_schema": lambda good: b"\x00" + struct.pack(">I", 77) + good[5:],
    "malformed_avro": lambda good: good[:-4],
}


def avro_pipeline(pipeline, make_spec, **overrides):
    folder = make_spec.directory / "schemas"
    folder.mkdir(exist_ok=True)
    (folder / "1.avsc").write_text(json.dumps(ORDER_SCHEMA))
    (folder / "2.avsc").write_text(json.dumps(ORDER_SCHEMA_V2))
    return pipeline(source={"value_format": "avro", "schemas": "schemas", "partitions": 2}, **overrides)


def orders(count: int) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    """`count` records: every 10th broken (cycling through BROKEN), the rest valid, half of them written
    with schema 2 (an added optional field); returns the records and the broken count per kind."""
    v1, v2 = parse_schema(json.dumps(ORDER_SCHEMA)), parse_schema(json.dumps(ORDER_SCHEMA_V2))
    records, broken = [], {kind: 0 for kind in BROKEN}
    for i in range(count):
        value = {"order_id": f"ord-{i}", "customer_id": f"cus-{i % 7}", "amount": float(i % 500),
                 "currency": "EUR", "status": "paid", "event_time": START + timedelta(seconds=i)}
        good = wire_value(1, v1, value) if i % 2 else wire_value(2, v2, {**value, "coupon": "WINTER"})
        if i % 10 == 9:
            kind = list(BROKEN)[(i // 10) % len(BROKEN)]
            broken[kind] += 1
            good = BROKEN[kind](good)
        records.append((f"ord-{i}".encode(), good))
    return records, broken


def test_an_avro_topic_lands_typed_with_its_broken_values_dead_lettered_by_kind(platform, pipeline, make_spec,
                                                                               spark):
    spec = avro_pipeline(pipeline, make_spec)
    records, broken = orders(600)
    send(platform, spec.source.topic, records)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 600
    data = {r["order_id"]: r for r in rows(platform, spec, spec.target.table)}
    assert len(data) == 600 - sum(broken.values())
    assert data["ord-0"]["event_time"] == START and data["ord-3"]["amount"] == 3.0
    letters = rows(platform, spec, spec.dead_letter_table)
    assert {kind: sum(1 for r in letters if r["error_kind"] == kind) for kind in BROKEN} == broken
    assert all(r["value"] for r in letters), "a dead letter keeps the raw value"


def test_kill_9_while_decoding_or_writing_a_batch_neither_loses_nor_duplicates_an_avro_record(platform, pipeline, make_spec,
                                                                                        spark):
    spec = avro_pipeline(pipeline, make_spec, trigger={"max_records_per_batch": 150})
    records, _ = orders(1000)
    send(platform, spec.source.topic, records)
    killed_at_every_point_then_resumed(platform, spec, points=FORMAT_KILL_POINTS)
    assert assert_exactly_once(platform, spec) == 1000


def test_an_avro_pipeline_without_writer_schemas_is_refused_at_start_naming_both_sources(platform, pipeline,
                                                                                        spark, monkeypatch):
    spec = pipeline(source={"value_format": "avro", "partitions": 1})
    monkeypatch.delenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", raising=False)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert run.returncode == 2, run.stderr[-2000:]
    assert "source.schemas" in run.stderr and "LAKEHOUSE_SCHEMA_REGISTRY_URL" in run.stderr
    assert not open_catalog(platform, spec.catalog).table_exists(spec.target.table), "refused before creating"


def test_a_registry_outage_stops_the_job_after_its_retry_budget_and_dead_letters_nothing(
        platform, pipeline, free_tcp_port, monkeypatch, spark):
    spec = pipeline(source={"value_format": "avro", "partitions": 1}, supervision={"retry_budget": "3s"})
    records, _ = orders(20)
    send(platform, spec.source.topic, records[:8])  # none broken
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", f"http://127.0.0.1:{free_tcp_port}")  # nobody listens
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 1, run.stderr[-2000:]
    assert "schema-registry-unavailable" in run.stderr and "Nothing was lost" in run.stderr, run.stderr[-2000:]
    assert rows(platform, spec, spec.dead_letter_table) == [] and rows(platform, spec, spec.target.table) == []


def test_lakehouse_produce_feeds_an_avro_pipeline_whose_dead_letters_match_what_it_broke(
        platform, pipeline, make_spec, spark):
    from lakehouse_dev import produce

    spec = avro_pipeline(pipeline, make_spec)
    report = produce.produce(spec, 1500, bad_ratio=0.1, seed=5)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 1500
    letters = rows(platform, spec, spec.dead_letter_table)
    assert {k: sum(1 for r in letters if r["error_kind"] == k) for k in report.bad_by_kind} == report.bad_by_kind
    assert len(letters) == sum(report.bad_by_kind.values()) and {"unknown_schema", "malformed_avro"} <= set(
        report.bad_by_kind)
