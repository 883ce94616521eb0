"""The contract's richer types on the real path (embedded broker, Spark tasks writing Parquet, the JDBC
catalog): decimals, UUIDs, floats, bytes, epoch-unit timestamps, structs, lists and maps land typed, and
a spec edit that adds a nested field and widens a decimal evolves the table in place."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import yaml

from e2e import assert_exactly_once, pipeline, rows, run_cli, send, table  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

FIELDS = [
    {"name": "order_id", "type": "string", "required": True},
    {"name": "amount", "type": "decimal(10,2)", "required": True},
    {"name": "ref", "type": "uuid"},
    {"name": "ratio", "type": "float"},
    {"name": "blob", "type": "binary"},
    {"name": "event_time", "type": "timestamp", "required": True, "unit": "ms"},
    {"name": "address", "type": "struct", "fields": [
        {"name": "street", "type": "string"},
        {"name": "zip", "type": "string", "required": True}]},
    {"name": "tags", "type": "list", "items": {"type": "string", "required": True}},
    {"name": "attrs", "type": "map", "values": {"type": "long"}},
]
REF = "6f1c2b9e-6a43-4d1e-9a51-0e8a1f3f7b21"


def order(i: int, **extra) -> tuple[bytes, bytes]:
    value = {"order_id": f"ord-{i}", "amount": f"{i}.5{i % 10}", "ref": REF.upper() if i % 2 else REF,
             "ratio": i / 4, "blob": "AAEC", "event_time": 1_764_000_000_000 + i,
             "address": {"street": "Main St", "zip": f"{10000 + i}"}, "tags": ["a", f"t{i}"],
             "attrs": {"qty": i, "gift": None}, **extra}
    return f"ord-{i}".encode(), json.dumps(value).encode()


def test_nested_decimal_uuid_and_binary_values_land_typed_and_broken_ones_are_dead_letters(pipeline, platform,
                                                                                           spark):
    spec = pipeline(fields=FIELDS, partition_by=None, partitions=1)
    broken = {
        "out_of_range": order(100, amount="12.345"),           # three decimal places in decimal(10,2)
        "bad_uuid": order(101, ref="not-a-uuid"),
        "missing_required": order(102, address={"street": "x"}),  # address.zip is required
        "wrong_type": order(103, tags="a,b"),
    }
    send(platform, spec.source.topic, [order(i) for i in range(20)] + list(broken.values()))
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_exactly_once(platform, spec) == 24

    landed = {r["order_id"]: r for r in rows(platform, spec, spec.target.table)}
    assert len(landed) == 20
    first = landed["ord-3"]
    assert first["amount"] == Decimal("3.53") and first["ref"] == REF  # canonical lower-case text
    assert first["ratio"] == pytest.approx(0.75) and first["blob"] == b"\x00\x01\x02"
    assert first["event_time"] == datetime.fromtimestamp(1_764_000_000.003, tz=timezone.utc)
    assert first["address"] == {"street": "Main St", "zip": "10003"}
    assert first["tags"] == ["a", "t3"] and dict(first["attrs"]) == {"qty": 3, "gift": None}
    letters = {r["error_kind"]: r["error_detail"] for r in rows(platform, spec, spec.dead_letter_table)}
    assert set(letters) == set(broken)
    assert "address.zip is required" in letters["missing_required"]
    assert "more than 2 decimal places" in letters["out_of_range"]

    # Spark reads the same table: nested columns resolve by path
    seen = spark.sql(f"SELECT address.zip AS zip, attrs['qty'] AS qty FROM {spec.qualified(spec.target.table)} "
                     f"WHERE order_id = 'ord-7'").collect()
    assert [(r.zip, r.qty) for r in seen] == [("10007", 7)]


def test_a_nested_field_added_and_a_decimal_widened_in_the_spec_evolve_the_table_in_place(pipeline, platform,
                                                                                          spark):
    spec = pipeline(fields=FIELDS, partition_by=None, partitions=1)
    send(platform, spec.source.topic, [order(i) for i in range(5)])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0

    raw = yaml.safe_load(open(spec.path))
    fields = raw["contract"]["fields"]
    fields[1]["type"] = "decimal(14,2)"
    fields[6]["fields"].append({"name": "city", "type": "string"})
    open(spec.path, "w").write(yaml.safe_dump(raw, sort_keys=False))
    send(platform, spec.source.topic, [order(i, amount="123456789012.25",
                                             address={"zip": "75001", "city": "Paris"}) for i in range(5, 8)])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]

    schema = table(platform, spec, spec.target.table).schema()
    assert str(schema.find_field("amount").field_type) == "decimal(14, 2)"
    assert schema.find_field("address.city") is not None
    landed = {r["order_id"]: r for r in rows(platform, spec, spec.target.table)}
    assert landed["ord-6"]["amount"] == Decimal("123456789012.25") and landed["ord-6"]["address"]["city"] == "Paris"
    assert landed["ord-1"]["address"] == {"street": "Main St", "zip": "10001", "city": None}  # old rows: null
    assert assert_exactly_once(platform, spec) == 8
