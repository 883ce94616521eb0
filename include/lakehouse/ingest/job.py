"""The ingest job: Kafka offset ranges -> data files written by Spark tasks -> one atomic Iceberg
commit per table.

One batch, top to bottom:
1. progress  read each table's committed positions from its snapshot summaries;
2. plan      find the log end per partition, plan `[position, end)` within the batch budget,
             cut and pack the ranges into about two tasks per core;
3. write     one Spark job: each task reads its ranges, decodes and validates every record,
             routes rows to their table and rejected records to the dead-letter table, and
             writes the Parquet data files itself (lakehouse.ingest.taskwriter); only file
             descriptions and counts come back;
4. commit    per table (data tables first), one fenced commit by lakehouse.ingest.committer whose
             summary carries the offsets it holds and the new positions: the tasks' files
             appended, or an upsert's staged rows merged by Spark;
5. publish   commit the consumer group's offsets, for monitoring tools only.

A crash anywhere leaves each table either with the whole batch or none of it (files
written but never committed are orphans), and the next run starts from what the tables
say. A job whose tables were claimed by a newer ingest job of the pipeline stops
(WriterFencedError). Transient failures (a locked or unreachable catalog, a stalled
broker) are retried with backoff within `supervision.retry_budget`; a record whose
decoding crashes a Spark task is dead-lettered as `reader_failure` and the batch runs
again without it.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from lakehouse.core import config, errors, events, hooks, lineage, offsets, retry, schemas, sparkenv
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import IngestError, PlanStaleError
from lakehouse.core.offsets import TableProgress
from lakehouse.core.spec import FORMAT_SCHEMA_TYPES, PipelineSpec, load_spec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest import committer, formats, tables, taskwriter
from lakehouse.ingest.layout import batch_schema
from lakehouse.ingest.plan import BatchPlan, plan_batch, split_for_tasks, task_groups, topic_state_for
from lakehouse.ingest.reader import make_reader
from lakehouse.ingest.records import Rejected, WriterSchemas
from lakehouse.ingest.taskwriter import TableTarget, TaskResult

log = logging.getLogger("lakehouse.ingest")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The stages of a batch, in order; their seconds add up to the batch's (plus recording the event):
#   plan          read the tables' positions, find the log ends, plan the ranges
#   read, decode, the Spark job whose tasks fetch the records, decode them and write the files, split
#   write         by the share of task time in consumer.consume (read), decoding and building Arrow
#                 batches (decode) and routing and writing Parquet (write); plus an upsert's MERGE
#   commit        the table commits: manifests, the catalog swap, conflict retries
#   group_commit  the consumer group's offsets (monitoring only)
STAGES = ("plan", "read", "decode", "write", "commit", "group_commit")
COMMIT_ATTEMPTS = 6
# timeline events kept while the catalog cannot take them (the newest are kept)
MAX_UNRECORDED_EVENTS = 1000
# a batch whose tasks keep failing on different records is broken in a way dead-lettering cannot fix
MAX_POISONED_PER_BATCH = 100
# Which of two records of one key is newer (s: incoming, t: held): within a partition the higher
# offset, across partitions the later Kafka timestamp.
NEWER = ("((s._kafka.partition = t._kafka.partition AND s._kafka.offset > t._kafka.offset) OR "
         "(s._kafka.partition <> t._kafka.partition AND s._kafka.timestamp >= t._kafka.timestamp))")
# A change stream orders a key's changes by the source: across partitions the later position in the
# source's log, else the later commit time, else the later Kafka timestamp.
NEWER_CDC = ("((s._kafka.partition = t._kafka.partition AND s._kafka.offset > t._kafka.offset) OR "
             "(s._kafka.partition <> t._kafka.partition AND CASE "
             "WHEN s._cdc.position IS NOT NULL AND t._cdc.position IS NOT NULL AND s._cdc.position <> t._cdc.position "
             "THEN s._cdc.position > t._cdc.position "
             "WHEN s._cdc.source_ts IS NOT NULL AND t._cdc.source_ts IS NOT NULL "
             "AND s._cdc.source_ts <> t._cdc.source_ts THEN s._cdc.source_ts > t._cdc.source_ts "
             "ELSE s._kafka.timestamp >= t._kafka.timestamp END))")


@dataclass
class Written:
    """What the tasks of one batch wrote: files per table and the batch's numbers, summed."""

    files: dict[str, list] = field(default_factory=dict)  # table -> pyiceberg DataFiles
    staged: dict[str, list[str]] = field(default_factory=dict)  # upsert table -> staging Parquet files
    rows: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    max_event_us: int | None = None
    min_kafka_us: int | None = None
    seconds: float = 0.0  # wall time of the Spark job
    read_s: float = 0.0  # task seconds, summed over the tasks
    decode_s: float = 0.0
    write_s: float = 0.0
    tasks: int = 0
    busy_s: float = 0.0  # wall seconds from each task's start to its end, summed over the tasks
    launch_s: float = 0.0  # from the job's start to its first task's start (scheduling, worker hand-off)
    tail_s: float = 0.0  # from the last task's end to the results on the driver

    @classmethod
    def of(cls, results: list[TaskResult], started: float, ended: float) -> Written:
        """The tasks' `results` of a Spark job that ran from `started` to `ended` (time.time)."""
        out = cls(seconds=ended - started, tasks=len(results))
        for r in results:
            for table, files in r.files.items():
                out.files.setdefault(table, []).extend(files)
            for table, paths in r.staged.items():
                out.staged.setdefault(table, []).extend(paths)
            for table, n in r.rows.items():
                out.rows[table] = out.rows.get(table, 0) + n
            out.dead_letters += r.dead_letters
            if r.max_event_us is not None:
                out.max_event_us = max(r.max_event_us, out.max_event_us or r.max_event_us)
            if r.min_kafka_us is not None:
                out.min_kafka_us = min(r.min_kafka_us, out.min_kafka_us or r.min_kafka_us)
            out.read_s += r.read_s
            out.decode_s += r.decode_s
            out.write_s += r.write_s
            out.busy_s += r.ended - r.started
        if results:
            out.launch_s = max(0.0, min(r.started for r in results) - started)
            out.tail_s = max(0.0, ended - max(r.ended for r in results))
        return out

    @property
    def max_event_time(self) -> datetime | None:
        return _utc(self.max_event_us) if self.max_event_us is not None else None

    @property
    def min_kafka_time(self) -> datetime | None:
        return _utc(self.min_kafka_us) if self.min_kafka_us is not None else None


@dataclass
class TableCommit:
    table: str
    rows: int
    snapshot_id: int | None
    attempts: int
    skipped: bool = False  # the table already held this batch (a retried or resumed commit)
    files: int = 0  # data files the commit added (snapshot summary `added-data-files`)
    bytes: int = 0  # their size (`added-files-size`)
    seconds: float = 0.0  # writing the files and committing, retries included
    write_seconds: float = 0.0  # of which the Spark jobs that wrote the data files (the last attempt)


@dataclass
class BatchReceipt:
    """What one batch read and where it went."""

    pipeline: str
    batch_id: str
    ranges: dict[int, tuple[int, int]]
    records: int
    rows_by_table: dict[str, int]
    dead_letters: int
    commits: list[TableCommit] = field(default_factory=list)
    max_event_time: datetime | None = None
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0
    log_ends: dict[int, int] = field(default_factory=dict)  # per partition, the log end the plan saw
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (STAGES) and task totals
    tasks: int = 0  # Spark tasks that read and wrote the batch

    @property
    def commit_retries(self) -> int:
        return sum(c.attempts - 1 for c in self.commits)

    @property
    def lag_records(self) -> int:
        """Records between the batch's end and the log end the plan saw (0: caught up)."""
        return sum(max(0, end - self.ranges.get(p, (end, end))[1]) for p, end in self.log_ends.items())

    def metrics(self, now: datetime | None = None) -> dict[str, float]:
        """The batch's numbers for the ops timeline (`batch` events) and /metrics."""
        now = now or datetime.now(UTC)
        files = sum(c.files for c in self.commits)
        size = sum(c.bytes for c in self.commits)
        out = {"records": self.records, "rows": sum(self.rows_by_table.values()), "dead_letters": self.dead_letters,
               "commit_retries": self.commit_retries, "files_added": files, "bytes_added": size,
               "mean_file_bytes": size / files if files else 0.0, "lag_records": self.lag_records,
               "seconds": round(self.seconds, 3), "commit_age_s": 0.0, "tasks": self.tasks}
        out.update({f"{stage}_s": round(value, 3) for stage, value in self.timings.items()})
        if self.max_event_time is not None:
            out["freshness_s"] = round((now - self.max_event_time).total_seconds(), 3)
        return out

    def to_json(self) -> dict:
        return {
            "pipeline": self.pipeline, "batch_id": self.batch_id,
            "ranges": {str(p): list(r) for p, r in self.ranges.items()},
            "records": self.records, "rows_by_table": self.rows_by_table, "dead_letters": self.dead_letters,
            "commit_retries": self.commit_retries,
            "max_event_time": self.max_event_time.isoformat() if self.max_event_time else None,
            "gaps": {str(p): list(r) for p, r in self.gaps.items()}, "seconds": round(self.seconds, 3),
        }


def _created_ms(table: Table) -> int:
    """When `table` was created: its first metadata file's time (the metadata log keeps the oldest ones of a
    table with few commits), else its only metadata's."""
    log = table.metadata.metadata_log
    return log[0].timestamp_ms if log else table.metadata.last_updated_ms


class IngestJob:
    """Runs batches of one pipeline against the platform's Kafka and catalog.

    Besides running batches (`run_once`, `run_continuous`, `run_batch`), a job is what replays
    (lakehouse.recovery.replay) and the benchmark build on; their public surface, and only it, is
    kept stable for them:

    - attributes `spec`, `platform`, `spark`, `catalog`, `kafka_conf` (the librdkafka settings)
      and `quarantined` (columns a schema change quarantined, left empty);
    - `progress()` and `topic_state()`: where each table stands and what Kafka holds;
    - `writer()`: this job's claim on the pipeline's tables (claimed once, fenced by a newer job);
    - `read_plan(plan)`: a plan's records, decoded, as a Spark DataFrame of `batch_schema` rows;
    - `rows_for(...)`: such rows for one table, in its columns; `merge_upsert(...)`: an upsert MERGE;
    - `commit_table(...)`: one table's fenced, atomic commit of a batch's written files.

    Everything with a leading underscore is the batch's own machinery and may change.
    """

    def __init__(self, spec: PipelineSpec, platform: config.PlatformConfig | None = None, spark=None,
                 accept_gap: bool = False):
        self.platform = platform or config.load()
        self.spec = spec
        self.accept_gap = accept_gap
        self.spark = spark or sparkenv.session(self.platform, [spec.catalog], f"lakehouse-ingest-{spec.name}")
        self.catalog = open_catalog(self.platform, spec.catalog)
        self.kafka_conf = self.platform.kafka()
        # Writer schemas of a wire format (none at all is said now, not in every task). Only the driver talks
        # to the registry; the tasks get the schemas it resolved with the spec (task_spec, writer_schemas).
        self._schemas = formats.schema_store(spec, self.platform.schema_registry()) if spec.wire_formats else None
        self.accepted_schemas: dict[int, tuple] = {}  # id -> fields: the tables were evolved for it
        self.resolved_schemas: dict[int, tuple[int, str, str]] = {}  # ids fetched from the registry, as shipped
        self.missing_schemas: set[int] = set()  # ids the registry does not have
        self._faults = hooks.faults()
        self._faults.check()
        self._spec_mtime = self._mtime()
        self._unrecorded: list[events.Event] = []  # timeline events not written yet (catalog outage)
        tables.check_default_table(self.catalog, spec)  # a renamed target.table stops before anything is created
        self._prefetch_schemas()
        self.quarantined = tables.ensure_tables(self.spark, self.catalog, self.spec, self._layout_changed)
        self._writer: committer.Writer | None = None  # claimed before the first commit
        self._start_new_tables()
        sparkenv.warm_python_workers(self.spark, ("lakehouse.ingest.taskwriter", "pyiceberg.io.pyarrow"))
        self._stop = threading.Event()
        # task seconds spent reading and decoding, summed over every task of the job (a stage clock)
        self._task_clock = (self.spark.sparkContext.accumulator(0.0), self.spark.sparkContext.accumulator(0.0))
        # records whose decoding crashed a Spark task: (partition, offset) -> why; dead-lettered unread
        self.poisoned: dict[tuple[int, int], str] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def _mtime(self) -> float:
        """When the spec, or the folder of writer schemas it names (a new `<id>.avsc`), last changed."""
        found = 0.0
        for path in (self.spec.path, self.spec.source.schemas_dir):
            try:
                found = max(found, Path(path).stat().st_mtime) if path else found
            except OSError:
                pass
        return found

    def _start_new_tables(self) -> None:
        """A table added to a pipeline that already ingests (a new fan-out route's table, a renamed dead-letter
        table) starts where the pipeline stands, not at Kafka's earliest offset: every record below the
        committed position was already written to one of the other tables (a record of the new route to the
        default table), so reading them again for it would hold them twice. An empty commit records the
        committed position as the new table's own (no rows, no offsets: `lakehouse.offsets` empty), fenced by
        this job's claim; the next batch starts there for every table. A table created with the others (a new
        pipeline) starts at the earliest offset with them.

        Refused (TableStateError, nothing changed) while the other tables stand at different positions: a batch
        was cut short between two of its commits, and the records of the unfinished part would be routed anew,
        some to the new table and some not, from different starting points. Finishing that batch with the
        spec as it was, then adding the table, keeps every record once."""
        progress, loaded = self._progress_and_tables()
        started = [tp for tp in progress if tp.positions]
        first_commit = min((s.timestamp_ms for tp in started for s in loaded[tp.table].metadata.snapshots),
                           default=None)
        # created after the pipeline's first commit (a table created with the others that never committed, a
        # dead-letter table whose first batch was cut short, resumes from the earliest offset with them)
        new = [tp for tp in progress if tp.exists and not tp.positions and not tp.total_records
               and first_commit is not None and _created_ms(loaded[tp.table]) > first_commit]
        if not new:
            return
        if any(tp.positions != started[0].positions for tp in started):
            stands = "; ".join(f"{tp.table} at {offsets.encode_positions(tp.positions)}" for tp in started)
            raise errors.TableStateError(
                f"pipeline {self.spec.name!r}: {', '.join(tp.table for tp in new)} would join the pipeline while "
                f"its tables stand at different positions ({stands}): a batch was cut short between its commits. "
                f"Run `lakehouse ingest --pipeline {self.spec.name} --once` with the spec as it was before the "
                f"new table(s), then start again with the new spec.")
        position = dict(started[0].positions)
        topic_ids = {tp.topic_id for tp in started if tp.topic_id}
        writer = self.writer()
        for tp in new:
            summary = {SnapshotSummary.PIPELINE: self.spec.name, SnapshotSummary.KIND: "ingest",
                       SnapshotSummary.TOPIC: self.spec.source.topic,
                       SnapshotSummary.TOPIC_ID: next(iter(topic_ids)) if len(topic_ids) == 1 else "",
                       SnapshotSummary.RANGES: offsets.encode_ranges({}),
                       SnapshotSummary.POSITIONS: offsets.encode_positions(position),
                       SnapshotSummary.BATCH: f"start-{uuid.uuid4().hex[:12]}",
                       SnapshotSummary.WRITER: writer.writer_id}
            committer.append_files(self.catalog, loaded[tp.table], [], summary, writer.fence(None))
            log.info("pipeline %s: new table %s starts at the committed position %s", self.spec.name, tp.table,
                     position)
            self._record_best_effort(events.Event(
                self.spec.name, "layout", "ok",
                f"{tp.table} joins the pipeline at its committed position (records before it are in the other "
                f"tables)", details={"table": tp.table, "positions": {str(p): o for p, o in position.items()}}))

    def reload_spec_if_changed(self) -> bool:
        """Pick up an edited spec between batches: additive schema evolution and the tables' layout
        (partitioning, properties) without stopping. A change of pipeline name, topic or tables raises
        IngestError, one the tables cannot follow (write mode, upsert key) LayoutChangeRefused; the
        tables are left as they were."""
        mtime = self._mtime()
        if mtime == self._spec_mtime:
            return False
        spec = self._with_accepted_schemas(load_spec(self.spec.path))
        if (spec.name, spec.source.topic, spec.target.tables, spec.dead_letter_table) != \
                (self.spec.name, self.spec.source.topic, self.spec.target.tables, self.spec.dead_letter_table):
            raise IngestError(f"{spec.path}: pipeline name, topic or tables changed while running; restart it")
        self.quarantined = tables.ensure_tables(self.spark, self.catalog, spec, self._layout_changed)
        if spec.wire_formats:  # the folder's writer schemas as they are now
            self._schemas = formats.schema_store(spec, self.platform.schema_registry())
        self.spec, self._spec_mtime = spec, mtime
        log.info("reloaded spec %s", spec.path)
        return True

    def _prefetch_schemas(self) -> None:
        """Fetch every version of the topic's subjects (`<topic>-value`, `<topic>-key`: Confluent's default
        naming) from the registry, so that tasks rarely meet an id they were not shipped; a contract that
        follows the writer schemas takes the compatible ones now. A registry that does not answer is
        logged: the ids are fetched when met."""
        store = self._schemas
        if store is None or store.registry is None:
            return
        subjects = [(f"{self.spec.source.topic}-value", True)]
        if self.spec.source.key_format in FORMAT_SCHEMA_TYPES:
            subjects.append((f"{self.spec.source.topic}-key", False))
        for subject, values in subjects:
            try:
                ids = store.subject_versions(subject)
            except errors.SchemaRegistryUnavailableError as exc:
                log.warning("pipeline %s: %s; writer schemas are fetched when the tasks meet them", self.spec.name, exc)
                return
            for schema_id in ids:
                self._ship(store, schema_id)
                if values and self.spec.contract.from_writer_schema:
                    self._accept_if_compatible(store, schema_id)

    def _ship(self, store: formats.SchemaStore, schema_id: int) -> None:
        if schema_id not in store.declared:
            self.resolved_schemas[schema_id] = store.shipped(schema_id)

    def _accept_if_compatible(self, store: formats.SchemaStore, schema_id: int) -> None:
        writer = store.resolve(schema_id)
        if writer.schema_type != FORMAT_SCHEMA_TYPES[self.spec.source.value_format]:
            return
        try:
            found = writer.fields(self.spec.source.envelope)
        except errors.SchemaTranslationError:
            return  # met in a record, it follows schema_policy then
        diff = schemas.compare(self.spec.contract.fields, found)
        if not diff.incompatible and not (diff.added and self.spec.schema_policy.on_additive == "fail"):
            self.accepted_schemas[schema_id] = found
            self.spec = self._with_accepted_schemas(self.spec)

    def task_spec(self) -> PipelineSpec:
        """The spec as reader tasks get it: with the writer schemas the driver fetched from the registry."""
        if not self.resolved_schemas:
            return self.spec
        shipped = (*self.spec.source.schemas, *(self.resolved_schemas[i] for i in sorted(self.resolved_schemas)))
        return replace(self.spec, source=replace(self.spec.source, schemas=shipped))

    def writer_schemas(self) -> WriterSchemas:
        """What reader tasks are told of writer schemas beyond those shipped (records.WriterSchemas)."""
        return WriterSchemas(resolvable=self._schemas is not None and self._schemas.registry is not None,
                             accepted=frozenset(self.accepted_schemas), missing=frozenset(self.missing_schemas))

    def _with_accepted_schemas(self, spec: PipelineSpec) -> PipelineSpec:
        """`spec` whose contract follows the writer schemas, with the writer schemas this job already
        evolved the table for merged in (a reloaded spec derives its contract from the folder only)."""
        if not spec.contract.from_writer_schema or not self.accepted_schemas:
            return spec
        fields = spec.contract.fields
        for found in self.accepted_schemas.values():
            fields = schemas.merge(fields, found)
        return replace(spec, contract=replace(spec.contract, fields=fields))

    def _evolve_for(self, store: formats.SchemaStore, schema_id: int) -> None:
        """Make the contract and the tables follow writer schema `schema_id`, which a task met first: add its
        fields, widen its types (schema_policy.on_additive 'fail' refuses new fields instead)."""
        found = store.resolve(schema_id).fields(self.spec.source.envelope)
        diff = schemas.compare(self.spec.contract.fields, found)
        if diff.added and self.spec.schema_policy.on_additive == "fail":
            raise errors.SchemaIncompatibleError(
                f"{self.spec.path}: writer schema {schema_id} adds {', '.join(diff.added)} and "
                f"schema_policy.on_additive is 'fail'; set it to 'evolve' to add them to the tables")
        self.accepted_schemas[schema_id] = found
        spec = self._with_accepted_schemas(self.spec)
        self.quarantined = tables.ensure_tables(self.spark, self.catalog, spec, self._layout_changed)
        self.spec = spec
        changes = "; ".join(f"{what} {', '.join(paths)}" for what, paths in
                            (("added", diff.added), ("widened", diff.widened), ("now optional", diff.relaxed))
                            if paths)
        log.info("pipeline %s: writer schema %d evolved the tables: %s", self.spec.name, schema_id, changes)
        self._record_best_effort(events.Event(
            self.spec.name, "schema", "ok", f"writer schema {schema_id} evolved the tables: {changes}"[:2000],
            details={"schema_id": schema_id, "added": diff.added, "widened": diff.widened,
                     "relaxed": diff.relaxed, "tables": list(self.spec.target.tables)}))

    def _layout_changed(self, drift: tables.LayoutDrift) -> None:
        """A `layout` event on the ops timeline: a data table now follows an edited spec."""
        self._record_best_effort(events.Event(
            self.spec.name, "layout", "ok", f"{drift.table} follows the spec: " + "; ".join(drift.describe()),
            details=drift.to_json()))

    def request_stop(self, *_args) -> None:
        self._stop.set()

    def run_once(self, on_batch=None) -> list[BatchReceipt]:
        """Catch up to the log end of every partition as found at the start, then return."""
        receipts: list[BatchReceipt] = []
        state = self.topic_state()  # first: a refused login fails here at once, not in a group commit
        self.sync_group_offsets()
        target = {p: ps.end for p, ps in state.partitions.items()}
        while not self._stop.is_set():
            capped = {p: replace(ps, end=min(ps.end, target.get(p, ps.end))) for p, ps in state.partitions.items()}
            receipt = self.run_batch(state=replace(state, partitions=capped))
            if receipt is None:
                break
            if receipts and receipt.ranges == receipts[-1].ranges:
                raise IngestError(f"no progress: batch {receipt.ranges} was planned twice; "
                                  f"the tables' positions did not advance")
            receipts.append(receipt)
            if on_batch:
                on_batch(receipt)
            state = self.topic_state()
        return receipts

    def run_continuous(self, interval_s: float | None = None, on_batch=None, max_batches: int | None = None) -> int:
        """Commit one batch per trigger until SIGTERM/SIGINT; the batch in flight finishes first."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        self.topic_state()  # a refused login fails here at once, not after the group commit's timeout
        self.sync_group_offsets()
        batches = 0
        while not self._stop.is_set():
            started = time.monotonic()
            receipt = self.run_batch()
            if receipt is not None:
                batches += 1
                if on_batch:
                    on_batch(receipt)
            if max_batches is not None and batches >= max_batches:
                break
            interval = self.spec.trigger.interval_s if interval_s is None else interval_s
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
        return batches

    # -- one batch ---------------------------------------------------------------------------

    def topic_state(self, progress: list[TableProgress] | None = None):
        """The topic's partitions (earliest offset, log end) and id, probed from where the tables stand
        (`progress`, read now when not given) and checked against the topic id they recorded."""
        return topic_state_for(self.kafka_conf, self.spec.source.topic,
                               progress if progress is not None else self.progress())

    def _tables(self) -> list[str]:
        return list(self.spec.positioned_tables)

    def progress(self) -> list[TableProgress]:
        """Each table's progress; raises PositionsLostError when a table holds rows but its positions
        cannot be found (resume fails closed), and, once this job has claimed the tables,
        WriterFencedError when another job claimed one since (an idle zombie stops too)."""
        return self._progress_and_tables()[0]

    def _progress_and_tables(self) -> tuple[list[TableProgress], dict[str, Table]]:
        """`progress()`, and the tables as loaded for it (one catalog load per table)."""
        found, loaded = [], {}
        for name in self._tables():
            try:
                table = self.catalog.load_table(name)
            except NoSuchTableError:
                found.append(TableProgress(table=name, exists=False))
                continue
            if self._writer is not None:
                self._writer.check(table)
            found.append(offsets.progress_of(table, name, self.spec.name).require_positions())
            loaded[name] = table
        return found, loaded

    def _fault_point(self, point: str, **context) -> None:
        self._faults.reached(point, home=self.platform.home, pipeline=self.spec.name, **context)

    def writer(self) -> committer.Writer:
        """This job's claim on the pipeline's tables, made on first use (a newer claim fences it)."""
        if self._writer is None:
            self._writer = committer.Writer.claim(self.catalog, self.spec.name, self._tables(),
                                                  home=str(self.platform.home))
            log.info("pipeline %s: writer %s claimed epoch %d", self.spec.name, self._writer.writer_id,
                     self._writer.epoch)
            self._record_best_effort(events.Event(
                self.spec.name, "writer", "ok", f"writer {self._writer.writer_id} claimed the tables with epoch "
                f"{self._writer.epoch}; older ingest jobs of the pipeline are fenced",
                metrics={"epoch": self._writer.epoch}, details={"writer": self._writer.writer_id,
                                                                 "tables": self._tables()}))
        return self._writer

    def run_batch(self, state=None) -> BatchReceipt | None:
        """Plan, read, route and commit one batch; None when there is nothing to do (or a stop was
        requested while waiting to retry).

        A transient failure (lakehouse.core.retry.transient_reason: not a configuration error, a table state
        or a fenced writer) runs the batch again after a backoff, until `supervision.retry_budget` has passed
        since the first failure; then OutageError. Each retry is a `retry` event on the ops timeline.
        """
        budget = self.spec.supervision.retry_budget_s

        def record(failed: retry.Retry) -> None:
            self._record_best_effort(events.Event(
                self.spec.name, "retry", "warn",
                f"transient failure, retry {failed.attempt} in {failed.wait_s:.1f}s: {failed.reason}"[:2000],
                metrics={"attempt": failed.attempt, "delay_s": failed.wait_s}))

        for attempt in retry.transient(
                f"pipeline {self.spec.name}", deadline_s=budget, first_wait_s=1.0, max_wait_s=30.0, on_retry=record,
                stop_event=self._stop,
                next_step=f"Nothing was lost: the next run resumes from the tables once the catalog, the broker and "
                          f"(for Avro) the schema registry answer again; to wait longer, raise "
                          f"supervision.retry_budget (now {budget:g}s)."):
            with attempt:
                if attempt.number > 1:
                    state = None  # plan again from the tables and the log as they are after the outage
                try:
                    return self._run_batch(state)
                except errors.WriterFencedError as exc:
                    self._record_best_effort(events.Event(self.spec.name, "writer", "failed", str(exc)[:2000]))
                    raise
        return None  # a stop was requested while waiting to retry

    def _record_best_effort(self, *found: events.Event) -> None:
        """Append events to the ops timeline; a timeline that cannot be written is logged, never fatal
        (the tables hold the truth; the timeline is for people). The catalog may be what is down: events
        that could not be written (stamped when they happened) go out with the next ones that can."""
        now = datetime.now(UTC)
        self._unrecorded.extend(e if e.ts else replace(e, ts=now) for e in found)
        del self._unrecorded[:-MAX_UNRECORDED_EVENTS]
        try:
            events.record(*self._unrecorded, platform=self.platform, catalog=self.spec.catalog)
        except Exception as exc:  # noqa: BLE001 - the timeline is for people; the tables hold the truth
            log.warning("could not record %s event(s) of %s yet: %s", "/".join(e.kind for e in found),
                        self.spec.name, exc)
        else:
            self._unrecorded.clear()

    def _run_batch(self, state=None) -> BatchReceipt | None:
        started = time.monotonic()
        progress, loaded = self._progress_and_tables()
        state = state or self.topic_state(progress)
        plan = plan_batch(self.spec, state, progress, self.spec.trigger.max_records_per_batch, self.accept_gap)
        if not plan.ranges:
            return None
        # after planning, not before: a spec edited before its first records were produced then
        # decodes every record of the plan (they were all in Kafka when the plan fixed its end)
        changed = self.reload_spec_if_changed()
        batch_id = uuid.uuid4().hex
        planned_from = {tp.table: tp for tp in progress}
        if changed or self._writer is None:  # the tables as the schema change or the claim left them
            self.writer()
            loaded = {name: self.catalog.load_table(name) for name in self._written_tables()}
        planned = time.monotonic()
        written = self._write_files(plan, batch_id, loaded, planned_from)
        self._fault_point("after_files")
        receipt = self._commit_all(written, plan, batch_id, loaded, planned_from)
        self._fault_point("before_group_commit")
        grouped = time.monotonic()
        self._commit_group({r.partition: r.end for r in plan.ranges})
        receipt.timings["plan"] = planned - started
        receipt.timings["group_commit"] = time.monotonic() - grouped
        receipt.log_ends = {p: ps.end for p, ps in state.partitions.items()}
        receipt.seconds = time.monotonic() - started
        self._record(receipt)
        lineage.ingest_batch(self.spec, self.platform, receipt, loaded)  # only when configured; never raises
        return receipt

    def _record(self, receipt: BatchReceipt) -> None:
        """A `batch` event (and a `gap` event for records that aged out) on the ops timeline; a
        timeline outage is logged, never stops ingestion."""
        found = [events.Event(
            self.spec.name, "batch", "ok",
            f"{receipt.records} records: {sum(receipt.rows_by_table.values())} rows, "
            f"{receipt.dead_letters} dead letters in {receipt.seconds:.1f}s",
            metrics=receipt.metrics(),
            details={"batch_id": receipt.batch_id, "ranges": {str(p): list(r) for p, r in receipt.ranges.items()},
                     "max_event_time": receipt.max_event_time.isoformat() if receipt.max_event_time else None,
                     "log_ends": {str(p): e for p, e in receipt.log_ends.items()},
                     "snapshots": {c.table: c.snapshot_id for c in receipt.commits}})]
        if receipt.gaps:
            lost = sum(end - start for start, end in receipt.gaps.values())
            found.append(events.Event(
                self.spec.name, "gap", "warn", f"{lost} records aged out of Kafka before they were ingested",
                metrics={"records_lost": lost},
                details={"gaps": {str(p): list(r) for p, r in receipt.gaps.items()}, "batch_id": receipt.batch_id}))
        self._record_best_effort(*found)

    def read_plan(self, plan: BatchPlan):
        """The records of `plan`'s ranges, read and decoded by Spark tasks (lazily) as a DataFrame of
        `batch_schema(spec)` rows: table rows with their `_route`, dead letters with `_route` null.
        Nothing is written; the batch's own path writes in the tasks instead (`_write_files`)."""
        schema, ddl = batch_schema(self.spec)
        # each partition's range cut so that every task slot has work, not one task per partition
        pieces = split_for_tasks(plan.ranges, self.spark.sparkContext.defaultParallelism * 2)
        rows = [(r.topic, r.partition, r.start, r.end) for r in pieces]
        # one task per piece, placed by parallelize rather than a repartition (which costs a shuffle)
        plan_df = self.spark.createDataFrame(self.spark.sparkContext.parallelize(rows, len(rows)),
                                             "topic string, partition int, start long, end long")
        reader = make_reader(self.task_spec(), self.kafka_conf, self.quarantined,
                             ingested_at_us=int(time.time() * 1_000_000),
                             fault=self._faults.task_probe(self.platform.home, self.spec.name), timers=self._task_clock,
                             poisoned=self._poisoned_in(plan), writer_schemas=self.writer_schemas())
        return plan_df.mapInArrow(reader, ddl)

    def _poisoned_in(self, plan: BatchPlan) -> dict[tuple[int, int], str]:
        ranges = plan.range_map()
        return {(p, o): why for (p, o), why in self.poisoned.items()
                if p in ranges and ranges[p][0] <= o < ranges[p][1]}

    def _written_tables(self) -> list[str]:
        """The tables the tasks write, in commit order: the data tables, then the dead-letter table."""
        return [*self.spec.target.tables, self.spec.dead_letter_table]

    def _targets(self, plan: BatchPlan, batch_id: str, loaded: dict[str, Table],
                 planned_from: dict[str, TableProgress]) -> list[TableTarget]:
        starts = {p: s for p, (s, _) in plan.range_map().items()}
        found = []
        for name in self._written_tables():
            table = loaded[name]
            tp = planned_from.get(name) or TableProgress(name, True)
            dead_letter = name == self.spec.dead_letter_table
            staging = None
            if self.spec.target.mode == "upsert" and not dead_letter:
                staging = f"{table.location().rstrip('/')}/staging/{batch_id}"
            found.append(TableTarget(
                name=name, metadata=taskwriter.shipped_metadata(table.metadata),
                io_properties=taskwriter.io_properties(table.io.properties), dead_letter=dead_letter,
                held={p: pos for p, pos in tp.positions.items() if pos > starts.get(p, pos)}, staging=staging))
        return found

    def _write_files(self, plan: BatchPlan, batch_id: str, loaded: dict[str, Table],
                     planned_from: dict[str, TableProgress]) -> Written:
        """One Spark job: the tasks read the plan's ranges, decode them and write every table's files.

        A task that fails on a record names it (errors.task_marker "record-failure"): that record is
        then dead-lettered as `reader_failure` without being decoded, and the batch is written again
        (the failed attempt's files are orphans, never committed).
        """
        targets = self._targets(plan, batch_id, loaded, planned_from)
        # one task per slot at most: two per slot measured slower (more task starts, half-size files)
        groups = task_groups(plan.ranges, self.spark.sparkContext.defaultParallelism)
        for _ in range(MAX_POISONED_PER_BATCH + 1):
            run = taskwriter.make_task_writer(
                self.task_spec(), self.kafka_conf, self.quarantined, ingested_at_us=int(time.time() * 1_000_000),
                targets=targets, write_uuid=uuid.uuid4(),
                fault=self._faults.task_probe(self.platform.home, self.spec.name),
                poisoned=self._poisoned_in(plan), writer_schemas=self.writer_schemas())
            started = time.time()
            try:
                with sparkenv.job_group(self.spark, f"lakehouse-{self.spec.name}-{batch_id}-write"):
                    results = self.spark.sparkContext.parallelize(groups, len(groups)).mapPartitionsWithIndex(
                        lambda index, items, run=run: run(index, (r for group in items for r in group))).collect()
            except Exception as exc:
                if not self._poison(plan, exc):
                    raise
                continue
            met = sorted({r.schema_event for r in results if r.schema_event})
            if not met:
                written = Written.of(results, started, time.time())
                for target in targets:  # pyiceberg's writer leaves DataFile.spec_id unset: the shipped spec's
                    for data_file in written.files.get(target.name, []):
                        data_file.spec_id = target.metadata.default_spec_id
                return written
            # tasks met writer schemas to resolve or follow first; the files they wrote are orphans
            if not any([self._schema_event(text) for text in met]):
                raise IngestError(f"pipeline {self.spec.name}: the tasks keep stopping at writer schemas: {met[0]}")
            loaded.update({name: self.catalog.load_table(name) for name in loaded})
            targets = self._targets(plan, batch_id, loaded, planned_from)
        raise IngestError(f"pipeline {self.spec.name}: more than {MAX_POISONED_PER_BATCH} records crashed the reader "
                          f"in one batch; the reader itself is broken")

    def _schema_event(self, text: str) -> bool:
        """Act on what a reader task reported of a writer schema (`text`, the message of its error with a
        marker): an id it was not shipped (`schema-unknown`) is fetched from the registry, or recorded
        as missing; a compatible change of a contract that follows the writer schemas (`schema-change`)
        evolves the tables. True when the batch should be written again. A writer schema that does not
        fit under schema_policy 'fail' (`schema-incompatible`) stops the job."""
        failed = errors.marker_in(text)
        if failed is None:
            return False
        kind, where = failed
        if kind == "schema-incompatible":
            raise errors.WriterSchemaIncompatibleError(text.split(" [lakehouse:")[0]) from None
        store = self._schemas
        if kind not in ("schema-change", "schema-unknown") or store is None:
            return False
        schema_id = int(where["schema_id"])
        if kind == "schema-unknown":
            if schema_id in self.resolved_schemas or schema_id in self.missing_schemas:
                return False  # shipping it did not help: the failure is something else
            try:
                store.resolve(schema_id)  # SchemaRegistryUnavailableError: retried by run_batch
            except Rejected as rejected:
                log.warning("pipeline %s: %s; its records are dead letters", self.spec.name, rejected.detail)
                self.missing_schemas.add(schema_id)
                return True
            self._ship(store, schema_id)
            return True
        if schema_id in self.accepted_schemas:
            return False  # evolving did not help: the failure is something else
        self._evolve_for(store, schema_id)
        return True

    def _poison(self, plan: BatchPlan, exc: Exception) -> bool:
        """Whether `exc`, a failed Spark job, names a record that crashed the reader and that record was
        added to the poisoned records (dead-lettered as `reader_failure` when the batch runs again)."""
        failed = errors.marker_in(str(exc))
        if failed is None or failed[0] != "record-failure" or len(self._poisoned_in(plan)) >= MAX_POISONED_PER_BATCH:
            return False
        where = (int(failed[1]["partition"]), int(failed[1]["offset"]))
        if where in self.poisoned:
            return False  # dead-lettering it did not help: the failure is not the record's
        self.poisoned[where] = f"the reader failed on this record: {_task_error(exc)}"
        log.error("pipeline %s: %s[%d]@%d crashed the reader; dead-lettering it as reader_failure: %s",
                  self.spec.name, plan.topic, where[0], where[1], self.poisoned[where])
        return True

    def _commit_all(self, written: Written, plan: BatchPlan, batch_id: str, loaded: dict[str, Table],
                    planned_from: dict[str, TableProgress]) -> BatchReceipt:
        receipt = BatchReceipt(pipeline=self.spec.name, batch_id=batch_id, ranges=plan.range_map(),
                               records=plan.record_count,
                               rows_by_table={t: written.rows.get(t, 0) for t in self.spec.target.tables},
                               dead_letters=written.dead_letters, max_event_time=written.max_event_time,
                               gaps=plan.gaps)
        # every table commits every batch, even with no rows: its position must move with the
        # batch, or a restart (and every later batch) would read again from where it stood
        if self.spec.target.mode != "upsert" and committer.commits_together(self.catalog):
            receipt.commits.extend(
                self.commit_together(self.catalog, written, plan, batch_id, loaded, planned_from))
        else:
            for table in self._written_tables():
                if table == self.spec.dead_letter_table:
                    self._fault_point("after_table_commit")
                receipt.commits.append(self.commit_table(table, written, plan, batch_id, self._rows(table, written),
                                                         loaded[table], planned_from.get(table)))
        task_s = written.read_s + written.decode_s + written.write_s
        shares = {stage: (getattr(written, f"{stage}_s") / task_s if task_s > 0 else 0.0)
                  for stage in ("read", "decode", "write")}
        merge = sum(c.write_seconds for c in receipt.commits)  # an upsert's MERGE writes in Spark
        receipt.timings.update({stage: written.seconds * share for stage, share in shares.items()})
        receipt.timings["write"] += merge
        receipt.timings.update({"commit": sum(c.seconds for c in receipt.commits) - merge,
                                "read_task": written.read_s, "decode_task": written.decode_s,
                                "write_task": written.write_s, "busy_task": written.busy_s,
                                # inside the write stage's wall time: Spark's share before and after the tasks
                                "launch": written.launch_s, "tail": written.tail_s})
        receipt.tasks = written.tasks
        return receipt

    def commit_table(self, table: str, written: Written, plan: BatchPlan, batch_id: str, row_count: int,
                     loaded: Table, planned: TableProgress | None) -> TableCommit:
        """One atomic, fenced commit of a batch's share of `table`: the files `written` holds for it are
        appended (or an upsert's staged rows merged) by lakehouse.ingest.committer, in one snapshot whose
        summary carries the plan's offsets and the table's new positions. `loaded` is the table as
        last loaded, `planned` its progress when `plan` was made (None: not checked).

        Guarantees: the commit lands only while this job's claim (`writer()`, taken here if not yet)
        holds, else WriterFencedError; a table that already holds the plan's positions is not
        committed again (`TableCommit.skipped`); a table whose positions moved since `planned`
        raises PlanStaleError; conflicts with other writers (compaction, a replay) are retried up
        to COMMIT_ATTEMPTS times, then IngestError. `row_count` is reported as is."""
        writer = self.writer()
        started = time.monotonic()
        upsert = self.spec.target.mode == "upsert" and table != self.spec.dead_letter_table

        def attempt(number: int) -> TableCommit:
            nonlocal loaded
            if number > 1:
                loaded = self.catalog.load_table(table)
            tp, held = self._commit_ready(table, loaded, plan, planned, written, writer)
            if held:
                return TableCommit(table, 0, tp.snapshot_id, number, skipped=True, seconds=time.monotonic() - started)
            summary = self._summary(plan, tp, batch_id, written.max_event_time, written.min_kafka_time)
            merge_s = 0.0
            files = written.files.get(table, [])
            added = (len(files), sum(f.file_size_in_bytes for f in files))
            try:
                if upsert:
                    merge_s, staged = self._merge_staged(table, written.staged.get(table, []), summary, loaded, tp,
                                                         batch_id, number, writer)
                    snapshot_id, merged = staged.snapshot_id, offsets.summary_properties(staged)
                    added = (int(merged.get("added-data-files", 0)), int(merged.get("added-files-size", 0)))
                else:
                    self._fault_point("concurrent_commit", upsert=False, spark=self.spark,
                                      table=lambda: self.catalog.load_table(table), key=None)
                    snapshot_id = committer.append_files(self.catalog, loaded, written.files.get(table, []), summary,
                                                         writer.fence(tp.snapshot_id))
            except errors.WriterFencedError:
                raise
            except Exception as exc:
                if not retry.is_conflict_in_chain(exc):  # a conflict is the policy's: tried again on the table reloaded
                    raise IngestError(f"commit to {table} failed: {sparkenv.describe_error(exc)}") from exc
                raise
            if upsert:
                self._drop_staging(loaded, written.staged.get(table, []))
            return TableCommit(table, row_count, snapshot_id, number, files=added[0], bytes=added[1],
                               seconds=time.monotonic() - started, write_seconds=merge_s)

        return self._commit_conflicts(f"commit to {table}").run(attempt)

    def commit_together(self, catalog: RestCatalog, written: Written, plan: BatchPlan, batch_id: str,
                        loaded: dict[str, Table], planned_from: dict[str, TableProgress]) -> list[TableCommit]:
        """The batch's tables (append: the data tables and the dead-letter table) in one atomic commit of
        `catalog` (this job's, a REST catalog: lakehouse.ingest.committer.commit_together), with
        `commit_table`'s guarantees for each: fenced, a table that already holds the plan's positions left out,
        PlanStaleError when a table's positions moved since `planned_from`, conflicts retried up to
        COMMIT_ATTEMPTS times (all tables again), then IngestError."""
        writer = self.writer()
        started = time.monotonic()
        tables = self._written_tables()

        def attempt(number: int) -> list[TableCommit]:
            nonlocal loaded
            if number > 1:
                loaded = {table: self.catalog.load_table(table) for table in tables}
            held: dict[str, int | None] = {}
            changes: dict[str, committer.TableChange] = {}
            for table in tables:
                tp, done = self._commit_ready(table, loaded[table], plan, planned_from.get(table), written, writer)
                if done:
                    held[table] = tp.snapshot_id
                    continue
                summary = self._summary(plan, tp, batch_id, written.max_event_time, written.min_kafka_time)
                changes[table] = committer.appended(loaded[table], written.files.get(table, []), summary,
                                                    writer.fence(tp.snapshot_id))
            if changes:
                last = list(changes)[-1]
                self._fault_point("concurrent_commit", upsert=False, spark=self.spark,
                                  table=lambda name=last: self.catalog.load_table(name), key=None)
                try:
                    committer.commit_together(catalog, list(changes.values()))
                except errors.WriterFencedError:
                    raise
                except Exception as exc:
                    if not retry.is_conflict_in_chain(exc):  # a conflict is the policy's: all tables reloaded
                        raise IngestError(f"commit to {', '.join(changes)} failed: "
                                          f"{sparkenv.describe_error(exc)}") from exc
                    raise
            seconds = time.monotonic() - started
            commits = []
            for table in tables:
                if table in held:
                    commits.append(TableCommit(table, 0, held[table], number, skipped=True, seconds=seconds))
                    continue
                files = written.files.get(table, [])
                commits.append(TableCommit(table, self._rows(table, written), changes[table].snapshot_id, number,
                                           files=len(files), bytes=sum(f.file_size_in_bytes for f in files),
                                           seconds=seconds))
            return commits

        return self._commit_conflicts(f"commit to {', '.join(tables)}").run(attempt)

    def _commit_conflicts(self, what: str) -> retry.Policy:
        """A batch's commit losing the catalog's compare-and-set to another writer (compaction, a replay) is tried
        again on the tables reloaded, up to COMMIT_ATTEMPTS attempts in all, then IngestError."""
        return retry.commit_conflicts(
            what, attempts=COMMIT_ATTEMPTS, error=IngestError, first_wait_s=0.2, max_wait_s=2.0,
            conflict=retry.is_conflict_in_chain,
            next_step="Nothing of the batch became visible and no offset moved; the next run writes it again. Another "
                      "writer (maintenance, a replay) kept committing to the table: give it a quieter window.")

    def _rows(self, table: str, written: Written) -> int:
        return written.dead_letters if table == self.spec.dead_letter_table else written.rows.get(table, 0)

    def _commit_ready(self, table: str, loaded: Table, plan: BatchPlan, planned: TableProgress | None,
                      written: Written, writer: committer.Writer) -> tuple[TableProgress, bool]:
        """`table`'s progress as `loaded` records it, and whether it already holds the plan's positions (a retried
        or resumed commit: nothing to commit). Raises PlanStaleError when its positions moved since `planned` or
        its partitioning since the files were written, WriterFencedError when another job claimed it."""
        tp = offsets.progress_of(loaded, table, self.spec.name).require_positions()
        if all(tp.positions.get(p, -1) >= end for p, (_, end) in plan.range_map().items()):
            return tp, True
        if planned is not None and tp.snapshot_id != planned.snapshot_id:
            # the files leave out what the table held when planned; another commit of the pipeline moved it
            raise PlanStaleError(f"{table}: the pipeline's positions moved from snapshot {planned.snapshot_id} to "
                                 f"{tp.snapshot_id} since the batch was planned; planning again")
        writer.check(loaded)  # a fenced job stops before committing anything
        stale = {f.spec_id for f in written.files.get(table, [])} - {loaded.metadata.default_spec_id}
        if stale:  # the partitioning changed since the tasks wrote the files (another process evolved it)
            raise PlanStaleError(f"{table}: the files were written with partition spec {sorted(stale)} but the "
                                 f"table's spec is now {loaded.metadata.default_spec_id}; writing the batch again")
        return tp, False

    def _merge_staged(self, table: str, paths: list[str], summary: dict[str, str], loaded: Table,
                      tp: TableProgress, batch_id: str, attempt: int,
                      writer: committer.Writer) -> tuple[float, Snapshot]:
        """An upsert table's commit: Spark MERGEs the rows the tasks staged, as a staged (WAP) snapshot that
        lakehouse.ingest.committer makes the head of `main`. Returns the MERGE's Spark seconds and the snapshot."""
        tables.require_staging(loaded, table)
        rows = self.staged_rows(table, paths)
        ledger = self.spec.tombstone_table
        if table == self.spec.target.table and ledger:
            self.record_tombstones(rows, ledger)
        group = f"lakehouse-{self.spec.name}-{batch_id}-{table}-{attempt}"
        wap_id = f"{batch_id}-{attempt}-{table}"
        with sparkenv.job_group(self.spark, group), sparkenv.staged(self.spark, wap_id):
            self._fault_point("concurrent_commit", upsert=True, spark=self.spark, table=lambda: loaded,
                              key=self.spec.target.key[0] if self.spec.target.key else None)
            # a change stream's key deleted in an earlier batch stays deleted against older changes
            self.merge_upsert(table, rows, summary, respect_tombstones=self.spec.is_cdc)
        staged = committer.staged_snapshot(self.catalog.load_table(table), wap_id)
        if staged is None:
            raise IngestError(f"the write to {table} staged no snapshot (wap.id {wap_id}); is "
                              f"write.wap.enabled still true on the table?")
        committer.commit_staged(self.catalog, self.catalog.load_table(table), staged.snapshot_id,
                                staged.parent_snapshot_id, writer.fence(tp.snapshot_id))
        return sparkenv.job_seconds(self.spark, group) or 0.0, staged

    def staged_rows(self, table: str, paths: list[str]):
        """The rows the tasks staged for an upsert `table` (its columns and `_op`) as a DataFrame."""
        from pyspark.sql import functions as F

        target = self.spark.table(self.spec.qualified(table))
        if not paths:
            return target.limit(0).withColumn(taskwriter.UPSERT_OP, F.lit(None).cast("string"))
        staged = self.spark.read.parquet(*paths)
        return staged.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in target.schema.fields],
                             taskwriter.UPSERT_OP)

    def _drop_staging(self, table: Table, paths: list[str]) -> None:
        """Delete an upsert's staging files once merged (left behind by a crash, maintenance removes them)."""
        for path in paths:
            try:
                table.io.delete(path)
            except Exception as exc:  # noqa: BLE001 - an orphan, not an error
                log.warning("could not delete staging file %s: %s", path, exc)

    def _summary(self, plan: BatchPlan, tp: TableProgress, batch_id: str, newest: datetime | None,
                 oldest_read: datetime | None) -> dict[str, str]:
        """The snapshot summary of one table's commit of the batch: the offsets it holds (past the table's
        own position) and the positions after it, with the pipeline, topic, batch and writer."""
        positions = dict(tp.positions)
        for p, (_, end) in plan.range_map().items():
            positions[p] = end
        summary = {
            SnapshotSummary.PIPELINE: self.spec.name,
            SnapshotSummary.KIND: "ingest",
            SnapshotSummary.TOPIC: plan.topic,
            SnapshotSummary.TOPIC_ID: plan.topic_id or "",
            SnapshotSummary.RANGES: offsets.encode_ranges(
                {p: (max(s, tp.positions.get(p, s)), e) for p, (s, e) in plan.range_map().items()}),
            SnapshotSummary.POSITIONS: offsets.encode_positions(positions),
            SnapshotSummary.BATCH: batch_id,
            SnapshotSummary.WRITER: self.writer().writer_id,
        }
        if newest is not None:
            summary[SnapshotSummary.MAX_EVENT_TIME] = newest.isoformat()
        if plan.gaps:
            summary[SnapshotSummary.GAPS] = offsets.encode_ranges(plan.gaps)
        if oldest_read is not None:
            # commit time minus this is how long Kafka had to hold the batch (retention alignment)
            summary[SnapshotSummary.MIN_KAFKA_TIME] = oldest_read.isoformat()
        return summary

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
        """The newest record of each key in `rows` (see NEWER, NEWER_CDC).

        In a change stream, a tombstone (no change event, so no source position) takes the source order of
        the change before it in its partition (Debezium writes it right after its delete): a delete read in
        the same batch as an older change of its key from another partition stays the newest."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        keys = list(self.spec.target.key)
        partition = Window.partitionBy(*keys, "_kafka.partition")
        source_order = []
        if self.spec.is_cdc:
            before = partition.orderBy(F.col("_kafka.offset")).rowsBetween(Window.unboundedPreceding, 0)
            for field in ("position", "source_ts"):
                rows = rows.withColumn(f"_order_{field}", F.last(f"_cdc.{field}", ignorenulls=True).over(before))
                source_order.append(F.col(f"_order_{field}").desc_nulls_last())
        across = Window.partitionBy(*keys).orderBy(*source_order, F.col("_kafka.timestamp").desc(),
                                                   F.col("_kafka.partition").desc())
        return (rows.withColumn("_rn", F.row_number().over(partition.orderBy(F.col("_kafka.offset").desc())))
                .where("_rn = 1").drop("_rn")
                .withColumn("_rn", F.row_number().over(across)).where("_rn = 1")
                .drop("_rn", "_order_position", "_order_source_ts"))

    def merge_upsert(self, table: str, rows, summary: dict[str, str], respect_tombstones: bool = False) -> None:
        """Upsert: the latest record per key wins, within the batch and against the table.

        With `respect_tombstones` (replays; every batch of a change stream), records older than their key's
        newest tombstone in the pipeline's ledger are left out, so that replaying old records, or an older
        change from another partition, cannot bring back a deleted key.
        """
        latest = self.latest_per_key(rows)
        ledger = self.spec.tombstone_table
        if respect_tombstones and ledger:
            latest = self._after_tombstones(latest, ledger)
        keys = list(self.spec.target.key)
        columns = [c for c in latest.columns if c != "_op"]
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        sets = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
        names = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(f"s.`{c}`" for c in columns)
        newer = NEWER_CDC if self.spec.is_cdc else NEWER
        sparkenv.merge(self.spark, latest,
                       f"MERGE INTO {self.spec.qualified(table)} t USING {{source}} s ON {on} "
                       f"WHEN MATCHED AND s._op = 'delete' AND {newer} THEN DELETE "
                       f"WHEN MATCHED AND s._op = 'upsert' AND {newer} THEN UPDATE SET {sets} "
                       f"WHEN NOT MATCHED AND s._op = 'upsert' THEN INSERT ({names}) VALUES ({values})", summary)

    def record_tombstones(self, rows, ledger: str) -> None:
        """Keep the batch's tombstones (key, coordinates) in the pipeline's ledger `ledger`, newest per key.

        Runs before the data table's commit: after a crash in between, the ledger knows of a delete the
        table has not applied yet, which only makes replays skip records that are older anyway.
        """
        from pyspark.sql import functions as F

        keys = list(self.spec.target.key)
        dead = self.latest_per_key(rows).where(F.col("_op") == "delete") \
            .select(*keys, "_kafka", F.current_timestamp().alias("_deleted_at"))
        if dead.isEmpty():
            return
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        sparkenv.merge(self.spark, dead,
                       f"MERGE INTO {self.spec.qualified(ledger)} t "
                       f"USING {{source}} s ON {on} "
                       f"WHEN MATCHED AND {NEWER} THEN UPDATE SET t._kafka = s._kafka, t._deleted_at = s._deleted_at "
                       f"WHEN NOT MATCHED THEN INSERT *", {})

    def _after_tombstones(self, latest, ledger: str):
        """`latest` without the upserts older than their key's newest tombstone in `ledger` (the batch's own
        tombstones are in it already: its deletes are kept, and only delete what is older, see NEWER_CDC).
        Across partitions, older means by Kafka timestamp: a tombstone carries no source position."""
        from pyspark.sql import functions as F

        keys = list(self.spec.target.key)
        tombs = self.spark.table(self.spec.qualified(ledger)).select(
            *[F.col(k).alias(f"_tomb_{k}") for k in keys], F.col("_kafka").alias("_tomb"))
        joined = latest.join(tombs, on=[latest[k] == tombs[f"_tomb_{k}"] for k in keys], how="left")
        s, t = F.col("_kafka"), F.col("_tomb")
        newer = (((s.partition == t.partition) & (s.offset > t.offset))
                 | ((s.partition != t.partition) & (s.timestamp >= t.timestamp)))
        kept = t.isNull() | newer | (F.col("_op") == "delete")
        return joined.where(kept).drop("_tomb", *[f"_tomb_{k}" for k in keys])

    def sync_group_offsets(self) -> None:
        """Bring the consumer group up to the tables (after a crash between table and group commit)."""
        positions = offsets.committed_positions(self.progress())  # partitions every table holds a position in
        if positions:
            self._commit_group(positions)

    def _commit_group(self, positions: dict[int, int]) -> None:
        """Consumer-group offsets follow the tables, for lag monitors; never read back for resume."""
        consumer = Consumer({**self.kafka_conf, "group.id": self.spec.consumer_group, "enable.auto.commit": False})
        try:
            consumer.commit(offsets=[TopicPartition(self.spec.source.topic, p, o) for p, o in positions.items()],
                            asynchronous=False)
        except Exception as exc:  # noqa: BLE001 - monitoring only: never fail a committed batch over it
            log.warning("consumer group commit for %s failed: %s", self.spec.consumer_group, exc)
        finally:
            consumer.close()


def _utc(epoch_us: int) -> datetime:
    """The UTC datetime of `epoch_us` microseconds since the epoch."""
    return _EPOCH + timedelta(microseconds=epoch_us)


def _task_error(exc: BaseException) -> str:
    """The failing task's own error line out of a failed Spark action's long message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    marked = [line for line in lines if "[lakehouse:record-failure" in line]
    return (marked[-1] if marked else lines[-1] if lines else type(exc).__name__)[:1000]


def receipt_line(receipt: BatchReceipt) -> str:
    return json.dumps(receipt.to_json(), separators=(",", ":"))
