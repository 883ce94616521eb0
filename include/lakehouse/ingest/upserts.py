"""An upsert pipeline's rows in Spark: a batch's rows per table, each key's newest record, the MERGE where the
newer record wins (lakehouse.core.newer), and the pipeline's ledger of tombstones that keeps a deleted key
deleted against older records (replays, a change stream's older change from another partition).

Used by the ingest job's commit of an upsert table (lakehouse.ingest.batch_commit) and by replays
(lakehouse.recovery.replay).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, In
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from lakehouse.core import newer, offsets, sparkenv
from lakehouse.core.offsets import TableProgress
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest import newest, taskwriter

log = logging.getLogger("lakehouse.ingest")

DELETED_AT = "_deleted_at"  # the tombstone ledger's column: when the pipeline applied the delete


@dataclass(frozen=True)
class NewestStaged:
    """An upsert batch's staging file of each key's newest row (`Upserts.newest_staged`)."""

    path: str  # "" when nothing was staged
    tombstones: pa.Table  # the keys whose newest record is a delete: the key's columns and `_kafka`
    schema: pa.Schema  # the file's, as written
    # given `newest_staged` the table, for a batch appended instead of merged: its upserts, left out of the
    # file (the staged columns without `_op`)
    fresh: pa.Table
    # whether the file holds a row the MERGE changes the table with (else, at most deletes of keys the table
    # does not hold, kept for the ledger's MERGE)
    merges: bool

    @property
    def paths(self) -> list[str]:
        return [self.path] if self.path else []

    @property
    def deletes(self) -> int:
        return int(self.tombstones.num_rows)


def spark_mappable(schema: pa.Schema) -> pa.Schema:
    """`schema` with its 64-bit-offset types as their 32-bit kin (`large_list` as `list`, `large_string` as
    `string`, `large_binary` as `binary`, at any depth), which PySpark maps to Spark's types (it maps no
    `large_list`); Parquet stores both alike, so Spark reads the file the same."""
    return pa.schema([field.with_type(_mappable(field.type)) for field in schema], metadata=schema.metadata)


def _mappable(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_mappable(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_mappable(t.key_type)), t.item_field.with_type(_mappable(t.item_type)),
                       keys_sorted=t.keys_sorted)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_mappable(f.type)) for f in t])
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


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

    def record_tombstones(self, ledger: Table, tombstones: pa.Table, latest) -> None:
        """Keep the batch's tombstones in the pipeline's ledger (`ledger`, as pyiceberg loaded it):
        `tombstones` (key columns and `_kafka`: `NewestStaged.tombstones`) are the deletes of `latest` (one
        record per key, `latest_per_key`), each kept when newer than its key's entry there in Kafka's order (a
        tombstone carries no source position).

        A key the ledger does not hold yet (one deleted once: most) needs no comparison: when it holds none of
        the batch's keys, the tombstones are appended by pyiceberg, without a Spark job (a MERGE of its own
        a batch otherwise). Otherwise Spark's MERGE keeps each key's newer tombstone. Either way the
        ledger holds one entry per key, and writing the same tombstones again (a batch tried again) changes
        nothing.

        Runs before the data table's commit: after a crash in between, the ledger knows of a delete the
        table has not applied yet, which only makes replays skip records that are older anyway. A batch
        without deletes needs no call.
        """
        from pyspark.sql import functions as F

        keys = list(self.spec.target.key)
        entries = ledger_entries(ledger, tombstones)
        if not ledger_holds(ledger, entries, keys):
            ledger.append(entries)
            return
        dead = latest.where(F.col("_op") == "delete") \
            .select(*keys, "_kafka", F.current_timestamp().alias(DELETED_AT))
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        sparkenv.merge(self.spark, dead,
                       f"MERGE INTO {self.spec.qualified('.'.join(ledger.name()))} t "
                       f"USING {{source}} s ON {on} "
                       f"WHEN MATCHED AND {newer.sql('s._kafka', 't._kafka')} "
                       f"THEN UPDATE SET t._kafka = s._kafka, t.{DELETED_AT} = s.{DELETED_AT} "
                       f"WHEN NOT MATCHED THEN INSERT *", {})

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

    def newest_staged(self, io: FileIO, paths: list[str], name: str, table: Table | None = None,
                      ledger: Table | None = None) -> NewestStaged:
        """The newest of the rows the tasks staged at `paths` for each key (lakehouse.ingest.newest, on the
        driver: Spark's windows over the staged files took seconds a batch), as one staging file beside
        them named after `name` (none when nothing is left to stage): the one file an upsert batch's MERGE
        reads. The caller deletes it once merged (`drop_staging`); a crash leaves it to orphan removal.

        Given the upsert `table` (at the snapshot the batch is committed on) and a change stream's tombstone
        `ledger`, a batch into a table without rows (an initial load's first batch, a change stream's
        snapshot) whose upserts' keys the ledger does not hold leaves its upserts out of the file, as
        `NewestStaged.fresh`: the MERGE would only insert them (no row to compare with, no tombstone to
        respect), which a plain append of the same rows does without Spark. Any other batch is merged whole:
        a MERGE's time hardly depends on how many of its rows are inserts (the table's scan and the job's
        stages are most of it), so looking up a batch's keys in a table that has rows, to append the new ones,
        spared no warm batch any time (docs/benchmarks.md)."""
        import pyarrow.parquet as pq

        if not paths:
            return NewestStaged("", pa.table({}), pa.schema([]), pa.table({}), merges=False)
        staged = []
        for path in paths:
            with io.new_input(path).open() as stream:
                staged.append(pq.read_table(stream))
        keys = list(self.spec.target.key)
        rows = newest.newest_rows(pa.concat_tables(staged, promote_options="default"), keys)
        upsert = pc.equal(rows.column(taskwriter.UPSERT_OP), "upsert")
        dead = rows.filter(pc.invert(upsert))
        fresh = rows.slice(0, 0)
        merges = bool(rows.num_rows)
        if table is not None:
            merges = holds_rows(table) or (ledger is not None and ledger_holds(ledger, rows.filter(upsert), keys))
            if not merges:
                fresh, rows = rows.filter(upsert), dead
        into = f"{paths[0].rsplit('/', 1)[0]}/{name}-newest.parquet" if rows.num_rows else ""
        try:
            if into:
                taskwriter.write_staging(io, into, rows)
        except BaseException:
            drop_staging(io, [into])
            raise
        return NewestStaged(into, dead.select([*keys, "_kafka"]), rows.schema,
                            fresh.drop_columns([taskwriter.UPSERT_OP]), merges)

    def staged_rows(self, table: str, newest: NewestStaged):
        """The rows of `newest` (`newest_staged`) for upsert `table`, its columns and `_op`, as a DataFrame.
        Spark is given the file's schema as written, not left to read it back (a Spark job a batch)."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        target = self.spark.table(self.spec.qualified(table))
        if not newest.path:
            return target.limit(0).withColumn(taskwriter.UPSERT_OP, F.lit(None).cast("string"))
        staged = self.spark.read.schema(from_arrow_schema(spark_mappable(newest.schema))).parquet(newest.path)
        return staged.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in target.schema.fields],
                             taskwriter.UPSERT_OP)


def ledger_entries(ledger: Table, tombstones: pa.Table) -> pa.Table:
    """`tombstones` (key columns and `_kafka`) as rows of the tombstone ledger `ledger`, applied now."""
    schema = ledger.schema().as_arrow()
    deleted_at = pa.array([datetime.now(UTC)] * tombstones.num_rows, schema.field(DELETED_AT).type)
    return pa.table([deleted_at if f.name == DELETED_AT else tombstones.column(f.name).cast(f.type) for f in schema],
                    schema=schema)


def insert_files(table: Table, rows: pa.Table) -> list:
    """`rows` (staged columns: `NewestStaged.fresh`) as data files of `table` (pyiceberg DataFiles, written
    as an append task writes them), to be appended; none for no rows."""
    if not rows.num_rows:
        return []
    schema = taskwriter.task_schema(table.metadata)
    projected = pa.Table.from_arrays([rows.column(f.name).cast(f.type) for f in schema], schema=schema)
    files = taskwriter.write_data_files(table.io, table.metadata, projected, uuid.uuid4(), itertools.count())
    for data_file in files:  # pyiceberg's writer leaves it unset
        data_file.spec_id = table.metadata.default_spec_id
    return files


def holds_rows(table: Table) -> bool:
    """Whether `table` has rows at its head (some may be deleted by delete files: a row count that does not
    say so counts as rows)."""
    head = table.current_snapshot()
    return head is not None and int(offsets.summary_properties(head).get("total-records", 1)) > 0


def ledger_holds(ledger: Table, entries: pa.Table, keys: list[str]) -> bool:
    """Whether the ledger holds an entry for any key of `entries` (its key columns read at its head; the
    files whose bounds rule out a batch's few integer or string keys are not read). A key with a null column
    matches nothing, as in the MERGE's join on equality."""
    if not entries.num_rows or ledger.current_snapshot() is None:
        return False
    row_filter: BooleanExpression = AlwaysTrue()
    for key in keys:
        column = entries.column(key)
        if pa.types.is_integer(column.type) or pa.types.is_string(column.type):
            row_filter = And(row_filter, In(term=key, literals=set(pc.unique(column.drop_null()).to_pylist())))
    held = ledger.scan(row_filter=row_filter, selected_fields=tuple(keys)).to_arrow()
    if not held.num_rows:
        return False
    wanted = entries.select(keys)
    return bool(wanted.join(held.select(keys).cast(wanted.schema), keys, join_type="left semi").num_rows)


def drop_staging(io: FileIO, paths: list[str]) -> None:
    """Delete an upsert's staging files once merged (left behind by a crash, maintenance removes them)."""
    for path in paths:
        try:
            io.delete(path)
        except Exception as exc:  # noqa: BLE001 - an orphan, not an error
            log.warning("could not delete staging file %s: %s", path, exc)
