"""The fast decode path is an optimisation, never a second opinion.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/ingest/test_fast_decode.py.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from lakehouse.core import topics
from lakehouse.ingest.layout import arrow_type
from lakehouse.ingest.reader import (
    MAX_KAFKA_TIMESTAMP_MS,
    MIN_KAFKA_TIMESTAMP_MS,
    make_reader,
)
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev.produce import produce
from tests.unit.ingest.test_fast_decode import (  # noqa: F401 - fixtures among them
    SINK_FIELDS,
    SummedSeconds,
    outcome,
)

# Every field type, optional fields, bounds, enums, a pattern and a key: the contract the traps run against.


def arrow_value(spec, name: str, value):
    """A contract value the way a batch row reads back (timestamps and dates as datetime and date)."""
    return pa.array([value], type=arrow_type(spec.contract.field(name))).to_pylist()[0]


@pytest.fixture
def sent_items(platform, make_spec):
    """500 items, about a quarter broken, on a one-partition topic."""
    spec = make_spec(fields=SINK_FIELDS, key={"field": "sku"}, partition_by=None, partitions=1)
    topics.ensure_topics([spec], platform)
    report = produce(spec, 500, bad_ratio=0.25, seed=3, platform=platform)
    return spec, report


@pytest.mark.slow
def test_the_reader_gives_the_reference_verdict_of_every_record_and_reports_its_clock(
        platform, sent_items, consume_all):
    spec, report = sent_items
    messages = consume_all(spec.source.topic, platform)
    read, decode = SummedSeconds(), SummedSeconds()
    reader = make_reader(spec, platform.kafka(), frozenset(), ingested_at_us=1, batch_rows=64,
                         timers=(read, decode))
    plan = pa.RecordBatch.from_pylist([{"topic": spec.source.topic, "partition": 0, "start": 0,
                                        "end": len(messages)}])
    started = time.perf_counter()
    batches = list(reader(iter([plan])))
    elapsed = time.perf_counter() - started

    assert max(b.num_rows for b in batches) == 64
    rows = pa.Table.from_batches(batches).to_pylist()
    assert [r["_kafka"]["offset"] for r in rows] == [m.offset() for m in messages]
    reference = RecordValidator(spec)
    for row, message in zip(rows, messages):
        verdict = outcome(reference, reference.check, message.key(), message.value())
        if not MIN_KAFKA_TIMESTAMP_MS <= message.timestamp()[1] <= MAX_KAFKA_TIMESTAMP_MS:
            verdict = ("rejected", "bad_kafka_timestamp", row["_dlq_error_detail"])
            assert row["_kafka"]["timestamp"] is None and str(message.timestamp()[1]) in verdict[2]
        if verdict[0] == "rejected":
            assert (row["_dlq_error_kind"], row["_dlq_error_detail"]) == verdict[1:]
            assert (row["_dlq_key"], row["_dlq_value"]) == (message.key(), message.value())
            assert [(h["key"], h["value"]) for h in row["_dlq_headers"]] == message.headers()
        else:
            expected = reference.check(reference.check_key(message.key()), message.value())
            assert {n: row[n] for n in spec.contract.names} == \
                {n: arrow_value(spec, n, v) for n, v in expected.items()}
            assert row["_route"] == spec.target.table and row["_dlq_error_kind"] is None
    assert sum(r["_dlq_error_kind"] is not None for r in rows) == sum(report.bad_by_kind.values())

    assert len(read.added) == len(decode.added) == 1  # once per task
    assert read.added[0] > 0 and decode.added[0] > 0
    assert read.added[0] + decode.added[0] <= elapsed  # disjoint parts of the task's time


@pytest.mark.slow
def test_a_failing_task_still_reports_its_clock(platform, sent_items):
    spec, _ = sent_items

    def lose_the_task_midway(point: str) -> None:
        if point == "during_read":
            raise RuntimeError("executor lost")

    read, decode = SummedSeconds(), SummedSeconds()
    reader = make_reader(spec, platform.kafka(), frozenset(), ingested_at_us=1, fault=lose_the_task_midway,
                         timers=(read, decode))
    plan = pa.RecordBatch.from_pylist([{"topic": spec.source.topic, "partition": 0, "start": 0, "end": 400}])
    with pytest.raises(RuntimeError, match="executor lost"):
        list(reader(iter([plan])))
    assert len(read.added) == len(decode.added) == 1
