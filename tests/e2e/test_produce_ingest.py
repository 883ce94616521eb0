"""`lakehouse produce` feeding the real embedded broker, ingested by the real job (Spark, catalog): Protobuf and
JSON Schema topics dead-letter exactly the defects the report names, and a produced Debezium change stream
(JSON with Kafka Connect schemas; Avro with its schemas registered in confluent-kafka's MockSchemaRegistryClient,
reached by the ingest job's driver in this process) lands in exactly the final state the report says."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import date, datetime, timedelta, timezone

import pytest
from tests.unit.devstack.test_synthesis_formats import EXTENSIONS

from e2e import assert_exactly_once, log_ends, pipeline, rows, run_cli, summaries  # noqa: F401 (fixture)
from lakehouse.core import config, offsets
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse_dev import produce, record_formats

pytestmark = pytest.mark.slow
CDC_FIELDS = [{"name": "id", "type": "long", "required": True},
              {"name": "sku", "type": "string", "required": True, "pattern": "^[A-Z]{3}-[0-9]{4}$"},
              {"name": "price", "type": "decimal(10,2)", "min": 0},
              {"name": "status", "type": "string", "required": True, "enum": ["active", "blocked"]},
              {"name": "updated_at", "type": "timestamp", "unit": "us", "required": True}]
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("fmt, key_format", [("protobuf", "json_schema"), ("json_schema", "protobuf")])
def test_produced_records_in_a_wire_format_are_dead_lettered_exactly_as_the_report_says(
        platform, pipeline, make_spec, spark, fmt, key_format):
    """Values in one wire format, record keys (holding order_id) in the other."""
    twin = make_spec()
    folder = make_spec.directory / "schemas"
    folder.mkdir()
    (folder / f"4.{EXTENSIONS[fmt]}").write_text(record_formats.contract_schema(fmt, twin.contract.fields, "orders"))
    (folder / f"5.{EXTENSIONS[key_format]}").write_text(
        record_formats.contract_schema(key_format, (twin.contract.field("order_id"),), "orders_key"))
    spec = pipeline(source={"value_format": fmt, "schemas": "schemas", "partitions": 2,
                            "key": {"field": "order_id", "required": True, "format": key_format}})
    report = produce.produce(spec, 800, bad_ratio=0.15, seed=5)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 800
    letters = Counter(r["error_kind"] for r in rows(platform, spec, spec.dead_letter_table))
    assert letters == Counter(report.bad_by_kind)
    assert {"bad_wire_format", "unknown_schema", "bad_key", "key_mismatch"} <= set(letters)
    landed = rows(platform, spec, spec.target.table)
    assert len(landed) == report.valid
    assert all(json.loads(r["_kafka"]["key"]) == {"order_id": r["order_id"]} for r in landed)


def as_checked(spec, row: dict) -> dict:
    """A table row's contract columns in the form the reader's checks give (epoch micros, epoch days)."""
    out = {}
    for f in spec.contract.fields:
        value = row[f.name]
        if isinstance(value, datetime):
            value = (value - _EPOCH) // timedelta(microseconds=1)
        elif isinstance(value, date):
            value = (value - _EPOCH.date()).days
        out[f.name] = value
    return out


@pytest.mark.parametrize("value_format", ["json", "avro"])
def test_a_produced_change_stream_lands_in_the_final_state_its_report_names(
        platform, pipeline, spark, monkeypatch, value_format, request):
    if value_format == "avro":  # schemas registered from the contract; the job's driver fetches them
        monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", request.getfixturevalue("registry_url"))
    spec = pipeline(fields=CDC_FIELDS, mode="cdc", table_key=["id"], partition_by=None, publish={"view": None},
                    source={"topic": f"shop.public.stock_{uuid.uuid4().hex[:6]}", "value_format": value_format,
                            "key": {"field": None}, "partitions": 3})
    report = produce.produce(spec, 1500, bad_ratio=0.05, seed=8, platform=config.load(),
                             connect_schemas=value_format == "json")
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    ends = log_ends(platform, spec.source.topic)
    assert sum(ends.values()) == 1500
    for name in (spec.target.table, spec.dead_letter_table):  # an upsert table keeps no overwritten row: positions
        assert offsets.decode_positions(summaries(platform, spec, name)[-1][SnapshotSummary.POSITIONS]) == ends
    landed = {(r["id"],): as_checked(spec, r) for r in rows(platform, spec, spec.target.table)}
    assert landed == report.changes.final_rows
    assert not report.changes.deleted_keys & set(landed) and report.changes.deleted_keys
    letters = Counter(r["error_kind"] for r in rows(platform, spec, spec.dead_letter_table))
    assert letters == Counter(report.bad_by_kind) and {"bad_envelope", "unsupported_change"} <= set(letters)
