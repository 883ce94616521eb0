"""An upsert batch applied on the driver as Iceberg's row delta, without Spark's MERGE: the table's live rows
holding the batch's keys are looked up in its files, every one of them the batch's newer record replaces or
deletes gets a position delete, and the batch's upserts that win are written as data files; both land in one
snapshot (lakehouse.ingest.committer, `append_files` with `deletes`).

It decides row by row as the MERGE replays still run (lakehouse.ingest.upserts.Upserts.merge_latest):

    WHEN MATCHED AND s is delete AND s newer THEN DELETE
    WHEN MATCHED AND s is upsert AND s newer THEN UPDATE          (here: the held row deleted, s inserted)
    WHEN NOT MATCHED AND s is upsert THEN INSERT

"newer" is lakehouse.core.newer's rule (lakehouse.ingest.newest.newer_than). A key held by more than one live
row (never written by the pipeline, which keeps one per key) has each of them judged on its own, as the
MERGE's join does; the upsert is written once, unless a held row is newer than it.

Position deletes are written as Iceberg's Spark runtime writes them by default (`write.delete.granularity` =
file): one delete file per data file it deletes rows of, in that file's partition and spec, its `file_path`
bounds naming the one file, so readers apply it to that file only. A table whose live files carry equality
deletes (written by another engine) is refused (IngestError, saying how to compact them away).

Cost: the key and coordinate columns of every live data file whose key bounds overlap the batch's, read once a
batch on the driver (the MERGE's join read them too, in Spark).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.types import LongType, StringType

from lakehouse.core.errors import IngestError
from lakehouse.ingest import newest, taskwriter

FILE = "_file"  # `held_rows`' columns: the number of the data file holding the row, and its position there
POS = "_pos"
COORDINATE_COLUMNS = ("_kafka", "_cdc")
# Iceberg's position delete file: its columns' reserved field ids (the table spec's "Position Delete Files")
DELETE_PATH_ID, DELETE_POS_ID = 2147483546, 2147483545
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(DELETE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(DELETE_POS_ID).encode()})])


@dataclass(frozen=True)
class Held:
    """`held_rows`: live rows of a table (key columns, `_kafka`, `_cdc`, FILE: a number in `files`, POS)."""

    rows: pa.Table
    files: list[DataFile]


@dataclass(frozen=True)
class RowDelta:
    """What a batch changes in its table: `inserts` (the batch's rows that win, its columns without `_op`) and
    `deleted` (FILE, POS of the held rows it replaces or deletes; FILE a number in `files`)."""

    inserts: pa.Table
    deleted: pa.Table
    files: list[DataFile]


def held_rows(table: Table, keys: Sequence[str], wanted: pa.Table) -> Held:
    """The live rows of `table` at its head whose key (the `keys` columns) is one of `wanted`'s rows. Files whose
    bounds rule out every wanted key of a single-column key are not read. Raises IngestError for equality
    deletes."""
    schema = table.schema()
    arrow = schema.as_arrow()
    columns = [*keys, *(c for c in COORDINATE_COLUMNS if c in schema.column_names)]
    empty = pa.table({**{c: pa.array([], arrow.field(c).type) for c in columns},
                      FILE: pa.array([], pa.int32()), POS: pa.array([], pa.int64())})
    if table.current_snapshot() is None or not wanted.num_rows:
        return Held(empty, [])
    ids = {schema.find_field(c).field_id: c for c in columns}
    tasks = list(table.scan(row_filter=_key_bounds(wanted, keys)).plan_files())
    deleted = _positions_deleted(table, [d for task in tasks for d in task.delete_files])
    parts = [empty]
    for number, task in enumerate(tasks):
        with table.io.new_input(task.file.file_path).open() as stream:
            parquet = pq.ParquetFile(stream)
            names = {int(f.metadata[b"PARQUET:field_id"]): f.name for f in parquet.schema_arrow
                     if f.metadata and b"PARQUET:field_id" in f.metadata}
            read = parquet.read(columns=[names[i] for i in ids if i in names])
        count = read.num_rows
        rows = pa.table({**{c: read.column(names[i]) if i in names else pa.nulls(count, arrow.field(c).type)
                            for i, c in ids.items()},
                         FILE: pa.array(np.full(count, number, dtype=np.int32)),
                         POS: pa.array(np.arange(count, dtype=np.int64))})
        gone = deleted.get(task.file.file_path)
        if gone is not None:
            rows = rows.filter(pa.array(~np.isin(np.arange(count), gone)))
        parts.append(rows.take(pairs(rows.select(keys), wanted, keys, "left semi").column("_left")))
    return Held(pa.concat_tables(parts, promote_options="permissive"), [task.file for task in tasks])


def plan(table: Table, rows: pa.Table, keys: Sequence[str], held: Held | None = None) -> RowDelta:
    """The row delta of `rows` (one per key: the batch's newest staged rows, its columns and `_op`) against
    `table` at its head: `held`, its `held_rows` for `rows`' keys (or more), read here when not given."""
    held = held if held is not None else held_rows(table, keys, rows.select(keys))
    matches = pairs(rows.select(keys), held.rows.select(keys), keys, "inner")
    row, match = matches.column("_left").to_numpy(), matches.column("_right").to_numpy()
    matched = held.rows.take(match)
    wins = newest.newer_than(_coordinates(rows.take(row)), _coordinates(matched))
    outdated = np.unique(row[~wins])  # batch rows a held row is newer than: the table keeps its row
    upsert = pc.equal(rows.column(taskwriter.UPSERT_OP), "upsert").to_numpy(zero_copy_only=False)
    keep = upsert & ~np.isin(np.arange(rows.num_rows), outdated)
    return RowDelta(rows.filter(pa.array(keep)).drop_columns([taskwriter.UPSERT_OP]),
                    matched.filter(pa.array(wins)).select([FILE, POS]), held.files)


def delete_files(table: Table, delta: RowDelta) -> list[DataFile]:
    """`delta`'s deleted rows as position delete files of `table`, one per data file (its spec and partition,
    `file_path` bounds naming it), rows ordered by position."""
    written: list[DataFile] = []
    batch = uuid.uuid4()
    provider = table.location_provider()
    by_file = delta.deleted.sort_by([(FILE, "ascending"), (POS, "ascending")])
    numbers = by_file.column(FILE).to_numpy()
    starts: list[int] = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]]).tolist() if len(numbers) else []
    for start, end in zip(starts, [*starts[1:], len(numbers)][:len(starts)], strict=True):
        data_file = delta.files[int(numbers[start])]
        positions = by_file.column(POS).slice(start, end - start).combine_chunks()
        count = len(positions)
        location = provider.new_data_location(f"{batch}-{len(written):05d}-deletes.parquet")
        with table.io.new_output(location).create(overwrite=True) as stream:
            pq.write_table(pa.table([pa.array([data_file.file_path] * count, pa.string()), positions],
                                    schema=DELETE_SCHEMA), stream)
        path = to_bytes(StringType(), data_file.file_path)
        delete = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES, file_path=location, file_format=FileFormat.PARQUET,
            partition=data_file.partition, record_count=count, file_size_in_bytes=len(table.io.new_input(location)),
            value_counts={DELETE_PATH_ID: count, DELETE_POS_ID: count},
            null_value_counts={DELETE_PATH_ID: 0, DELETE_POS_ID: 0},
            lower_bounds={DELETE_PATH_ID: path, DELETE_POS_ID: to_bytes(LongType(), pc.min(positions).as_py())},
            upper_bounds={DELETE_PATH_ID: path, DELETE_POS_ID: to_bytes(LongType(), pc.max(positions).as_py())})
        delete.spec_id = data_file.spec_id
        written.append(delete)
    return written


def _coordinates(rows: pa.Table) -> dict:
    return newest.coordinates_of(rows.column("_kafka"), rows.column("_cdc") if "_cdc" in rows.column_names else None)


def pairs(left: pa.Table, right: pa.Table, keys: Sequence[str], how: str) -> pa.Table:
    """The row numbers ("_left", "_right") of `left` and `right` (key columns) whose keys are equal (a null
    equal to nothing, as in SQL's join); `how` "inner" or "left semi" (then "_left" only)."""
    numbered = left.append_column("_left", pa.array(np.arange(left.num_rows, dtype=np.int64)))
    others = right.cast(left.schema).append_column("_right", pa.array(np.arange(right.num_rows, dtype=np.int64)))
    return numbered.join(others, list(keys), join_type=how).drop_columns(list(keys))


def _positions_deleted(table: Table, deletes: list[DataFile]) -> dict[str, np.ndarray]:
    """The positions `deletes` (position delete files, each read once) delete, by data file path."""
    by_path: dict[str, list[np.ndarray]] = {}
    for delete in {d.file_path: d for d in deletes}.values():
        if delete.content != DataFileContent.POSITION_DELETES:
            raise IngestError(f"{'.'.join(table.name())} holds equality deletes ({delete.file_path}), written by "
                              f"another engine: the ingest job applies upserts with position deletes and reads "
                              f"no equality deletes. Compact the table (Iceberg's rewrite_data_files with "
                              f"delete-file-threshold=1) and run the job again.")
        with table.io.new_input(delete.file_path).open() as stream:
            rows = pq.read_table(stream, columns=["file_path", "pos"])
        paths = rows.column("file_path").combine_chunks()
        positions = rows.column("pos").to_numpy()
        for path in pc.unique(paths).to_pylist():
            by_path.setdefault(path, []).append(positions[pc.equal(paths, path).to_numpy(zero_copy_only=False)])
    return {path: np.concatenate(parts) for path, parts in by_path.items()}


def _key_bounds(wanted: pa.Table, keys: Sequence[str]) -> BooleanExpression:
    if len(keys) != 1:
        return AlwaysTrue()
    column = wanted.column(keys[0])
    if not (pa.types.is_integer(column.type) or pa.types.is_string(column.type)):
        return AlwaysTrue()
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return AlwaysTrue()
    return And(GreaterThanOrEqual(term=keys[0], value=low), LessThanOrEqual(term=keys[0], value=high))
