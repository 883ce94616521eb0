"""The retention guard.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/upkeep/test_retention_guard.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from e2e import pipeline, run_cli, xcom  # noqa: F401 (fixture)
from lakehouse.core import events, topics
from lakehouse.ingest.job import IngestJob
from lakehouse.upkeep import retention
from tests.unit.upkeep.test_retention_guard import (  # noqa: F401 - fixtures among them
    HOUR_MS,
    MINUTE_MS,
    spec,
)


def stalled_records(platform, topic: str, age: timedelta, count: int = 5, partition: int = 0) -> None:
    """`count` valid orders on `partition` whose Kafka timestamps are `age` old: produced, never ingested."""
    producer = Producer(platform.kafka())
    stamp = int((datetime.now(timezone.utc) - age).timestamp() * 1000)
    for i in range(count):
        value = {"order_id": f"old-{i}", "customer_id": "c-1", "amount": 1.0, "currency": "EUR", "status": "created",
                 "event_time": datetime.now(timezone.utc).isoformat()}
        producer.produce(topic, key=value["order_id"].encode(), value=json.dumps(value).encode(), partition=partition,
                         timestamp=stamp)
    assert producer.flush(30) == 0


def guard_events(platform, spec) -> list[dict]:
    return events.recent(spec.name, retention.GUARD_KIND, platform=platform, catalog=spec.catalog)


@pytest.mark.slow
def test_the_guard_raises_retention_for_a_stalled_writer_and_restores_the_value_found_once_it_caught_up(
        platform, spark, make_spec, run_dag, monkeypatch, signed_in_page):
    """The spec declares no retention.ms: the guard restores the value the topic had before it raised it,
    which only its raise event on the timeline remembers (each run reads its state from there)."""
    spec = make_spec(partitions=2, retention_ms=None, retention={"max_retention": "3h"},
                     slo={"lag_seconds": "5m"})
    admin = AdminClient(platform.kafka())
    admin.create_topics([NewTopic(spec.source.topic, 2, 1, config={"retention.ms": str(HOUR_MS)})])[
        spec.source.topic].result(15)
    stalled_records(platform, spec.source.topic, timedelta(minutes=40))  # past half of the hour: within threshold
    stalled_records(platform, spec.source.topic, timedelta(seconds=1), partition=1)

    run = run_dag("retention_guard", make_spec.directory)

    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {f"guard_{spec.name}": "success"}
    raised = xcom(run, f"guard_{spec.name}")
    assert (raised["action"], raised["status"], raised["declared_ms"]) == ("raised", "warn", HOUR_MS)
    assert raised["partitions"]["0"]["age_ms"] >= 40 * MINUTE_MS and raised["partitions"]["1"]["age_ms"] < MINUTE_MS
    assert raised["new_retention_ms"] == 101 * MINUTE_MS  # 40 min (+ the run's seconds) + 1 h, whole minutes
    assert topics.describe_retention(spec.source.topic, platform) == 101 * MINUTE_MS
    [event] = guard_events(platform, spec)
    assert (event["status"], event["actor"]) == ("warn", "dag_test")  # the DAG run's triggering user
    assert event["details"]["guard_state"] == {"raised": True, "declared_ms": HOUR_MS, "set_ms": 101 * MINUTE_MS}
    assert event["metrics"]["new_retention_ms"] == 101 * MINUTE_MS

    # the pipelines page raises the alert with the others
    client, signed_in = signed_in_page(make_spec.directory)
    [card] = [e for e in client.get("/api/pipelines", headers=signed_in).json() if e["pipeline"] == spec.name]
    assert card["timeline"]["latest"]["retention_guard"]["status"] == "warn"
    assert 'data-field="latest_retention_guard" class="status-warn"' in client.get("/", headers=signed_in).text

    # still behind but a full hour from the new horizon: nothing changes, nothing is recorded
    held = run_cli(spec, "retention", "--pipeline", spec.name, "--guard", "--json")
    assert held.returncode == 0, held.stderr
    assert json.loads(held.stdout)["action"] == "none"
    assert len(guard_events(platform, spec)) == 1

    IngestJob(spec, platform, spark=spark).run_once()  # the writer catches up
    restored = run_cli(spec, "retention", "--pipeline", spec.name, "--guard", "--json")
    assert restored.returncode == 0, restored.stderr
    assert (json.loads(restored.stdout)["action"], json.loads(restored.stdout)["new_retention_ms"]) == \
        ("restored", HOUR_MS)
    assert topics.describe_retention(spec.source.topic, platform) == HOUR_MS
    newest = guard_events(platform, spec)[0]
    assert (newest["status"], newest["actor"], newest["details"]["actor"]["via"]) == \
        ("ok", events.Actor.of_process().user, "cli")
    assert newest["details"]["guard_state"]["raised"] is False


@pytest.mark.slow
def test_a_guard_that_cannot_protect_the_records_alerts_and_leaves_the_topic_as_it_is(platform, pipeline, kafka_user,
                                                                                       monkeypatch):
    uncapped = pipeline(retention_ms=HOUR_MS)
    refused = pipeline(retention_ms=HOUR_MS, retention={"max_retention": "2h"})
    for spec in (uncapped, refused):
        stalled_records(platform, spec.source.topic, timedelta(minutes=45))

    alert = run_cli(uncapped, "retention", "--pipeline", uncapped.name, "--guard")
    assert alert.returncode == 3
    assert "retention.max_retention is not set" in alert.stderr

    topic = refused.source.topic  # a reader of the topic, not its administrator
    with monkeypatch.context() as as_reader:
        for name, value in kafka_user([("TOPIC", topic, "READ"), ("TOPIC", topic, "DESCRIBE"),
                                       ("TOPIC", topic, "DESCRIBE_CONFIGS"), ("GROUP", "lakehouse-*", "READ")]).items():
            as_reader.setenv(name, value)
        denied = run_cli(refused, "retention", "--pipeline", refused.name, "--guard", "--json")
    assert denied.returncode == 3
    assert "lacks the permission ALTER_CONFIGS on topic " + refused.source.topic in denied.stderr
    assert json.loads(denied.stdout)["missing_permission"] == f"ALTER_CONFIGS on topic {refused.source.topic}"

    for spec in (uncapped, refused):
        assert topics.describe_retention(spec.source.topic, platform) == HOUR_MS
        [event] = guard_events(platform, spec)
        assert event["status"] == "failed"
        assert event["details"]["guard_state"]["raised"] is False  # nothing to restore later
    assert guard_events(platform, refused)[0]["details"]["action"] == "refused"
