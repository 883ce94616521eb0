"""Executor side of a batch: a Spark task reads its offset ranges, decodes them and writes the
Iceberg data files itself; only descriptions of the files travel back to the driver.

This is the Iceberg Kafka Connect sink's shape on Spark: workers write, one committer
commits. A task

1. reads all of its offset ranges with one confluent-kafka consumer assignment and decodes every
   record into Arrow (`reader.read_ranges`: table rows and dead letters, never failing on a record);
2. routes the rows: each data table gets its rows (minus offsets the table already holds,
   after a crash between two tables' commits), cast to the table's Iceberg schema, and
   the dead-letter table gets the rejected records;
3. writes Parquet through pyiceberg's writer with the table's field ids, partitioned by the
   table's partition spec, cut at its target file size, with column metrics for pruning
   (`write_data_files`: what pyiceberg's own append runs, plus bounds for the fields nested in
   `_kafka`, which pyiceberg leaves out and Spark's writer keeps);
4. returns a `TaskResult`: the DataFiles (metadata only) per table, the per-table counts,
   event-time and Kafka-time bounds, and its stage clock.

No file it writes is visible until the driver's committer appends it; the files of a
failed or retried task, or of a batch that never commits, are orphans for maintenance.
Upsert tables get a staging Parquet file (the table's columns and `_op`) that the driver
reads, applies as a row delta (lakehouse.ingest.row_deltas) and deletes once committed.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from lakehouse.core import errors, sparkenv
from lakehouse.core.adapters import pyiceberg_internals
from lakehouse.core.offsets import OffsetRange
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.layout import DEAD_LETTER_TABLE
from lakehouse.ingest.reader import BatchBuilder, StageClock, read_ranges, reader_consumer
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.writer_schemas import WriterSchemas

# Arrow columns of a decoded batch that become a dead-letter row, in the dead-letter table's names
# (layout.DEAD_LETTER_TABLE), and the columns that hold the pipeline's name
DEAD_LETTER_SOURCES = tuple((name, source) for name, _, source, _ in DEAD_LETTER_TABLE if source)
DEAD_LETTER_PIPELINE = tuple(name for name, _, source, _ in DEAD_LETTER_TABLE if source is None)
UPSERT_OP = "_op"


@dataclass(frozen=True)
class TableTarget:
    """What a task needs to write one table's share of the batch.

    `metadata` is the table's metadata without its snapshot history (schema, partition spec,
    properties, location): small to ship to every task. `held` maps partitions where the table
    is already past the batch's start to its position there: rows below it are left out.
    `staging` is set for an upsert table: the directory its staging file goes to.
    """

    name: str
    metadata: Any  # pyiceberg TableMetadata
    io_properties: dict[str, str]
    dead_letter: bool = False
    held: Mapping[int, int] = field(default_factory=dict)
    staging: str | None = None


@dataclass
class TaskResult:
    """What one task sends back to the driver: file descriptions and numbers, never rows."""

    files: dict[str, list] = field(default_factory=dict)  # table -> [pyiceberg DataFile]
    staged: dict[str, list[str]] = field(default_factory=dict)  # upsert table -> staging file paths
    rows: dict[str, int] = field(default_factory=dict)  # rows routed to each data table (before `held`)
    dead_letters: int = 0
    max_event_us: int | None = None  # newest event time of a routed row, epoch micros
    min_kafka_us: int | None = None  # oldest Kafka timestamp read, epoch micros
    read_s: float = 0.0
    decode_s: float = 0.0
    write_s: float = 0.0
    started: float = 0.0  # wall clock (time.time) when the task began and ended its work
    ended: float = 0.0
    # a writer schema the driver must act on first (its error message, with the marker naming it): the
    # task stopped there and wrote nothing; returned rather than raised, so Spark does not retry the task
    schema_event: str | None = None


# FileIO settings a task needs (object store endpoint, region, credentials' source), never the catalog's URI
_IO_PREFIXES = ("py-io-impl", "s3.", "gcs.", "adls.", "hdfs.", "oss.", "client.")


def io_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The FileIO properties of a table (pyiceberg's `table.io.properties`) that tasks need to write."""
    return {k: v for k, v in properties.items() if k.startswith(_IO_PREFIXES)}


def shipped_metadata(metadata):
    """A table's metadata without its history (snapshots, logs, refs): what writing files needs
    (schema, partition specs, properties, location), small whatever the table's age."""
    return metadata.model_copy(update={"snapshots": [], "snapshot_log": [], "metadata_log": [], "refs": {},
                                       "current_snapshot_id": None, "statistics": [], "partition_statistics": []})


def task_schema(metadata) -> pa.Schema:
    """The Arrow schema of a table's rows as the task writes them (field ids included)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(metadata.schema(), include_field_ids=True)


def _project(decoded: pa.Table, schema: pa.Schema, sources: Mapping[str, str], quarantined: frozenset[str],
             constants: Mapping[str, Any]) -> pa.Table:
    """`decoded` in the table's columns: each cast from its source column, or null when the batch has
    none (a column the spec dropped, or one quarantined by a schema change)."""
    arrays = []
    n = decoded.num_rows
    for f in schema:
        source = sources.get(f.name, f.name)
        if f.name in constants:
            arrays.append(pa.array([constants[f.name]] * n, f.type))
        elif source in decoded.column_names and f.name not in quarantined:
            arrays.append(decoded.column(source).cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def below_held(decoded: pa.Table, held: Mapping[int, int]) -> pa.Table:
    """`decoded` without the offsets a table already holds (partition -> its position): one lookup of
    each row's partition in a dense array of positions, whatever the number of partitions."""
    if not held or decoded.num_rows == 0:
        return decoded
    kafka = decoded.column("_kafka")
    partition = pc.struct_field(kafka, "partition")
    positions = [0] * (max(held) + 1)
    for p, position in held.items():
        positions[p] = position
    floor = pc.take(pa.array(positions, pa.int64()), pc.min_element_wise(partition, len(positions) - 1))
    # partitions past the highest held one hold nothing: their floor is 0
    floor = pc.if_else(pc.greater(partition, len(positions) - 1), 0, floor)
    return decoded.filter(pc.greater_equal(pc.struct_field(kafka, "offset"), floor))


def _epoch_us(column: pa.ChunkedArray, date: bool = False) -> pa.ChunkedArray:
    if date:
        return pc.multiply(column.cast(pa.int32()).cast(pa.int64()), 86_400_000_000)
    return column.cast(pa.int64())


def _write(target: TableTarget, rows: pa.Table, write_uuid: uuid.UUID, task_id: int) -> list:
    """pyiceberg's writer: Parquet files with the table's field ids, partition spec, target size and
    column metrics, named `<write_uuid>` and counted from a per-task offset (distinct in a batch)."""
    from pyiceberg.io import load_file_io

    io = load_file_io(target.io_properties, target.metadata.location)
    return write_data_files(io, target.metadata, rows, write_uuid, itertools.count(task_id * 100_000))


def write_data_files(io, metadata, rows: pa.Table, write_uuid: uuid.UUID, counter: itertools.count[int]) -> list:
    """`rows` as the table's data files, by pyiceberg's writer (what its own append runs, through
    lakehouse.core.adapters.pyiceberg_internals), with lower and upper bounds for the fields nested in structs
    too, which pyiceberg leaves at counts only (Iceberg's Java writer, Spark's, keeps them): `_kafka.partition`,
    `_kafka.offset` and `_kafka.timestamp` must prune scans that look for a record by its coordinates.

    The bounds come from the footer the writer holds when it closes a file: pyiceberg asks its statistics
    plan which metrics to take from it, and is handed one with the struct leaves upgraded for the length of
    the call. Reading each footer back instead cost a HeadObject and a GetObject per file on an object store."""
    return pyiceberg_internals.write_data_files(io, metadata, rows, write_uuid, counter, _with_struct_leaves)


def _struct_leaves(fields, nested: bool = False) -> Iterator[int]:
    """Field ids of the primitive fields nested in structs (not in lists or maps), e.g. `_kafka.offset`."""
    from pyiceberg.types import PrimitiveType, StructType

    for f in fields:
        if isinstance(f.field_type, StructType):
            yield from _struct_leaves(f.field_type.fields, nested=True)
        elif nested and isinstance(f.field_type, PrimitiveType):
            yield f.field_id


def _with_struct_leaves(plan: dict, schema, properties) -> dict:
    """`plan` (pyiceberg's statistics plan) with the fields nested in structs collecting bounds under the
    table's metrics mode for the column (truncate(16) by default), as for a top-level column."""
    from pyiceberg.io.pyarrow import MetricModeTypes, MetricsMode, StatisticsCollector, match_metrics_mode
    from pyiceberg.table import TableProperties
    from pyiceberg.types import BinaryType, StringType

    default = properties.get(TableProperties.DEFAULT_WRITE_METRICS_MODE,
                             TableProperties.DEFAULT_WRITE_METRICS_MODE_DEFAULT)
    plan = dict(plan)
    for field_id in _struct_leaves(schema.fields):
        collector = plan.get(field_id)
        if collector is None:
            continue
        mode = match_metrics_mode(properties.get(
            f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.{collector.column_name}", default))
        if mode.type not in (MetricModeTypes.TRUNCATE, MetricModeTypes.FULL):
            continue
        if not isinstance(collector.iceberg_type, (StringType, BinaryType)):
            mode = MetricsMode(MetricModeTypes.FULL)
        plan[field_id] = StatisticsCollector(field_id=field_id, iceberg_type=collector.iceberg_type, mode=mode,
                                             column_name=collector.column_name)
    return plan


def _stage(staging: str, target: TableTarget, rows: pa.Table, write_uuid: uuid.UUID, task_id: int) -> list[str]:
    """An upsert table's rows (with `_op`) as one staging Parquet file in `staging` (`target.staging`), which
    the driver merges."""
    from pyiceberg.io import load_file_io

    path = f"{staging.rstrip('/')}/{write_uuid}-{task_id:05d}.parquet"
    write_staging(load_file_io(target.io_properties, path), path, rows)
    return [path]


def write_staging(io: FileIO, path: str, rows: pa.Table) -> None:
    """`rows` as the staging Parquet file `path` (a task's share of an upsert table, or the driver's newest
    rows of a batch: lakehouse.ingest.upserts)."""
    import pyarrow.parquet as pq

    with io.new_output(path).create(overwrite=True) as stream:
        pq.write_table(rows, stream, compression="zstd")


def make_task_writer(spec: PipelineSpec, kafka_conf: dict, quarantined: frozenset[str], ingested_at_us: int,
                     targets: list[TableTarget], write_uuid: uuid.UUID, batch_rows: int = 10_000,
                     stall_timeout: float = 60.0, fault=None, poisoned: Mapping[tuple[int, int], str] | None = None,
                     writer_schemas: WriterSchemas = WriterSchemas()):
    """The function `rdd.mapPartitionsWithIndex` runs in each task: offset ranges in, one TaskResult out.

    `fault`, `poisoned`, `batch_rows`, `stall_timeout` and `writer_schemas` mean what they mean for
    `reader.make_reader`; the task's stage clock comes back in its TaskResult.
    """
    poisoned = dict(poisoned or {})
    event_field = spec.event_time_field
    event_is_date = event_field is not None and spec.contract.field(event_field).type == "date"
    upsert = spec.target.mode == "upsert"
    dead_letter_constants = dict.fromkeys(DEAD_LETTER_PIPELINE, spec.name)

    def run(task_id: int, ranges: Iterator[OffsetRange]) -> Iterator[TaskResult]:
        began = time.time()
        sparkenv.steady_zip_imports()
        clock = StageClock()
        builder = BatchBuilder(spec, RecordValidator(spec, quarantined, writer_schemas=writer_schemas), ingested_at_us)
        batches: list[pa.RecordBatch] = []
        try:
            with reader_consumer(kafka_conf, spec.name) as (consumer, watch):
                batches.extend(read_ranges(consumer, list(ranges), builder, batch_rows, stall_timeout, fault, clock,
                                           watch=watch, poisoned=poisoned))
        except (errors.SchemaUnknownError, errors.SchemaChangeError, errors.WriterSchemaIncompatibleError) as exc:
            yield TaskResult(read_s=clock.read_s, decode_s=clock.decode_s, started=began, ended=time.time(),
                             schema_event=str(exc))
            return
        result = TaskResult(read_s=clock.read_s, decode_s=clock.decode_s, started=began)
        if not batches:
            result.ended = time.time()
            yield result
            return
        started = time.perf_counter()
        decoded = pa.Table.from_batches(batches)
        del batches
        route = decoded.column("_route")
        result.min_kafka_us = pc.min(_epoch_us(pc.struct_field(decoded.column("_kafka"), "timestamp"))).as_py()
        result.dead_letters = route.null_count
        for target in targets:
            if target.dead_letter:
                rows = decoded.filter(pc.is_null(route))
                projected = _project(below_held(rows, target.held), task_schema(target.metadata),
                                     dict(DEAD_LETTER_SOURCES), frozenset(), dead_letter_constants)
            else:
                rows = decoded.filter(pc.equal(route, target.name))
                result.rows[target.name] = rows.num_rows
                if event_field is not None and rows.num_rows:
                    newest = pc.max(_epoch_us(rows.column(event_field), event_is_date)).as_py()
                    if newest is not None:
                        result.max_event_us = max(newest, result.max_event_us or newest)
                rows = below_held(rows, target.held)
                projected = _project(rows, task_schema(target.metadata), {}, quarantined, {})
                if upsert and target.staging:
                    projected = projected.append_column(UPSERT_OP, rows.column(UPSERT_OP))
            if projected.num_rows == 0:
                continue
            if target.staging:
                result.staged[target.name] = _stage(target.staging, target, projected, write_uuid, task_id)
            else:
                result.files[target.name] = _write(target, projected, write_uuid, task_id)
        result.write_s = time.perf_counter() - started
        result.ended = time.time()
        yield result

    return run
