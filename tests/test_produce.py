"""The synthetic producer: valid records keep the contract, broken ones break exactly one rule.

Records are read back from the real (embedded) broker with assign until partition
EOF (those tests are marked slow: the end-to-end layer). Timing is never asserted; the
rate limiter's schedule is checked on a fake clock.
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
from lakehouse.ingest.reader import MAX_KAFKA_TIMESTAMP_MS, BatchBuilder
from lakehouse.ingest.rejects import ERROR_KINDS
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev import produce as producer_module
from lakehouse_dev.produce import BAD_KINDS, FORMAT_KINDS, ProduceError, RateLimiter, produce, synthesize

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


def headers_of(msg) -> dict[str, bytes]:
    return dict(msg.headers() or [])


# ---------------------------------------------------------------------------- against the broker

@pytest.fixture
def orders_topic(pipeline):
    return pipeline(partitions=3)


@pytest.fixture
def sent(platform, orders_topic, consume_all):
    """600 orders, about 20% broken, and every record read back from the topic (which keeps producers'
    timestamps however far ahead, so the Kafka timestamp defect gets through too)."""
    producer_module.accept_any_timestamp(orders_topic.source.topic, platform)
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


# ---------------------------------------------------------------------------- without a broker

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


# ---------------------------------------------------------------------------- rate limiting

class FakeClock:
    """A clock that only moves when the limiter sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_rate_limiter_spaces_messages_at_the_rate_after_a_burst():
    clock = FakeClock()
    limiter = RateLimiter(100, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(105):
        limiter.acquire()
    assert clock.now == pytest.approx(1.0)  # 5 at once, then 100 more at 100/s
    assert max(clock.sleeps) <= 0.05        # sleeps are sliced so deliveries keep being served


def test_the_rate_limiter_default_burst_is_20ms_of_traffic():
    clock = FakeClock()
    limiter = RateLimiter(10_000, clock=clock, sleep=clock.sleep)
    assert limiter.burst == 200
    for _ in range(10_200):
        limiter.acquire()
    assert clock.now == pytest.approx(1.0)
    assert RateLimiter(1, clock=clock, sleep=clock.sleep).burst == 1  # never less than one message
