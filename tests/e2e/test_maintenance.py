"""Table maintenance compacts small files without changing a row, while ingestion keeps committing,
and snapshot expiry never takes the snapshot ingestion resumes from nor the readers' branch; the DAG's
run gives Airflow's OpenLineage provider the tables it maintained.

Orphan removal deletes only files the table owns: where another table keeps files in its folder (a second
catalog name sharing the warehouse, a `write.data.path` pointing into it) it is refused and the other
table's files stay. One table's failure is recorded and the next tables are still maintained. A dry run
(the DAG's `dry_run` Param) changes nothing and lists exactly what the run then rewrites, expires and
deletes."""

import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
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
from lakehouse.core import config, events, lineage, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.ingest.job import IngestJob
from lakehouse.upkeep import maintenance, storage_paths
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def order(i: int, status: str) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": status, "event_time": "2026-11-20T12:00:00+00:00"}
    return record["order_id"].encode(), json.dumps(record).encode()


def small_batches(spec, job: IngestJob, batches: int, records: int, bad_ratio: float = 0.1) -> None:
    """`batches` commits of `records` records each: several small files per table."""
    for seed in range(batches):
        produce.produce(spec, records, bad_ratio=bad_ratio, seed=100 + seed)
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
    assert data.delete_files_before > 0 and data.delete_files_after == 0  # every delete folded back
    assert data.data_files_after < data.data_files_before
    assert data.rows_after == data.rows_before and data.checksum_after == data.checksum_before
    send(platform, spec.source.topic, [order(100 + i, "created") for i in range(10)])
    assert sum(r.records for r in job.run_once()) == 10
    latest = rows(platform, spec, spec.target.table)  # the newest record per key, as before compaction
    assert len(latest) == 40 + 10
    mine = [r for r in latest if r["order_id"] in {f"ord-{i}" for i in range(40)}]
    assert len(mine) == 40 and all(r["status"] == "shipped" for r in mine)


# ---------------------------------------------------------------------------- what orphan removal may delete

def folder(location: str) -> Path:
    return Path(urlparse(location).path)


def files_under(*locations: str) -> set[Path]:
    return {path for location in locations for path in folder(location).rglob("*") if path.is_file()}


def age(paths, seconds: float = 7200) -> None:
    """Make `paths` older than a 1h orphan safety window, as a crashed attempt's files would be."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def maintenance_events(spec, platform, run_id: str) -> list[dict]:
    return [e for e in events.recent(spec.name, "maintenance", platform=platform, catalog=spec.catalog)
            if e["details"].get("run_id") == run_id]


def test_orphan_removal_is_refused_where_another_catalog_name_shares_the_folder(platform, pipeline, monkeypatch):
    """Two catalog names on one JDBC database and one warehouse (a `.pyiceberg.yaml` naming the warehouse
    twice): `twin.raw.orders_<x>` is another table in the very folder of `lake.raw.orders_<x>`, its files old
    enough to be orphans of the lake table. Orphan removal of the lake table is refused naming the twin, whose
    files and rows stay; compaction and expiry of the table still ran, the other tables were maintained."""
    spec = pipeline(partition_by=[], retention={"replay_window": "1s"}, maintenance={"orphan_safety_window": "1h"})
    job = IngestJob(spec)
    small_batches(spec, job, 3, 20)
    lake = platform.catalog(spec.catalog)
    monkeypatch.setenv("PYICEBERG_CATALOG__TWIN__URI", lake.uri)
    monkeypatch.setenv("PYICEBERG_CATALOG__TWIN__WAREHOUSE", lake.warehouse)
    shared = config.load(fresh=True)
    mine = table(shared, spec, spec.target.table)
    before = files_under(mine.location())
    twin = open_catalog(shared, "twin")
    twin.create_namespace_if_not_exists("raw")
    theirs = twin.create_table(spec.target.table, schema=pa.schema([pa.field("id", pa.int64())]))
    try:
        theirs.append(pa.table({"id": [1, 2, 3]}))
        assert storage_paths.canonical_path(theirs.location()) == storage_paths.canonical_path(mine.location())
        twin_files = files_under(mine.location()) - before
        assert any(p.suffix == ".parquet" for p in twin_files) and any(p.name.endswith(".metadata.json")
                                                                       for p in twin_files)
        age(twin_files)
        time.sleep(1.5)  # the behaviour under test, not an event: the ingest snapshots age past the 1s window

        receipt = maintenance.run(spec, shared, spark=job.spark)

        assert all(path.exists() for path in twin_files), sorted(str(p) for p in twin_files if not p.exists())
        assert twin.load_table(spec.target.table).scan().to_arrow()["id"].to_pylist() == [1, 2, 3]
        data, dlq, timeline = receipt.tables
        assert data.status == "failed" and not receipt.ok
        assert data.orphans_removed == 0 and data.orphans_refused == data.message
        assert data.message.startswith(f"orphan removal of {spec.qualified(spec.target.table)} refused, nothing "
                                       f"deleted: its location {mine.location()} is shared: ")
        assert f"twin.{spec.target.table}'s location" in data.message and "Give each table a folder" in data.message
        assert data.snapshots_expired > 0, "expiry ran before orphan removal was refused"
        assert dlq.status == "ok" and timeline.status == "ok"
        recorded = {e["details"]["table"]: e for e in maintenance_events(spec, shared, receipt.run_id)}
        assert recorded[data.table]["status"] == "failed" and recorded[data.table]["message"] == data.message
        assert recorded[data.table]["metrics"]["orphans_refused"] == 1.0
    finally:
        twin.drop_table(spec.target.table)  # the catalog entry only: its files are the evidence above


def test_orphan_removal_is_refused_where_another_tables_write_data_path_points_into_the_folder(platform, pipeline):
    """`raw.intruder_<x>` writes its data files into the pipeline's table folder (`write.data.path`). Orphan
    removal of the pipeline's table would take them for its own orphans; it is refused naming the intruder's
    property, and the intruder's rows stay readable."""
    spec = pipeline(partition_by=[], maintenance={"orphan_safety_window": "1h"})
    job = IngestJob(spec)
    small_batches(spec, job, 2, 20)
    catalog = open_catalog(platform, spec.catalog)
    mine = catalog.load_table(spec.target.table)
    intruder_name = f"raw.intruder_{spec.name}"
    intruder = catalog.create_table(intruder_name, schema=pa.schema([pa.field("id", pa.int64())]),
                                    properties={"write.data.path": f"{mine.location()}/data"})
    try:
        intruder.append(pa.table({"id": [7, 8]}))
        theirs = {folder(task.file.file_path) for task in intruder.scan().plan_files()}
        assert theirs and all(path.is_relative_to(folder(mine.location())) for path in theirs)
        age(theirs)

        receipt = maintenance.run(spec, platform, spark=job.spark)

        assert all(path.exists() for path in theirs)
        assert sorted(catalog.load_table(intruder_name).scan().to_arrow()["id"].to_pylist()) == [7, 8]
        data = receipt.tables[0]
        assert data.status == "failed" and data.orphans_removed == 0
        assert f"lake.{intruder_name}'s write.data.path {mine.location()}/data lies inside it" in data.orphans_refused
        assert [t.status for t in receipt.tables[1:]] == ["ok", "ok"]
    finally:
        catalog.drop_table(intruder_name)


def test_a_table_that_fails_is_recorded_and_the_next_tables_are_still_maintained(platform, pipeline):
    """The data table's current metadata file is unreadable (a torn copy): its maintenance fails with the reason,
    recorded on the timeline, and the dead-letter table and the timeline are still compacted and expired. Their
    orphan removal is refused: where the unreadable table keeps its files is unknown. Once the metadata is
    repaired, a run maintains every table."""
    spec = pipeline(partition_by=[], retention={"replay_window": "1s"}, maintenance={"min_input_files": 2})
    job = IngestJob(spec)
    small_batches(spec, job, 3, 20, bad_ratio=0.5)  # dead letters in every batch: small files in both tables
    catalog = open_catalog(platform, spec.catalog)
    metadata = folder(catalog.load_table(spec.target.table).metadata_location)
    intact = metadata.read_bytes()
    dlq_snapshots = len(catalog.load_table(spec.dead_letter_table).snapshots())
    time.sleep(1.5)  # the behaviour under test, not an event: the ingest snapshots age past the 1s window
    metadata.write_bytes(intact[: len(intact) // 2])
    try:
        receipt = maintenance.run(spec, platform, spark=job.spark)
    finally:
        metadata.write_bytes(intact)

    data, dlq, timeline = receipt.tables
    assert not receipt.ok and data.status == "failed"
    assert data.message.startswith(f"maintenance of {data.table} failed: ")
    unreadable = f"{data.table} could not be read ("
    for other in (dlq, timeline):
        assert other.status == "failed" and unreadable in other.orphans_refused, other.message
        assert other.rewritten_data_files >= 2 and other.content_unchanged
    assert dlq.snapshots_expired > 0 and dlq.snapshots_expired == dlq_snapshots - 1
    recorded = {e["details"]["table"]: e["status"] for e in maintenance_events(spec, platform, receipt.run_id)}
    assert recorded == {data.table: "failed", dlq.table: "failed", timeline.table: "failed"}

    repaired = maintenance.run(spec, platform, spark=job.spark)
    assert repaired.ok, [t.message for t in repaired.tables]


def test_a_dry_run_changes_nothing_and_lists_what_the_run_then_does(platform, pipeline, make_spec, run_dag):
    """The maintenance DAG triggered with `dry_run` (the job's `--dry-run`): no commit to any table, every file
    still there, and its receipt lists exactly the files compaction then rewrites, the snapshots expiry then
    names and the orphan files removal then deletes."""
    spec = pipeline(partition_by=[], retention={"replay_window": "1s"},
                    maintenance={"orphan_safety_window": "1h", "min_input_files": 2})
    job = IngestJob(spec)
    small_batches(spec, job, 4, 20, bad_ratio=0.5)  # dead letters in every batch: small files in both tables
    names = (spec.target.table, spec.dead_letter_table)
    locations = {name: table(platform, spec, name).location() for name in names}
    old, fresh = set(), set()
    for name, location in locations.items():
        for kind, found in (("crashed-attempt", old), ("in-flight", fresh)):
            path = folder(location) / "data" / f"{kind}-{name}.parquet"
            path.write_bytes(b"PAR1 not referenced by any snapshot")
            found.add(path)
    age(old)
    time.sleep(1.5)  # the behaviour under test, not an event: the ingest snapshots age past the 1s window
    heads = {name: table(platform, spec, name).metadata_location for name in names}
    on_disk = files_under(*locations.values())

    run = run_dag(f"{spec.name}_maintenance", make_spec.directory, conf={"dry_run": True})
    assert run.state == "success"
    preview = xcom(run, "maintain_tables")
    assert preview["ok"] and preview["dry_run"]
    assert {name: table(platform, spec, name).metadata_location for name in names} == heads
    assert files_under(*locations.values()) == on_disk
    planned = {t["table"]: t for t in preview["tables"]}

    receipt = maintenance.run(spec, platform, spark=job.spark)
    assert receipt.ok, [t.message for t in receipt.tables]
    done = {t.table: t for t in receipt.tables}
    for name in names:
        plan, did = planned[spec.qualified(name)], done[spec.qualified(name)]
        assert plan["dry_run"] and plan["status"] == "skipped" and plan["message"].startswith("dry run: ")
        assert plan["would_rewrite_data_files"] == did.rewritten_data_files >= 2
        assert plan["would_expire_count"] == did.snapshots_expired > 0
        assert sorted(s["snapshot_id"] for s in plan["would_expire"]) == did.expired_snapshot_ids
        assert plan["would_delete_orphans"] == did.removed_orphan_files
        assert {folder(p) for p in did.removed_orphan_files} == {p for p in old if p.is_relative_to(folder(
            locations[name]))}
    assert not any(path.exists() for path in old) and all(path.exists() for path in fresh)
