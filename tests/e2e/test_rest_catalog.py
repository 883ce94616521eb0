"""The pipeline on the real parts a platform team runs (end to end): an Iceberg REST catalog (Apache Iceberg's own
REST catalog server, as the stack starts it) whose warehouse is on S3 (the stack's object store), beside the
session's Apache Kafka (the `services` home of conftest).

- a batch's tables commit together, in one multi-table commit the server applies whole or not at all;
- every exactly-once guarantee holds through the REST protocol: kill -9 at each point of a batch, then the
  rest; a replay of rows lost by hand; compaction racing ingestion (the REST catalog's 409 conflicts retried
  as JDBC conflicts are); a second ingest job fencing the first; the catalog restarted mid-stream;
- the data and metadata files are objects in the bucket, and the object store counted the requests;
- a REST catalog that refuses the credentials, is down, or is not a catalog gets a clear error at once.

Jobs run as `lakehouse` processes, as users run them: the in-process Spark session belongs to the session home.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from e2e import (
    assert_exactly_once,
    killed_at_every_point_then_resumed,
    lakehouse,
    log_ends,
    spawn,
    table,
)
from lakehouse.core import config, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.topics import ensure_topics
from lakehouse_dev import object_store, produce
from lakehouse_dev import stack as stack_module
from polling import wait_until, while_running

pytestmark = pytest.mark.slow


def held(platform, spec) -> int:
    """Offsets the pipeline's tables hold (0 before the job created them)."""
    from pyiceberg.exceptions import NoSuchTableError

    from e2e import coordinates

    try:
        return len(coordinates(platform, spec))
    except NoSuchTableError:
        return 0


@pytest.fixture
def pipeline_on_services(on_services, make_spec):
    """Factory: make_spec(**overrides) with its topic created, on the REST catalog and the S3 warehouse."""
    def factory(**overrides):
        spec = make_spec(**overrides)
        ensure_topics([spec], on_services)
        return spec

    return factory


def test_the_stack_serves_a_rest_catalog_over_an_s3_warehouse(on_services, services):
    platform = on_services
    lake = platform.catalog("lake")
    assert (lake.type, lake.uri) == ("rest", services["status"]["services"]["rest_catalog"]["url"])
    assert platform.warehouse == "s3://lakehouse/warehouse" and lake.warehouse_on_s3
    assert platform.object_store.endpoint == services["status"]["services"]["object_store"]["endpoint"]
    shown = stack_module.status()
    assert {name: s["running"] for name, s in shown["services"].items()} == \
        {"object_store": True, "rest_catalog": True, "registry": True}
    assert platform.object_store.secret_access_key not in json.dumps(shown)


def test_a_multi_table_commit_changes_every_table_or_none(on_services):
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.schema import Schema
    from pyiceberg.table.update import AssertRefSnapshotId, SetPropertiesUpdate
    from pyiceberg.types import LongType, NestedField

    from lakehouse.ingest import committer

    catalog = open_catalog(on_services, "lake")
    assert committer.commits_together(catalog)  # the server lists POST /v1/{prefix}/transactions/commit
    catalog.create_namespace_if_not_exists("together")
    names = []
    for name in ("together.orders", "together.dead_letters"):
        catalog.create_table_if_not_exists(name, Schema(NestedField(1, "id", LongType(), required=False)))
        names.append(name)

    def change(name: str, value: str, main_at: int | None = None) -> committer.TableChange:
        loaded = catalog.load_table(name)
        at = loaded.metadata.current_snapshot_id if main_at is None else main_at
        return committer.TableChange(loaded, (AssertRefSnapshotId(ref="main", snapshot_id=at),),
                                     (SetPropertiesUpdate(updates={"lakehouse.test.together": value}),))

    def marks() -> list[str | None]:
        return [catalog.load_table(name).properties.get("lakehouse.test.together") for name in names]

    committer.commit_together(catalog, [change(names[0], "1"), change(names[1], "1")])
    assert marks() == ["1", "1"]
    # the second table's requirement fails on the server: the first table's change does not land either
    with pytest.raises(CommitFailedException):
        committer.commit_together(catalog, [change(names[0], "2"), change(names[1], "2", main_at=123456789)])
    assert marks() == ["1", "1"]


def test_kill_9_at_every_point_then_a_replay_land_each_offset_once_in_s3(on_services, pipeline_on_services):
    platform = on_services
    spec = pipeline_on_services(partitions=2, partition_by=[], trigger={"max_records_per_batch": 150})
    endpoint = platform.object_store.endpoint
    object_store.request_counts(endpoint, reset=True)
    produce.produce(spec, 700, bad_ratio=0.05, seed=21, platform=platform)
    killed_at_every_point_then_resumed(platform, spec, in_process=False)
    assert assert_exactly_once(platform, spec) == 700
    data = table(platform, spec, spec.target.table)
    assert data.location().startswith("s3://lakehouse/warehouse/")
    assert all(task.file.file_path.startswith("s3://lakehouse/") for task in data.scan().plan_files())
    counts = object_store.request_counts(endpoint)["buckets"]["lakehouse"]
    assert counts["classes"]["put"] > 0 and counts["classes"]["get"] > 0  # measured at the server

    from pyiceberg.expressions import EqualTo
    data.delete(EqualTo("status", "paid"))  # someone deletes rows by mistake
    spans = ",".join(f"{p}:0-{e}" for p, e in log_ends(platform, spec.source.topic).items() if e)
    replayed = lakehouse(spec, "replay", "--pipeline", spec.name, "--offsets", spans, "--json")
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert json.loads(replayed.stdout)["inserted_by_table"][spec.target.table] > 0
    assert assert_exactly_once(platform, spec) == 700


def aged(home, bucket: str, key: str, seconds: float) -> None:
    """Make the stored object `key` `seconds` older on the object store's disk, as os.utime would a file's mtime
    (the store reads it back when it restarts)."""
    from datetime import datetime, timedelta, timezone

    path = object_store.object_file(object_store.Layout(home).buckets / bucket, key)
    header, _, value = path.read_bytes().partition(b"\n")
    found = json.loads(header)
    found["last_modified"] = (datetime.now(timezone.utc) - timedelta(seconds=seconds)).isoformat()
    path.write_bytes(json.dumps(found).encode() + b"\n" + value)


def test_the_cost_models_objects_written_per_batch_are_the_ones_the_object_store_creates(on_services,
                                                                                        pipeline_on_services):
    """lakehouse.ops.cost counts each table commit's writes from its snapshot summary (its files, manifests, a
    manifest list and a metadata file); the store counts the objects it created under each table's location
    (a PutObject, or a multipart upload's completion): per table they agree, with one metadata file more for
    each commit that adds no snapshot (the new job's writer claim)."""
    from lakehouse.ops import cost

    platform = on_services
    spec = pipeline_on_services(partitions=2, partition_by=[], trigger={"max_records_per_batch": 100})
    produce.produce(spec, 100, seed=70, platform=platform)
    first = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json")  # creates the tables
    assert first.returncode == 0, first.stderr[-3000:]
    catalog = open_catalog(platform, spec.catalog)
    names = (spec.target.table, spec.dead_letter_table)
    before = {name: catalog.load_table(name).metadata for name in names}
    endpoint = platform.object_store.endpoint
    object_store.request_counts(endpoint, reset=True)
    produce.produce(spec, 400, bad_ratio=0.05, seed=71, platform=platform)
    done = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    counted = object_store.request_counts(endpoint)["tables"]
    for name in names:
        loaded = catalog.load_table(name)
        seen = {s.snapshot_id for s in before[name].snapshots}
        commits = [s for s in loaded.snapshots() if s.snapshot_id not in seen]
        assert len(commits) == 4  # 400 records, 100 a batch
        modeled = sum(cost.commit_requests(offsets.summary_properties(s))["put"] for s in commits)
        metadata_only = len(loaded.metadata.metadata_log) - len(before[name].metadata_log) - len(commits)
        operations = counted[loaded.location()]["operations"]
        created = operations.get("PutObject", 0) + operations.get("CompleteMultipartUpload", 0)
        assert created == modeled + metadata_only, (name, modeled, metadata_only, operations)


def test_compaction_racing_continuous_ingestion_loses_and_duplicates_nothing(on_services, pipeline_on_services,
                                                                             services):
    """Then orphan removal lists the table's prefix on S3: an unreferenced object older than the safety window
    goes, a fresh one (a commit in flight, maybe) stays."""
    platform = on_services
    spec = pipeline_on_services(partitions=1, partition_by=[], maintenance={"min_input_files": 2})
    produce.produce(spec, 40, seed=30, platform=platform)
    job = spawn(spec, "ingest", "--pipeline", spec.name, "--trigger-interval", "500ms", "--json")
    stop, seeds = threading.Event(), iter(range(31, 10_000))

    def keep_producing() -> None:
        while not stop.is_set():
            produce.produce(spec, 15, bad_ratio=0.1, seed=next(seeds), platform=platform)
            time.sleep(0.2)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        wait_until(while_running(job, lambda: held(platform, spec) >= 40), 240, "the first batches")
        # compaction commits while ingestion commits: the catalog's compare-and-set decides
        maintained = lakehouse(spec, "maintain", "--pipeline", spec.name, "--json")
        assert maintained.returncode == 0, maintained.stderr[-3000:]
    finally:
        stop.set()
        producer.join(timeout=60)
    ends = log_ends(platform, spec.source.topic)
    try:
        wait_until(while_running(job, lambda: held(platform, spec) == sum(ends.values())), 240,
                   "ingestion to catch up")
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=120)
    assert assert_exactly_once(platform, spec) == sum(ends.values())
    compacted = [e for e in events.recent(spec.name, "maintenance", platform=platform, catalog=spec.catalog)
                 if e["details"].get("table") in (spec.qualified(spec.target.table), spec.target.table)]
    assert compacted and all(e["status"] == "ok" for e in compacted)

    store = platform.object_store
    s3 = object_store.s3_client(store.endpoint, object_store.Credentials(store.access_key_id,
                                                                         store.secret_access_key))
    bucket, _, prefix = table(platform, spec, spec.target.table).location().removeprefix("s3://").partition("/")
    old, fresh = f"{prefix}/data/crashed-attempt.parquet", f"{prefix}/data/in-flight.parquet"
    for key in (old, fresh):
        s3.put_object(Bucket=bucket, Key=key, Body=b"PAR1 not referenced by any snapshot")
    aged(services["home"], bucket, old, 4 * 86400)  # past the default 3-day safety window
    stack_module.restart("object_store")
    maintained = lakehouse(spec, "maintain", "--pipeline", spec.name, "--json")
    assert maintained.returncode == 0, maintained.stderr[-3000:]
    receipt = next(t for t in json.loads(maintained.stdout)["tables"]
                   if t["table"] in (spec.target.table, spec.qualified(spec.target.table)))
    assert receipt["orphans_removed"] == 1
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/data/")["Contents"]}
    assert old not in listed and fresh in listed
    assert assert_exactly_once(platform, spec) == sum(ends.values())


def elsewhere(platform, home) -> dict[str, str]:
    """The environment of a host that shares the catalog, the warehouse and Kafka but not this home."""
    store = platform.object_store
    return {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_BOOTSTRAP_SERVERS": platform.bootstrap_servers,
            "LAKEHOUSE_CATALOG_URI": platform.catalog_uri, "LAKEHOUSE_WAREHOUSE": platform.warehouse,
            "LAKEHOUSE_S3_ENDPOINT": store.endpoint, "LAKEHOUSE_S3_PATH_STYLE_ACCESS": "true",
            "LAKEHOUSE_S3_REGION": store.region, "AWS_ACCESS_KEY_ID": store.access_key_id,
            "AWS_SECRET_ACCESS_KEY": store.secret_access_key}


def test_a_second_ingest_job_fences_the_first_through_the_rest_catalog(on_services, pipeline_on_services, tmp_path):
    """A second job of the pipeline on another host claims the tables at its first commit; the first, at its
    next commit, finds the claim in the metadata it commits against (the REST commit requires main unchanged
    since) and stops without committing: exit 4."""
    platform = on_services
    spec = pipeline_on_services(partitions=1, partition_by=[])
    produce.produce(spec, 50, seed=40, platform=platform)
    first = spawn(spec, "ingest", "--pipeline", spec.name, "--trigger-interval", "500ms")
    second = None
    try:
        wait_until(while_running(first, lambda: held(platform, spec) == 50), 240, "the first job's batch")
        second = spawn(spec, "ingest", "--pipeline", spec.name, "--trigger-interval", "500ms",
                       env=elsewhere(platform, tmp_path / "other-host"))
        sent, seeds = 50, iter(range(41, 10_000))
        deadline = time.monotonic() + 240
        while first.poll() is None and time.monotonic() < deadline:  # both jobs plan what comes
            produce.produce(spec, 10, seed=next(seeds), platform=platform)
            sent += 10
            time.sleep(0.5)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 4, err[-3000:]
        assert "another ingest job took over" in err
        wait_until(while_running(second, lambda: held(platform, spec) == sent), 240, "the second job to catch up")
    finally:
        for job in (first, second):
            if job is not None and job.poll() is None:
                job.send_signal(signal.SIGTERM)
                job.communicate(timeout=120)
    assert assert_exactly_once(platform, spec) == sent


def test_the_catalog_restarted_mid_stream_loses_and_duplicates_nothing(on_services, pipeline_on_services, services,
                                                                       monkeypatch):
    platform = on_services
    spec = pipeline_on_services(partitions=2, partition_by=[])
    produce.produce(spec, 100, seed=50, platform=platform)
    job = spawn(spec, "ingest", "--pipeline", spec.name, "--trigger-interval", "500ms")
    try:
        wait_until(while_running(job, lambda: held(platform, spec) == 100), 240, "the first batches")
        outage = threading.Thread(target=stack_module.restart, args=("rest_catalog", 5.0))
        outage.start()  # the catalog is down for 5 s while records keep coming
        for seed in range(51, 56):
            produce.produce(spec, 40, seed=seed, platform=platform)
            time.sleep(1)
        outage.join(timeout=180)
        wait_until(while_running(job, lambda: held(platform, spec) == 300), 300,
                   "ingestion to resume after the catalog came back")
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=120)
    assert assert_exactly_once(platform, spec) == 300
    retries = [e for e in events.recent(spec.name, "retry", platform=platform, catalog=spec.catalog)]
    assert retries, "the outage was retried (a retry event on the timeline)"
    # the restarted server takes concurrent writes: each of its database connections writes
    names = [f"{spec.name}_after_restart_{i}" for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda name: open_catalog(platform, spec.catalog).create_namespace(name), names))
    assert set(names) <= {ns[0] for ns in open_catalog(platform, spec.catalog).list_namespaces()}


def test_a_rest_catalog_that_refuses_or_is_not_there_fails_at_once_naming_the_setting(
        on_services, pipeline_on_services, monkeypatch, free_tcp_port, tmp_path):
    spec = pipeline_on_services(partitions=1)
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"http://127.0.0.1:{free_tcp_port}")  # nobody listens
    with pytest.raises(Exception) as down:
        open_catalog(config.load(fresh=True), "lake", fresh=True)
    assert type(down.value).__name__ == "CatalogUnavailableError" and "is it running?" in str(down.value)
    # something that answers HTTP but is no REST catalog: the object store
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", on_services.object_store.endpoint)
    started = time.monotonic()
    wrong = lakehouse(spec, "status", "--pipeline", spec.name, timeout=120)
    assert wrong.returncode != 0 and time.monotonic() - started < 60
    assert "catalog 'lake'" in wrong.stderr and "LAKEHOUSE_CATALOG_URI" in wrong.stderr, wrong.stderr[-2000:]
    assert "Traceback" not in wrong.stderr


def test_an_object_store_that_is_down_refuses_the_key_or_lacks_the_bucket_is_named_at_once(
        on_services, pipeline_on_services, monkeypatch, free_tcp_port):
    """Checked before anything is read or written (lakehouse.core.warehouse, when a catalog opens): each case gets
    its own error naming the setting to fix, within seconds, and creates nothing."""
    from dataclasses import replace

    from lakehouse.core import warehouse
    from lakehouse.core.errors import ObjectStoreAccessError, ObjectStoreUnavailableError

    lake = on_services.catalog("lake")
    store = lake.object_store
    cases = [
        (replace(lake, object_store=replace(store, endpoint=f"http://127.0.0.1:{free_tcp_port}")),
         ObjectStoreUnavailableError, "LAKEHOUSE_S3_ENDPOINT"),
        (replace(lake, object_store=replace(store, secret_access_key="not-the-secret")),
         ObjectStoreAccessError, "refused"),
        (replace(lake, object_store=replace(store, access_key_id="AKIAUNKNOWNKEY000000")),
         ObjectStoreAccessError, "refused"),
        (replace(lake, warehouse="s3://no-such-bucket/warehouse/lake"), ObjectStoreAccessError, "no bucket"),
    ]
    for settings, error, words in cases:
        warehouse.forget()
        started = time.monotonic()
        with pytest.raises(error, match=words):
            warehouse.check(settings)
        assert time.monotonic() - started < 30
    warehouse.forget()
    warehouse.check(lake)  # the stack's own settings pass

    # as users meet it: a command on a pipeline whose warehouse bucket is missing, one line, exit 2
    spec = pipeline_on_services(partitions=1)
    monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", "s3://no-such-bucket/warehouse")
    refused = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "no bucket 'no-such-bucket'" in refused.stderr and "LAKEHOUSE_WAREHOUSE" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_spark_standalone_cluster_ingests_into_s3_exactly_once(on_services, pipeline_on_services):
    """Executors in JVMs of their own reach the object store with the stack's key (spark.executorEnv) and the
    checksum settings S3-compatible stores need."""
    from tests.conftest import free_port
    from lakehouse_dev import spark_cluster

    platform = on_services
    cluster = spark_cluster.up(port=free_port(), ui_port=free_port())
    try:
        assert config.load(fresh=True).spark_master == cluster["master"]
        spec = pipeline_on_services(partitions=2, partition_by=[])
        produce.produce(spec, 400, bad_ratio=0.05, seed=60, platform=platform)
        done = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        apps = spark_cluster.master_info(cluster["master_ui"])["completedapps"]
        assert any(app["name"] == f"lakehouse-ingest-{spec.name}" for app in apps)
    finally:
        spark_cluster.down()
    assert assert_exactly_once(platform, spec) == 400
