"""Each key's newest record among many, in Arrow, in the order lakehouse.core.newer defines (LATEST_ORDER):
within a partition the highest offset; across partitions the latest source position, then the latest source
time (a change stream's; a tombstone, which has neither, takes those of the change before it in its partition,
the delete Debezium writes right before it), then the latest Kafka timestamp, then the highest partition;
unknown values last.

The ingest job ranks an upsert batch's staged rows with it before applying them (`newest_rows`), and
lakehouse.audit a verifier's window of Kafka records (`ranked`): both sides of a check decide alike. Which of
two records is newer, row by row over many pairs, is `newer_than`: the rules of lakehouse.core.newer, as its
`sql` and `is_newer` evaluate them. Pure: pyarrow and numpy, on the driver, so an upsert batch's rows are held
there once (max_records_per_batch bounds them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.core.newer import KAFKA_FIELDS, LATEST_ORDER, RULES, SOURCE_ORDER, Rule

COORDINATES = ("partition", "offset", "timestamp", *SOURCE_ORDER)
ROW = "row"  # `ranked`'s column: the newest row's number among the rows given


Column: TypeAlias = pa.Array | pa.ChunkedArray

# A rule's operator (lakehouse.core.newer's Rule.op) on two columns, row by row: null where either is unknown.
_COMPARE = {">": pc.greater, ">=": pc.greater_equal}


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
    coordinates = coordinates_of(rows.column("_kafka"), rows.column("_cdc") if "_cdc" in rows.column_names else None)
    return rows.take(ranked([rows.column(k) for k in keys], coordinates).column(ROW))


def coordinates_of(kafka: Column, cdc: Column | None = None) -> dict[str, Column]:
    """The COORDINATES of records from their `_kafka` struct column (fields partition, offset, timestamp) and,
    in a change stream, their `_cdc` struct column (fields position, source_ts; None when the records carry
    none): a record whose struct is null has all of that struct's fields unknown (null)."""
    coordinates = {name: pc.struct_field(_whole(kafka), name) for name in KAFKA_FIELDS}
    if cdc is not None:
        coordinates.update({name: pc.struct_field(_whole(cdc), name) for name in SOURCE_ORDER})
    return coordinates


def newer_than(s: Mapping[str, Column], t: Mapping[str, Column]) -> np.ndarray:
    """Row by row, whether the record with coordinates `s` is newer than the one with `t` (lakehouse.core.newer's
    rules, exactly `is_newer`, an unknown value deciding nothing as in SQL): a bool per row. `s` and `t` map
    COORDINATES to columns of equal length (as `coordinates_of` gives them); the source rules (a change
    stream's) apply when both carry the SOURCE_ORDER columns, as `is_newer`'s `by_source`."""
    s, t = {name: _whole(column) for name, column in s.items()}, {name: _whole(column) for name, column in t.items()}
    count = len(s["partition"])
    if any(len(column) != count for column in (*s.values(), *t.values())):
        raise ValueError("newer_than: the coordinates' columns are not all of one length")
    by_source = all(name in s and name in t for name in SOURCE_ORDER)

    def compare(rule: Rule) -> pa.Array:  # `s` against `t` by the rule's operator; null where either is unknown
        return _COMPARE[rule.op](s[rule.field], t[rule.field])

    same_partition = pc.equal(s["partition"], t["partition"])
    # SQL's AND of these, true only where each is: the same partition, and every "same" rule holds
    same = _true(same_partition)
    for rule in (r for r in RULES if r.partitions == "same"):
        same &= _true(compare(rule))
    # across partitions, the first rule that decides a row: a source rule where both values are known and
    # differ (a change stream's only), else the first other rule, whose verdict may be unknown
    across = np.zeros(count, dtype=bool)
    decided = np.zeros(count, dtype=bool)
    for rule in (r for r in RULES if r.partitions == "across"):
        if rule.source:
            if by_source:
                decides = ~decided & _true(pc.not_equal(s[rule.field], t[rule.field]))
                across |= decides & _true(compare(rule))
                decided |= decides
        else:
            across |= ~decided & _true(compare(rule))
            break
    return same | (_true(pc.invert(same_partition)) & across)


def _whole(column: Column) -> pa.Array:
    """`column` as one array (a chunked array's chunks combined)."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _true(condition: Column) -> np.ndarray:
    """Where a boolean column is true: an unknown (null) value is not, as SQL reads a condition."""
    return np.asarray(pc.fill_null(condition, False).to_numpy(zero_copy_only=False), dtype=bool)


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
