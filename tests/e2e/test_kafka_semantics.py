"""Apache Kafka semantics a Kafka-wire stand-in never exercised, on the embedded Apache Kafka (end to end).

- Transactions: a producer's committed transactions reach the table, its aborted ones never do; the
  offsets of transaction markers and aborted records are never delivered, so a batch whose range ends on
  a marker neither waits for it nor counts it as lost; a transaction still open holds the last stable
  offset back, and nothing past it is planned until it commits. Verification accounts for those offsets
  as delivering no record (never missing), and trace says so.
- Compaction: a change stream's topic with `cleanup.policy=compact`, cleaned (older values of a key
  removed, their offsets gone): the table ends in the source's final state and verification passes, with
  the removed offsets accounted for.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from e2e import pipeline, run_cli, table  # noqa: F401 (pipeline: a fixture)
from polling import wait_until

from lakehouse.audit import verify
from lakehouse.ingest.job import IngestJob
from lakehouse.ingest.plan import topic_state

pytestmark = pytest.mark.slow


def order(i: int) -> tuple[bytes, bytes]:
    return f"ord-{i}".encode(), json.dumps({
        "order_id": f"ord-{i}", "customer_id": "c-1", "amount": 10.0 + i, "currency": "EUR", "status": "created",
        "event_time": "2026-11-26T10:00:00+00:00"}).encode()


def transaction(producer: Producer, topic: str, records: list[tuple[bytes, bytes]], commit: bool | None) -> None:
    """One transaction of `records` on partition 0: committed, aborted (False) or left open (None)."""
    producer.begin_transaction()
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    producer.flush(30)
    if commit is True:
        producer.commit_transaction(30)
    elif commit is False:
        producer.abort_transaction(30)


def delivered(platform, topic: str) -> list[int]:
    """The offsets a read_committed consumer is given in partition 0, up to its end."""
    consumer = Consumer(platform.kafka(**{"group.id": "semantics-probe", "enable.partition.eof": True,
                                          "isolation.level": "read_committed"}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    found = []
    try:
        while True:
            msg = consumer.poll(10)
            assert msg is not None, "no end-of-partition within 10s"
            if msg.error():
                return found
            found.append(msg.offset())
    finally:
        consumer.close()


def test_committed_transactions_land_once_and_aborted_ones_and_markers_never(platform, pipeline, spark):
    spec = pipeline(partitions=1, trigger={"max_records_per_batch": 11})
    topic = spec.source.topic
    producer = Producer(platform.kafka(**{"transactional.id": f"tx-{spec.name}"}))
    producer.init_transactions(60)
    transaction(producer, topic, [order(i) for i in range(10)], commit=True)           # 0-9, marker 10
    transaction(producer, topic, [order(i) for i in range(10, 15)], commit=False)      # 11-15, marker 16
    transaction(producer, topic, [order(i) for i in range(15, 20)], commit=True)       # 17-21, marker 22
    transaction(producer, topic, [order(i) for i in range(20, 23)], commit=None)       # 23-25, still open
    assert delivered(platform, topic) == [*range(10), *range(17, 22)]
    # the log ends at the open transaction's first offset for a read_committed reader (the last stable offset)
    assert topic_state(platform.kafka(), topic).partitions[0].end == 23

    receipts = IngestJob(spec, platform, spark).run_once()
    ranges = [r.ranges[0] for r in receipts if r.ranges]
    assert ranges[0] == (0, 11)  # the first batch ends on the commit marker at 10: it did not wait for it
    assert [start for start, _ in ranges[1:]] == [end for _, end in ranges[:-1]] and ranges[-1][1] == 23
    rows = table(platform, spec, spec.target.table).scan().to_arrow().to_pylist()
    assert sorted(r["_kafka"]["offset"] for r in rows) == [*range(10), *range(17, 22)]
    assert {r["order_id"] for r in rows} == {f"ord-{i}" for i in (*range(10), *range(15, 20))}
    assert table(platform, spec, spec.dead_letter_table).scan().to_arrow().num_rows == 0

    first = verify.verify(spec, platform, progress=lambda line: None)
    assert first.ok, first.summary()
    assert (first.findings.offsets, first.findings.undelivered) == (15, 8)  # 3 markers, 5 aborted records
    assert "8 where it delivers no record" in first.summary()
    for offset in (10, 13, 16):  # a commit marker, an aborted record, an abort marker
        done = run_cli(spec, "trace", "--pipeline", spec.name, "--partition", "0", "--offset", str(offset), "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["records"][0]["verdict"] == "no-record", done.stdout
    pending = run_cli(spec, "trace", "--pipeline", spec.name, "--partition", "0", "--offset", "24", "--json")
    assert json.loads(pending.stdout)["records"][0]["verdict"] == "beyond-log-end"  # not readable until its transaction ends

    producer.commit_transaction(30)  # the open transaction commits: its records become readable
    IngestJob(spec, platform, spark).run_once()
    rows = table(platform, spec, spec.target.table).scan().to_arrow().to_pylist()
    assert sorted(r["_kafka"]["offset"] for r in rows) == [*range(10), *range(17, 22), 23, 24, 25]
    again = verify.verify(spec, platform, progress=lambda line: None)
    assert again.ok and again.mode == "incremental", again.summary()


def test_a_compacted_change_stream_lands_in_the_final_state_and_verifies(platform, make_spec, spark):
    from tests.e2e.test_cdc_ingest import change_stream, table_state

    spec = make_spec(fields=[{"name": "id", "type": "long", "required": True},
                             {"name": "email", "type": "string"},
                             {"name": "balance", "type": "decimal(10,2)"},
                             {"name": "updated_at", "type": "timestamp", "unit": "us"}],
                     mode="cdc", table_key=["id"], partition_by=None, partitions=1,
                     source={"key": {"field": None}, "value_format": "json"}, publish={"view": None})
    topic = spec.source.topic
    admin = AdminClient(platform.kafka())
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
        "delete.retention.ms": "600000", "min.compaction.lag.ms": "0"})])[topic].result(30)
    records, final, _ = change_stream(keys=12, changes=120, seed=9)
    # no truncates: compaction keeps a key's last record, and a truncate (a dead letter) would hide its last change
    records = [(k, v) for k, v in records if v is None or json.loads(v).get("op") != "t"]
    producer = Producer(platform.kafka(**{"linger.ms": 5}))
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
        producer.poll(0)
    producer.flush(30)
    sent = len(records)

    def compacted() -> bool:
        producer.produce(topic, key=b'{"id":-1}', value=None, partition=0)  # a record that rolls the segment
        producer.flush(10)
        return len(delivered(platform, topic)) < sent

    wait_until(compacted, 120, "the log cleaner to compact the topic", interval=2)
    time.sleep(1)
    IngestJob(spec, platform, spark).run_once()
    assert table_state(platform, spec) == final
    result = verify.verify(spec, platform, progress=lambda line: None)
    assert result.ok, result.summary()
    assert result.findings.undelivered > 0  # offsets the cleaner removed: accounted for, never missing
    assert result.findings.counts["missing"] == 0
