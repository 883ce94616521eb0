"""`lakehouse verify` proves a range exactly once, on the real broker, Spark and catalog.

The tables are damaged on purpose with pyiceberg, as a careless hand or a broken writer would:
a row deleted, a row duplicated, a dead letter removed, a file of rows from another range added.
Each must be found with its coordinates, and the verification must fail (exit 3), incrementally,
after a passing one. Upsert tables keep the newest record per key: a stale row and a key that
vanished without a tombstone are found. The publish DAG verifies the audited snapshots and
refuses to publish what no passing verification covers. The pure checks are in the unit layer
(tests/test_verify_checks.py).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.expressions import And, EqualTo

from e2e import pipeline, run_cli, send, table, task_states  # noqa: F401 (fixture)
from lakehouse.core import events
from lakehouse.ops import verify
from lakehouse.wap import publish

pytestmark = pytest.mark.slow


def order(partition: int, i: int, **changes) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{partition}-{i}", "customer_id": f"c-{i % 7}", "amount": 10.0 + i,
              "currency": "EUR", "status": "created", "event_time": datetime.now(timezone.utc).isoformat()}
    record.update(changes)
    return record["order_id"].encode(), json.dumps(record).encode()


def at(partition: int, offset: int):
    return And(EqualTo("_kafka.partition", partition), EqualTo("_kafka.offset", offset))


def delete(spark, spec, name: str, where: str) -> None:
    """DELETE FROM a table of the pipeline with Spark SQL, as an operator's query would."""
    spark.sql(f"DELETE FROM {spec.qualified(name)} WHERE {where}")


def ingest(spec) -> None:
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert done.returncode == 0, done.stderr[-3000:]


def verify_cli(spec, *args: str) -> tuple[int, dict]:
    done = run_cli(spec, "verify", "--pipeline", spec.name, "--json", *args)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def problems(result: dict, kind: str) -> set[tuple]:
    return {(p["partition"], p["offset"], tuple(p["tables"])) for p in result["problems"] if p["kind"] == kind}


@pytest.fixture
def orders(platform, pipeline):
    """An append pipeline, ingested: partition 0 holds 30 records whose offsets 5, 15 and 25 are dead
    letters (not JSON), partition 1 holds 20 good records."""
    spec = pipeline(partitions=2)
    send(platform, spec.source.topic, [(b"bad", b"{not json") if i % 10 == 5 else order(0, i) for i in range(30)],
         partition=0)
    send(platform, spec.source.topic, [order(1, i) for i in range(20)], partition=1)
    ingest(spec)
    return spec


def test_verify_proves_the_tables_then_finds_each_damage_with_its_coordinates(platform, orders, spark):
    spec = orders
    code, first = verify_cli(spec)
    assert code == 0 and first["ok"], first
    assert first["mode"] == "full"  # nothing was verified before: every row, every offset Kafka holds
    assert first["offsets"] == 50 and first["rows"] == 50
    assert first["committed"] == {"0": 30, "1": 20}
    data, dead = (table(platform, spec, name) for name in (spec.target.table, spec.dead_letter_table))
    assert first["snapshots"] == {spec.target.table: data.current_snapshot().snapshot_id,
                                  spec.dead_letter_table: dead.current_snapshot().snapshot_id}
    event = events.recent(spec.name, kind="verify", platform=platform)[0]
    assert event["status"] == "ok" and event["metrics"]["offsets"] == 50
    assert event["details"]["snapshots"] == first["snapshots"]

    # the same proof as a Spark job (what large windows run as)
    on_spark = verify.verify(spec, platform, full=True, engine="spark", spark_factory=lambda: spark,
                             record_event=False)
    assert on_spark.ok and on_spark.engine == "spark" and on_spark.findings.offsets == 50

    code, again = verify_cli(spec)  # incremental: nothing was committed since
    assert code == 0 and again["status"] == "skipped" and again["offsets"] == 0

    # the damage
    delete(spark, spec, spec.target.table, "_kafka.partition = 0 AND _kafka.offset = 7")    # a row deleted
    delete(spark, spec, spec.dead_letter_table, "_kafka.partition = 0 AND _kafka.offset = 15")  # a dead letter
    data = data.refresh()
    data.append(data.scan(row_filter=at(1, 3)).to_arrow())  # a row duplicated
    rows = data.scan(row_filter=And(EqualTo("_kafka.partition", 1), EqualTo("_kafka.offset", 10))).to_arrow()
    foreign = pa.concat_tables([rows, rows, rows])
    kafka = foreign.column("_kafka").combine_chunks()
    moved = pa.StructArray.from_arrays(
        [pa.array([spec.source.topic, spec.source.topic, "another-topic"]), kafka.field("partition"),
         pa.array([500, 501, 10], pa.int64()), kafka.field("timestamp"), kafka.field("key")],
        fields=list(kafka.type))
    data.append(foreign.set_column(foreign.schema.get_field_index("_kafka"), "_kafka", moved))  # another range

    code, found = verify_cli(spec)
    assert code == 3 and not found["ok"] and found["mode"] == "incremental"
    assert found["counts"] == {"missing": 2, "duplicated": 1, "foreign": 3, "stale": 0}
    assert problems(found, "missing") == {(0, 7, ()), (0, 15, ())}
    assert found["missing"] == {"0": [[7, 8], [15, 16]]}
    assert problems(found, "duplicated") == {(1, 3, (spec.target.table, spec.target.table))}
    assert problems(found, "foreign") == {(1, 500, (spec.target.table,)), (1, 501, (spec.target.table,)),
                                          (1, 10, (spec.target.table,))}
    reasons = {p["offset"]: p["detail"] for p in found["problems"] if p["kind"] == "foreign"}
    assert "committed position 20" in reasons[500] and "another topic" in reasons[10]
    assert found["tables"][spec.target.table]["base"] == first["snapshots"][spec.target.table]
    failed = events.recent(spec.name, kind="verify", platform=platform)[0]
    assert failed["status"] == "failed" and failed["metrics"]["missing"] == 2
    assert "0:7" not in failed["message"] and f"{spec.source.topic}[0]@7" in failed["message"]

    # a failed run does not move the chain: the next one checks the same snapshots again
    code, still = verify_cli(spec)
    assert code == 3 and still["counts"] == found["counts"]
    assert verify.unverified(spec, {spec.target.table: data.refresh().current_snapshot().snapshot_id}, platform)


def test_trace_says_where_each_record_is(platform, orders, spark):
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


def test_upsert_tables_hold_each_keys_newest_record(platform, pipeline, spark):
    spec = pipeline(partitions=1, mode="upsert", table_key=["order_id"], partition_by=[])
    updates = [order(0, i % 4, status=status) for i, status in enumerate(["created"] * 4 + ["paid"] * 4)]
    send(platform, spec.source.topic, updates + [(b"ord-0-3", None)], partition=0)  # offset 8: delete ord-0-3
    ingest(spec)
    code, first = verify_cli(spec)
    assert code == 0 and first["ok"] and first["keys_checked"] == 4, first
    data = table(platform, spec, spec.target.table)
    assert data.scan().to_arrow().num_rows == 3

    # ord-0-1's row rolled back to its first version (offset 1, not 5); ord-0-2's row dropped without a tombstone
    older = data.scan(row_filter=at(0, 5)).to_arrow()
    kafka = older.column("_kafka").combine_chunks()
    stale = older.set_column(older.schema.get_field_index("_kafka"), "_kafka", pa.StructArray.from_arrays(
        [kafka.field("topic"), kafka.field("partition"), pa.array([1], pa.int64()), kafka.field("timestamp"),
         kafka.field("key")], fields=list(kafka.type)))
    delete(spark, spec, spec.target.table, "order_id = 'ord-0-1'")
    data = data.refresh()
    data.append(stale)
    delete(spark, spec, spec.target.table, "order_id = 'ord-0-2'")  # merge-on-read: a position delete
    code, found = verify_cli(spec)
    assert code == 3, found
    assert {(p["kind"], p["offset"], p["key"]) for p in found["problems"]} == {
        ("stale", 5, "ord-0-1"), ("missing", 6, "ord-0-2")}
    assert pc.sum(pc.equal(data.refresh().scan().to_arrow().column("order_id"), "ord-0-1")).as_py() == 1


def test_the_publish_dag_publishes_only_verified_snapshots(platform, orders, make_spec, run_dag, spark):
    spec = orders
    run = run_dag(f"{spec.name}_verify", make_spec.directory)  # the scheduled verification
    assert task_states(run) == {"verify": "success"}
    verified = events.recent(spec.name, kind="verify", platform=platform)[0]
    assert verified["status"] == "ok" and verified["details"]["mode"] == "full"

    run = run_dag(f"{spec.name}_publish", make_spec.directory)
    assert task_states(run)["publish"] == "success", task_states(run)
    data = table(platform, spec, spec.target.table)
    published = publish.published_head(data, spec.publish.branch)
    assert published == data.current_snapshot().snapshot_id

    # a row lost on main after more records arrived: the audit passes, verification does not
    send(platform, spec.source.topic, [order(1, i) for i in range(20, 25)], partition=1)
    ingest(spec)
    delete(spark, spec, spec.target.table, "_kafka.partition = 1 AND _kafka.offset = 22")
    run = run_dag(f"{spec.name}_publish", make_spec.directory)
    states = task_states(run)
    assert states["quality"] == "success" and states["verify"] == "failed" and states["publish"] == "upstream_failed"
    data = table(platform, spec, spec.target.table)
    assert publish.published_head(data, spec.publish.branch) == published  # readers see nothing new
    head = data.current_snapshot().snapshot_id
    with pytest.raises(verify.UnverifiedError, match=rf"{spec.target.table} snapshot {head}.*{spec.name}_publish"):
        publish.publish(spec, {spec.target.table: head}, platform, spark_factory=lambda: spark,
                        require_verified=True)
    assert publish.published_head(data.refresh(), spec.publish.branch) == published
