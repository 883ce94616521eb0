"""The synthetic producer: valid records keep the contract, broken ones break exactly one rule.

Records are read back from the real (embedded) broker with assign until partition
EOF (those tests are marked slow: the end-to-end layer). Timing is never asserted; the
rate limiter's schedule is checked on a fake clock.

The end-to-end half; the unit half is tests/unit/devstack/test_synthesis.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError
from e2e import pipeline  # noqa: F401 (pipeline: a fixture)

from lakehouse.ingest.reader import MAX_KAFKA_TIMESTAMP_MS
from lakehouse_dev import produce as producer_module
from lakehouse_dev.defects import FORMAT_KINDS
from lakehouse_dev.produce import produce
from lakehouse_dev.producer_settings import accept_any_timestamp
from lakehouse_dev.record_formats import ProduceError
from tests.unit.devstack.test_synthesis import (  # noqa: F401 - fixtures among them
    conforms,
)


def headers_of(msg) -> dict[str, bytes]:
    return dict(msg.headers() or [])


@pytest.fixture
def orders_topic(pipeline):
    return pipeline(partitions=3)


@pytest.fixture
def sent(platform, orders_topic, consume_all):
    """600 orders, about 20% broken, and every record read back from the topic (which keeps producers'
    timestamps however far ahead, so the Kafka timestamp defect gets through too)."""
    accept_any_timestamp(orders_topic.source.topic, platform)
    report = produce(orders_topic, 600, bad_ratio=0.2, seed=42, platform=platform)
    return orders_topic, report, consume_all(orders_topic.source.topic, platform)


@pytest.mark.slow
def test_a_topic_that_refuses_far_future_timestamps_gets_none(platform, pipeline, consume_all):
    """Apache Kafka 4 refuses a batch holding a timestamp more than message.timestamp.after.max.ms (an hour)
    ahead: produce leaves that defect out instead of failing the other records of the batch."""
    spec = pipeline(partitions=1)
    report = produce(spec, 300, bad_ratio=0.5, seed=43, platform=platform)
    assert report.sent == 300 and "bad_kafka_timestamp" not in report.bad_by_kind and report.bad > 100
    assert len(consume_all(spec.source.topic, platform)) == 300


@pytest.mark.slow
def test_every_record_lands_on_the_topic(sent):
    spec, report, messages = sent
    assert report.sent == len(messages) == 600
    assert report.topic == spec.source.topic
    assert report.per_partition == dict(sorted(Counter(m.partition() for m in messages).items()))
    assert len(report.per_partition) == 3  # keys spread over all partitions


@pytest.mark.slow
def test_each_defect_kind_is_sent_and_counted(sent):
    spec, report, messages = sent
    # every kind of a JSON value applies to the orders contract, but those of dates and uuids it has none of
    assert set(report.bad_by_kind) == set(FORMAT_KINDS["json"]) - {"bad_date", "bad_uuid"}
    assert 80 <= report.bad <= 160  # about 20% of 600
    labelled = Counter(headers_of(m)["fault"].decode() for m in messages if "fault" in headers_of(m))
    assert labelled == report.bad_by_kind
    assert report.valid == 600 - report.bad


@pytest.mark.slow
def test_defects_are_real_on_the_wire(sent):
    spec, report, messages = sent
    by_kind: dict[str | None, list] = {}
    for m in messages:
        fault = headers_of(m).get("fault")
        by_kind.setdefault(fault.decode() if fault else None, []).append(m)

    assert sum(m.value() is None for m in messages) == report.bad_by_kind["null_value"]
    assert sum(m.key() is None for m in messages) == report.bad_by_kind["null_key"]
    for m in by_kind["not_utf8"]:
        with pytest.raises(UnicodeDecodeError):
            m.value().decode("utf-8")
    for m in by_kind["malformed_json"]:
        with pytest.raises(json.JSONDecodeError):
            json.loads(m.value().decode("utf-8"))
    for m in by_kind["not_an_object"]:
        assert not isinstance(json.loads(m.value()), dict)
    limit = spec.source.max_value_bytes
    assert all(len(m.value()) > limit for m in by_kind["oversize"])
    assert all(len(m.value()) <= limit for kind, group in by_kind.items() if kind != "oversize"
               for m in group if m.value() is not None)
    for m in by_kind["missing_required"]:
        record = json.loads(m.value())
        assert any(f.name not in record for f in spec.contract.fields if f.required)
    for m in by_kind["bad_timestamp"]:
        assert not conforms(spec.contract.field("event_time"), json.loads(m.value())["event_time"])
    for m in by_kind["out_of_range"]:
        assert json.loads(m.value())["amount"] < 0  # the only bounded field: amount, min 0
    for m in by_kind["bad_string"]:  # JSON text whose escapes decode to a lone surrogate
        assert m.value().isascii()
        assert any(isinstance(v, str) and re.search("[\ud800-\udfff]", v) for v in json.loads(m.value()).values())
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    first, last = (moment.replace(tzinfo=timezone.utc) - epoch for moment in (datetime.min, datetime.max))
    for m in by_kind["timestamp_out_of_range"]:  # ISO-8601 with an offset, in year 0 or 10000 once in UTC
        moment = datetime.fromisoformat(json.loads(m.value())["event_time"])
        assert moment.utcoffset() is not None and not first <= moment - epoch <= last
    for m in by_kind["bad_kafka_timestamp"]:  # the broker keeps the timestamp as sent
        assert m.timestamp()[1] > MAX_KAFKA_TIMESTAMP_MS
        assert conforms(spec.contract.field("event_time"), json.loads(m.value())["event_time"])


@pytest.mark.slow
def test_valid_records_keep_the_contract_and_are_keyed_by_the_key_field(sent):
    spec, report, messages = sent
    valid = [m for m in messages if "fault" not in headers_of(m)]
    assert len(valid) == report.valid
    for m in valid:
        record = json.loads(m.value().decode("utf-8"))
        assert isinstance(record, dict)
        for field in spec.contract.fields:
            assert conforms(field, record.get(field.name)), (field.name, record)
        assert m.key() == record["order_id"].encode("utf-8")
        assert headers_of(m)["source"] == b"lakehouse-produce" and len(headers_of(m)["trace_id"]) == 32


@pytest.mark.slow
def test_records_of_one_key_stay_on_one_partition(sent):
    spec, report, messages = sent
    partitions_by_key: dict[bytes, set[int]] = {}
    for m in messages:
        if m.key() is not None:
            partitions_by_key.setdefault(m.key(), set()).add(m.partition())
    assert all(len(parts) == 1 for parts in partitions_by_key.values())
    assert any(len([m for m in messages if m.key() == k]) > 1 for k in partitions_by_key)  # ids recur


@pytest.mark.slow
def test_progress_is_reported_with_the_final_count(platform, orders_topic):
    seen: list[int] = []
    report = produce(orders_topic, 50, rate=5_000, seed=1, platform=platform, on_progress=seen.append)
    assert report.sent == 50 and report.bad_by_kind == {}
    assert seen[-1] == 50


@pytest.mark.slow
def test_producing_to_a_missing_topic_fails_with_the_topic_name(platform, make_spec):
    spec = make_spec()  # topic never created
    with pytest.raises(ProduceError, match=rf"topic '{spec.source.topic}' .* does not exist"):
        produce(spec, 1, platform=platform)


@pytest.mark.slow
def test_a_failed_delivery_fails_the_run_loudly(platform, orders_topic, monkeypatch):
    class RefusingProducer:
        """Accepts records and reports each as undeliverable, like a broker that went away."""

        def __init__(self, conf):
            self.pending = []

        def list_topics(self, timeout=None):
            return SimpleNamespace(topics={orders_topic.source.topic: None})

        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
            self.pending.append((key, on_delivery))

        def poll(self, timeout=0):
            for key, callback in self.pending:
                callback(KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"),
                         SimpleNamespace(partition=lambda: 1, key=lambda: key))
            self.pending.clear()
            return 0

        def flush(self, timeout=None):
            self.poll()
            return 0

        def purge(self):
            self.pending.clear()

    monkeypatch.setattr(producer_module, "Producer", RefusingProducer)
    with pytest.raises(ProduceError, match="failed for 1 record.*Message timed out"):
        produce(orders_topic, 10, platform=platform)
