"""The table follows its spec: partitioning evolves, the properties the spec owns are applied, and
what a table cannot follow (write mode, upsert key, a renamed default table) stops with an
explanation. The unit tests drive pyiceberg tables in a private SQLite catalog; the end-to-end tests
change the partitioning of a pipeline under continuous ingestion and check exactly-once, the files'
partition specs, pruning, status and the page.

The end-to-end half; the unit half is tests/unit/ingest/test_table_layout.py.
"""

from __future__ import annotations

import json
import signal
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from e2e import assert_exactly_once, pipeline, rows, run_cli, send, table  # noqa: F401 - pipeline is a fixture
from pyiceberg.expressions import EqualTo
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import StringType

from lakehouse.core import errors, events
from lakehouse.core.spec import PipelineSpec, load_spec
from tests.unit.ingest.test_table_layout import (  # noqa: F401 - fixtures among them
    catalog,
    edit,
)

BASE = datetime(2026, 11, 20, tzinfo=timezone.utc)
from lakehouse.core.spec import PipelineSpec, load_spec
from lakehouse.core.table_properties import TableProperties


def order(i: int) -> tuple[bytes, bytes]:
    """Order `i`, its event time in hour i % 47 of two days: each hour's ids spread over the whole run."""
    at = BASE + timedelta(hours=i % 47, minutes=i % 60)
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": "created", "event_time": at.isoformat()}
    return record["order_id"].encode(), json.dumps(record).encode()


class Producer(threading.Thread):
    """Sends orders 20 at a time, every 0.2 s, until stopped; `sent` counts them."""

    def __init__(self, platform, topic: str):
        super().__init__(daemon=True)
        self.platform, self.topic, self.sent = platform, topic, 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            send(self.platform, self.topic, [order(self.sent + k) for k in range(20)])
            self.sent += 20
            self.halt.wait(0.2)

    def stop(self) -> int:
        self.halt.set()
        self.join(60)
        return self.sent


def page_card(signed_in_page, spec: PipelineSpec) -> str:
    """The pipeline's card on the pipelines page, rendered by the plugin's app in this process for a signed-in
    admin."""
    import re

    client, headers = signed_in_page(Path(spec.path).parent)
    body = client.get("/", headers=headers).text
    match = re.search(rf'<section class="card[^"]*" data-pipeline="{spec.name}"[^>]*>(.*?)</section>', body, re.S)
    assert match, body[:2000]
    return match.group(1)


@pytest.mark.slow
def test_partitioning_changes_mid_stream_under_continuous_ingestion_exactly_once(platform, spark, pipeline,
                                                                                 monkeypatch, signed_in_page):
    """day(event_time) -> hour(event_time) (with a new file size and a property) -> hour plus bucket(4,
    order_id) (the property removed), each edit picked up by the running job between batches."""
    from pyspark.sql import functions as F

    from lakehouse.ingest.job import IngestJob

    spec = pipeline(partitions=2, partition_by=["day(event_time)"])
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(Path(spec.path).parent))
    edits = [{"partition_by": ["hour(event_time)"], "target_file_size_mb": 64,
              "properties": {"commit.retry.num-retries": 7}},
             {"partition_by": ["hour(event_time)", "bucket(4, order_id)"], "properties": None}]
    job = IngestJob(spec, platform, spark)
    producer = Producer(platform, spec.source.topic)
    layouts = []  # the partitioning the job held after each batch with rows

    def on_batch(receipt) -> None:
        if not receipt.rows_by_table[spec.target.table]:
            return
        layouts.append(tuple(str(p) for p in job.spec.target.partition_by))
        if layouts[-2:] != [layouts[-1]] * 2:
            return  # two batches under each layout before the next edit
        if edits:
            edit(job.spec, edits.pop(0))
        else:
            producer.stop()
            job.request_stop()

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    producer.start()
    try:
        job.run_continuous(interval_s=0.3, on_batch=on_batch, max_batches=60)
    finally:
        produced = producer.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    # a burst the restart below ingests in one batch: files of several rows each under the last layout (the
    # continuous batches of a fast machine hold a row or so per hour and bucket), which the pruning check needs
    send(platform, spec.source.topic, [order(produced + k) for k in range(1_000)])
    produced += 1_000
    # a new job (a restart) ingests what the producer sent after the last batch; the tables already follow
    IngestJob(load_spec(spec.path), platform, spark).run_once()
    assert not edits, f"the job stopped before applying every edit: {layouts}"
    assert layouts[0] == ("day(event_time)",) and layouts[-1] == ("hour(event_time)", "bucket(4, order_id)")
    assert assert_exactly_once(platform, spec) == produced

    data = table(platform, spec, spec.target.table)
    specs = data.metadata.specs()
    assert [sorted(str(f.transform) for f in specs[i].fields) for i in (0, 1, 2)] == \
        [["day"], ["hour"], ["bucket[4]", "hour"]] and data.metadata.default_spec_id == 2
    props = data.metadata.properties
    assert props["write.target-file-size-bytes"] == str(64 * 1024 * 1024)
    assert "commit.retry.num-retries" not in props and TableProperties.SPEC_PROPERTIES not in props  # set, then unset
    # every commit added files of one spec, and the spec only ever moved forward: files written after an
    # evolution carry the new spec (the spec of the manifest that lists them)
    files = {f["file_path"]: f for f in data.inspect.files().to_pylist()}
    by_commit = {}
    for entry in data.inspect.entries().to_pylist():
        by_commit.setdefault(entry["sequence_number"], set()).add(files[entry["data_file"]["file_path"]]["spec_id"])
    assert all(len(ids) == 1 for ids in by_commit.values())
    in_order = [next(iter(by_commit[seq])) for seq in sorted(by_commit)]
    assert in_order == sorted(in_order) and set(in_order) == {0, 1, 2}
    # readers see every row; a filtered scan prunes the newest files on their bucket: a file of another
    # bucket whose order_id bounds hold the key (so its metrics cannot rule it out) is not planned
    qualified = spec.qualified(spec.target.table)
    assert spark.table(qualified).count() == len(rows(platform, spec, spec.target.table))
    newest = [f for f in files.values() if f["spec_id"] == 2]
    keys = sorted(f"ord-{i}" for i in range(produced))
    bucket = BucketTransform(4).transform(StringType())
    unprunable_keys = [(k, f) for f in newest for k in keys
                       if f["readable_metrics"]["order_id"]["lower_bound"] <= k
                       <= f["readable_metrics"]["order_id"]["upper_bound"]
                       and bucket(k) != f["partition"]["order_id_bucket_4"]]
    assert unprunable_keys, [(f["record_count"], f["partition"]) for f in newest]
    key, unprunable = unprunable_keys[0]
    planned = {task.file.file_path for task in data.scan(row_filter=EqualTo("order_id", key)).plan_files()}
    assert unprunable["file_path"] not in planned
    assert all(files[p]["partition"]["order_id_bucket_4"] == bucket(key) for p in planned if files[p]["spec_id"] == 2)
    assert spark.table(qualified).where(F.col("order_id") == key).count() == 1
    # each change is on the timeline
    changes = [e for e in events.recent(spec.name, "layout", platform=platform, catalog=spec.catalog)]
    assert len(changes) == 2 and all(e["status"] == "ok" for e in changes)
    assert "partitioning [hour(event_time)] -> [hour(event_time), bucket(4, order_id)]" in changes[0]["message"]

    # status and the page: in sync, then the drift an ALTER by hand leaves until the job's next start
    [status] = json.loads(run_cli(spec, "status", "--pipeline", spec.name, "--json").stdout)
    assert status["layout"]["in_sync"] is True
    spark.sql(f"ALTER TABLE {qualified} SET TBLPROPERTIES ('write.parquet.compression-codec'='snappy')")
    [status] = json.loads(run_cli(spec, "status", "--pipeline", spec.name, "--json").stdout)
    assert status["layout"]["in_sync"] is False and status["layout"]["refused"] == []
    assert status["layout"]["tables"][0]["set_properties"] == {
        "write.parquet.compression-codec": {"table": "snappy", "spec": "zstd"}}
    human = run_cli(spec, "status", "--pipeline", spec.name).stdout
    assert f"layout drift of {qualified}, applied when the ingest job next starts" in human
    card = page_card(signed_in_page, spec)
    assert 'data-field="layout" class="">drift<' in card
    assert "property write.parquet.compression-codec: &#x27;snappy&#x27; -&gt; &#x27;zstd&#x27;" in card


@pytest.mark.slow
def test_changes_a_table_cannot_follow_stop_the_job_with_what_to_do(platform, spark, pipeline):
    from lakehouse.core.catalog import open_catalog
    from lakehouse.ingest.job import IngestJob

    spec = pipeline(partitions=1)
    catalog = open_catalog(platform, spec.catalog)
    send(platform, spec.source.topic, [order(i) for i in range(10)])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0

    # a renamed target.table: refused before anything is created, then done the way the message says
    renamed = edit(spec, {"table": spec.target.table + "_v2"})
    refused = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert refused.returncode == 2, refused.stderr
    assert f"ALTER TABLE lake.{spec.target.table} RENAME TO {renamed.target.table}" in refused.stderr
    assert not catalog.table_exists(renamed.target.table)
    spark.sql(f"ALTER TABLE lake.{spec.target.table} RENAME TO {renamed.target.table}")  # as the message says
    send(platform, spec.source.topic, [order(i) for i in range(10, 15)])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    assert assert_exactly_once(platform, renamed) == 15
    assert len(rows(platform, renamed, renamed.target.table)) == 15

    # a new upsert key picked up mid-stream: the running job stops on it, the table as it was
    job = IngestJob(renamed, platform, spark)
    rekeyed = edit(renamed, {"mode": "upsert", "key": ["order_id"]})
    send(platform, spec.source.topic, [order(i) for i in range(15, 20)])
    with pytest.raises(errors.LayoutChangeRefused, match="was written as append but the spec now says upsert"):
        job.run_batch()
    data = table(platform, rekeyed, rekeyed.target.table)
    assert data.metadata.properties[TableProperties.WRITE_MODE] == "append"
    assert "write.merge.mode" not in data.metadata.properties
    assert len(rows(platform, rekeyed, rekeyed.target.table)) == 15
    refused = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")  # and a restart stops too
    assert refused.returncode == 2 and f"candidate_for: {spec.name}" in refused.stderr
    [status] = json.loads(run_cli(spec, "status", "--pipeline", spec.name, "--json").stdout)
    assert status["layout"]["in_sync"] is False
    assert "was written as append" in status["layout"]["refused"][0]
    assert "LAYOUT REFUSED" in run_cli(spec, "status", "--pipeline", spec.name).stdout
