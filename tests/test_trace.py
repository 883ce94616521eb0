"""`lakehouse trace` says where one record is, and why there.

Unit layer: the verdict for a record rows hold (in a table, a dead letter, a tombstone, duplicated,
foreign) and for one no row holds (beyond the log end, a recorded gap, not yet ingested, aged out,
no record at the offset, missing, and for upsert tables superseded or deleted), from what decides it.

End-to-end (slow), on the real broker, Spark and catalog: each answer of `lakehouse trace` for
records of an ingested pipeline, by coordinates and by key over a time window. The embedded broker
cannot delete records (no DeleteRecords, no retention on its in-memory log), so the gap and aged-out
answers are checked in the unit layer only.
"""

from __future__ import annotations

import json

import pytest

from fastapi.testclient import TestClient

import lakehouse_ui
from e2e import pipeline, run_cli, send, table  # noqa: F401 (pipeline: a fixture)
from bench import proof
from lakehouse.core import config, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.ops.coordinates import Coverage, coordinate_filter
from lakehouse.ops.trace import VERDICTS, Sighting, Whereabouts, held_verdict, not_held_verdict, trace_record
from test_ui import card, field
from test_verify import at, delete, order, orders  # noqa: F401 (orders: a fixture)

# ---------------------------------------------------------------------------- unit layer: verdicts

COMMIT = {"snapshot_id": 42, "at": "2026-11-21T10:00:00+00:00", "kind": "ingest", "batch_id": "b1",
          "table": "raw.orders", "operation": "append"}


def sighting(role: str = "data", commits=(COMMIT,), complete: bool = True, **row) -> Sighting:
    table = {"data": "raw.orders", "dead-letter": "raw.orders_dlq", "tombstones": "raw.orders__tombstones"}[role]
    return Sighting(table, role, {"_kafka": {"partition": 0, "offset": 7, "key": "k"}, **row}, list(commits), complete)


@pytest.mark.parametrize("sightings, verdict, words", [
    ([sighting()], "in-table", "is a row of raw.orders, committed by snapshot 42"),
    ([sighting("dead-letter", error_kind="bad_enum", error_detail="status 'x'")], "dead-letter",
     "a dead letter in raw.orders_dlq: bad_enum: status 'x'"),
    ([sighting("tombstones")], "tombstone", "it deleted key 'k'"),
    ([sighting(), sighting("dead-letter")], "duplicated", "held 2 times (raw.orders, raw.orders_dlq)"),
    ([sighting(commits=())], "foreign", "no commit of the pipeline covers that offset"),
    ([sighting(commits=(), complete=False)], "in-table", "is a row of raw.orders"),  # history expired: unknown
])
def test_a_held_record_is_where_its_rows_are(make_spec, sightings, verdict, words):
    found, message = held_verdict(make_spec(), 0, 7, sightings)
    assert found == verdict and words in message and found in VERDICTS


def test_a_record_no_row_holds_is_explained_by_the_log_the_positions_and_the_gaps(make_spec):
    spec = make_spec()
    where = Whereabouts(earliest=10, end=100, committed=60)
    assert not_held_verdict(spec, 0, 100, where)[0] == "beyond-log-end"
    gap = Whereabouts(earliest=10, end=100, committed=60, gap=COMMIT)
    assert not_held_verdict(spec, 0, 5, gap) == (
        "gap", f"{spec.source.topic}[0]@5 aged out of Kafka before it was ingested: the gap was recorded by "
               "snapshot 42 of raw.orders at 2026-11-21T10:00:00+00:00")
    verdict, message = not_held_verdict(spec, 0, 70, where)
    assert verdict == "not-yet-ingested" and "committed position of partition 0 is 60, 40 records behind" in message
    assert not_held_verdict(spec, 0, 5, where)[0] == "aged-out"
    assert not_held_verdict(spec, 0, 20, Whereabouts(10, 100, 60, read=True))[0] == "no-record"
    verdict, message = not_held_verdict(spec, 0, 20, Whereabouts(10, 100, 60, read=True, record={"key": "k"}))
    assert verdict == "missing" and f"--pipeline {spec.name} --offsets 0:20-21" in message


def test_an_upsert_record_no_row_holds_was_superseded_or_deleted_or_is_missing(make_spec):
    spec = make_spec(mode="upsert", table_key=["order_id"])
    record = {"key": "ord-1", "timestamp_ms": 1000}

    def verdict(row=None, tombstone=None) -> str:
        return not_held_verdict(spec, 0, 20, Whereabouts(10, 100, 60, None, True, record, row, tombstone))[0]

    assert verdict(row=(0, 30, 900)) == "superseded"          # a later offset of the key in the same partition
    assert verdict(row=(1, 3, 1000)) == "superseded"          # another partition, a timestamp no older
    assert verdict(row=(0, 15, 2000), tombstone=(0, 25, 0)) == "deleted"
    assert verdict(row=(1, 3, 999)) == "missing"              # the row is older: this record should be it
    fanned = make_spec(mode="upsert", table_key=["order_id"],
                       fanout={"field": "status", "routes": {"paid": "raw.orders_{suffix}_paid"}})
    assert not_held_verdict(fanned, 0, 20, Whereabouts(10, 100, 60, read=True, record=record))[0] == "not-held"


# ---------------------------------------------------------------------------- unit layer: pruning


@pytest.fixture
def private_platform(tmp_path) -> config.PlatformConfig:
    """A platform whose catalog and warehouse are private to the test; no broker is ever contacted."""
    home = tmp_path / "home"
    home.mkdir()
    return config.PlatformConfig(home=home, bootstrap_servers="127.0.0.1:9", catalog_uri=f"sqlite:///{home}/catalog.db",
                                 warehouse=(home / "warehouse").as_uri())


def test_a_trace_reads_only_the_file_whose_coordinate_bounds_hold_the_record(make_spec, private_platform):
    """The bench's table builder writes files as ingestion does (one per partition and batch, with `_kafka`
    bounds); a trace's scan plans the one file holding the offset and answers from the table alone."""
    spec = make_spec(partitions=proof.PARTITIONS)
    catalog = open_catalog(private_platform, spec.catalog)
    built = proof.build_table(catalog, spec, rows=30_000, rows_per_commit=5_000)
    table = catalog.load_table(spec.target.table)
    assert built["commits"] == 6 and len(list(table.scan().plan_files())) == built["files"] >= 18
    planned = list(table.scan(row_filter=coordinate_filter(1, 4321, spec.source.topic)).plan_files())
    assert len(planned) == 1  # pyiceberg binds `_kafka.partition`/`_kafka.offset` and prunes on the bounds

    found = trace_record(spec, 1, 4321, private_platform)  # no broker: the table answers alone
    assert found.verdict == "in-table" and found.kafka is None
    (sighting,) = found.sightings
    assert sighting.row["order_id"] == "ord-1-4321"
    holding = [s for s in table.snapshots() if (1, 4321) in Coverage.of_ranges(offsets.decode_ranges(
        offsets.summary_properties(s).get(offsets.K_RANGES)))]
    assert [c["snapshot_id"] for c in sighting.commits] == [s.snapshot_id for s in holding] and len(holding) == 1


# ---------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_trace_says_where_each_record_is(platform, orders, spark, make_spec, monkeypatch):
    spec = orders
    data = table(platform, spec, spec.target.table)

    def trace(*args: str) -> tuple[int, dict]:
        done = run_cli(spec, "trace", "--pipeline", spec.name, "--json", *args)
        assert done.returncode in (0, 3), done.stderr[-3000:]
        return done.returncode, json.loads(done.stdout)

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
    client = TestClient(lakehouse_ui.app)
    html = card(client.get("/").text, spec.name)
    assert field(html, "verification") == "failed" and 'name="partition"' in html
    assert f"{spec.source.topic}[0]@7" in field(html, "verification_message")
    answer = client.get("/trace", params={"pipeline": spec.name, "partition": "0", "offset": "7"})
    assert answer.status_code == 200 and field(answer.text, "verdict") == "missing"
    assert "lakehouse replay" in field(answer.text, "message")
    assert client.get("/api/trace", params={"pipeline": spec.name, "partition": "1", "offset": "4"}).json()[
        "sightings"][0]["commits"][0]["snapshot_id"] == ingest_commit.snapshot_id
    refused = client.get("/api/trace", params={"pipeline": spec.name, "partition": "-1", "offset": "4"})
    assert refused.status_code == 400 and "partition must be a whole number" in refused.json()["error"]
    unknown = client.get("/trace", params={"pipeline": "no_such_pipeline", "partition": "0", "offset": "0"})
    assert unknown.status_code == 422 and "no pipeline named &#x27;no_such_pipeline&#x27;" in unknown.text
