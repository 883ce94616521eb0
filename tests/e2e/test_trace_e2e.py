"""`lakehouse trace` says where one record is, and why there.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/audit/test_trace.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from e2e import page_reads, pipeline, run_cli, send, table  # noqa: F401 (pipeline: a fixture)
from pyiceberg.expressions import EqualTo

from lakehouse.core import offsets
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse_airflow import ui as lakehouse_ui
from tests.e2e.test_ui import card, field
from tests.unit.audit.test_trace import (  # noqa: F401 - fixtures among them
    auth_manager,
    sighting,
    signed_in,
)
from tests.unit.audit.test_verify import at, delete, order, orders  # noqa: F401 (orders: a fixture)

# ---------------------------------------------------------------------------- unit layer: verdicts


def traced(found: dict, args: tuple[str, ...]) -> dict:
    """What `trace --json ARGS` answered: for --partition/--offset the one record it traced (the answer's
    `records` holds exactly that record), else the whole answer (a key's records)."""
    if "--partition" not in args:
        return found
    [record] = found["records"]
    partition, offset = (int(args[args.index(flag) + 1]) for flag in ("--partition", "--offset"))
    assert (found["partition"], found["offset"], found["key"]) == (partition, offset, None)
    assert (record["partition"], record["offset"]) == (partition, offset)
    return record


@pytest.mark.slow
def test_trace_says_where_each_record_is(platform, orders, spark, make_spec, signed_in, monkeypatch):
    spec = orders
    data = table(platform, spec, spec.target.table)

    def trace(*args: str) -> tuple[int, dict]:
        done = run_cli(spec, "trace", "--pipeline", spec.name, "--json", *args)
        assert done.returncode in (0, 3), done.stderr[-3000:]
        return done.returncode, traced(json.loads(done.stdout), args)

    code, row = trace("--partition", "1", "--offset", "4")
    assert code == 0 and row["verdict"] == "in-table"
    (sighting,) = row["sightings"]
    assert sighting["table"] == spec.target.table and sighting["row"]["order_id"] == "ord-1-4"
    ingest_commit = data.current_snapshot()
    assert [c["snapshot_id"] for c in sighting["commits"]] == [ingest_commit.snapshot_id]
    assert sighting["commits"][0]["kind"] == "ingest" and row["kafka"] is None  # the table answered alone

    code, letter = trace("--partition", "0", "--offset", "15")
    assert code == 0 and letter["verdict"] == "dead-letter"
    assert letter["sightings"][0]["row"]["error_kind"] == "malformed_json"
    assert "malformed_json" in letter["message"]

    send(platform, spec.source.topic, [order(1, i) for i in range(20, 23)], partition=1)
    code, pending = trace("--partition", "1", "--offset", "21")
    assert code == 0 and pending["verdict"] == "not-yet-ingested"
    assert pending["kafka"] == {"earliest": 0, "end": 23, "committed": 20, "lag": 3}
    code, beyond = trace("--partition", "1", "--offset", "999")
    assert code == 0 and beyond["verdict"] == "beyond-log-end" and "log end 23" in beyond["message"]

    delete(spark, spec, spec.target.table, "_kafka.partition = 0 AND _kafka.offset = 7")
    data = data.refresh()
    code, lost = trace("--partition", "0", "--offset", "7")
    assert code == 3 and lost["verdict"] == "missing"
    assert lost["record"]["key"] == "ord-0-7" and "--offsets 0:7-8" in lost["message"]
    data.append(data.scan(row_filter=at(1, 3)).to_arrow())
    code, twice = trace("--partition", "1", "--offset", "3")
    assert code == 3 and twice["verdict"] == "duplicated" and len(twice["sightings"]) == 2

    human = run_cli(spec, "trace", "--pipeline", spec.name, "--partition", "1", "--offset", "4")
    assert human.returncode == 0 and f"{spec.source.topic}[1]@4" in human.stdout
    assert f"committed by snapshot {ingest_commit.snapshot_id} (ingest" in human.stdout

    # by key over a time window: the ingested record, and the same key sent again since
    send(platform, spec.source.topic, [order(1, 4, status="paid")], partition=1)
    code, key = trace("--key", "ord-1-4", "--since", "1h")
    assert code == 0
    assert [(r["partition"], r["offset"], r["verdict"]) for r in key["records"]] == \
        [(1, 4, "in-table"), (1, 23, "not-yet-ingested")]

    bad = run_cli(spec, "trace", "--pipeline", spec.name, "--partition", "7", "--offset", "0")
    assert bad.returncode == 2 and "has no partition 7" in bad.stderr

    # the pipelines page: the last verification, and the trace form's answers
    assert run_cli(spec, "verify", "--pipeline", spec.name).returncode == 3
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    page_reads(monkeypatch, make_spec.directory, lakehouse_ui)
    client = signed_in("viewer")
    html = card(client.get("/").text, spec.name)
    assert field(html, "verification") == "failed" and 'name="partition"' in html
    # the verification's problems (their keys) stay on the timeline, for `lakehouse verify` and the trace form
    assert f"{spec.source.topic}[0]@7" not in html
    answer = client.get("/trace", params={"pipeline": spec.name, "partition": "0", "offset": "7"})
    assert answer.status_code == 200 and field(answer.text, "verdict") == "missing"
    assert "lakehouse replay" in field(answer.text, "message")
    assert client.get("/api/trace", params={"pipeline": spec.name, "partition": "1", "offset": "4"}).json()[
        "sightings"][0]["commits"][0]["snapshot_id"] == ingest_commit.snapshot_id
    refused = client.get("/api/trace", params={"pipeline": spec.name, "partition": "-1", "offset": "4"})
    assert refused.status_code == 400 and "partition must be a whole number" in refused.json()["error"]
    unknown = client.get("/trace", params={"pipeline": "no_such_pipeline", "partition": "0", "offset": "0"})
    assert unknown.status_code == 422 and "no pipeline named &#x27;no_such_pipeline&#x27;" in unknown.text


@pytest.mark.slow
def test_a_recorded_gap_is_traced_as_aged_out_before_ingestion(platform, pipeline, spark, make_spec, signed_in,
                                                               monkeypatch):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from lakehouse.core import events

    spec = pipeline(partitions=2)
    topic = spec.source.topic
    send(platform, topic, [order(0, i) for i in range(10)], partition=0)
    send(platform, topic, [order(1, i) for i in range(5)], partition=1)
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    send(platform, topic, [order(0, i) for i in range(10, 30)], partition=0)  # 10-19 age out before ingestion
    admin = AdminClient(platform.kafka())  # what retention does: the log now starts at 20 (and at 3 in 1)
    for deleted in admin.delete_records([TopicPartition(topic, 0, 20), TopicPartition(topic, 1, 3)]).values():
        deleted.result(timeout=30)

    stopped = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert stopped.returncode == 3, stopped.stderr[-2000:]
    assert "offsets [10, 20) aged out of Kafka before they were ingested (10 records lost" in stopped.stderr
    accepted = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--accept-gap")
    assert accepted.returncode == 0, accepted.stderr[-2000:]

    data = table(platform, spec, spec.target.table)
    held = sorted(r["_kafka"]["offset"] for r in data.scan(row_filter=EqualTo("_kafka.partition", 0)).to_arrow()
                  .to_pylist())
    assert held == [*range(10), *range(20, 30)]
    recorded = data.current_snapshot()
    assert offsets.decode_ranges(offsets.summary_properties(recorded)[SnapshotSummary.GAPS]) == {0: (10, 20)}
    assert events.recent(spec.name, kind="gap", platform=platform)[0]["message"] == \
        "10 records aged out of Kafka before they were ingested"

    def trace(*args: str) -> dict:
        done = run_cli(spec, "trace", "--pipeline", spec.name, "--json", *args)
        assert done.returncode == 0, done.stderr[-3000:]
        return traced(json.loads(done.stdout), args)

    gap = trace("--partition", "0", "--offset", "15")
    assert gap["verdict"] == "gap" and gap["sightings"] == []
    assert gap["message"] == (f"{topic}[0]@15 aged out of Kafka before it was ingested: the gap was recorded by "
                              f"snapshot {recorded.snapshot_id} of {spec.target.table} at "
                              f"{datetime.fromtimestamp(recorded.timestamp_ms / 1000, timezone.utc).isoformat()}")
    assert [trace("--partition", "0", "--offset", o)["verdict"] for o in ("9", "10", "19", "20")] == \
        ["in-table", "gap", "gap", "in-table"]
    by_key = trace("--key", "ord-0-15", "--since", "1h")
    assert by_key["records"] == []  # neither a row nor Kafka holds it any more: nothing to find by key
    # an offset Kafka deleted after it was ingested, whose row is gone too: nobody can tell any more
    spark.sql(f"DELETE FROM {spec.qualified(spec.target.table)} WHERE _kafka.partition = 1 AND _kafka.offset = 1")
    assert trace("--partition", "1", "--offset", "1")["verdict"] == "aged-out"
    assert trace("--partition", "1", "--offset", "3")["verdict"] == "in-table"

    # the page answers the same, for one record and for the key
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(make_spec.directory))
    client = signed_in("viewer")
    answer = client.get("/api/trace", params={"pipeline": spec.name, "partition": "0", "offset": "15"})
    assert answer.status_code == 200 and answer.json()["verdict"] == "gap"
    assert answer.json()["message"] == gap["message"]
    page = client.get("/trace", params={"pipeline": spec.name, "partition": "0", "offset": "15"})
    assert page.status_code == 200 and field(page.text, "verdict") == "gap"
    assert "aged out of Kafka before it was ingested" in field(page.text, "message")
    keyed = client.get("/trace", params={"pipeline": spec.name, "key": "ord-0-25", "since": "1h", "until": ""})
    assert keyed.status_code == 200 and field(keyed.text, "records_found") == "1"
    assert 'data-record="0@25"' in keyed.text and field(keyed.text, "verdict") == "in-table"
