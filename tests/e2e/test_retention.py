"""Retention alignment: a topic that cannot hold records through lag + outage budget + replay window
fails with the fix to apply, one that can passes, and data retention deletes only aged-out rows."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from e2e import pipeline, rows, send, xcom  # noqa: F401 (fixture)
from lakehouse.core import events
from lakehouse.ingest.job import IngestJob
from lakehouse.upkeep import retention
from lakehouse_dev import produce

pytestmark = pytest.mark.slow
WEEK_MS = 7 * 86400 * 1000


def test_the_retention_dag_fails_a_topic_too_short_for_outage_and_replay_and_passes_one_long_enough(
        platform, pipeline, run_dag, make_spec):
    short = pipeline(retention_ms=3_600_000)  # 1h, but a day of outage and 3 days of replay are promised
    enough = pipeline(retention_ms=WEEK_MS)
    infinite = pipeline(retention_ms=-1)

    run = run_dag("retention_alignment", make_spec.directory)

    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == {f"align_{short.name}": "failed", f"align_{enough.name}": "success",
                      f"align_{infinite.name}": "success"}
    failed = xcom(run, f"align_{short.name}", "report")
    required = (86400 + 3 * 86400) * 1000
    assert failed["status"] == "failed" and failed["retention_ms"] == 3_600_000
    assert failed["required_ms"] >= required
    assert "retention.ms=3600000" in failed["message"] and "replay window" in failed["message"]
    assert failed["suggestion"] == (f"kafka-configs --bootstrap-server {platform.bootstrap_servers} --alter "
                                    f"--entity-type topics --entity-name {short.source.topic} "
                                    f"--add-config retention.ms={required}")
    assert failed["suggestion"] in failed["message"]
    ok = xcom(run, f"align_{enough.name}")
    assert ok["status"] == "ok" and ok["retention_ms"] == WEEK_MS
    assert ok["snapshot_expiry_window_s"] == enough.retention.replay_window_s == 3 * 86400
    assert xcom(run, f"align_{infinite.name}")["retention_ms"] == -1
    # each check is a `retention` event on the ops timeline
    [event] = events.recent(short.name, "retention", platform=platform)
    assert event["status"] == "failed" and "kafka-configs" in event["message"]
    assert event["metrics"]["required_ms"] == failed["required_ms"]


def test_worst_lag_comes_from_the_ingest_commits_and_raises_the_requirement(platform, pipeline):
    spec = pipeline(retention_ms=WEEK_MS, partitions=1)
    produce.produce(spec, 30, seed=4)
    job = IngestJob(spec)
    job.run_once()
    report = retention.check(spec, platform)
    assert report.observed_batches >= 2  # the data and the dead-letter table's commit of the batch
    assert report.worst_lag_s > 0
    assert report.required_ms == pytest.approx(
        (report.worst_lag_s + spec.retention.outage_budget_s + spec.retention.replay_window_s) * 1000, abs=1)
    report.raise_for_status()  # a week covers lag + 1 day + 3 days


def order(i: int, event_time: datetime) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": "created", "event_time": event_time.isoformat()}
    return record["order_id"].encode(), json.dumps(record).encode()


def test_data_retention_deletes_only_rows_older_than_delete_after(platform, pipeline):
    spec = pipeline(retention={"delete_after": "30d"}, retention_ms=WEEK_MS)
    now = datetime.now(timezone.utc)
    old = [order(i, now - timedelta(days=40 + i)) for i in range(7)]
    young = [order(100 + i, now - timedelta(days=i)) for i in range(5)]
    send(platform, spec.source.topic, old + young)
    job = IngestJob(spec)
    job.run_once()
    assert len(rows(platform, spec, spec.target.table)) == 12

    report = retention.align(spec, platform, spark=job.spark, now=now)
    assert report.status == "ok"
    assert report.deleted_rows == {spec.qualified(spec.target.table): 7}
    kept = rows(platform, spec, spec.target.table)
    assert sorted(r["order_id"] for r in kept) == sorted(f"ord-{100 + i}" for i in range(5))
    [event] = events.recent(spec.name, "retention", platform=platform)
    assert event["metrics"]["deleted_rows"] == 7
    # nothing older is left: a second run deletes nothing
    assert retention.align(spec, platform, spark=job.spark, now=now).deleted_rows == {
        spec.qualified(spec.target.table): 0}
