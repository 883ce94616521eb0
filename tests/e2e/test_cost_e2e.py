"""`lakehouse cost`: what a pipeline used per day, from Kafka, the tables and the ops timeline, priced
only when unit prices are set. The end-to-end test ingests and maintains a pipeline on the real
broker, Spark and catalog, then checks every figure against one computed here independently:
record bytes read back from Kafka, file sizes and manifests read from the tables, receipts of the
runs.

The end-to-end half; the unit half is tests/unit/ops/test_cost.py.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest
from confluent_kafka import Producer

from e2e import pipeline, run_cli, send, table  # noqa: F401 - pipeline is a fixture
from lakehouse.core import events
from lakehouse.ops import cost


def produce_with_headers(platform, topic: str, count: int) -> None:
    """`count` orders with a header each (headers are produced bytes too)."""
    producer = Producer(platform.kafka())
    for i in range(count):
        value = json.dumps({"order_id": f"h-{i}", "customer_id": "c-9", "amount": 1.5, "currency": "EUR",
                            "status": "paid", "event_time": "2026-11-20T08:00:00+00:00"}).encode()
        producer.produce(topic, key=f"h-{i}".encode(), value=value, headers=[("source", b"checkout")])
    assert producer.flush(30) == 0


def written_by(data, snapshot) -> tuple[int, int]:
    """(data and delete files, manifests) `snapshot` of `data` wrote, read from its manifests."""
    mine = [m for m in snapshot.manifests(data.io) if m.added_snapshot_id == snapshot.snapshot_id]
    files = sum(1 for m in mine for e in m.fetch_manifest_entry(data.io, discard_deleted=False)
                if e.status.name == "ADDED")
    return files, len(mine)


@pytest.mark.slow
def test_cost_counts_what_the_pipeline_produced_stored_requested_and_ran(platform, spark, pipeline, consume_all,
                                                                         monkeypatch, signed_in_page):
    spec = pipeline(partitions=2, trigger={"max_records_per_batch": 40}, maintenance={"min_input_files": 2})
    send(platform, spec.source.topic, [(f"o-{i}".encode(), json.dumps({
        "order_id": f"o-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR", "status": "created",
        "event_time": "2026-11-20T12:00:00+00:00"}).encode()) for i in range(90)] + [(b"bad", b"{not json")])
    produce_with_headers(platform, spec.source.topic, 9)
    ingested = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert ingested.returncode == 0, ingested.stderr
    batches = [json.loads(line) for line in ingested.stdout.splitlines() if line.startswith("{")]
    assert len(batches) >= 3
    maintained = run_cli(spec, "maintain", "--pipeline", spec.name, "--json")
    assert maintained.returncode == 0, maintained.stderr
    maintenance = json.loads(maintained.stdout)

    found = run_cli(spec, "cost", "--pipeline", spec.name, "--days", "2", "--json")
    assert found.returncode == 0, found.stderr
    assert "sampling up to 1000 records" in found.stderr  # what it reads is told on stderr
    report = json.loads(found.stdout)
    assert [d["day"] for d in report["days"]][-1] == datetime.now(timezone.utc).date().isoformat()
    assert report["priced"] is False and all(d["price"] is None for d in report["days"])

    # produced: every record read back, by the UTC day of its Kafka timestamp
    produced = defaultdict(lambda: [0, 0])
    for msg in consume_all(spec.source.topic, platform):
        day = datetime.fromtimestamp(msg.timestamp()[1] / 1000, tz=timezone.utc).date().isoformat()
        produced[day][0] += 1
        produced[day][1] += len(msg.key() or b"") + len(msg.value() or b"") + \
            sum(len(k) + len(v) for k, v in msg.headers() or [])
    by_day = {d["day"]: d for d in report["days"]}
    assert sum(n for n, _ in produced.values()) == 100
    for day, (records, size) in produced.items():
        assert (by_day[day]["produced_records"], by_day[day]["produced_bytes"]) == (records, size)
        assert by_day[day]["kafka_retained_bytes"] == size * 7  # 7 days' retention, replication 1
    assert report["retention_ms"] == 7 * 86_400_000 and report["retention_source"] == "spec"

    # tables: the files of the current snapshots; requests: what each of today's commits wrote
    today = report["days"][-1]
    tables = [table(platform, spec, name) for name in spec.owned_tables]
    current = [f for t in tables for f in t.inspect.files().to_pylist()]
    assert today["table_files"] == len(current) and today["table_bytes"] == sum(f["file_size_in_bytes"] for f in current)
    commits = [(t, s) for t in tables for s in t.snapshots()
               if datetime.fromtimestamp(s.timestamp_ms / 1000, tz=timezone.utc).date().isoformat() == today["day"]]
    files, manifests = map(sum, zip(*(written_by(t, s) for t, s in commits)))
    timeline = events.recent(spec.name, since=datetime.fromisoformat(today["day"]).replace(tzinfo=timezone.utc),
                             limit=1000, platform=platform)
    assert today["commits"] == len(commits) and today["timeline_commits"] == len(timeline)
    assert (today["files_written"], today["manifests_written"]) == (files, manifests)
    assert today["put_requests"] == files + manifests + 2 * len(commits) + 4 * len(timeline)
    rewritten = sum(t["rewritten_data_files"] for t in maintenance["tables"])
    assert rewritten > 0  # compaction ran and read files
    assert today["get_requests"] == 2 * len(commits) + 2 * len(timeline) + rewritten
    # compute: the batches' and maintenance's own receipts
    assert today["batches"] == len(batches)
    assert today["ingest_seconds"] == pytest.approx(sum(b["seconds"] for b in batches), abs=0.01)
    assert today["maintenance_seconds"] == pytest.approx(sum(t["seconds"] for t in maintenance["tables"]), abs=0.01)

    # priced when unit prices are set, item by item
    monkeypatch.setenv("LAKEHOUSE_PRICE_PUT_PER_1000", "5")
    monkeypatch.setenv("LAKEHOUSE_PRICE_COMPUTE_HOUR", "3.6")
    monkeypatch.setenv("LAKEHOUSE_PRICE_CURRENCY", "EUR")
    priced = json.loads(run_cli(spec, "cost", "--pipeline", spec.name, "--days", "2", "--json").stdout)["days"][-1]
    expected = round(priced["put_requests"] / 1000 * 5, 6) + round(priced["compute_seconds"] / 3600 * 3.6, 6)
    assert set(priced["price"]) == {"put_requests", "compute", "total"}
    assert priced["price"]["total"] == pytest.approx(expected)
    human = run_cli(spec, "cost", "--pipeline", spec.name, "--days", "2").stdout
    assert "PRICE EUR" in human and f"{priced['price']['total']:.4f}" in human
    monkeypatch.setenv("LAKEHOUSE_PRICE_GET_PER_1000", "free")
    refused = run_cli(spec, "cost", "--pipeline", spec.name)
    assert refused.returncode == 2 and "LAKEHOUSE_PRICE_GET_PER_1000='free' is not a price" in refused.stderr
    monkeypatch.delenv("LAKEHOUSE_PRICE_GET_PER_1000")

    # the page's cost panel shows the same day
    client, signed_in = signed_in_page(Path(spec.path).parent)
    body = client.get("/", headers=signed_in).text
    card = re.search(rf'data-pipeline="{spec.name}"[^>]*>(.*?)</section>', body, re.S).group(1)

    def field(name: str) -> str:
        return re.search(rf'data-field="cost_{today["day"]}_{name}"[^>]*>([^<]*)<', card).group(1)

    assert field("produced_bytes") == cost.human_bytes(produced[today["day"]][1])
    assert field("table_files") == str(today["table_files"]) and field("price") == f"{priced['price']['total']:.4f}"
