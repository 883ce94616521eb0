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
4. commit    per table (data tables first), one fenced commit (lakehouse.ingest.batch_commit, of the
             batch's state, lakehouse.ingest.batch_state) whose summary carries the offsets it holds
             and the new positions: the tasks' files appended, or an upsert's staged rows applied
             by the driver as a row delta (lakehouse.ingest.row_deltas);
5. publish   commit the consumer group's offsets, for monitoring tools only.

A crash anywhere leaves each table either with the whole batch or none of it (files
written but never committed are orphans), and the next run starts from what the tables
say. A job whose tables were claimed by a newer ingest job of the pipeline stops
(WriterFencedError). Transient failures (a locked or unreachable catalog, a stalled
broker) are retried with backoff within `supervision.retry_budget`; a record whose
decoding crashes a Spark task is dead-lettered as `reader_failure` and the batch runs
again without it.

This module is the loop; its collaborators are the batch's state (batch_state), its commits
(batch_commit), the upsert rows and merges (upserts), the writer schemas the driver follows
(schema_follower) and the receipts (receipts).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakehouse.core import config, errors, events, hooks, lineage, offsets, python_daemon, retry, sparkenv
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import IngestError
from lakehouse.core.offsets import TableProgress
from lakehouse.core.spec import PipelineSpec, load_spec
from lakehouse.ingest import committer, tables, taskwriter
from lakehouse.ingest.batch_commit import BatchCommitter
from lakehouse.ingest.batch_state import BatchState, Written
from lakehouse.ingest.layout import batch_schema
from lakehouse.ingest.plan import AdminSession, BatchPlan, plan_batch, split_for_tasks, task_groups, topic_state_for
from lakehouse.ingest.reader import make_reader
from lakehouse.ingest.receipts import BatchReceipt
from lakehouse.ingest.schema_follower import Evolution, SchemaFollower
from lakehouse.ingest.taskwriter import TableTarget
from lakehouse.ingest.upserts import Upserts

log = logging.getLogger("lakehouse.ingest")
# timeline events kept while the catalog cannot take them (the newest are kept)
MAX_UNRECORDED_EVENTS = 1000
# a batch whose tasks keep failing on different records is broken in a way dead-lettering cannot fix
MAX_POISONED_PER_BATCH = 100


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

    - attributes `spec`, `platform`, `spark`, `catalog`, `kafka_conf` (the librdkafka settings),
      `quarantined` (columns a schema change quarantined, left empty) and `schemas` (the writer
      schemas the driver follows: its `task_spec(spec)` and `writer_schemas()` are what tasks get);
    - `progress()` and `topic_state()`: where each table stands and what Kafka holds;
    - `writer()`: this job's claim on the pipeline's tables (claimed once, fenced by a newer job);
    - `read_plan(plan)`: a plan's records, decoded, as a Spark DataFrame of `batch_schema` rows;
    - `upserts()`: the pipeline's rows per table and its upsert MERGE (lakehouse.ingest.upserts);
    - `batch_committer()`: fenced, atomic commits of a batch's state under this job's claim
      (lakehouse.ingest.batch_commit).

    Everything with a leading underscore is the batch's own machinery and may change.
    """

    def __init__(self, spec: PipelineSpec, platform: config.PlatformConfig | None = None, spark=None,
                 accept_gap: bool = False):
        self.platform = platform or config.load()
        self.spec = spec
        self.accept_gap = accept_gap
        self.spark = spark or sparkenv.session(self.platform, [spec.catalog], f"lakehouse-ingest-{spec.name}")
        warming = sparkenv.warm_python_workers(self.spark, python_daemon.PRELOADED)
        self.catalog = open_catalog(self.platform, spec.catalog)
        self.kafka_conf = self.platform.kafka()
        # Writer schemas of a wire format (none at all is said now, not in every task). Only the driver talks
        # to the registry; the tasks get the schemas it resolved with the spec.
        self.schemas = SchemaFollower(spec, self._registry(spec))
        self._faults = hooks.faults()
        self._faults.check()
        self._spec_mtime = self._mtime()
        self._unrecorded: list[events.Event] = []  # timeline events not written yet (catalog outage)
        tables.check_default_table(self.catalog, spec)  # a renamed target.table stops before anything is created
        self.spec = self.schemas.prefetch(spec)
        self.quarantined = tables.ensure_tables(self.spark, self.catalog, self.spec, self._layout_changed)
        self._writer: committer.Writer | None = None  # claimed before the first commit
        # Kafka clients kept while a run lasts (closed by _close_clients at its end): the topic probes' admin
        # client and the consumer that commits the group's offsets (_commit_group)
        self._admin = AdminSession(self.kafka_conf)
        self._group: Consumer | None = None
        self._start_new_tables()
        warming.result()
        self._stop = threading.Event()
        # task seconds spent reading and decoding, summed over every task of the job (a stage clock)
        self._task_clock = (self.spark.sparkContext.accumulator(0.0), self.spark.sparkContext.accumulator(0.0))
        # records whose decoding crashed a Spark task: (partition, offset) -> why; dead-lettered unread
        self.poisoned: dict[tuple[int, int], str] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def _registry(self, spec: PipelineSpec) -> dict | None:
        return self.platform.schema_registry() if spec.wire_formats else None

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
            summary = offsets.commit_summary(
                self.spec.name, "ingest", self.spec.source.topic, {}, f"start-{uuid.uuid4().hex[:12]}",
                topic_id=next(iter(topic_ids)) if len(topic_ids) == 1 else "", positions=position,
                writer=writer.writer_id)
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
        spec = self.schemas.with_accepted(load_spec(self.spec.path))
        if (spec.name, spec.source.topic, spec.target.tables, spec.dead_letter_table) != \
                (self.spec.name, self.spec.source.topic, self.spec.target.tables, self.spec.dead_letter_table):
            raise IngestError(f"{spec.path}: pipeline name, topic or tables changed while running; restart it")
        self.quarantined = tables.ensure_tables(self.spark, self.catalog, spec, self._layout_changed)
        self.schemas.reload(spec, self._registry(spec))  # the folder's writer schemas as they are now
        self.spec, self._spec_mtime = spec, mtime
        log.info("reloaded spec %s", spec.path)
        return True

    def _follow(self, evolution: Evolution) -> None:
        """Make the tables follow a writer schema a task met first (SchemaFollower.act_on)."""
        self.quarantined = tables.ensure_tables(self.spark, self.catalog, evolution.spec, self._layout_changed)
        self.spec = evolution.spec
        diff, changes = evolution.diff, evolution.describe()
        log.info("pipeline %s: writer schema %d evolved the tables: %s", self.spec.name, evolution.schema_id, changes)
        self._record_best_effort(events.Event(
            self.spec.name, "schema", "ok", f"writer schema {evolution.schema_id} evolved the tables: {changes}"[:2000],
            details={"schema_id": evolution.schema_id, "added": diff.added, "widened": diff.widened,
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
        try:
            self.sync_group_offsets()
            target = {p: ps.end for p, ps in state.partitions.items()}
            while not self._stop.is_set():
                capped = {p: replace(ps, end=min(ps.end, target.get(p, ps.end)))
                          for p, ps in state.partitions.items()}
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
        finally:
            self._close_clients()
        return receipts

    def run_continuous(self, interval_s: float | None = None, on_batch=None, max_batches: int | None = None) -> int:
        """Commit one batch per trigger until SIGTERM/SIGINT; the batch in flight finishes first. With a
        `trigger.write_interval` shorter than the trigger, a batch is read and written in steps of that
        interval and committed once per trigger."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        self.topic_state()  # a refused login fails here at once, not after the group commit's timeout
        batches = 0
        try:
            self.sync_group_offsets()
            while not self._stop.is_set():
                started = time.monotonic()
                interval = self.spec.trigger.interval_s if interval_s is None else interval_s
                receipt = self.run_batch(window_s=interval if self.writes_in_steps(interval) else None)
                if receipt is not None:
                    batches += 1
                    if on_batch:
                        on_batch(receipt)
                if max_batches is not None and batches >= max_batches:
                    break
                self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
        finally:
            self._close_clients()
        return batches

    # -- one batch ---------------------------------------------------------------------------

    def topic_state(self, progress: list[TableProgress] | None = None):
        """The topic's partitions (earliest offset, log end) and id, probed from where the tables stand
        (`progress`, read now when not given) and checked against the topic id they recorded."""
        return topic_state_for(self.kafka_conf, self.spec.source.topic,
                               progress if progress is not None else self.progress(), session=self._admin)

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

    def writes_in_steps(self, interval_s: float) -> bool:
        """Whether a batch committed every `interval_s` is read and written in steps (trigger.write_interval)."""
        step_s = self.spec.trigger.write_interval_s
        return step_s is not None and step_s < interval_s and self.spec.target.mode == "append"

    def run_batch(self, state=None, window_s: float | None = None) -> BatchReceipt | None:
        """Plan, read, route and commit one batch; None when there is nothing to do (or a stop was
        requested while waiting to retry). With `window_s`, the batch is read and written in steps of
        trigger.write_interval for that long (`_write_steps`), then committed.

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
                    return self._run_batch(state, window_s)
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

    def _run_batch(self, state=None, window_s: float | None = None) -> BatchReceipt | None:
        started = time.monotonic()
        progress, loaded = self._progress_and_tables()
        state = state or self.topic_state(progress)
        plan = plan_batch(self.spec, state, progress, self.spec.trigger.max_records_per_batch, self.accept_gap)
        if not plan.ranges and window_s is None:
            return None
        # after planning, not before: a spec edited before its first records were produced then
        # decodes every record of the plan (they were all in Kafka when the plan fixed its end)
        changed = self.reload_spec_if_changed()
        if changed or self._writer is None:  # the tables as the schema change or the claim left them
            self.writer()
            loaded = {name: self.catalog.load_table(name) for name in self._written_tables()}
        batch = BatchState.planned(self.spec, plan, uuid.uuid4().hex, loaded, progress)
        planned = time.monotonic()
        if plan.ranges:
            batch = self._write_files(batch)
        if window_s is not None:
            batch = self._write_steps(batch, progress, started, window_s)
            if not batch.plan.ranges:
                return None
        self._fault_point("after_files")
        receipt = self.batch_committer().commit(batch)
        self._fault_point("before_group_commit")
        grouped = time.monotonic()
        self._commit_group({r.partition: r.end for r in batch.plan.ranges})
        receipt.timings["plan"] = planned - started
        receipt.timings["group_commit"] = time.monotonic() - grouped
        receipt.log_ends = {**{p: ps.end for p, ps in state.partitions.items()}, **batch.plan.ends}
        receipt.seconds = time.monotonic() - started
        self._record(receipt)
        lineage.ingest_batch(self.spec, self.platform, receipt, dict(batch.loaded))  # only when configured
        return receipt

    def batch_committer(self) -> BatchCommitter:
        """Commits of a batch's state under this job's claim (`writer()`, taken here if not yet)."""
        return BatchCommitter(self.catalog, self.spark, self.writer(), self._fault_point)

    def upserts(self) -> Upserts:
        """The pipeline's rows per table and its upsert MERGE, for the spec as it is now."""
        return Upserts(self.spark, self.spec, frozenset(self.quarantined))

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
        reader = make_reader(self.schemas.task_spec(self.spec), self.kafka_conf, self.quarantined,
                             ingested_at_us=int(time.time() * 1_000_000),
                             fault=self._faults.task_probe(self.platform.home, self.spec.name), timers=self._task_clock,
                             poisoned=self._poisoned_in(plan), writer_schemas=self.schemas.writer_schemas())
        return plan_df.mapInArrow(reader, ddl)

    def _poisoned_in(self, plan: BatchPlan) -> dict[tuple[int, int], str]:
        ranges = plan.range_map()
        return {(p, o): why for (p, o), why in self.poisoned.items()
                if p in ranges and ranges[p][0] <= o < ranges[p][1]}

    def _written_tables(self) -> list[str]:
        """The tables the tasks write, in commit order: the data tables, then the dead-letter table."""
        return [*self.spec.target.tables, self.spec.dead_letter_table]

    def _targets(self, batch: BatchState) -> list[TableTarget]:
        starts = {p: s for p, (s, _) in batch.plan.range_map().items()}
        found = []
        for name in batch.tables:
            table = batch.loaded[name]
            tp = batch.progress(name)
            dead_letter = name == batch.spec.dead_letter_table
            staging = None
            if batch.spec.target.mode == "upsert" and not dead_letter:
                staging = f"{table.location().rstrip('/')}/staging/{batch.batch_id}"
            found.append(TableTarget(
                name=name, metadata=taskwriter.shipped_metadata(table.metadata),
                io_properties=taskwriter.io_properties(table.io.properties), dead_letter=dead_letter,
                held={p: pos for p, pos in tp.positions.items() if pos > starts.get(p, pos)}, staging=staging))
        return found

    def _write_files(self, batch: BatchState) -> BatchState:
        """One Spark job: the tasks read the plan's ranges, decode them and write every table's files;
        returns `batch` as written.

        A task that fails on a record names it (errors.task_marker "record-failure"): that record is
        then dead-lettered as `reader_failure` without being decoded, and the batch is written again
        (the failed attempt's files are orphans, never committed).
        """
        targets = self._targets(batch)
        # one task per slot at most: two per slot measured slower (more task starts, half-size files)
        groups = task_groups(batch.plan.ranges, self.spark.sparkContext.defaultParallelism)
        for _ in range(MAX_POISONED_PER_BATCH + 1):
            run = taskwriter.make_task_writer(
                self.schemas.task_spec(self.spec), self.kafka_conf, self.quarantined,
                ingested_at_us=int(time.time() * 1_000_000), targets=targets, write_uuid=uuid.uuid4(),
                fault=self._faults.task_probe(self.platform.home, self.spec.name),
                poisoned=self._poisoned_in(batch.plan), writer_schemas=self.schemas.writer_schemas())
            started = time.time()
            try:
                with sparkenv.job_group(self.spark, f"lakehouse-{self.spec.name}-{batch.batch_id}-write"):
                    results = self.spark.sparkContext.parallelize(groups, len(groups)).mapPartitionsWithIndex(
                        lambda index, items, run=run: run(index, (r for group in items for r in group))).collect()
            except Exception as exc:
                if not self._poison(batch.plan, exc):
                    raise
                continue
            met = sorted({r.schema_event for r in results if r.schema_event})
            if not met:
                written = Written.of(results, started, time.time())
                for target in targets:  # pyiceberg's writer leaves DataFile.spec_id unset: the shipped spec's
                    for data_file in written.files.get(target.name, []):
                        data_file.spec_id = target.metadata.default_spec_id
                return batch.with_written(written)
            # tasks met writer schemas to resolve or follow first; the files they wrote are orphans
            if not any([self._schema_event(text) for text in met]):
                raise IngestError(f"pipeline {self.spec.name}: the tasks keep stopping at writer schemas: {met[0]}")
            batch = batch.with_tables({name: self.catalog.load_table(name) for name in batch.loaded}, self.spec)
            targets = self._targets(batch)
        raise IngestError(f"pipeline {self.spec.name}: more than {MAX_POISONED_PER_BATCH} records crashed the reader "
                          f"in one batch; the reader itself is broken")

    def _write_steps(self, batch: BatchState, progress: list[TableProgress], opened: float,
                     window_s: float) -> BatchState:
        """`batch` (its first step written at `opened`, time.monotonic) grown by a step every
        trigger.write_interval until `window_s` has passed: each step plans from where the batch's plan ends
        and writes what arrived meanwhile, and the batch is committed once, at the end (as the Kafka Connect
        sink writes files between commits). The last step starts half a step before the window closes, so
        that the commit lands about when the window does. Stepping ends early at a stop request, at
        trigger.max_records_per_batch, or when a step finds records aged out of Kafka: the next batch,
        planned from the tables, records that gap. Files of steps never committed are orphans."""
        step_s = self.spec.trigger.write_interval_s or window_s
        cap = self.spec.trigger.max_records_per_batch
        due = opened + step_s
        while due <= opened + window_s - step_s / 2 and batch.plan.record_count < cap:
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            plan = plan_batch(batch.spec, self.topic_state(progress), progress, cap - batch.plan.record_count,
                              self.accept_gap, after=batch.plan)
            if plan.gaps:
                break
            if plan.ranges:
                step = self._write_files(BatchState.planned(batch.spec, plan, batch.batch_id, batch.loaded, progress))
                batch = batch.followed_by(step)
                self._fault_point("between_steps")
            # a step that overran its interval is followed at once, not by the steps it overran
            due = max(due + step_s, time.monotonic())
        return batch

    def _schema_event(self, text: str) -> bool:
        """Act on what a reader task reported of a writer schema (SchemaFollower.act_on), the tables following
        an evolved contract; True when the batch should be written again."""
        again, evolution = self.schemas.act_on(self.spec, text)
        if evolution is not None:
            self._follow(evolution)
        return again

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

    def sync_group_offsets(self) -> None:
        """Bring the consumer group up to the tables (after a crash between table and group commit)."""
        positions = offsets.committed_positions(self.progress())  # partitions every table holds a position in
        if positions:
            self._commit_group(positions)

    def _commit_group(self, positions: dict[int, int]) -> None:
        """Consumer-group offsets follow the tables, for lag monitors; never read back for resume.

        Committed (and waited for) by one consumer kept while a run lasts (`_close_clients` at its end): its
        connection to the group's coordinator serves every batch. A consumer made for each batch, which found
        the coordinator again, cost a batch 0.06-0.2 s."""
        try:
            if self._group is None:
                self._group = Consumer({**self.kafka_conf, "group.id": self.spec.consumer_group,
                                        "enable.auto.commit": False})
            self._group.commit(offsets=[TopicPartition(self.spec.source.topic, p, o) for p, o in positions.items()],
                               asynchronous=False)
        except Exception as exc:  # noqa: BLE001 - monitoring only: never fail a committed batch over it
            log.warning("consumer group commit for %s failed: %s", self.spec.consumer_group, exc)

    def _close_clients(self) -> None:
        """Close the Kafka clients kept while a run lasts (a later batch makes others)."""
        self._admin.close()
        group, self._group = self._group, None
        if group is not None:
            try:
                group.close()
            except Exception as exc:  # noqa: BLE001 - monitoring only
                log.warning("closing the group committer of %s failed: %s", self.spec.consumer_group, exc)


def _task_error(exc: BaseException) -> str:
    """The failing task's own error line out of a failed Spark action's long message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    marked = [line for line in lines if "[lakehouse:record-failure" in line]
    return (marked[-1] if marked else lines[-1] if lines else type(exc).__name__)[:1000]
