"""Each key's newest record among many, in Arrow, in the order lakehouse.core.newer defines (LATEST_ORDER):
within a partition the highest offset; across partitions the latest source position, then the latest source
time (a change stream's; a tombstone, which has neither, takes those of the change before it in its partition,
the delete Debezium writes right before it), then the latest Kafka timestamp, then the highest partition;
unknown values last.

The ingest job ranks an upsert batch's staged rows with it before the batch's MERGE (`newest_rows`), and
lakehouse.audit a verifier's window of Kafka records (`ranked`): both sides of a check decide alike. Pure:
pyarrow and numpy, on the driver, so an upsert batch's rows are held there once (max_records_per_batch
bounds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.core.newer import LATEST_ORDER, SOURCE_ORDER

COORDINATES = ("partition", "offset", "timestamp", *SOURCE_ORDER)
ROW = "row"  # `ranked`'s column: the newest row's number among the rows given


Column: TypeAlias = pa.Array | pa.ChunkedArray


def ranked(keys: Sequence[Column], coordinates: Mapping[str, Column]) -> pa.Table:
    """One row per key, in key order: ROW (the number of the key's newest row among those given) and that row's
    COORDINATES, a tombstone's source order as it inherited it. `keys`: the key's columns (rows whose key has
    a null rank among themselves); `coordinates`: the rows' COORDINATES, a source-order column missing when
    the records carry none (not a change stream)."""
    count = len(coordinates["offset"])
    key_names = [f"key{i}" for i in range(len(keys))]
    columns: dict[str, Column] = dict(zip(key_names, keys, strict=True))
    for name in COORDINATES:
        columns[name] = coordinates[name] if name in coordinates else pa.nulls(count, pa.int64())
    columns[ROW] = pa.array(np.arange(count, dtype=np.int64))
    rows = pa.table(columns)
    if not count:
        return rows.select([ROW, *COORDINATES])
    by_key = [(name, "ascending") for name in key_names]
    rows = _inherit_source_order(rows.sort_by([*by_key, ("partition", "ascending"), ("offset", "ascending")]),
                                 (*key_names, "partition"))
    per_partition = _first_of_each(rows.sort_by([*by_key, ("partition", "ascending"), ("offset", "descending")]),
                                   (*key_names, "partition"))
    newest = _first_of_each(per_partition.sort_by([*by_key, *((name, "descending") for name in LATEST_ORDER)]),
                            tuple(key_names))
    return newest.select([ROW, *COORDINATES])


def newest_rows(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The newest of `rows` (an upsert batch's staged rows: the table's columns, `_kafka` and, in a change
    stream, `_cdc`) for each value of the `keys` columns, in key order."""
    kafka = rows.column("_kafka").combine_chunks()
    coordinates = {name: pc.struct_field(kafka, name) for name in ("partition", "offset", "timestamp")}
    if "_cdc" in rows.column_names:
        cdc = rows.column("_cdc").combine_chunks()
        coordinates.update({name: pc.struct_field(cdc, name) for name in SOURCE_ORDER})
    return rows.take(ranked([rows.column(k) for k in keys], coordinates).column(ROW))


def _inherit_source_order(ordered: pa.Table, group: tuple[str, ...]) -> pa.Table:
    """`ordered` (by `group`, then offset) with each row lacking a source position and time (a tombstone)
    given those of the newest earlier row of its group."""
    starts = _starts(ordered, group)
    rows = np.arange(ordered.num_rows)
    for name in SOURCE_ORDER:
        column = ordered.column(name)
        # each row's source: itself when it has a value or starts its group, else the last such row before it
        source = np.maximum.accumulate(np.where(pc.is_valid(column).to_numpy(zero_copy_only=False) | starts, rows, 0))
        ordered = ordered.set_column(ordered.schema.get_field_index(name), name, column.take(pa.array(source)))
    return ordered


def _first_of_each(ordered: pa.Table, group: tuple[str, ...]) -> pa.Table:
    """The first row of each run of equal `group` values in `ordered` (sorted by them first)."""
    return ordered.filter(pa.array(_starts(ordered, group)))


def _starts(ordered: pa.Table, group: tuple[str, ...]) -> np.ndarray:
    """Whether each row of `ordered` starts a run of equal `group` values (nulls equal to nulls)."""
    starts = np.zeros(ordered.num_rows, dtype=bool)
    if ordered.num_rows:
        starts[0] = True
    for name in group:
        column = ordered.column(name)
        values = column.to_numpy(zero_copy_only=False)
        known = pc.is_valid(column).to_numpy(zero_copy_only=False)
        both = known[1:] & known[:-1]
        starts[1:] |= np.where(both, values[1:] != values[:-1], known[1:] != known[:-1])
    return starts
