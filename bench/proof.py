"""Proving the contract: how long one `lakehouse trace` takes on a large table, and how many offsets
per second `lakehouse verify` proves.

- **Trace latency**: a table of `rows` rows (10,000,000 by default) is built the way ingestion leaves
  one, but without pushing the records through Kafka: pyiceberg appends of generated Arrow orders,
  one commit per batch of 100,000 rows carrying the batch's offset ranges and positions in its
  summary, one data file per Kafka partition per batch, each with the `_kafka` bounds the task writer
  records (`taskwriter.write_data_files`). Then `lakehouse.audit.trace.trace_record` looks up random
  records of it, each call as a fresh CLI call would (loading the table from the catalog), and the
  seconds of each answer are measured, with the data files the lookup's scan planned against the
  table's total.
- **Verification throughput**: `lakehouse.audit.verify.verify(full=True)` over a pipeline that
  `lakehouse ingest --once` filled from the benchmark's topic: in this process (engine local,
  repeated) and as `lakehouse verify --engine spark` in its own process (JVM start included); offsets
  Kafka holds that were proven exactly once per second.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench import stats
from bench.env import BenchError, BenchStack
from lakehouse.core import offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.layout import ARROW_TYPES, KAFKA_STRUCT

ROWS_PER_COMMIT = 100_000
PARTITIONS = 3


def _schema(spec: PipelineSpec) -> pa.Schema:
    """The data table's columns as ingestion creates them: the contract, `_kafka`, `_ingested_at`."""
    return pa.schema([(f.name, ARROW_TYPES[f.type]) for f in spec.contract.fields]
                     + [("_kafka", KAFKA_STRUCT), ("_ingested_at", pa.timestamp("us", tz="UTC"))])


def synthetic_orders(spec: PipelineSpec, partition: int, start: int, count: int, base: datetime) -> pa.Table:
    """`count` orders of `partition` at offsets start..start+count, one second apart in event and Kafka time."""
    offsets_ = np.arange(start, start + count, dtype=np.int64)
    ids = pc.binary_join_element_wise(pa.scalar(f"ord-{partition}-"), pc.cast(pa.array(offsets_), pa.string()), "")
    micros = (int(base.timestamp() * 1_000_000) + offsets_ * 1_000_000 * PARTITIONS + partition * 1_000_000)
    stamps = pa.array(micros, pa.timestamp("us", tz="UTC"))
    statuses = pa.array(np.array(["created", "paid", "shipped", "cancelled", "refunded"])[offsets_ % 5])
    columns = {"order_id": ids, "customer_id": pc.binary_join_element_wise(
        pa.scalar("c-"), pc.cast(pa.array(offsets_ % 9973), pa.string()), ""),
        "amount": pa.array((offsets_ % 10_000) / 7.0), "currency": pa.array(["EUR"] * count),
        "status": statuses, "event_time": stamps}
    kafka = pa.StructArray.from_arrays([pa.array([spec.source.topic] * count), pa.array(np.full(count, partition,
                                                                                           dtype=np.int32)),
                                        pa.array(offsets_), stamps.cast(KAFKA_STRUCT.field("timestamp").type), ids],
                                       fields=list(KAFKA_STRUCT))
    arrays = [columns[f.name] if f.name in columns else pa.nulls(count, f.type) for f in _schema(spec)
              if f.name not in ("_kafka", "_ingested_at")]
    return pa.Table.from_arrays([*arrays, kafka, stamps], schema=_schema(spec))


def build_table(catalog, spec: PipelineSpec, rows: int, progress=lambda line: None,
                rows_per_commit: int = ROWS_PER_COMMIT) -> dict[str, Any]:
    """The spec's data table, created in `catalog` (pyiceberg) and filled with `rows` orders over PARTITIONS
    partitions, as ingest commits leave it; returns the build's numbers (rows, files, commits, seconds)."""
    from pyiceberg.transforms import DayTransform

    from lakehouse.ingest import tables
    from lakehouse.ingest.taskwriter import write_data_files  # with the bounds ingestion records, for pruning

    started = time.monotonic()
    catalog.create_namespace_if_not_exists(spec.target.table.split(".")[0])
    table = catalog.create_table(spec.target.table, schema=_schema(spec), properties=tables.table_properties(spec))
    with table.update_spec() as partitioning:
        partitioning.add_field("event_time", DayTransform(), "event_time_day")
    positions = dict.fromkeys(range(PARTITIONS), 0)
    base = datetime.now(timezone.utc) - timedelta(days=30)
    counter = itertools.count()
    files = commits = 0
    while sum(positions.values()) < rows:
        batch = min(rows_per_commit, rows - sum(positions.values()))
        shares = {p: batch // PARTITIONS + (1 if p < batch % PARTITIONS else 0) for p in positions}
        written = []
        for p, count in shares.items():
            if count:
                data = synthetic_orders(spec, p, positions[p], count, base)
                written += write_data_files(table.io, table.metadata, data, uuid.uuid4(), counter)
        ranges = {p: (positions[p], positions[p] + n) for p, n in shares.items() if n}
        positions = {p: positions[p] + shares[p] for p in positions}
        summary = offsets.commit_summary(spec.name, "ingest", spec.source.topic, ranges, uuid.uuid4().hex,
                                         positions=positions)
        with table.transaction() as tx:
            with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
                for data_file in written:
                    append.append_data_file(data_file)
        table = catalog.load_table(spec.target.table)
        files += len(written)
        commits += 1
        if commits % 10 == 0:
            progress(f"  trace table: {sum(positions.values()):,} of {rows:,} rows in {commits} commits")
    return {"table": spec.qualified(spec.target.table), "rows": sum(positions.values()), "files": files,
            "commits": commits, "partitions": PARTITIONS, "build_s": round(time.monotonic() - started, 1)}


def trace_latency(platform, spec: PipelineSpec, rows: int, lookups: int, seed: int) -> dict[str, Any]:
    """Seconds of `lookups` traces of random records of the table `build_table` filled (each as a fresh
    call: the table loaded from the catalog, its files planned with the coordinate filter); every
    answer must be the row itself."""
    from lakehouse.audit import trace
    from lakehouse.audit.coordinates import coordinate_filter

    per_partition = rows // PARTITIONS
    rng = random.Random(seed)
    seconds, planned = [], []
    table = open_catalog(platform, spec.catalog).load_table(spec.target.table)
    total_files = int(offsets.summary_properties(table.current_snapshot()).get("total-data-files", 0))
    for _ in range(lookups):
        partition, offset = rng.randrange(PARTITIONS), rng.randrange(per_partition)
        started = time.monotonic()
        found = trace.trace_record(spec, partition, offset, platform)
        seconds.append(time.monotonic() - started)
        if found.verdict != "in-table" or found.sightings[0].row["order_id"] != f"ord-{partition}-{offset}":
            raise BenchError(f"trace of {partition}@{offset} answered {found.verdict}: {found.message}")
        planned.append(len(list(table.scan(row_filter=coordinate_filter(partition, offset, spec.source.topic))
                                .plan_files())))
    return {"lookups": lookups, "seconds": [round(s, 4) for s in seconds], "median_s": stats.median(seconds),
            "p95_s": stats.percentile(seconds, 95), "max_s": max(seconds),
            "files_planned_median": stats.median(planned), "files_total": total_files}


def verify_throughput(stack: BenchStack, spec: PipelineSpec, repeats: int) -> dict[str, Any]:
    """Offsets proven exactly once per second by full verifications of `spec`'s pipeline: in this process
    (engine local, `repeats` times) and once as `lakehouse verify --engine spark` in its own process."""
    from lakehouse.audit import verify

    platform = stack.platform()
    local = []
    for _ in range(repeats):
        result = verify.verify(spec, platform, full=True, engine="local", record_event=False)
        if not result.ok:
            raise BenchError(f"verification of {spec.name} failed: {result.summary()}")
        local.append({"offsets": result.findings.offsets, "rows": result.findings.rows,
                      "seconds": round(result.seconds, 3), "offsets_per_s": round(result.offsets_per_s, 1)})
    started = time.monotonic()
    done = stack.run_cli("verify", "--pipeline", spec.name, "--full", "--engine", "spark", "--json",
                         log_name=f"verify-spark-{spec.name}", timeout=900)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise BenchError(f"`lakehouse verify --engine spark` exited with {done.returncode}: {done.stderr[-2000:]}")
    spark = json.loads(done.stdout)
    return {
        "pipeline": spec.name, "local": local,
        "local_median_offsets_per_s": stats.median(r["offsets_per_s"] for r in local),
        "local_median_s": stats.median(r["seconds"] for r in local), "offsets": local[0]["offsets"],
        "spark": {"offsets": spark["offsets"], "seconds": spark["seconds"], "offsets_per_s": spark["offsets_per_s"],
                  "process_wall_s": round(wall, 2)},
    }
