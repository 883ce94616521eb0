"""`lakehouse verify` proves a range exactly once.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/audit/test_verify.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from e2e import pipeline, run_cli, send, table, task_states  # noqa: F401 (pipeline: a fixture)
from pyiceberg.expressions import And, EqualTo

from lakehouse.audit import verify, verify_model, windows
from lakehouse.core import config, errors, events
from lakehouse.wap import publish
from tests.unit.audit.test_verify import (  # noqa: F401 - fixtures among them
    at,
    delete,
    ingest,
    kafka,
    order,
    orders,
    rows,
)

# ---------------------------------------------------------------------------- unit layer: the arithmetic


def verify_cli(spec, *args: str) -> tuple[int, dict]:
    done = run_cli(spec, "verify", "--pipeline", spec.name, "--json", *args)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def problems(result: dict, kind: str) -> set[tuple]:
    return {(p["partition"], p["offset"], tuple(p["tables"])) for p in result["problems"] if p["kind"] == kind}


@pytest.mark.slow
def test_verify_proves_the_tables_then_finds_each_damage_with_its_coordinates(platform, orders, spark, monkeypatch):
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
    # the Spark job finds the same damage: chosen by `auto` past its threshold, and by spark-submit of the entry point
    monkeypatch.setattr(verify, "SPARK_ABOVE_OFFSETS", 10)
    auto = verify.verify(spec, platform, spark_factory=lambda: spark, record_event=False).to_json()
    assert auto["engine"] == "spark" and auto["counts"] == found["counts"]
    assert all(problems(auto, kind) == problems(found, kind) for kind in verify_model.PROBLEMS)
    submitted = subprocess.run(
        [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[1]", "--packages", ",".join(platform.spark_packages),
         str(config.REPO_ROOT / "spark_jobs" / "verify.py"), "--pipeline", spec.name, "--engine", "spark", "--json"],
        env=dict(os.environ, LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent), PYSPARK_PYTHON=sys.executable),
        capture_output=True, text=True, timeout=300, start_new_session=True)
    assert submitted.returncode == 3, submitted.stderr[-3000:]
    # spark-submit passes the Python driver's stderr (the progress lines) on in its stdout, before the document
    on_cluster = json.loads(submitted.stdout[submitted.stdout.rindex("\n{\n") + 1:])
    assert on_cluster["engine"] == "spark" and on_cluster["counts"] == found["counts"]
    assert problems(on_cluster, "foreign") == problems(found, "foreign")
    # on demand: the last hour's snapshots, and the data table's snapshots from the ingest commit on
    code, recent = verify_cli(spec, "--since", "1h")
    assert code == 3 and recent["mode"] == "since" and recent["counts"] == found["counts"]
    head = data.refresh().current_snapshot().snapshot_id
    code, ranged = verify_cli(spec, "--snapshots", f"{first['snapshots'][spec.target.table]}..{head}")
    assert code == 3 and ranged["counts"] == found["counts"]
    assert ranged["tables"][spec.target.table] | {"positions": None} == {
        "to": head, "base": None, "snapshots": 4, "positions": None}  # the ingest commit and the 3 damages to it
    assert head not in windows.verified_snapshots(spec, platform).get(spec.target.table, set())  # found damaged


@pytest.mark.slow
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


@pytest.mark.slow
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
    with pytest.raises(errors.UnverifiedError, match=rf"{spec.target.table} snapshot {head}.*{spec.name}_publish"):
        publish.publish(spec, {spec.target.table: head}, platform, spark_factory=lambda: spark,
                        require_verified=True)
    assert publish.published_head(data.refresh(), spec.publish.branch) == published
