"""The synthetic producer's records (lakehouse_dev.synthesis): valid records keep the contract, broken ones
break exactly one rule, the one the reader's verdict names.

The unit half, without a broker; the end-to-end half (records read back from the embedded broker) is
tests/e2e/test_produce_e2e.py, the pacing is tests/unit/devstack/test_rate_limit.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime, timezone

import pytest
from e2e import pipeline  # noqa: F401 (pipeline: a fixture)

from lakehouse.ingest.reader import BatchBuilder
from lakehouse.ingest.rejects import ERROR_KINDS
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev.defects import BAD_KINDS, FORMAT_KINDS
from lakehouse_dev.produce import produce
from lakehouse_dev.synthesis import synthesize

FIXED_NOW = datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=timezone.utc)


def conforms(field, value) -> bool:
    """The contract rule for one field, written out independently of the producer and the decoder."""
    if value is None:
        return not field.required
    if field.type == "string":
        return (isinstance(value, str)
                and (field.enum is None or value in field.enum)
                and (field.max_length is None or len(value) <= field.max_length)
                and (field.pattern is None or re.fullmatch(field.pattern, value) is not None))
    if field.type in ("int", "long"):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif field.type == "double":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif field.type == "boolean":
        return isinstance(value, bool)
    elif field.type == "timestamp":
        try:
            return isinstance(value, str) and datetime.fromisoformat(value).utcoffset() is not None
        except ValueError:
            return False
    else:  # date
        try:
            return isinstance(value, str) and bool(datetime.strptime(value, "%Y-%m-%d"))
        except ValueError:
            return False
    return (ok and (field.enum is None or value in field.enum)
            and (field.min is None or value >= field.min) and (field.max is None or value <= field.max))


def verdicts(spec, records) -> list[str | None]:
    """The dead-letter kind the reader gives each record (Kafka timestamp included), None when accepted."""
    builder = BatchBuilder(spec, RecordValidator(spec), ingested_at_us=0)
    for offset, record in enumerate(records):
        builder.add(spec.source.topic, 0, offset, record.timestamp, record.key, record.value, record.headers)
    return builder.flush().column("_dlq_error_kind").to_pylist()


def test_the_reader_rejects_each_defect_as_its_kind_and_accepts_the_rest(make_spec):
    spec = make_spec()
    assert set(BAD_KINDS) <= set(ERROR_KINDS)
    records = list(synthesize(spec, 3_000, bad_ratio=0.3, seed=7))
    assert verdicts(spec, records) == [r.kind for r in records]


def test_any_contract_is_generated_within_its_rules(make_spec):
    spec = make_spec(
        fields=[
            {"name": "sku", "type": "string", "required": True, "pattern": r"^[a-z]{2}-\d{4}(-[A-Z])?$",
             "max_length": 9},
            {"name": "qty", "type": "int", "required": True, "min": 1, "max": 10},
            {"name": "weight_kg", "type": "double", "required": True, "min": 0.5, "max": 20},
            {"name": "in_stock", "type": "boolean", "required": True},
            {"name": "grade", "type": "long", "required": True, "enum": [1, 2, 3]},
            {"name": "released", "type": "date"},
            {"name": "seen_at", "type": "timestamp"},
            {"name": "label", "type": "string", "max_length": 5},
            {"name": "serial", "type": "long"},
        ],
        key={"field": "sku"}, partition_by=None,
    )
    records = list(synthesize(spec, 2_000, bad_ratio=0.25, seed=3))
    kinds = Counter(r.kind for r in records if r.kind)
    # pattern, range, enum, timestamp, date and key rules all exist here; only uuids are missing
    assert set(kinds) == set(FORMAT_KINDS["json"]) - {"bad_uuid"}
    for record in records:
        if record.kind is None:
            value = json.loads(record.value)
            assert all(conforms(f, value.get(f.name)) for f in spec.contract.fields), value
            assert record.key == value["sku"].encode()
    assert verdicts(spec, records) == [r.kind for r in records]


def test_kinds_a_spec_cannot_express_are_not_sent(make_spec):
    spec = make_spec(
        fields=[{"name": "customer_id", "type": "string", "required": True},
                {"name": "note", "type": "string"}],
        key={"field": "customer_id", "required": False},
        mode="upsert", table_key=["customer_id"], partition_by=None,
        max_value_bytes=None,  # the default, 1 MiB: an oversize record could not be sent to Kafka
    )
    kinds = Counter(r.kind for r in synthesize(spec, 1_000, bad_ratio=0.5, seed=5) if r.kind)
    # no key requirement: no null_key; an upsert keyed on the record key reads a tombstone as a delete;
    # no enum, range, pattern or timestamp; 1 MiB values are the broker's own limit
    assert set(kinds) == {"malformed_json", "not_utf8", "not_an_object", "missing_required", "wrong_type",
                          "bad_string", "bad_kafka_timestamp", "bad_key", "key_mismatch"}


def test_a_seed_reproduces_the_same_records(make_spec):
    spec = make_spec()
    first = list(synthesize(spec, 300, bad_ratio=0.2, seed=11, now=lambda: FIXED_NOW))
    again = list(synthesize(spec, 300, bad_ratio=0.2, seed=11, now=lambda: FIXED_NOW))
    assert first == again
    assert first != list(synthesize(spec, 300, bad_ratio=0.2, seed=12, now=lambda: FIXED_NOW))


def test_orders_look_like_an_order_stream(make_spec):
    spec = make_spec()
    values = [json.loads(r.value) for r in synthesize(spec, 3_000, seed=2, now=lambda: FIXED_NOW)]
    assert all(re.fullmatch(r"ord-\d{6,}", v["order_id"]) for v in values)
    assert {v["currency"] for v in values} <= {"EUR", "USD", "GBP", "JPY", "CHF", "SEK"}
    assert all(round(v["amount"], 2) == v["amount"] and v["amount"] >= 0 for v in values)
    # customers come back, orders move through their lifecycle under the same id
    assert len({v["customer_id"] for v in values}) < len(values) / 2
    statuses_by_order: dict[str, list[str]] = {}
    for v in values:
        statuses_by_order.setdefault(v["order_id"], []).append(v["status"])
    assert all(s[0] == "created" for s in statuses_by_order.values())
    assert any(s[:3] == ["created", "paid", "shipped"] for s in statuses_by_order.values())
    # timestamps carry a UTC offset; most are about now, some are days late
    times = [datetime.fromisoformat(v["event_time"]) for v in values]
    assert all(t.utcoffset() is not None for t in times)
    assert all(v["event_time"].endswith("+00:00") for v in values)
    lags = sorted((FIXED_NOW - t).total_seconds() for t in times)
    assert lags[len(lags) // 2] < 60 and lags[-1] > 86_400 and lags[0] >= 0


def test_bad_arguments_are_refused_before_anything_is_sent(make_spec):
    spec = make_spec()
    with pytest.raises(ValueError, match="bad_ratio"):
        synthesize(spec, 10, bad_ratio=1.5)
    with pytest.raises(ValueError, match="count"):
        synthesize(spec, -1)
    with pytest.raises(ValueError, match="rate"):
        produce(spec, 10, rate=0)
