"""The data files the Spark tasks write are proper Iceberg data files of the table.

Tasks write Parquet themselves (lakehouse.ingest.taskwriter) and the driver only appends their
descriptions: the files must carry the table's field ids, its partition spec and values,
column metrics that prune scans, and one commit per table must add exactly them. Runs
`lakehouse ingest --once` in the test process against the real broker and catalog.
"""

import json
from datetime import date
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import GreaterThan

from e2e import assert_exactly_once, pipeline, run_cli, send, summaries, table  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def order(i: int, day: int) -> tuple[bytes, bytes]:
    value = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": 1.0 + i, "currency": "EUR",
             "status": "created", "event_time": f"2026-11-{day:02d}T12:00:00+00:00"}
    return value["order_id"].encode(), json.dumps(value).encode()


def data_files(t):
    """The data files of `t`'s current snapshot."""
    return [task.file for task in t.scan().plan_files()]


def test_tasks_write_files_with_the_tables_field_ids_partitions_and_metrics(platform, pipeline):
    spec = pipeline(partition_by=["day(event_time)"])
    records = [order(i, 20 + i % 3) for i in range(3000)] + [(b"bad", b"{not json")] * 30
    send(platform, spec.source.topic, records)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 3030

    t = table(platform, spec, spec.target.table)
    files = data_files(t)
    assert sum(f.record_count for f in files) == 3000
    # partitioned by the table's spec: one day per file, three days in all
    assert all(f.spec_id == t.spec().spec_id for f in files)
    assert {f.partition[0] for f in files} == {(date(2026, 11, d) - date(1970, 1, 1)).days for d in (20, 21, 22)}
    # the table's field ids in every file
    ids = {f.name: f.field_id for f in t.schema().fields}
    for f in files:
        schema = pq.read_schema(urlparse(f.file_path).path)
        assert {name: int(schema.field(name).metadata[b"PARQUET:field_id"]) for name in ids} == ids
    # column metrics on the Kafka coordinates: a scan past the last offset prunes every file
    offset_id = t.schema().find_field("_kafka.offset").field_id
    assert all(offset_id in f.lower_bounds and offset_id in f.upper_bounds for f in files)
    assert list(t.scan(row_filter=GreaterThan("_kafka.offset", 10**9)).plan_files()) == []
    assert len(list(t.scan(row_filter=GreaterThan("_kafka.offset", 0)).plan_files())) == len(files)
    # one commit added exactly these files
    [summary] = summaries(platform, spec, spec.target.table)
    assert int(summary["added-data-files"]) == len(files) and int(summary["added-records"]) == 3000

    dlq = table(platform, spec, spec.dead_letter_table)
    assert sum(f.record_count for f in data_files(dlq)) == 30


def test_a_ten_record_batch_is_one_task_and_one_file_per_table(platform, pipeline):
    spec = pipeline(partition_by=[])
    send(platform, spec.source.topic, [order(i, 20) for i in range(9)] + [(b"bad", b"[]")])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert assert_exactly_once(platform, spec) == 10
    for name in (spec.target.table, spec.dead_letter_table):
        assert len(data_files(table(platform, spec, name))) == 1, name
