"""An upsert pipeline's rows: in Spark, a replay's rows per table, each key's newest record and the MERGE where
the newer record wins (lakehouse.core.newer); on the driver, an ingest batch's newest staged row of each key
(`newest_staged`), written as data files (`insert_files`); and the pipeline's ledger of tombstones that keeps a
deleted key deleted against older records (replays, a change stream's older change from another partition).

Used by the ingest job's commit of an upsert table (lakehouse.ingest.batch_commit, which applies a batch as a
row delta: lakehouse.ingest.row_deltas) and by replays (lakehouse.recovery.replay).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from lakehouse.core import newer, sparkenv
from lakehouse.core.offsets import TableProgress
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest import committer, newest, row_deltas, taskwriter

log = logging.getLogger("lakehouse.ingest")

DELETED_AT = "_deleted_at"  # the tombstone ledger's column: when the pipeline applied the delete


@dataclass(frozen=True)
class NewestStaged:
    """An upsert batch's newest staged row of each key (`Upserts.newest_staged`): the staged columns and `_op`."""

    rows: pa.Table
    keys: tuple[str, ...]

    @property
    def tombstones(self) -> pa.Table:
        """The keys whose newest record is a delete: the key's columns and `_kafka`."""
        if not self.rows.num_rows:
            return self.rows
        return self.rows.filter(pc.invert(self.upserts())).select([*self.keys, "_kafka"])

    @property
    def deletes(self) -> int:
        return int(self.tombstones.num_rows)

    def upserts(self) -> pa.ChunkedArray:
        return pc.equal(self.rows.column(taskwriter.UPSERT_OP), "upsert")


@dataclass(frozen=True)
class Upserts:
    """`spec`'s tables' rows in `spark`; `quarantined`: columns a schema change quarantined, left empty."""

    spark: Any  # a SparkSession
    spec: PipelineSpec
    quarantined: frozenset[str] = frozenset()

    def newer(self) -> str:
        """The MERGE's condition that the source's record `s` is newer than the table's `t` (a change stream
        orders across partitions by its source)."""
        if self.spec.is_cdc:
            return newer.sql("s._kafka", "t._kafka", "s._cdc", "t._cdc")
        return newer.sql("s._kafka", "t._kafka")

    def rows_for(self, table: str, df, tp: TableProgress, starts: dict[int, int] | None = None):
        """The batch's rows for `table`, minus offsets the table already holds, in the table's columns.

        `starts` (partition -> first offset of the batch) spares the filter for partitions where the
        table is not past the batch's start; without it every position the table holds is applied.
        """
        from pyspark.sql import functions as F

        rows = df.where(F.col("_route") == table)
        # only partitions where this table is already past the batch's start need a filter (after a
        # crash between two tables' commits); one flat map lookup, not an OR per partition, which
        # overflows Spark's analyser at about 1,000 partitions (docs/sizing.md)
        ahead = {p: pos for p, pos in tp.positions.items() if starts is None or pos > starts.get(p, pos)}
        if ahead:
            held = F.create_map(*[c for p, pos in sorted(ahead.items())
                                  for c in (F.lit(p).cast("int"), F.lit(pos).cast("long"))])
            rows = rows.where(F.col("_kafka.offset")
                              >= F.coalesce(F.element_at(held, F.col("_kafka.partition")), F.lit(0).cast("long")))
        target = self.spark.table(self.spec.qualified(table)).schema
        keep = ["_op"] if self.spec.target.mode == "upsert" else []
        cols = []
        for f in target.fields:
            if f.name in rows.columns and f.name not in self.quarantined:
                cols.append(F.col(f.name).cast(f.dataType).alias(f.name) if f.name not in ("_kafka",)
                            else F.col(f.name))
            else:
                cols.append(F.lit(None).cast(f.dataType).alias(f.name))
        return rows.select(*cols, *keep)

    def latest_per_key(self, rows):
        """The newest record of each key in `rows` (lakehouse.core.newer.LATEST_ORDER).

        In a change stream, a tombstone (no change event, so no source position) takes the source order of
        the change before it in its partition (Debezium writes it right after its delete): a delete read in
        the same batch as an older change of its key from another partition stays the newest."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        keys = list(self.spec.target.key)
        partition = Window.partitionBy(*keys, "_kafka.partition")
        inherited = newer.SOURCE_ORDER if self.spec.is_cdc else ()
        before = partition.orderBy(F.col("_kafka.offset")).rowsBetween(Window.unboundedPreceding, 0)
        for name in inherited:
            rows = rows.withColumn(f"_order_{name}", F.last(f"_cdc.{name}", ignorenulls=True).over(before))
        order = [F.col(f"_order_{name}" if name in inherited else f"_kafka.{name}").desc_nulls_last()
                 for name in newer.LATEST_ORDER if name in inherited or name in newer.KAFKA_FIELDS]
        across = Window.partitionBy(*keys).orderBy(*order)
        return (rows.withColumn("_rn", F.row_number().over(partition.orderBy(F.col("_kafka.offset").desc())))
                .where("_rn = 1").drop("_rn")
                .withColumn("_rn", F.row_number().over(across)).where("_rn = 1")
                .drop("_rn", *[f"_order_{name}" for name in inherited]))

    def merge(self, table: str, rows, summary: dict[str, str], respect_tombstones: bool = False) -> None:
        """Upsert: the latest record per key wins, within the batch and against the table (`merge_latest`)."""
        self.merge_latest(table, self.latest_per_key(rows), summary, respect_tombstones)

    def merge_latest(self, table: str, latest, summary: dict[str, str], respect_tombstones: bool = False) -> None:
        """Upsert `latest` (one record per key, `latest_per_key`): the newer record wins against the table.

        With `respect_tombstones` (replays; every batch of a change stream), records older than their key's
        newest tombstone in the pipeline's ledger are left out, so that replaying old records, or an older
        change from another partition, cannot bring back a deleted key.
        """
        ledger = self.spec.tombstone_table
        if respect_tombstones and ledger:
            latest = self.after_tombstones(latest, ledger)
        keys = list(self.spec.target.key)
        columns = [c for c in latest.columns if c != "_op"]
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        sets = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
        names = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(f"s.`{c}`" for c in columns)
        newer_sql = self.newer()
        sparkenv.merge(self.spark, latest,
                       f"MERGE INTO {self.spec.qualified(table)} t USING {{source}} s ON {on} "
                       f"WHEN MATCHED AND s._op = 'delete' AND {newer_sql} THEN DELETE "
                       f"WHEN MATCHED AND s._op = 'upsert' AND {newer_sql} THEN UPDATE SET {sets} "
                       f"WHEN NOT MATCHED AND s._op = 'upsert' THEN INSERT ({names}) VALUES ({values})", summary)

    def record_tombstones(self, ledger: Table, tombstones: pa.Table, held: row_deltas.Held | None = None) -> None:
        """Keep the batch's tombstones in the pipeline's ledger (`ledger`, as pyiceberg loaded it):
        `tombstones` (key columns and `_kafka`: `NewestStaged.tombstones`, one per key), each kept when newer
        than its key's entry there in Kafka's order (a tombstone carries no source position). Applied on the
        driver as a row delta (lakehouse.ingest.row_deltas: a held entry an incoming one is newer than is
        deleted by position), so the ledger holds one entry per key, and writing the same tombstones again (a
        batch tried again) changes nothing.

        Runs before the data table's commit: after a crash in between, the ledger knows of a delete the
        table has not applied yet, which only makes replays skip records that are older anyway. A batch
        without deletes needs no call. `held`: the ledger's entries for the tombstones' keys (or more), as
        `row_deltas.held_rows` read them at `ledger`'s head, when the caller has them.
        """
        entries = ledger_entries(ledger, tombstones)
        entries = entries.append_column(taskwriter.UPSERT_OP, pa.array(["upsert"] * entries.num_rows, pa.string()))
        delta = row_deltas.plan(ledger, entries, list(self.spec.target.key), held)
        committer.commit_files(ledger, insert_files(ledger, delta.inserts), row_deltas.delete_files(ledger, delta))

    def after_tombstones(self, latest, ledger: str):
        """`latest` without the upserts older than their key's newest tombstone in `ledger` (the batch's own
        tombstones are in it already: its deletes are kept, and only delete what is older).
        Across partitions, older means by Kafka timestamp: a tombstone carries no source position."""
        from pyspark.sql import functions as F

        keys = list(self.spec.target.key)
        tombs = self.spark.table(self.spec.qualified(ledger)).select(
            *[F.col(k).alias(f"_tomb_{k}") for k in keys], F.col("_kafka").alias("_tomb"))
        joined = latest.join(tombs, on=[latest[k] == tombs[f"_tomb_{k}"] for k in keys], how="left")
        kept = F.col("_tomb").isNull() | F.expr(newer.sql("_kafka", "_tomb")) | (F.col("_op") == "delete")
        return joined.where(kept).drop("_tomb", *[f"_tomb_{k}" for k in keys])

    def newest_staged(self, io: FileIO, paths: list[str]) -> NewestStaged:
        """The newest of the rows the tasks staged at `paths` for each key (lakehouse.ingest.newest, on the
        driver: Spark's windows over the staged files took seconds a batch)."""
        import pyarrow.parquet as pq

        keys = tuple(self.spec.target.key)
        if not paths:
            return NewestStaged(pa.table({}), keys)
        staged = []
        for path in paths:
            with io.new_input(path).open() as stream:
                staged.append(pq.read_table(stream))
        return NewestStaged(newest.newest_rows(pa.concat_tables(staged, promote_options="default"), keys), keys)


def ledger_entries(ledger: Table, tombstones: pa.Table) -> pa.Table:
    """`tombstones` (key columns and `_kafka`) as rows of the tombstone ledger `ledger`, applied now."""
    schema = ledger.schema().as_arrow()
    deleted_at = pa.array([datetime.now(UTC)] * tombstones.num_rows, schema.field(DELETED_AT).type)
    return pa.table([deleted_at if f.name == DELETED_AT else tombstones.column(f.name).cast(f.type) for f in schema],
                    schema=schema)


def insert_files(table: Table, rows: pa.Table) -> list:
    """`rows` (staged columns: `row_deltas.RowDelta.inserts`) as data files of `table` (pyiceberg DataFiles, written
    as an append task writes them), to be appended; none for no rows."""
    if not rows.num_rows:
        return []
    schema = taskwriter.task_schema(table.metadata)
    projected = pa.Table.from_arrays([rows.column(f.name).cast(f.type) for f in schema], schema=schema)
    files = taskwriter.write_data_files(table.io, table.metadata, projected, uuid.uuid4(), itertools.count())
    for data_file in files:  # pyiceberg's writer leaves it unset
        data_file.spec_id = table.metadata.default_spec_id
    return files


def after_ledger(held: row_deltas.Held, rows: pa.Table, keys: list[str]) -> pa.Table:
    """`rows` (`NewestStaged.rows`) without the upserts older than their key's tombstone in the tombstone ledger
    (`held`: its entries for `rows`' keys, `row_deltas.held_rows`; Kafka's order: a tombstone carries no source
    position), as `Upserts.after_tombstones` filters a replay's: an older change from another partition, or an old
    record replayed, cannot bring a deleted key back. Deletes are kept. The ledger may be read before or after
    the batch's own tombstones are recorded: a key whose newest record is an upsert has none among them."""
    upsert = pc.equal(rows.column(taskwriter.UPSERT_OP), "upsert").to_numpy(zero_copy_only=False)
    pairs = row_deltas.pairs(rows.select(keys), held.rows.select(keys), keys, "inner")
    row, match = pairs.column("_left").to_numpy(), pairs.column("_right").to_numpy()
    older = ~newest.newer_than(newest.coordinates_of(rows.column("_kafka").take(row)),
                               newest.coordinates_of(held.rows.column("_kafka").take(match)))
    outdated = row[older & upsert[row]]
    return rows.filter(pa.array(~np.isin(np.arange(rows.num_rows), outdated))) if len(outdated) else rows


def drop_staging(io: FileIO, paths: list[str]) -> None:
    """Delete an upsert's staging files once merged (left behind by a crash, maintenance removes them)."""
    for path in paths:
        try:
            io.delete(path)
        except Exception as exc:  # noqa: BLE001 - an orphan, not an error
            log.warning("could not delete staging file %s: %s", path, exc)
