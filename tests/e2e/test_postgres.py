"""PostgreSQL in the production topology: the Iceberg JDBC catalog and Airflow's metadata DB.

The module starts a throwaway PostgreSQL cluster of its own (tests/support/pgserver.py: `initdb`, trust
authentication, a free port on 127.0.0.1), so it relies on no server someone else configured. Every
test gets a database of its own there (`lakehouse_test_<uuid>`, dropped afterwards) and reaches it the
way users do: the catalog through LAKEHOUSE_CATALOG_URI and `stack.up()`, Airflow through
LAKEHOUSE_AIRFLOW_DB_URI and `airflow_stack.up()`. Without the server binaries the tests fail, never
skip: `make setup` installs them.

The race runs its producer, compaction and publisher as separate processes started from this
file (`python tests/e2e/test_postgres.py produce|compact|publish <spec.yaml> <work dir>`) next to a
continuous `lakehouse ingest`, so that their commits meet at the catalog's compare-and-set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pgserver
import pytest
from polling import wait_until, while_running
from pyiceberg.exceptions import NoSuchTableError

from e2e import LAKEHOUSE, assert_exactly_once, lakehouse, log_ends, receipts, send, table
from lakehouse.core import config, events, offsets, sparkenv
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec, load_spec
from lakehouse.core.topics import ensure_topics
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.upkeep import maintenance
from lakehouse.wap import publish, quality
from lakehouse_dev import airflow_stack, produce
from lakehouse_dev import stack as stack_module

pytestmark = pytest.mark.slow

START_POSTGRES = "is the cluster this module started still running? Its log is in the cluster's folder"
# The race: the producer sends CHUNK records (BAD_RATIO of them broken) every CHUNK_PAUSE_S until told
# to stop, then POISON records the contract accepts and the quality suite rejects (currency ZZZ).
CHUNK, CHUNK_PAUSE_S, BAD_RATIO, POISON = 20, 0.3, 0.05, 5
COMPACTION_ROUNDS, PUBLISH_ROUNDS = 2, 3
TRIGGER_INTERVAL = "200ms"  # back-to-back batches: commits as often as ingestion can make them
WAIT_S = 240.0  # the most a worker waits for ingestion to commit again before giving up
# What each process logs when one of its commits lost the catalog's compare-and-set to another writer
CONFLICT_MARKERS = {"iceberg": "Retrying task after failure",  # Iceberg (Java) retrying a commit
                    "pyiceberg": "Commit failed due to a concurrent update",  # pyiceberg retrying an append
                    # lakehouse.core.retry: ingest retrying a table commit, maintenance a step, publish a branch move
                    "lakehouse": "conflicted with another commit (attempt"}


# ---------------------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="module")
def postgres() -> Iterator[pgserver.Server]:
    """The module's own PostgreSQL cluster (trust authentication on a free port of 127.0.0.1)."""
    try:
        with pgserver.cluster(auth_host="trust") as server:
            yield server
    except pgserver.PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def admin_connection(server: pgserver.Server):
    """An autocommit connection to the server's `postgres` database.

    Fails the test (never skips) when the server does not answer, saying so.
    """
    import psycopg2

    try:
        conn = psycopg2.connect(host=server.host, port=server.port, user=server.user, dbname="postgres",
                                connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(f"PostgreSQL does not answer on {server.host}:{server.port} ({str(exc).strip()}); "
                    f"{START_POSTGRES}", pytrace=False)
    conn.autocommit = True
    return conn


@contextlib.contextmanager
def fresh_database(server: pgserver.Server) -> Iterator[str]:
    """A new database `lakehouse_test_<uuid>`; yields its SQLAlchemy URI and drops it afterwards,
    closing whatever sessions are still connected to it."""
    name = f"lakehouse_test_{uuid.uuid4().hex}"
    with contextlib.closing(admin_connection(server)) as conn, conn.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.url(name)
    finally:
        with contextlib.closing(admin_connection(server)) as conn, conn.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def query(uri: str, sql: str, params: tuple = ()) -> list[tuple]:
    """The rows of one query in the database `uri` (a SQLAlchemy URI) names."""
    import psycopg2
    from sqlalchemy.engine import make_url

    url = make_url(uri)
    with contextlib.closing(psycopg2.connect(host=url.host, port=url.port, user=url.username, dbname=url.database,
                                             connect_timeout=5)) as conn, conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@pytest.fixture
def pg_platform(postgres, stack, monkeypatch, tmp_path) -> Iterator[config.PlatformConfig]:
    """The platform on a fresh PostgreSQL catalog: LAKEHOUSE_CATALOG_URI (and a warehouse of the
    test's own) set as a user would, then `stack.up()`, which creates the catalog tables."""
    with fresh_database(postgres) as uri:
        monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", uri)
        monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", (tmp_path / "warehouse").as_uri())
        status = stack_module.up()
        assert status["catalog_uri"] == uri and status["broker"]["running"]
        created = {name for (name,) in query(uri, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"iceberg_tables", "iceberg_namespace_properties"} <= created
        platform = config.load()
        assert platform.catalog_uri == uri
        assert platform.catalog("lake").jdbc() == (
            f"jdbc:postgresql://{postgres.host}:{postgres.port}/{uri.rsplit('/', 1)[1]}", {"user": postgres.user})
        yield platform


def registered_tables(uri: str) -> dict[str, str]:
    """namespace.name -> metadata location of every table the catalog in `uri` holds."""
    return {f"{ns}.{name}": location for ns, name, location in query(
        uri, "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables WHERE catalog_name = 'lake'")}


# ---------------------------------------------------------------------------- tables

def props(snapshot) -> dict[str, str]:
    return offsets.summary_properties(snapshot)


def main_chain(tbl) -> list:
    """The snapshots of `main`, oldest first: the current snapshot and its ancestors."""
    return list(offsets.main_ancestry(tbl.metadata))[::-1]


def ingest_snapshots(tbl, pipeline: str) -> list:
    return [s for s in main_chain(tbl) if props(s).get(SnapshotSummary.PIPELINE) == pipeline
            and props(s).get(SnapshotSummary.KIND) == "ingest"]


def tbl_parent(tbl, snapshot_id: int) -> int | None:
    return tbl.snapshot_by_id(snapshot_id).parent_snapshot_id


def rows_at(tbl, snapshot_id: int) -> list[dict]:
    """Every row of the snapshot, in Kafka order (partition, offset)."""
    found = tbl.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return sorted(found, key=lambda r: (r["_kafka"]["partition"], r["_kafka"]["offset"]))


def coordinates(found: list[dict]) -> Counter:
    return Counter((r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in found)


def poison_order(i: int) -> tuple[bytes, bytes]:
    """An order the contract accepts (currency ^[A-Z]{3}$) and the `orders` suite rejects."""
    record = {"order_id": f"poison-{i}", "customer_id": "c-1", "amount": 1.0, "currency": "ZZZ",
              "status": "created", "event_time": datetime.now(timezone.utc).isoformat()}
    return record["order_id"].encode(), json.dumps(record).encode()


def audit_and_publish(spec: PipelineSpec, platform: config.PlatformConfig) -> dict:
    """The write-audit-publish gate as the publish DAG applies it: audit `main`, and only when the
    suite passed, publish exactly the audited snapshots. Returns what happened, as JSON."""
    result = quality.audit(spec, platform)
    published = None
    if result.success and result.snapshots:
        published = [asdict(p) for p in publish.publish(spec, result.snapshots, platform)]
    return {"success": result.success, "rows": result.rows, "snapshots": result.snapshots,
            "lineage": {t: a.lineage for t, a in result.tables.items()},
            "offending": [(o["partition"], o["offset"]) for o in result.offending_offsets],
            "published": published}


# ---------------------------------------------------------------------------- the race's worker processes

def _ingest_ids(catalog, spec: PipelineSpec) -> set[int]:
    """The ingest commits on `main` of the data table (none while ingestion has not created it)."""
    try:
        return {s.snapshot_id for s in ingest_snapshots(catalog.load_table(spec.target.table), spec.name)}
    except NoSuchTableError:
        return set()


def _data_files(catalog, name: str) -> int:
    try:
        current = catalog.load_table(name).current_snapshot()
    except NoSuchTableError:
        return 0
    return int(props(current).get("total-data-files", 0)) if current else 0


def produce_until_stopped(spec: PipelineSpec, work: Path) -> None:
    """Produce CHUNK records every CHUNK_PAUSE_S until `<work>/stop` exists, then POISON records."""
    platform = config.load()
    sent = chunks = 0
    while not (work / "stop").exists():
        sent += produce.produce(spec, CHUNK, bad_ratio=BAD_RATIO, seed=1000 + chunks, platform=platform).sent
        chunks += 1
        time.sleep(CHUNK_PAUSE_S)  # the production rate, not a wait for an event
    send(platform, spec.source.topic, [poison_order(i) for i in range(POISON)])
    print(json.dumps({"sent": sent, "chunks": chunks, "poison": POISON}), flush=True)


def compact_rounds(spec: PipelineSpec, work: Path) -> None:
    """COMPACTION_ROUNDS runs of the maintenance job (compaction, manifests, expiry, orphans of the data,
    dead-letter and timeline tables) in one Spark session, the first once ingestion left enough files in
    both tables to compact, each later one after ingestion committed again; one receipt (JSON) per round."""
    platform = config.load()
    catalog = open_catalog(platform, spec.catalog)
    spark = sparkenv.session(platform, [spec.catalog], f"test-compaction-{spec.name}")
    tables = (spec.target.table, spec.dead_letter_table)
    wait_until(lambda: all(_data_files(catalog, t) >= spec.maintenance.min_input_files for t in tables), WAIT_S,
               f"ingestion to leave {spec.maintenance.min_input_files} files in each of {tables}")
    seen: set[int] = set()
    for round_ in range(COMPACTION_ROUNDS):
        if round_:
            wait_until(lambda: _ingest_ids(catalog, spec) - seen, WAIT_S, "a new ingest commit")
        seen = _ingest_ids(catalog, spec)
        receipt = maintenance.run(spec, platform, spark=spark)
        print(json.dumps(receipt.to_json(), default=str), flush=True)
    spark.stop()


def publish_rounds(spec: PipelineSpec, work: Path) -> None:
    """PUBLISH_ROUNDS audits, each publishing what passed, each after ingestion committed again; one
    JSON line per round."""
    platform = config.load()
    catalog = open_catalog(platform, spec.catalog)
    seen: set[int] = set()
    for _ in range(PUBLISH_ROUNDS):
        wait_until(lambda: _ingest_ids(catalog, spec) - seen, WAIT_S, "a new ingest commit")
        seen = _ingest_ids(catalog, spec)
        print(json.dumps(audit_and_publish(spec, platform)), flush=True)


WORKERS = {"produce": produce_until_stopped, "compact": compact_rounds, "publish": publish_rounds}


def start_worker(kind: str, spec: PipelineSpec, work: Path) -> subprocess.Popen:
    """`python tests/e2e/test_postgres.py KIND SPEC WORK` in its own process group, output in WORK/KIND.out|err
    (files, not pipes: a full pipe would stall the worker)."""
    return _start([sys.executable, __file__, kind, spec.path, str(work)], spec, work, kind)


def _start(args: list[str], spec: PipelineSpec, work: Path, name: str) -> subprocess.Popen:
    env = dict(os.environ, LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent),
               # the worker imports the tests' support modules (pgserver, polling, e2e) as pytest does
               PYTHONPATH=os.pathsep.join([str(config.REPO_ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")]))
    env.pop("LAKEHOUSE_FAULT", None)
    with open(work / f"{name}.out", "w") as out, open(work / f"{name}.err", "w") as err:
        return subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, work: Path, name: str, timeout: float = 400) -> list[dict]:
    """Wait for a worker; its JSON lines. Fails with the end of its stderr when it did not exit 0."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = "killed after timeout"
    err = (work / f"{name}.err").read_text(errors="replace")
    assert code == 0, f"{name} exited {code}:\n{err[-4000:]}"
    return receipts((work / f"{name}.out").read_text())


@pytest.fixture
def stoppable():
    """register(proc): processes still running when the test ends are killed with their group."""
    procs: list[subprocess.Popen] = []
    yield procs.append
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------- tests

def test_without_postgresql_the_tests_fail_and_say_so(postgres, free_tcp_port):
    with pytest.raises(pytest.fail.Exception, match=rf"PostgreSQL does not answer on 127.0.0.1:{free_tcp_port}"):
        admin_connection(dataclasses.replace(postgres, port=free_tcp_port))


def test_airflow_metadata_db_is_postgresql_or_sqlite(monkeypatch, own_home, tmp_path):
    monkeypatch.delenv("LAKEHOUSE_AIRFLOW_DB_URI", raising=False)
    assert airflow_stack.metadata_db() == f"sqlite:///{own_home / 'airflow' / 'airflow.db'}"
    monkeypatch.setenv("LAKEHOUSE_AIRFLOW_DB_URI", "postgresql+psycopg2://airflow:secret@db:5432/airflow")
    assert airflow_stack.environment(8080)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == \
        "postgresql+psycopg2://airflow:secret@db:5432/airflow"
    assert airflow_stack.status()["metadata_db"] == "postgresql+psycopg2://airflow:***@db:5432/airflow"
    for wrong in ("postgres://airflow:secret@db/airflow", "mssql://db/airflow", "sqlite:///relative.db"):
        monkeypatch.setenv("LAKEHOUSE_AIRFLOW_DB_URI", wrong)
        with pytest.raises(airflow_stack.AirflowStackError, match="LAKEHOUSE_AIRFLOW_DB_URI") as caught:
            airflow_stack.environment(8080)
        assert "secret" not in str(caught.value)
    monkeypatch.delenv("LAKEHOUSE_AIRFLOW_DB_URI")
    monkeypatch.setenv("LAKEHOUSE_AIRFLOW_DAGS_FOLDER", str(tmp_path / "missing"))
    with pytest.raises(airflow_stack.AirflowStackError, match="LAKEHOUSE_AIRFLOW_DAGS_FOLDER"):
        airflow_stack.environment(8080)


def test_postgresql_catalog_ingests_exactly_once_and_pyiceberg_reads_sparks_offsets(pg_platform, make_spec):
    spec = make_spec(partitions=3)
    ensure_topics([spec], pg_platform)
    report = produce.produce(spec, 1000, bad_ratio=0.05, seed=3, platform=pg_platform)

    run = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json")

    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_exactly_once(pg_platform, spec) == 1000
    ends = log_ends(pg_platform, spec.source.topic)
    [receipt] = receipts(run.stdout)
    # Spark committed through the PostgreSQL catalog, and only there
    registered = registered_tables(pg_platform.catalog_uri)
    assert {spec.target.table, spec.dead_letter_table, events.EVENTS_TABLE} <= set(registered)
    session_catalog = config.lakehouse_home() / "catalog.db"
    if session_catalog.exists():
        with contextlib.closing(sqlite3.connect(session_catalog)) as db:
            assert not db.execute("SELECT 1 FROM iceberg_tables WHERE table_name = ?",
                                  (spec.target.table.split(".")[1],)).fetchall()
    # pyiceberg reads the same catalog: the snapshot Spark wrote, with its offsets in the summary
    for name in (spec.target.table, spec.dead_letter_table):
        tbl = table(pg_platform, spec, name)
        assert tbl.metadata_location == registered[name]
        summary = props(tbl.current_snapshot())
        assert summary[SnapshotSummary.PIPELINE] == spec.name and summary[SnapshotSummary.KIND] == "ingest"
        assert summary[SnapshotSummary.BATCH] == receipt["batch_id"]
        assert offsets.decode_positions(summary[SnapshotSummary.POSITIONS]) == ends
        assert offsets.decode_ranges(summary[SnapshotSummary.RANGES]) == {p: (0, e) for p, e in ends.items() if e}
    data_rows = table(pg_platform, spec, spec.target.table).scan().to_arrow()
    assert data_rows.num_rows == 1000 - sum(report.bad_by_kind.values()) == receipt["rows_by_table"][spec.target.table]
    # (resuming from these offsets on PostgreSQL is part of the race below: the continuous job
    # starts where a --once run stopped, and a --once run catches up after it)


def test_killed_catalog_connections_are_retried_not_fatal(postgres, pg_platform, make_spec):
    """pg_terminate_backend on every catalog connection, over and over, while the continuous job runs
    and commits: pooled connections are replaced (pre-ping) or the failed call is retried (`retry`
    events), the job keeps committing, nothing is lost or doubled."""
    spec = make_spec(partitions=2, partition_by=[], trigger={"interval": "300ms"})
    ensure_topics([spec], pg_platform)
    produce.produce(spec, 300, bad_ratio=0.05, seed=51, platform=pg_platform)
    catalog = open_catalog(pg_platform, spec.catalog)

    def ingested() -> int:
        return sum(offsets.read_progress(catalog, spec.dead_letter_table, spec.name).positions.values())

    database = pg_platform.catalog_uri.rsplit("/", 1)[1]
    job = subprocess.Popen([LAKEHOUSE, "ingest", "--pipeline", spec.name, "--json"], start_new_session=True,
                           env=dict(os.environ, LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(while_running(job, lambda: ingested() == 300), 180, "the first batch")
        killed, deadline, seed = 0, time.monotonic() + 12, 52
        window = datetime.now(timezone.utc)
        while time.monotonic() < deadline:
            produce.produce(spec, 25, bad_ratio=0.05, seed=seed, platform=pg_platform)
            seed += 1
            with contextlib.closing(admin_connection(postgres)) as conn, conn.cursor() as cursor:
                cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE datname = %s AND pid <> pg_backend_pid()", (database,))
                killed += cursor.fetchone()[0]
            time.sleep(0.25)  # the fault's rate for its 12 s, not a wait for an event
        window = (window, datetime.now(timezone.utc))
        total = 300 + 25 * (seed - 52)
        wait_until(while_running(job, lambda: ingested() == total), 180,
                   "the records produced while connections were killed")
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
    assert job.returncode == 0, err[-3000:]
    assert killed > 0, "the test should have killed catalog connections"
    committed = [e for e in events.recent(spec.name, "batch", platform=pg_platform)
                 if window[0] <= e["ts"] <= window[1]]
    assert committed, f"the job should have committed while its connections were killed: {err[-3000:]}"
    retries = events.recent(spec.name, "retry", platform=pg_platform)
    assert all("PostgreSQL" in e["message"] or "SQLException" in e["message"] or "connection" in e["message"]
               for e in retries), retries
    assert assert_exactly_once(pg_platform, spec) == total


def test_ingestion_compaction_and_publishing_race_on_postgresql_without_losing_a_commit_or_a_row(
        pg_platform, make_spec, tmp_path, stoppable, capsys):
    spec = make_spec(partitions=2, partition_by=[], publish={"view": None},
                     trigger={"interval": TRIGGER_INTERVAL, "max_records_per_batch": 1000},
                     maintenance={"min_input_files": 2})
    ensure_topics([spec], pg_platform)
    catalog = open_catalog(pg_platform, spec.catalog)
    work = tmp_path / "race"
    work.mkdir()

    # the race: a producer, continuous ingestion, compaction and write-audit-publish, all at once
    ingest = _start([LAKEHOUSE, "ingest", "--pipeline", spec.name, "--trigger-interval", TRIGGER_INTERVAL, "--json"],
                    spec, work, "ingest")
    workers = {kind: start_worker(kind, spec, work) for kind in ("produce", "compact", "publish")}
    for proc in (ingest, *workers.values()):
        stoppable(proc)
    compactions = finish(workers["compact"], work, "compact")
    publications = finish(workers["publish"], work, "publish")
    (work / "stop").touch()
    [produced] = finish(workers["produce"], work, "produce")
    ends = log_ends(pg_platform, spec.source.topic)
    wait_until(lambda: all(offsets.read_progress(catalog, t, spec.name).positions == ends
                           for t in (spec.target.table, spec.dead_letter_table)),
               WAIT_S, "continuous ingestion to reach the end of the log")
    ingest.send_signal(signal.SIGTERM)  # as the supervisor stops it: a batch in flight is committed first
    batches = finish(ingest, work, "ingest", timeout=120)

    # every record produced is in the data or dead-letter table exactly once
    assert sum(ends.values()) == produced["sent"] + POISON
    assert log_ends(pg_platform, spec.source.topic) == ends
    assert assert_exactly_once(pg_platform, spec) == sum(ends.values())
    assert sum(b["records"] for b in batches) == sum(ends.values())

    # every batch that reported success is on main of every table, with the offsets it reported, and
    # the ranges follow each other without gap or overlap up to the log end
    reported = {b["batch_id"]: {int(p): tuple(r) for p, r in b["ranges"].items()} for b in batches}
    assert len(reported) == len(batches)
    rebased: Counter = Counter()
    for name in (spec.target.table, spec.dead_letter_table):
        tbl = table(pg_platform, spec, name)
        chain = main_chain(tbl)
        committed = ingest_snapshots(tbl, spec.name)
        others = [s for s in chain if s not in committed]
        assert all(props(s)["operation"] == "replace" for s in others), [props(s) for s in others]
        on_main = {props(s)[SnapshotSummary.BATCH]: offsets.decode_ranges(props(s)[SnapshotSummary.RANGES])
                   for s in committed}
        assert len(on_main) == len(committed), f"{name}: a batch committed twice"
        assert on_main == reported, f"{name}: batches on main differ from those that reported success"
        position = {p: 0 for p in ends}
        for snap in committed:
            for p, (start, end) in sorted(offsets.decode_ranges(props(snap)[SnapshotSummary.RANGES]).items()):
                assert start == position[p], f"{name} partition {p}: snapshot {snap.snapshot_id} starts at " \
                                             f"{start}, the previous commit ended at {position[p]}"
                position[p] = end
        assert position == ends
        assert offsets.decode_positions(props(committed[-1])[SnapshotSummary.POSITIONS]) == ends

        # compaction rewrote files without changing a row: each rewrite commit holds exactly the rows
        # (every column) of the snapshot it replaced
        rewrites = [s for s in others if "deleted-data-files" in props(s)]
        assert rewrites, f"{name}: compaction never committed"
        for snap in rewrites:
            assert rows_at(tbl, snap.snapshot_id) == rows_at(tbl, snap.parent_snapshot_id), snap.snapshot_id
            # every file of these tables is small, so a rewrite takes every file of the snapshot it was
            # planned on: files it left were added by ingest commits that landed while it ran
            parent = tbl.snapshot_by_id(snap.parent_snapshot_id)
            rebased[name] += int(props(parent)["total-data-files"]) > int(props(snap)["deleted-data-files"])
    assert len(compactions) == COMPACTION_ROUNDS
    for receipt in compactions:
        assert receipt["ok"], receipt
        assert all(t["content_unchanged"] for t in receipt["tables"]), receipt
    assert all(t["compactions"] for t in compactions[0]["tables"]), "the first round compacted every table"

    # readers' branch: each publication moved it to exactly the snapshot its audit passed, along main
    data = table(pg_platform, spec, spec.target.table)
    assert len(publications) == PUBLISH_ROUNDS
    assert all(p["success"] and p["published"] for p in publications), publications
    moved = [p["published"][0]["snapshot_id"] for p in publications]
    assert moved == [p["snapshots"][spec.target.table] for p in publications]
    assert all(quality.is_ancestor(data, a, b) for a, b in zip(moved, moved[1:]))
    head = publish.published_head(data, spec.publish.branch)
    assert head == moved[-1]
    published_rows = rows_at(data, head)
    # each row readers see was audited: the audits covered every snapshot between publications (rows a
    # compaction rewrote in between are audited again, so the sum may exceed what readers see)
    assert sum(p["rows"] for p in publications) >= len(published_rows)
    lineages = [p["lineage"][spec.target.table] for p in publications]
    assert all(tbl_parent(data, later[0]) == earlier[-1]
               for earlier, later in zip(lineages, lineages[1:]) if earlier and later), "adjacent, no gaps"
    main_rows = rows_at(data, data.current_snapshot().snapshot_id)
    assert set(coordinates(published_rows)) <= set(coordinates(main_rows))

    # the poison reached main after the last publication: its audit fails and the branch stays
    final = audit_and_publish(spec, pg_platform)
    assert not final["success"] and final["published"] is None
    poisoned = {(r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in main_rows if r["currency"] == "ZZZ"}
    assert len(poisoned) == POISON and {tuple(o) for o in final["offending"]} == poisoned
    assert publish.published_head(table(pg_platform, spec, spec.target.table), spec.publish.branch) == head
    assert not any(r["currency"] == "ZZZ" for r in published_rows)

    # how often the commits collided (recorded, not asserted: timing decides): the ingest job's own
    # retries, which the ops timeline's batch events carry, and the lost compare-and-sets each process
    # logged (Iceberg's and pyiceberg's internal retries, the maintenance and publish retries)
    timeline = {e["details"]["batch_id"]: e["metrics"]["commit_retries"]
                for e in events.recent(spec.name, "batch", limit=100_000, platform=pg_platform)}
    retries = {b["batch_id"]: b["commit_retries"] for b in batches}
    assert set(timeline) <= set(retries) and all(timeline[b] == retries[b] for b in timeline)
    logged = {name: {kind: (work / f"{name}.err").read_text(errors="replace").count(marker)
                     for kind, marker in CONFLICT_MARKERS.items()} for name in ("ingest", "compact", "publish")}
    with capsys.disabled():
        print(f"\nrace on PostgreSQL: {len(batches)} ingest batches ({sum(ends.values())} records), "
              f"{sum(len(t['compactions']) for r in compactions for t in r['tables'])} compaction commits "
              f"({dict(rebased)} rebased over concurrent ingest commits), {len(moved)} publications; "
              f"ingest job commit retries {sum(retries.values())} (timeline: {sum(timeline.values()):g} over "
              f"{len(timeline)} batch events); conflicts logged per process: {logged}")


BARRIER_DAG = '''"""Two task instances that only succeed together: each waits until the other one has started."""
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

BARRIER = Path({barrier!r})
PEERS = ("left", "right")


@task
def meet(name: str) -> str:
    BARRIER.joinpath(name).touch()
    deadline = time.monotonic() + 120
    while not all(BARRIER.joinpath(peer).exists() for peer in PEERS):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{{name}}: the other task did not start while this one ran: no parallel tasks")
        time.sleep(0.1)
    return name


@task
def join(left: str, right: str) -> None:
    assert (left, right) == PEERS


with DAG(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=4):
    join(meet.override(task_id="left")("left"), meet.override(task_id="right")("right"))
'''


def api(url: str, token: str | None = None, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON body) of one call to Airflow's REST API; an error status is returned, not raised."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")}


def test_airflow_on_postgresql_runs_task_instances_in_parallel_with_the_local_executor(
        postgres, own_home, tmp_path, monkeypatch, free_tcp_port):
    dag_id = f"parallel_{uuid.uuid4().hex[:8]}"
    dags, barrier = tmp_path / "dags", tmp_path / "barrier"
    dags.mkdir()
    barrier.mkdir()
    (dags / f"{dag_id}.py").write_text(BARRIER_DAG.format(barrier=str(barrier), dag_id=dag_id))
    with fresh_database(postgres) as uri:
        monkeypatch.setenv("LAKEHOUSE_AIRFLOW_DB_URI", uri)
        monkeypatch.setenv("LAKEHOUSE_AIRFLOW_DAGS_FOLDER", str(dags))
        try:
            started = airflow_stack.up(port=free_tcp_port)
            assert started["healthy"] and all(started["running"].values()), started
            assert started["metadata_db"] == uri and started["dags_folder"] == str(dags)
            assert not (Path(started["home"]) / "airflow.db").exists(), "no SQLite metadata DB on the side"
            url = started["url"]
            _, login = api(f"{url}/auth/token", method="POST",
                           body={"username": started["user"], "password": started["password"]})
            token = login["access_token"]
            wait_until(lambda: api(f"{url}/api/v2/dags/{dag_id}", token)[0] == 200, WAIT_S,
                       f"the DAG processor to parse {dag_id}")
            status, body = api(f"{url}/api/v2/dags/{dag_id}", token, "PATCH", {"is_paused": False})
            assert status == 200 and body["is_paused"] is False, body
            status, body = api(f"{url}/api/v2/dags/{dag_id}/dagRuns", token, "POST", {"logical_date": None})
            assert status == 200, body
            run_id = body["dag_run_id"]

            def finished() -> dict | None:
                found = api(f"{url}/api/v2/dags/{dag_id}/dagRuns/{run_id}", token)[1]
                return found if found.get("state") in ("success", "failed") else None

            run = wait_until(finished, WAIT_S, f"dag run {run_id} to finish")

            # the metadata DB in PostgreSQL recorded the run: every task succeeded, the two peers overlapped
            tis = {task: (state, start, end, pid, job) for task, state, start, end, pid, job in query(
                uri, "SELECT task_id, state, start_date, end_date, pid, queued_by_job_id FROM task_instance "
                     "WHERE dag_id = %s AND run_id = %s", (dag_id, run_id))}
            assert run["state"] == "success", tis
            assert {t: s[0] for t, s in tis.items()} == {"left": "success", "right": "success", "join": "success"}
            _, left_start, left_end, left_pid, _ = tis["left"]
            _, right_start, right_end, right_pid, _ = tis["right"]
            assert left_start < right_end and right_start < left_end, tis
            assert left_pid and right_pid and left_pid != right_pid, tis
            assert tis["join"][1] >= max(left_end, right_end)
            # queued by the scheduler of this stack, whose executor is the LocalExecutor
            schedulers = {job for (job,) in query(uri, "SELECT id FROM job WHERE job_type = 'SchedulerJob'")}
            assert {t[4] for t in tis.values()} <= schedulers
            assert airflow_stack.environment(free_tcp_port)["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        finally:
            stopped = airflow_stack.down()
        assert set(airflow_stack.COMPONENTS) <= set(stopped), stopped
        assert not any(airflow_stack.status()["running"].values())


if __name__ == "__main__":  # a worker of the race: python tests/e2e/test_postgres.py KIND SPEC WORK
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kind, spec_path, work_dir = sys.argv[1:4]
    WORKERS[kind](load_spec(Path(spec_path)), Path(work_dir))
