"""Table maintenance compacts small files without changing a row, while ingestion keeps committing,
and snapshot expiry never takes the snapshot ingestion resumes from nor the readers' branch; the DAG's
run gives Airflow's OpenLineage provider the tables it maintained."""

import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from e2e import (  # noqa: F401 (fixture)
    airflow_dags_test,
    assert_exactly_once,
    emitted,
    pipeline,
    rows,
    send,
    table,
    task_states,
    xcom,
)
from lakehouse.core import events, lineage, offsets
from lakehouse.ingest.job import IngestJob
from lakehouse.upkeep import maintenance
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def order(i: int, status: str) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": status, "event_time": "2026-11-20T12:00:00+00:00"}
    return record["order_id"].encode(), json.dumps(record).encode()


def small_batches(spec, job: IngestJob, batches: int, records: int) -> None:
    """`batches` commits of `records` records each: several small files per table."""
    for seed in range(batches):
        produce.produce(spec, records, bad_ratio=0.1, seed=100 + seed)
        assert job.run_once()


def test_maintenance_dag_compacts_small_files_while_ingestion_commits(platform, pipeline, airflow_db, make_spec,
                                                                      lineage_file):
    spec = pipeline(partition_by=[])
    job = IngestJob(spec)
    small_batches(spec, job, spec.maintenance.min_input_files + 1, 50)  # one file per table per small batch
    before = table(platform, spec, spec.target.table)
    files_before = int(offsets.summary_properties(before.current_snapshot())["total-data-files"])
    assert files_before >= spec.maintenance.min_input_files

    # ingestion keeps producing and committing for as long as the maintenance DAG runs
    stop, commit_times, errors = threading.Event(), [], []

    def ingest_meanwhile() -> None:
        seed = 1000
        try:
            while not stop.is_set():
                seed += 1
                produce.produce(spec, 20, bad_ratio=0.1, seed=seed)
                for _ in job.run_once():
                    commit_times.append(time.time())
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    ingester = threading.Thread(target=ingest_meanwhile, daemon=True)
    ingester.start()
    started = time.time()
    run = airflow_dags_test(f"{spec.name}_maintenance", make_spec.directory)  # OpenLineage to lineage_file
    finished = time.time()
    stop.set()
    ingester.join(timeout=300)
    assert not errors, errors

    assert run.state == "success"
    assert task_states(run) == {"maintain_tables": "success"}
    receipt = xcom(run, "maintain_tables")
    assert receipt["ok"] and receipt["pipeline"] == spec.name
    by_table = {t["table"]: t for t in receipt["tables"]}
    timeline = f"{spec.catalog}.{events.EVENTS_TABLE}"
    assert set(by_table) == {spec.qualified(spec.target.table), spec.qualified(spec.dead_letter_table), timeline}
    # the pipeline's batch events, one small file each, were compacted too; nothing else changed
    ops = by_table.pop(timeline)
    assert ops["status"] == "ok" and ops["data_files_after"] < ops["data_files_before"]
    assert ops["content_unchanged"] and ops["rows_after"] == ops["rows_before"]
    data = by_table[spec.qualified(spec.target.table)]
    assert data["status"] == "ok"
    assert data["data_files_after"] < data["data_files_before"]
    assert data["rewritten_data_files"] >= spec.maintenance.min_input_files
    assert data["rows_after"] == data["rows_before"] > 0
    assert data["checksum_after"] == data["checksum_before"] != "0"
    assert data["content_unchanged"] and data["compactions"]
    # the same receipt is on the ops timeline, one event per table
    recorded = [e for e in events.recent(spec.name, "maintenance", platform=platform)
                if e["details"]["run_id"] == receipt["run_id"]]
    assert len(recorded) == 3 and all(e["status"] == "ok" for e in recorded)
    # audited: the job spark-submit ran names the user who triggered the DAG run
    assert {(e["actor"], e["details"]["actor"]["dag_id"]) for e in recorded} == {("dag_test", run.dag_id)}
    assert {e["metrics"]["data_files_after"] for e in recorded} == {t["data_files_after"] for t in receipt["tables"]}

    # OpenLineage, through Airflow's provider: each table maintained, in and out, with its state after
    completed = [e for e in emitted(lineage_file)
                 if e["job"]["name"] == f"{run.dag_id}.maintain_tables" and e["eventType"] == "COMPLETE"]
    assert len(completed) == 1, [(e["job"]["name"], e["eventType"]) for e in emitted(lineage_file)]
    [event] = completed
    maintained = {spec.target.table: data, spec.dead_letter_table: by_table[spec.qualified(spec.dead_letter_table)],
                  events.EVENTS_TABLE: ops}
    located = {name: lineage.location_name(table(platform, spec, name).location()) for name in maintained}
    assert sorted((d["namespace"], d["name"]) for d in event["inputs"]) == \
        sorted((d["namespace"], d["name"]) for d in event["outputs"]) == sorted(located.values())
    for output in event["outputs"]:
        [identifier] = output["facets"]["symlinks"]["identifiers"]
        after = maintained[identifier["name"]]
        assert (output["namespace"], output["name"]) == located[identifier["name"]]
        assert output["outputFacets"]["outputStatistics"] | {"_producer": None, "_schemaURL": None} == \
            {"rowCount": after["rows_after"], "fileCount": after["data_files_after"], "size": after["bytes_after"],
             "_producer": None, "_schemaURL": None}
        snapshot = int(output["facets"]["version"]["datasetVersion"])  # the table's head when the run ended
        assert table(platform, spec, identifier["name"]).snapshot_by_id(snapshot) is not None
    data_out = next(o for o in event["outputs"] if o["name"] == located[spec.target.table][1])
    assert {"order_id", "_kafka"} <= {f["name"] for f in data_out["facets"]["schema"]["fields"]}

    # ingestion did commit while the maintenance job ran, and nothing was lost or duplicated
    assert any(started < t < finished for t in commit_times), (started, finished, commit_times)
    job.run_once()
    total = assert_exactly_once(platform, spec)
    # and it resumes from where the tables say, after compaction
    produce.produce(spec, 40, seed=7)
    assert sum(r.records for r in job.run_once()) == 40
    assert assert_exactly_once(platform, spec) == total + 40


def test_expiry_keeps_the_resume_snapshot_and_the_published_branch(platform, pipeline):
    spec = pipeline(retention={"replay_window": "1s"}, maintenance={"orphan_safety_window": "1h"})
    job = IngestJob(spec)
    small_batches(spec, job, 5, 20)
    data = table(platform, spec, spec.target.table)
    first_ingest = min(data.snapshots(), key=lambda s: s.timestamp_ms).snapshot_id
    job.spark.sql(f"ALTER TABLE {spec.qualified(spec.target.table)} CREATE BRANCH published "
                  f"AS OF VERSION {first_ingest}")
    progress = offsets.read_progress(job.catalog, spec.target.table, spec.name)

    # a file no snapshot references: old enough to be an orphan, and one that might be a commit in flight
    data_dir = Path(urlparse(data.location()).path) / "data"
    old_orphan, fresh_orphan = data_dir / "crashed-attempt.parquet", data_dir / "in-flight.parquet"
    for path in (old_orphan, fresh_orphan):
        path.write_bytes(b"PAR1 not referenced by any snapshot")
    two_hours_ago = time.time() - 7200
    os.utime(old_orphan, (two_hours_ago, two_hours_ago))
    time.sleep(1.5)  # the behaviour under test, not an event: every ingest snapshot ages past the 1s replay window

    receipt = maintenance.run(spec, platform, spark=job.spark)
    assert receipt.ok, [t.message for t in receipt.tables]
    data_receipt, dlq_receipt = receipt.tables[:2]
    # the data table's commits after the published head are not published yet: the next audit walks
    # them, so they stay whatever their age; the dead-letter table has no readers' branch
    assert data_receipt.snapshots_expired == 0 and data_receipt.kept_for_resume == len(data.snapshots())
    assert dlq_receipt.snapshots_expired > 0
    assert data_receipt.positions_snapshot_id == progress.snapshot_id
    assert dlq_receipt.positions_snapshot_id == \
        offsets.read_progress(job.catalog, spec.dead_letter_table, spec.name).snapshot_id
    assert data_receipt.orphans_removed == 1
    assert not old_orphan.exists() and fresh_orphan.exists()

    data = table(platform, spec, spec.target.table)
    kept = {s.snapshot_id for s in data.snapshots()}
    assert first_ingest in kept and data.metadata.refs["published"].snapshot_id == first_ingest
    after = offsets.read_progress(job.catalog, spec.target.table, spec.name)
    assert after.snapshot_id == progress.snapshot_id and after.positions == progress.positions
    # time travel to the published branch still reads its rows
    published = job.spark.sql(f"SELECT count(*) AS n FROM {spec.qualified(spec.target.table)} "
                              f"VERSION AS OF 'published'").collect()[0]["n"]
    assert published > 0

    # ingestion resumes exactly where it stood
    produce.produce(spec, 25, seed=99)
    assert sum(r.records for r in job.run_once()) == 25
    assert assert_exactly_once(platform, spec) == 5 * 20 + 25


def test_upsert_tables_are_compacted_with_their_deletes_applied(platform, pipeline):
    spec = pipeline(mode="upsert", table_key=["order_id"], partition_by=[], maintenance={"min_input_files": 2})
    job = IngestJob(spec)
    for status in ("created", "paid", "shipped"):  # the same orders again: merge-on-read delete files
        send(platform, spec.source.topic, [order(i, status) for i in range(40)])
        assert job.run_once()
    before = table(platform, spec, spec.target.table)
    assert int(offsets.summary_properties(before.current_snapshot())["total-delete-files"]) > 0

    receipt = maintenance.run(spec, platform, spark=job.spark)
    assert receipt.ok, [t.message for t in receipt.tables]
    data = receipt.tables[0]
    assert data.delete_files_after < data.delete_files_before
    assert data.data_files_after < data.data_files_before
    assert data.rows_after == data.rows_before and data.checksum_after == data.checksum_before
    send(platform, spec.source.topic, [order(100 + i, "created") for i in range(10)])
    assert sum(r.records for r in job.run_once()) == 10
    latest = rows(platform, spec, spec.target.table)  # the newest record per key, as before compaction
    assert len(latest) == 40 + 10
    mine = [r for r in latest if r["order_id"] in {f"ord-{i}" for i in range(40)}]
    assert len(mine) == 40 and all(r["status"] == "shipped" for r in mine)
