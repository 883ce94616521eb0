"""A batch's commits: each table's share of a written batch (lakehouse.ingest.batch_state) made visible in one
fenced, atomic commit by lakehouse.ingest.committer, with the offsets it holds and the table's new positions in
its snapshot summary (`summary`).

Per table (data tables first, the dead-letter table last; all in one request where the catalog commits several
tables together):
- a table that already holds the plan's positions (a retried or resumed commit) is left as it is;
- a table whose positions moved since the plan, or whose partitioning changed since the files were written,
  raises PlanStaleError (the job plans again); a table another job claimed raises WriterFencedError;
- an append table's files are appended; an upsert table's staged rows are applied by the driver as a row
  delta (lakehouse.ingest.row_deltas: the winning rows appended and the rows they replace deleted by
  position, in one snapshot);
- a commit losing the catalog's compare-and-set to another writer (compaction, a replay) is tried again on
  the table reloaded, up to COMMIT_ATTEMPTS attempts in all, then IngestError.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.table import Table

from lakehouse.core import errors, offsets, retry, sparkenv
from lakehouse.core.errors import IngestError, PlanStaleError
from lakehouse.core.offsets import TableProgress
from lakehouse.ingest import committer, row_deltas
from lakehouse.ingest.batch_state import BatchState
from lakehouse.ingest.receipts import BatchReceipt, TableCommit
from lakehouse.ingest.upserts import Upserts, after_ledger, drop_staging, insert_files

COMMIT_ATTEMPTS = 6


def no_fault(point: str, **context: Any) -> None:
    """A fault point that injects nothing (lakehouse.core.hooks' faults are the job's)."""


def conflicts(what: str) -> retry.Policy:
    """A batch's commit losing the catalog's compare-and-set to another writer (compaction, a replay) is tried
    again on the tables reloaded, up to COMMIT_ATTEMPTS attempts in all, then IngestError."""
    return retry.commit_conflicts(
        what, attempts=COMMIT_ATTEMPTS, error=IngestError, first_wait_s=0.2, max_wait_s=2.0,
        conflict=retry.is_conflict_in_chain,
        next_step="Nothing of the batch became visible and no offset moved; the next run writes it again. Another "
                  "writer (maintenance, a replay) kept committing to the table: give it a quieter window.")


class BatchCommitter:
    """Commits batches to `catalog` under `writer`'s claim; `spark` merges upsert tables; `fault` is the job's
    fault point (tests inject faults there)."""

    def __init__(self, catalog: Catalog, spark: Any, writer: committer.Writer,
                 fault: Callable[..., None] = no_fault):
        self.catalog = catalog
        self.spark = spark
        self.writer = writer
        self.fault = fault

    def commit(self, state: BatchState) -> BatchReceipt:
        """Every table's commit of `state`'s batch, and the batch's receipt (its stage times but plan and
        group commit, which are the loop's)."""
        spec, written, plan = state.spec, state.written, state.plan
        receipt = BatchReceipt(pipeline=spec.name, batch_id=state.batch_id, ranges=plan.range_map(),
                               records=plan.record_count,
                               rows_by_table={t: written.rows.get(t, 0) for t in spec.target.tables},
                               dead_letters=written.dead_letters, max_event_time=written.max_event_time,
                               gaps=dict(plan.gaps))
        # every table commits every batch, even with no rows: its position must move with the
        # batch, or a restart (and every later batch) would read again from where it stood
        if spec.target.mode != "upsert" and committer.commits_together(self.catalog):
            receipt.commits.extend(self.commit_together(self.catalog, state))
        else:
            for table in state.tables:
                if table == spec.dead_letter_table:
                    self.fault("after_table_commit")
                receipt.commits.append(self.commit_table(state, table))
        task_s = written.read_s + written.decode_s + written.write_s
        shares = {stage: (getattr(written, f"{stage}_s") / task_s if task_s > 0 else 0.0)
                  for stage in ("read", "decode", "write")}
        merge = sum(c.write_seconds for c in receipt.commits)  # an upsert's files, written by the driver
        receipt.timings.update({stage: written.seconds * share for stage, share in shares.items()})
        receipt.timings["write"] += merge
        receipt.timings.update({"commit": sum(c.seconds for c in receipt.commits) - merge,
                                "read_task": written.read_s, "decode_task": written.decode_s,
                                "write_task": written.write_s, "busy_task": written.busy_s,
                                # inside the write stage's wall time: Spark's share before and after the tasks
                                "launch": written.launch_s, "tail": written.tail_s})
        receipt.tasks = written.tasks
        return receipt

    def commit_table(self, state: BatchState, table: str) -> TableCommit:
        """One atomic, fenced commit of `state`'s share of `table`: the files written for it are appended (or
        an upsert's staged rows merged), in one snapshot whose summary carries the plan's offsets and the
        table's new positions. The table is `state.loaded`'s, its progress when planned `state.planned_from`'s
        (not checked when missing). See the module's docstring for what it guarantees."""
        spec, written = state.spec, state.written
        started = time.monotonic()
        upsert = spec.target.mode == "upsert" and table != spec.dead_letter_table
        loaded = state.loaded[table]

        def attempt(number: int) -> TableCommit:
            nonlocal loaded
            if number > 1:
                loaded = self.catalog.load_table(table)
            tp, held = self.ready(state, table, loaded)
            if held:
                return TableCommit(table, 0, tp.snapshot_id, number, skipped=True, seconds=time.monotonic() - started)
            summary = self.summary(state, tp)
            merge_s = 0.0
            files = written.files.get(table, [])
            added = (len(files), sum(f.file_size_in_bytes for f in files))
            try:
                if upsert:
                    merge_s, snapshot_id, added = self._apply_upserts(state, table, summary, loaded, tp)
                else:
                    self.fault("concurrent_commit", spark=self.spark,
                               table=lambda: self.catalog.load_table(table), key=None)
                    snapshot_id = committer.append_files(self.catalog, loaded, files, summary,
                                                         self.writer.fence(tp.snapshot_id))
            except errors.WriterFencedError:
                raise
            except Exception as exc:
                if not retry.is_conflict_in_chain(exc):  # a conflict is the policy's: tried again on the table reloaded
                    raise IngestError(f"commit to {table} failed: {sparkenv.describe_error(exc)}") from exc
                raise
            if upsert:
                drop_staging(loaded.io, written.staged.get(table, []))
            return TableCommit(table, state.rows(table), snapshot_id, number, files=added[0], bytes=added[1],
                               seconds=time.monotonic() - started, write_seconds=merge_s)

        return conflicts(f"commit to {table}").run(attempt)

    def commit_together(self, catalog: RestCatalog, state: BatchState) -> list[TableCommit]:
        """`state`'s tables (append: the data tables and the dead-letter table) in one atomic commit of
        `catalog` (this committer's, a REST catalog: lakehouse.ingest.committer.commit_together), with
        `commit_table`'s guarantees for each; a conflict tries all tables again."""
        written = state.written
        started = time.monotonic()
        names = state.tables
        loaded = dict(state.loaded)

        def attempt(number: int) -> list[TableCommit]:
            nonlocal loaded
            if number > 1:
                loaded = {table: self.catalog.load_table(table) for table in names}
            held: dict[str, int | None] = {}
            changes: dict[str, committer.TableChange] = {}
            for table in names:
                tp, done = self.ready(state, table, loaded[table])
                if done:
                    held[table] = tp.snapshot_id
                    continue
                changes[table] = committer.appended(loaded[table], written.files.get(table, []),
                                                    self.summary(state, tp), self.writer.fence(tp.snapshot_id))
            if changes:
                last = list(changes)[-1]
                self.fault("concurrent_commit", spark=self.spark,
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
            for table in names:
                if table in held:
                    commits.append(TableCommit(table, 0, held[table], number, skipped=True, seconds=seconds))
                    continue
                files = written.files.get(table, [])
                commits.append(TableCommit(table, state.rows(table), changes[table].snapshot_id, number,
                                           files=len(files), bytes=sum(f.file_size_in_bytes for f in files),
                                           seconds=seconds))
            return commits

        return conflicts(f"commit to {', '.join(names)}").run(attempt)

    def ready(self, state: BatchState, table: str, loaded: Table) -> tuple[TableProgress, bool]:
        """`table`'s progress as `loaded` records it, and whether it already holds the plan's positions (a retried
        or resumed commit: nothing to commit). Raises PlanStaleError when its positions moved since the plan or
        its partitioning since the files were written, WriterFencedError when another job claimed it."""
        tp = offsets.progress_of(loaded, table, state.spec.name).require_positions()
        if all(tp.positions.get(p, -1) >= end for p, (_, end) in state.plan.range_map().items()):
            return tp, True
        planned = state.planned_from.get(table)
        if planned is not None and tp.snapshot_id != planned.snapshot_id:
            # the files leave out what the table held when planned; another commit of the pipeline moved it
            raise PlanStaleError(f"{table}: the pipeline's positions moved from snapshot {planned.snapshot_id} to "
                                 f"{tp.snapshot_id} since the batch was planned; planning again")
        self.writer.check(loaded)  # a fenced job stops before committing anything
        stale = {f.spec_id for f in state.written.files.get(table, [])} - {loaded.metadata.default_spec_id}
        if stale:  # the partitioning changed since the tasks wrote the files (another process evolved it)
            raise PlanStaleError(f"{table}: the files were written with partition spec {sorted(stale)} but the "
                                 f"table's spec is now {loaded.metadata.default_spec_id}; writing the batch again")
        return tp, False

    def summary(self, state: BatchState, tp: TableProgress) -> dict[str, str]:
        """The snapshot summary of one table's commit of the batch: the offsets it holds (past the table's
        own position `tp`) and the positions after it, with the pipeline, topic, batch and writer."""
        plan = state.plan
        positions = dict(tp.positions)
        for p, (_, end) in plan.range_map().items():
            positions[p] = end
        # min_kafka_time: commit time minus it is how long Kafka had to hold the batch (retention alignment)
        return offsets.commit_summary(
            state.spec.name, "ingest", plan.topic,
            {p: (max(s, tp.positions.get(p, s)), e) for p, (s, e) in plan.range_map().items()}, state.batch_id,
            topic_id=plan.topic_id or "", positions=positions, writer=self.writer.writer_id, gaps=plan.gaps,
            max_event_time=state.written.max_event_time, min_kafka_time=state.written.min_kafka_time)

    def _apply_upserts(self, state: BatchState, table: str, summary: dict[str, str], loaded: Table,
                       tp: TableProgress) -> tuple[float, int, tuple[int, int]]:
        """An upsert table's commit, on the driver: the newest of the rows the tasks staged for each key (lakehouse.
        ingest.newest) applied to the table as it is `loaded` as a row delta (lakehouse.ingest.row_deltas: the
        winning upserts written as data files, the held rows they replace or delete deleted by position), in one
        fenced commit; a change stream's deletes go to its tombstone ledger first, and upserts older than their
        key's tombstone there are left out. Returns the seconds spent writing files, the new head and the (data
        files, bytes) added."""
        spec = state.spec
        keys = list(spec.target.key)
        upserts = Upserts(self.spark, spec)
        newest = upserts.newest_staged(loaded.io, state.written.staged.get(table, []))
        rows = newest.rows
        if table == spec.target.table and spec.tombstone_table and (newest.deletes or spec.is_cdc and rows.num_rows):
            ledger = self.catalog.load_table(spec.tombstone_table)
            held = row_deltas.held_rows(ledger, keys, rows.select(keys))  # read once, for both uses
            if spec.is_cdc:  # a change stream's key deleted in an earlier batch stays deleted against older changes
                rows = after_ledger(held, rows, keys)
            if newest.deletes:
                upserts.record_tombstones(ledger, newest.tombstones, held)
        started = time.monotonic()
        delta = row_deltas.plan(loaded, rows, keys) if rows.num_rows else None
        files = insert_files(loaded, delta.inserts) if delta else []
        deletes = row_deltas.delete_files(loaded, delta) if delta else []
        written = time.monotonic() - started
        self.fault("concurrent_commit", spark=self.spark, table=lambda: self.catalog.load_table(table), key=keys[0])
        snapshot_id = committer.append_files(self.catalog, loaded, files, summary, self.writer.fence(tp.snapshot_id),
                                             deletes)
        return written, snapshot_id, (len(files), sum(f.file_size_in_bytes for f in files))
