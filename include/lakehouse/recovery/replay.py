"""Replay: re-ingest a known offset or time range, or dead letters after a contract fix.

Replays are idempotent: a row is inserted only if its source coordinates
(topic, partition, offset) are not in the table yet, in one atomic commit per
table, so each source offset is in the table exactly once afterwards however
often a replay runs. Upsert tables merge as ingestion does (the newer record
wins), and a record older than its key's newest tombstone in the pipeline's ledger
is left out, so a replay never brings back a deleted key. Replays never move the
pipeline's positions; their commits record the replayed ranges under
`lakehouse.kind=replay`, and the next publication audits them (the audit covers
every snapshot since the published head).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field, replace

from lakehouse.core import config, offsets, sparkenv
from lakehouse.core.errors import ReplayError
from lakehouse.core.offsets import OffsetRange, TableProgress
from lakehouse.core.spec import PipelineSpec, is_table_name
from lakehouse.ingest import tables
from lakehouse.ingest.job import IngestJob
from lakehouse.ingest.layout import batch_schema
from lakehouse.ingest.plan import BatchPlan, offsets_for_time
from lakehouse.ingest.reader import make_redecoder

COORDS = ("t._kafka.topic = s._kafka.topic AND t._kafka.partition = s._kafka.partition "
          "AND t._kafka.offset = s._kafka.offset")


@dataclass
class ReplayReceipt:
    pipeline: str
    kind: str  # replay | dead-letter-replay
    ranges: dict[int, tuple[int, int]]
    records: int
    inserted_by_table: dict[str, int] = field(default_factory=dict)
    dead_letters_resolved: int = 0
    dead_letters_added: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "kind": self.kind,
                "ranges": {str(p): list(r) for p, r in self.ranges.items()}, "records": self.records,
                "inserted_by_table": self.inserted_by_table,
                "dead_letters_resolved": self.dead_letters_resolved,
                "dead_letters_added": self.dead_letters_added, "seconds": round(self.seconds, 3)}


def parse_offset_ranges(text: str) -> dict[int, tuple[int, int]]:
    """`0:100-200,2:0-50` -> {0: (100, 200), 2: (0, 50)}: per partition, start inclusive, end exclusive."""
    ranges: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            partition, span = part.split(":")
            start, end = span.split("-")
            p, s, e = int(partition), int(start), int(end)
        except ValueError:
            raise ReplayError(f"offset range {part!r} is not PARTITION:START-END, e.g. 0:100-200") from None
        if p < 0 or s < 0 or e <= s:
            raise ReplayError(f"offset range {part!r}: need 0 <= START < END")
        if p in ranges:
            raise ReplayError(f"partition {p} is given twice")
        ranges[p] = (s, e)
    if not ranges:
        raise ReplayError("no offset ranges given")
    return ranges


def plan_ranges(spec: PipelineSpec, ranges: dict[int, tuple[int, int]], progress: list[TableProgress],
                state) -> BatchPlan:
    """The read plan of `ranges` given the tables' `progress` and the topic's `state`; raises ReplayError for
    a partition the topic lacks, offsets that aged out of Kafka, or a range past the committed position."""
    committed = offsets.committed_positions(progress, state.earliest)
    for p, (s, e) in sorted(ranges.items()):
        if p not in state.partitions:
            raise ReplayError(f"topic {spec.source.topic!r} has no partition {p}")
        ps = state.partitions[p]
        if s < ps.earliest:
            raise ReplayError(f"partition {p}: offsets before {ps.earliest} are no longer in Kafka "
                              f"(asked from {s})")
        if e > committed[p]:
            raise ReplayError(
                f"partition {p}: range [{s}, {e}) goes past the pipeline's committed position {committed[p]}; "
                f"records from there on are the live ingestion's to write "
                f"(run `lakehouse ingest --pipeline {spec.name} --once`)")
    return BatchPlan(topic=spec.source.topic, topic_id=state.topic_id,
                     ranges=tuple(OffsetRange(spec.source.topic, p, s, e) for p, (s, e) in sorted(ranges.items())),
                     ends={p: ps.end for p, ps in state.partitions.items()})


@dataclass
class ReplayPreview:
    """What a replay would do, read without Spark and without writing: the offset ranges it would read (after
    a time range is resolved), how many records they hold (or how many dead letters it would decode again),
    the tables it would write and whether `--into-table` would create its table."""

    pipeline: str
    kind: str  # replay | dead-letter-replay
    ranges: dict[int, tuple[int, int]]
    records: int
    tables: list[str]
    creates_table: bool = False

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "kind": self.kind, "dry_run": True,
                "ranges": {str(p): list(r) for p, r in self.ranges.items()}, "records": self.records,
                "tables": self.tables, "creates_table": self.creates_table}

    def render(self) -> str:
        if self.kind == "dead-letter-replay":
            what = f"would decode {self.records} dead letters again"
        else:
            shown = " ".join(f"p{p}:[{s},{e})" for p, (s, e) in sorted(self.ranges.items())) or "no ranges"
            what = f"would replay {self.records} records ({shown})"
        return (f"dry run: {what} into {', '.join(self.tables)}"
                + (" (created from the contract: it does not exist)" if self.creates_table else "")
                + "; nothing written")


def preview(spec: PipelineSpec, platform: config.PlatformConfig, ranges: dict[int, tuple[int, int]] | None = None,
            from_ms: int | None = None, to_ms: int | None = None, dead_letters: bool = False,
            error_kind: str | None = None,
            into_table: str | None = None) -> ReplayPreview:
    """What `lakehouse replay` with these arguments would read and write; reads the catalog and Kafka, starts no
    Spark session and creates nothing. Raises ReplayError for what the replay itself would refuse."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.expressions import And, BooleanExpression, EqualTo

    from lakehouse.core.catalog import open_catalog
    from lakehouse.ingest.plan import topic_state_for

    catalog = open_catalog(platform, spec.catalog)
    if dead_letters:
        try:
            table = catalog.load_table(spec.dead_letter_table)
        except NoSuchTableError:
            count = 0
        else:
            row_filter: BooleanExpression = EqualTo(term="pipeline", value=spec.name)
            if error_kind:
                row_filter = And(row_filter, EqualTo(term="error_kind", value=error_kind))
            count = table.scan(row_filter=row_filter, selected_fields=("pipeline",)).to_arrow().num_rows
        return ReplayPreview(spec.name, "dead-letter-replay", {}, count,  # valid ones move out of the DLQ
                             [spec.qualified(t) for t in (*spec.target.tables, spec.dead_letter_table)])
    if into_table and into_table in spec.owned_tables:
        raise ReplayError(f"{into_table} is a table of pipeline {spec.name}; replay in place instead")
    progress = [offsets.read_progress(catalog, t, spec.name) for t in spec.positioned_tables]
    kafka_conf = platform.kafka(logger=logging.getLogger("lakehouse.kafka"))
    state = topic_state_for(kafka_conf, spec.source.topic, progress)
    if ranges is None:
        if from_ms is None:
            raise ReplayError("a replay reads offset ranges, a time range or the dead letters: give one of them")
        ends = {p: ps.end for p, ps in state.partitions.items()}
        starts = offsets_for_time(kafka_conf, spec.source.topic, ends, from_ms, ends)
        stops = ends if to_ms is None else offsets_for_time(kafka_conf, spec.source.topic, ends, to_ms, ends)
        ranges = {p: (starts[p], stops[p]) for p in ends if stops[p] > starts[p]}
    plan = plan_ranges(spec, ranges, progress, state) if ranges else None
    if into_table:
        try:
            catalog.load_table(into_table)
            creates = False
        except NoSuchTableError:
            creates = True
        written = [spec.qualified(into_table)]
    else:
        creates, written = False, [spec.qualified(t) for t in (*spec.target.tables, spec.dead_letter_table)]
    return ReplayPreview(spec.name, "replay", plan.range_map() if plan else {},
                         plan.record_count if plan else 0, written, creates)


class Replay:
    """Replays of one pipeline, sharing the ingest job's reader and writers."""

    def __init__(self, job: IngestJob):
        self.job = job
        self.spec = job.spec
        self.spark = job.spark

    def resolve_time_range(self, from_ms: int, to_ms: int | None) -> dict[int, tuple[int, int]]:
        state = self.job.topic_state()
        ends = {p: ps.end for p, ps in state.partitions.items()}
        conf = self.job.kafka_conf
        starts = offsets_for_time(conf, self.spec.source.topic, ends, from_ms, ends)
        stops = ends if to_ms is None else offsets_for_time(conf, self.spec.source.topic, ends, to_ms, ends)
        return {p: (starts[p], stops[p]) for p in ends if stops[p] > starts[p]}

    def offsets(self, ranges: dict[int, tuple[int, int]]) -> ReplayReceipt:
        """Re-ingest `ranges` (partition -> [start, end)); raises ReplayError for ranges it cannot serve."""
        started = time.monotonic()
        plan = self.plan(ranges)
        df = self.job.read_plan(plan).persist()
        try:
            receipt = ReplayReceipt(self.spec.name, "replay", plan.range_map(), plan.record_count)
            self._write(df, receipt, dead_letters_from_kafka=True)
        finally:
            df.unpersist()
        receipt.seconds = time.monotonic() - started
        return receipt

    def into_table(self, ranges: dict[int, tuple[int, int]], table: str) -> ReplayReceipt:
        """Write the valid records of `ranges` into `table` (namespace.table), not the pipeline's tables.

        The table is created from the contract when missing (evolved like the pipeline's
        tables when it exists) and takes the rows of every route; rows are inserted only
        if their source coordinates are absent (upsert tables merge by key), so repeated
        runs add nothing. Dead letters stay where ingestion put them. Raises ReplayError
        for ranges it cannot serve or when `table` is one of the pipeline's own tables.
        """
        from pyspark.sql import functions as F

        if not is_table_name(table):
            raise ReplayError(f"{table!r} is not a table name: use namespace.table in lower case, e.g. raw.orders_v2")
        if table in self.spec.owned_tables:
            raise ReplayError(f"{table} is a table of pipeline {self.spec.name}; replay in place instead")
        started = time.monotonic()
        plan = self.plan(ranges)
        into = replace(self.spec, target=replace(self.spec.target, table=table, fanout=None))
        tables.ensure_tables(self.spark, self.job.catalog, into)
        # every valid record is routed to `table`; columns the live tables quarantine stay empty there too
        df = self.job.read_plan(plan).withColumn(
            "_route", F.when(F.col("_route").isNotNull(), F.lit(table))).persist()
        try:
            receipt = ReplayReceipt(self.spec.name, "replay", plan.range_map(), plan.record_count)
            upserts = self.job.upserts()
            rows = upserts.rows_for(table, df, TableProgress(table, True))
            receipt.inserted_by_table[table] = self._absent(rows, table).count()
            if self.spec.target.mode == "upsert":
                upserts.merge(table, rows, self._summary(receipt), respect_tombstones=True)
            else:
                self._insert_absent(table, rows, self._summary(receipt))
        finally:
            df.unpersist()
        receipt.seconds = time.monotonic() - started
        return receipt

    def plan(self, ranges: dict[int, tuple[int, int]]) -> BatchPlan:
        """The read plan of `ranges`; raises ReplayError for a partition the topic lacks, offsets that
        aged out of Kafka, or a range past the pipeline's committed position."""
        progress = self.job.progress()
        return plan_ranges(self.spec, ranges, progress, self.job.topic_state(progress))

    def dead_letters(self, error_kind: str | None = None) -> ReplayReceipt:
        """Decode dead letters again with the current contract; those now valid move to their table."""
        from pyspark.sql import functions as F

        started = time.monotonic()
        dlq = self.spark.table(self.spec.qualified(self.spec.dead_letter_table)) \
            .where(F.col("pipeline") == self.spec.name)
        if error_kind:
            dlq = dlq.where(F.col("error_kind") == error_kind)
        _, ddl = batch_schema(self.spec)
        redecoded = dlq.select("_kafka", "key", "value", "headers").mapInArrow(
            make_redecoder(self.job.schemas.task_spec(self.spec), self.job.quarantined, int(time.time() * 1_000_000),
                           writer_schemas=self.job.schemas.writer_schemas()), ddl).persist()
        try:
            records = redecoded.count()
            receipt = ReplayReceipt(self.spec.name, "dead-letter-replay", {}, records)
            if records:
                self._write(redecoded, receipt, dead_letters_from_kafka=False)
        finally:
            redecoded.unpersist()
        receipt.seconds = time.monotonic() - started
        return receipt

    def _summary(self, receipt: ReplayReceipt) -> dict[str, str]:
        return offsets.commit_summary(self.spec.name, receipt.kind, self.spec.source.topic, receipt.ranges,
                                      uuid.uuid4().hex)

    def _absent(self, rows, table: str):
        """`rows` whose source coordinates are not in `table`."""
        held = self.spark.table(self.spec.qualified(table)).select(
            "_kafka.topic", "_kafka.partition", "_kafka.offset")
        keyed = rows.select("_kafka.topic", "_kafka.partition", "_kafka.offset")
        return keyed.join(held, ["topic", "partition", "offset"], "left_anti")

    def _write(self, df, receipt: ReplayReceipt, dead_letters_from_kafka: bool) -> None:
        from pyspark.sql import functions as F

        summary = self._summary(receipt)
        upserts = self.job.upserts()
        for table in self.spec.target.tables:
            rows = upserts.rows_for(table, df, TableProgress(table, True))
            receipt.inserted_by_table[table] = self._absent(rows, table).count()
            if self.spec.target.mode == "upsert":
                upserts.merge(table, rows, summary, respect_tombstones=True)
            else:
                self._insert_absent(table, rows, summary)
        # dead letters: drop those now in a table, add rejected ones not there yet
        dlq_rows = df.select(*tables.dead_letter_columns(self.spec.name), F.col("_route").isNotNull().alias("_valid"))
        if not dead_letters_from_kafka:
            dlq_rows = dlq_rows.where("_valid")
        held = self.spark.table(self.spec.qualified(self.spec.dead_letter_table)).select(
            "_kafka.topic", "_kafka.partition", "_kafka.offset")
        coords = dlq_rows.select("_kafka.topic", "_kafka.partition", "_kafka.offset", "_valid")
        receipt.dead_letters_resolved = coords.where("_valid").join(
            held, ["topic", "partition", "offset"], "left_semi").count()
        receipt.dead_letters_added = coords.where("NOT _valid").join(
            held, ["topic", "partition", "offset"], "left_anti").count()
        cols = [c for c in dlq_rows.columns if c != "_valid"]
        sparkenv.merge(self.spark, dlq_rows,
                       f"MERGE INTO {self.spec.qualified(self.spec.dead_letter_table)} t USING {{source}} s "
                       f"ON {COORDS} WHEN MATCHED AND s._valid THEN DELETE "
                       f"WHEN NOT MATCHED AND NOT s._valid THEN INSERT ({', '.join(cols)}) "
                       f"VALUES ({', '.join('s.' + c for c in cols)})", summary)

    def _insert_absent(self, table: str, rows, summary: dict[str, str]) -> None:
        cols = ", ".join(f"`{c}`" for c in rows.columns)
        values = ", ".join(f"s.`{c}`" for c in rows.columns)
        sparkenv.merge(self.spark, rows,
                       f"MERGE INTO {self.spec.qualified(table)} t USING {{source}} s ON {COORDS} "
                       f"WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({values})", summary)
