"""Table maintenance, the runner: compaction, manifest rewrite, snapshot expiry and orphan removal.

`run(spec)` maintains every table of a pipeline (data tables, the tombstone ledger of an
upsert pipeline and the dead-letter table), one after the other, while ingestion keeps
committing:

1. compact   `rewrite_data_files` toward `target.target_file_size_bytes`, only where a
             file group has `maintenance.min_input_files` small files; upsert
             (merge-on-read) tables also rewrite data files carrying that many delete
             files and then compact or drop their position-delete files;
2. verify    row count and an order-independent hash over all columns (`sum(xxhash64(*))`)
             of each compaction commit and of the snapshot it replaced must be equal;
3. manifests `rewrite_manifests`;
4. expire    snapshots older than `retention.replay_window` (time travel covers the
             same window as Kafka replay), named one by one: never the newest snapshot
             that carries the pipeline's `lakehouse.positions` nor any snapshot between
             it and the head (resume walks those ancestors), never a snapshot between
             `main`'s head and a branch or tag head such as `published` (the audit of
             the next publication walks them), never a branch or tag head. Commits that
             land meanwhile are newer than anything named, so they are kept too;
5. orphans   files no snapshot references and older than
             `maintenance.orphan_safety_window` (a commit in flight is never that old), but only
             once the table is proven to own its folder (`lakehouse.upkeep.ownership`): its location is the one
             its catalog assigns it (the catalog's warehouse, or its namespace's location, plus
             namespace/table as that catalog type lays tables out), its `write.data.path`,
             `write.metadata.path`, `write.object-storage.path` and `write.folder-storage.path` lie
             inside that location, no location provider of its own places files, GC is enabled, and
             no other table of any configured catalog keeps its location, a file path or its
             metadata inside that location, or holds the table inside its own. Otherwise orphan
             removal is refused with the overlapping table and what to do, and deletes nothing.

Then the same steps for the pipeline's events in the ops timeline (`TimelineMaintenance`),
which otherwise grows by one small file and one snapshot per event.

Rewrites commit with Iceberg's optimistic concurrency: a concurrent append is
rebased under the rewrite, a conflicting commit (new deletes against rewritten files)
fails it, and it is retried from the new head up to COMMIT_ATTEMPTS times; after that
the table's receipt says `failed` and why. A table whose maintenance fails in any way (a
step out of retries, a refused orphan removal, unreadable metadata, a Py4J error) gets a
`failed` receipt and the run goes on with the next table. Each table gets one `maintenance`
event on the ops timeline with the receipt's numbers as metrics (the receipts, their text and
their reading back from the timeline are `lakehouse.upkeep.maintenance_receipts`).

A dry run (`run(..., dry_run=True)`, `lakehouse maintain --dry-run`) rewrites, expires and
deletes nothing: each table's receipt lists the data files compaction would rewrite (Iceberg's
own bin-pack planner, with the options a run passes), the snapshots expiry would name (ids and
times) and the orphan files removal would delete (Iceberg's DeleteOrphanFiles with a delete
function that only collects), after the same ownership proof. Its receipts say `skipped` (or
`failed` where a run would fail) with `dry_run` true, and are recorded as `maintenance` events
like a run's, so that a preview is audited and the DAG can show it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar
from urllib.parse import urlsplit

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakehouse.core import config, errors, events, offsets, retry, sparkenv
from lakehouse.core.adapters import pyspark_internals
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import MaintenanceError, OwnershipError
from lakehouse.core.spec import PipelineSpec
from lakehouse.upkeep.maintenance_receipts import (
    MAX_LISTED,
    CompactionCommit,
    Content,
    MaintenanceReceipt,
    TableReceipt,
)
from lakehouse.upkeep.ownership import GC_ENABLED, LOCATION_PROVIDER_PROPERTIES, PATH_PROPERTIES, OwnershipCheck
from lakehouse.upkeep.storage_paths import canonical_path

log = logging.getLogger("lakehouse.maintenance")
COMMIT_ATTEMPTS = 4
# snapshot ids per expire_snapshots call (a SQL array literal)
EXPIRE_CHUNK = 500
# the ops timeline keeps its snapshots this long: enough for readers scanning it while it is maintained
TIMELINE_SNAPSHOT_AGE = timedelta(hours=1)
# summary keys only a data-file or delete-file rewrite writes (rewrite_manifests writes neither)
_REWRITE_KEYS = ("deleted-data-files", "removed-delete-files", "removed-position-delete-files")
T = TypeVar("T")


def retrying(what: str, fn: Callable[[], T]) -> tuple[T, int]:
    """(fn(), attempts): a step's Spark procedure, tried again when another commit won (Iceberg's optimistic
    concurrency, through py4j) or the catalog was briefly unavailable, up to COMMIT_ATTEMPTS attempts
    (lakehouse.core.retry); MaintenanceError once they run out or on any other error."""
    policy = retry.commit_conflicts(what, attempts=COMMIT_ATTEMPTS, error=MaintenanceError, first_wait_s=0.4,
                                    max_wait_s=4.0, conflict=retry.is_conflict_in_chain, outages=True,
                                    next_step="The table is as it was before the step; the next maintenance run "
                                              "tries again (or run `lakehouse maintain --pipeline NAME` when "
                                              "ingestion is quieter).")

    def attempt(number: int) -> tuple[T, int]:
        try:
            return fn(), number
        except Exception as exc:  # py4j wraps Iceberg's exceptions
            if policy.retries(exc):
                raise
            raise MaintenanceError(f"{what} failed after {number} attempt(s): "
                                   f"{sparkenv.describe_error(exc)}") from exc

    return policy.run(attempt)


def timestamp_literal(at: datetime) -> str:
    """A Spark SQL TIMESTAMP literal in UTC (the session time zone is UTC)."""
    return "TIMESTAMP '" + at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


def content(spark, qualified: str, snapshot_id: int) -> Content:
    """Row count and `sum(xxhash64(<all columns>))` of `qualified` as of `snapshot_id` (exact: summed
    as decimal). Spark refuses to hash maps, so a map column is hashed as its entries sorted by key."""
    from pyspark.sql.types import MapType

    df = spark.sql(f"SELECT * FROM {qualified} VERSION AS OF {int(snapshot_id)}")
    columns = [f"array_sort(map_entries(`{f.name}`))" if isinstance(f.dataType, MapType) else f"`{f.name}`"
               for f in df.schema.fields]
    row = df.selectExpr("count(*) AS n", f"sum(cast(xxhash64({', '.join(columns)}) AS decimal(38, 0))) AS h") \
        .collect()[0]
    return Content(rows=int(row["n"]), checksum=str(row["h"] or 0))


def _totals(table: Table, snapshot_id: int) -> tuple[int, int, int]:
    """(data files, delete files, bytes) of a snapshot, from its summary totals."""
    props = offsets.summary_properties(table.snapshot_by_id(snapshot_id))
    return (int(props.get("total-data-files", 0)), int(props.get("total-delete-files", 0)),
            int(props.get("total-files-size", 0)))


def _rewrites_since(table: Table, since_ms: int) -> list:
    """Data/delete-file rewrite commits on main since `since_ms`, oldest first. Ingestion never commits
    `replace` operations, so these are the ones this run made."""
    found = []
    for snap in offsets.main_ancestry(table.metadata):  # newest first
        if snap.timestamp_ms < since_ms:
            break
        props = offsets.summary_properties(snap)
        if props.get("operation") == "replace" and any(k in props for k in _REWRITE_KEYS):
            found.append(snap)
    return list(reversed(found))


def _java_map(jvm, values: Mapping[str, object]):
    """A java.util.HashMap of `values` as strings (Iceberg's action options)."""
    found = jvm.java.util.HashMap()
    for key, value in values.items():
        found.put(str(key), str(value))
    return found


def _each(closeable_iterable):
    """The items of a Java CloseableIterable, closed afterwards."""
    try:
        iterator = closeable_iterable.iterator()
        while iterator.hasNext():
            yield iterator.next()
    finally:
        closeable_iterable.close()


def snapshots_to_keep(table: Table, pipeline: str | None) -> set[int]:
    """Snapshots expiry must keep whatever their age: branch and tag heads; `main`'s head and its
    ancestors down to the newest one carrying `pipeline`'s positions (resume walks them); and `main`'s
    ancestors down to every branch or tag head that is one of them (the audit of the next publication
    walks from the published head to `main`)."""
    metadata = table.metadata
    keep = {ref.snapshot_id for ref in metadata.refs.values()}
    chain = [s.snapshot_id for s in offsets.main_ancestry(metadata)]
    if pipeline is not None:
        keep.update(offsets.resume_point(metadata, pipeline).chain)
    else:
        keep.update(chain[:1])
    for ref in metadata.refs.values():
        if ref.snapshot_id in chain:
            keep.update(chain[:chain.index(ref.snapshot_id) + 1])
    return keep


class TableMaintenance:
    """Maintains one table of a pipeline with a Spark session that has the Iceberg extensions.

    `run()` returns the table's receipt and never raises for the table's own failure: a step that fails
    after its retries, a compaction that changed the content, a refused orphan removal or any other error
    (unreadable metadata, a Py4J error) stops the table's remaining steps and marks the receipt `failed`.
    `ownership` proves the table owns its folder before orphan removal (one check per run, shared by its
    tables); with `dry_run`, `run()` only previews (`preview`)."""

    def __init__(self, spark, catalog, spec: PipelineSpec, table: str, now: datetime,
                 ownership: OwnershipCheck | None = None, dry_run: bool = False):
        self.spark = spark
        self.catalog = catalog
        self.spec = spec
        self.table = table
        self.qualified = spec.qualified(table)
        self.now = now
        self.ownership = ownership or OwnershipCheck(config.load(), spec)
        self.dry_run = dry_run
        # merge-on-read tables also carry delete files to compact
        self.upsert = spec.target.mode == "upsert" and table in spec.target.tables

    def _call(self, procedure: str, **args: str):
        sql_args = ", ".join(f"{k} => {v}" for k, v in {"table": f"'{self.table}'", **args}.items())
        return self.spark.sql(f"CALL {self.spec.catalog}.system.{procedure}({sql_args})").collect()

    def _java_table(self):
        """(the JVM, the table as Spark's Iceberg catalog loads it), for Iceberg's Action API."""
        jvm = pyspark_internals.jvm(self.spark)
        return jvm, jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(pyspark_internals.java_session(self.spark),
                                                                             self.qualified)

    @staticmethod
    def _options(options: dict[str, object]) -> str:
        return "map(" + ", ".join(f"'{k}', '{v}'" for k, v in options.items()) + ")"

    def run(self) -> TableReceipt:
        started = time.monotonic()
        receipt = TableReceipt(table=self.qualified, dry_run=self.dry_run)
        try:
            self._maintain(receipt)
        except Exception as exc:  # noqa: BLE001 - one table's failure of any kind must not stop the others
            # the steps done so far stay in the receipt
            reason = str(exc) if isinstance(exc, errors.LakehouseError) else \
                f"maintenance of {receipt.table} failed: {sparkenv.describe_error(exc)}"
            receipt.status, receipt.message = "failed", ("dry run: " if self.dry_run else "") + reason
            if isinstance(exc, OwnershipError):
                receipt.orphans_refused = str(exc)
            log.error("%s", receipt.message)
        receipt.seconds = round(time.monotonic() - started, 3)
        return receipt

    def _maintain(self, receipt: TableReceipt) -> None:
        try:
            table = self.catalog.load_table(self.table)
        except NoSuchTableError:
            receipt.status, receipt.message = "skipped", "table does not exist yet"
            return
        head = table.current_snapshot()
        if head is None:
            receipt.status, receipt.message = "skipped", "table has no snapshot yet"
            return
        if self.dry_run:
            self.preview(receipt, table, head.snapshot_id)
            return
        self.compact(receipt, head.snapshot_id)
        receipt.manifests_rewritten = self.rewrite_manifests()
        self.expire(receipt)
        self.remove_orphans(receipt)
        receipt.message = (f"{receipt.table}: data files {receipt.data_files_before}->"
                           f"{receipt.data_files_after}, delete files {receipt.delete_files_before}->"
                           f"{receipt.delete_files_after}, {receipt.snapshots_expired} snapshots expired, "
                           f"{receipt.orphans_removed} orphans removed")

    def compaction_options(self) -> dict[str, object]:
        """The options of `rewrite_data_files` (and of Iceberg's bin-pack planner, which a dry run asks)."""
        options: dict[str, object] = {"min-input-files": self.spec.maintenance.min_input_files,
                                      "target-file-size-bytes": self.spec.target.target_file_size_bytes}
        if self.upsert:  # fold every delete back: a data file with any delete file is rewritten with them applied
            options["delete-file-threshold"] = 1
        return options

    @staticmethod
    def delete_compaction_options() -> dict[str, object]:
        """The options of an upsert table's `rewrite_position_delete_files`: every delete file, so that
        entries for data files compaction replaced are dropped (those `remove-dangling-deletes` keeps: the
        newest deletes share the rewritten files' starting sequence number) and the rest are packed."""
        return {"rewrite-all": "true"}

    def compact(self, receipt: TableReceipt, head_id: int) -> None:
        """Rewrite small data files (and, for upsert tables, files with deletes and the delete files),
        then check each rewrite commit left the content of the snapshot it replaced unchanged."""
        since_ms = int(time.time() * 1000) - 1000  # rewrite commits are stamped by this process' clock
        options = self.compaction_options()
        if self.upsert:  # then the delete files that apply to no live data file leave the table (a second commit)
            options["remove-dangling-deletes"] = "true"
        rows, receipt.compaction_attempts = retrying(f"compaction of {receipt.table}", lambda: self._call(
            "rewrite_data_files", options=self._options(options), **self.compaction_scope()))
        receipt.rewritten_data_files = int(rows[0]["rewritten_data_files_count"])
        receipt.added_data_files = int(rows[0]["added_data_files_count"])
        if self.upsert:
            rows, _ = retrying(f"delete-file compaction of {receipt.table}", lambda: self._call(
                "rewrite_position_delete_files",
                options=self._options(self.delete_compaction_options())))
            receipt.rewritten_delete_files = int(rows[0]["rewritten_delete_files_count"])

        table = self.catalog.load_table(self.table)
        for snap in _rewrites_since(table, since_ms):
            receipt.compactions.append(CompactionCommit(
                snapshot_id=snap.snapshot_id, parent_id=snap.parent_snapshot_id,
                before=content(self.spark, self.qualified, snap.parent_snapshot_id),
                after=content(self.spark, self.qualified, snap.snapshot_id)))
        if receipt.compactions:
            first, last = receipt.compactions[0], receipt.compactions[-1]
            before_id, after_id, before, after = first.parent_id, last.snapshot_id, first.before, last.after
        else:
            before_id = after_id = head_id
            before = after = content(self.spark, self.qualified, head_id)
        receipt.data_files_before, receipt.delete_files_before, receipt.bytes_before = _totals(table, before_id)
        receipt.data_files_after, receipt.delete_files_after, receipt.bytes_after = _totals(table, after_id)
        receipt.rows_before, receipt.checksum_before = before.rows, before.checksum
        receipt.rows_after, receipt.checksum_after = after.rows, after.checksum
        if not receipt.content_unchanged:
            changed = [c.snapshot_id for c in receipt.compactions if c.before != c.after]
            raise MaintenanceError(f"compaction of {receipt.table} changed the table's content in snapshot(s) "
                                   f"{changed}; roll back to the parent snapshot and report an Iceberg bug")

    def compaction_scope(self) -> dict[str, str]:
        """Extra `rewrite_data_files` arguments that narrow what is compacted (none: the whole table)."""
        return {}

    def compaction_filter(self, jvm):
        """`compaction_scope` as the Iceberg expression the bin-pack planner takes: the whole table."""
        return jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue()

    def rewrite_manifests(self) -> int:
        rows, _ = retrying(f"manifest rewrite of {self.qualified}", lambda: self._call("rewrite_manifests"))
        return int(rows[0]["rewritten_manifests_count"]) if rows else 0

    def expiry_cutoff(self) -> datetime:
        """Snapshots older than this may expire: the replay window (time travel reaches as far back)."""
        return self.now - timedelta(seconds=self.spec.retention.replay_window_s)

    def keep(self, table: Table) -> set[int]:
        """Snapshots to keep whatever their age (see snapshots_to_keep); the tombstone ledger carries
        no positions, so only its head and refs."""
        return snapshots_to_keep(table, self.spec.name if self.table in self.spec.positioned_tables else None)

    def expiry_plan(self, table: Table, receipt: TableReceipt) -> list:
        """The snapshots expiry names (older than the cutoff, not kept), oldest first; fills the receipt's
        cutoff, positions snapshot and the count of old snapshots kept."""
        cutoff = self.expiry_cutoff()
        receipt.expire_older_than = cutoff.isoformat()
        point = offsets.resume_point(table.metadata, self.spec.name)
        receipt.positions_snapshot_id = point.snapshot.snapshot_id if point.snapshot is not None else None
        keep = self.keep(table)
        old = [s for s in table.metadata.snapshots if s.timestamp_ms < cutoff.timestamp() * 1000]
        doomed = sorted((s for s in old if s.snapshot_id not in keep), key=lambda s: (s.timestamp_ms, s.snapshot_id))
        receipt.kept_for_resume = len(old) - len(doomed)
        return doomed

    def expire(self, receipt: TableReceipt) -> None:
        """Expire the snapshots older than the cutoff that nothing needs, by id (expire_snapshots with
        `snapshot_ids`, nothing expired by age alone), then check the resume chain is intact."""
        table = self.catalog.load_table(self.table)
        doomed = [s.snapshot_id for s in self.expiry_plan(table, receipt)]
        before = {s.snapshot_id for s in table.metadata.snapshots}
        for i in range(0, len(doomed), EXPIRE_CHUNK):
            ids = ", ".join(f"{int(sid)}L" for sid in doomed[i:i + EXPIRE_CHUNK])
            # older_than at the epoch: the explicit ids are all that expires (Iceberg would otherwise
            # also expire by the table's max-snapshot-age)
            retrying(f"snapshot expiry of {receipt.table}", partial(
                self._call, "expire_snapshots", older_than="TIMESTAMP '1970-01-01 00:00:00.001'",
                snapshot_ids=f"array({ids})"))
        table = self.catalog.load_table(self.table)
        expired = sorted(before - {s.snapshot_id for s in table.metadata.snapshots})
        receipt.snapshots_expired, receipt.expired_snapshot_ids = len(expired), expired[:MAX_LISTED]
        if receipt.positions_snapshot_id is not None:
            progress = offsets.progress_of(table, self.table, self.spec.name)
            if progress.snapshot_id is None:
                raise MaintenanceError(f"snapshot expiry of {receipt.table} lost the positions snapshot "
                                       f"{receipt.positions_snapshot_id}: the next ingest run cannot resume; "
                                       f"stop ingestion and restore the table's metadata")

    def remove_orphans(self, receipt: TableReceipt) -> None:
        """Delete files no snapshot references that are older than the orphan safety window, once the table
        is proven to own every file under its location (OwnershipError otherwise, nothing deleted).

        The Action API, not the procedure: the procedure refuses windows under 24 hours, while the
        spec allows down to one hour (and 100 trigger intervals)."""
        action = self._orphan_action(receipt, self.catalog.load_table(self.table))
        removed = sorted(str(path) for path in action.execute().orphanFileLocations())
        receipt.orphans_removed, receipt.removed_orphan_files = len(removed), removed[:MAX_LISTED]

    def _orphan_action(self, receipt: TableReceipt, table: Table):
        """Iceberg's DeleteOrphanFiles action on the table, after the ownership proof of `table` (pyiceberg's
        view of it) and a check that the Spark side reads the same location and file-placing properties."""
        older_than = self.now - timedelta(seconds=self.spec.maintenance.orphan_safety_window_s)
        receipt.orphan_older_than = older_than.isoformat()
        proven = self.ownership.prove(self.catalog, self.table, table)
        jvm, iceberg_table = self._java_table()
        placing = iceberg_table.properties()
        seen = {key: str(placing.get(key)) for key in (*PATH_PROPERTIES, *LOCATION_PROVIDER_PROPERTIES, GC_ENABLED)
                if placing.get(key) is not None}
        if canonical_path(iceberg_table.location()) != canonical_path(proven.location) or seen != proven.properties:
            raise OwnershipError(f"orphan removal of {self.qualified} refused, nothing deleted: its location or file "
                                 f"placement changed while it was checked ({proven.location} {dict(proven.properties)} "
                                 f"-> {iceberg_table.location()} {seen}); run maintenance again")
        action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(pyspark_internals.java_session(self.spark)) \
            .deleteOrphanFiles(iceberg_table).olderThan(int(older_than.timestamp() * 1000))
        if urlsplit(iceberg_table.location()).scheme in config.S3_SCHEMES:
            action = action.usePrefixListing(True)  # list through the table's S3FileIO, not Hadoop
        return action

    # ------------------------------------------------------------------------ dry run

    def preview(self, receipt: TableReceipt, table: Table, head_id: int) -> None:
        """What a run would do to the table, doing none of it: the data (and delete) files compaction would
        rewrite, the snapshots expiry would name and the orphan files removal would delete; `failed` with
        the reason when orphan removal would be refused."""
        receipt.status = "skipped"
        files, deletes, size = _totals(table, head_id)
        receipt.data_files_before = receipt.data_files_after = files
        receipt.delete_files_before = receipt.delete_files_after = deletes
        receipt.bytes_before = receipt.bytes_after = size
        self.preview_compaction(receipt)
        doomed = self.expiry_plan(table, receipt)
        receipt.would_expire_count = len(doomed)
        receipt.would_expire = [{"snapshot_id": s.snapshot_id,
                                 "timestamp": datetime.fromtimestamp(s.timestamp_ms / 1000, UTC).isoformat()}
                                for s in doomed[:MAX_LISTED]]
        summary = (f"dry run: {receipt.table}: compaction would rewrite {receipt.would_rewrite_data_files} data files "
                   f"({receipt.would_rewrite_bytes} bytes, {receipt.would_rewrite_groups} groups)"
                   + (f" and {receipt.would_rewrite_delete_files} delete files" if self.upsert else "")
                   + f", {receipt.would_expire_count} snapshots would expire")
        try:
            sink = pyspark_internals.jvm(self.spark).java.util.stream.Stream.builder()  # collects, deletes nothing
            found = sorted(str(path) for path in
                           self._orphan_action(receipt, table).deleteWith(sink).execute().orphanFileLocations())
        except OwnershipError as exc:
            receipt.status, receipt.orphans_refused = "failed", str(exc)
            receipt.message = f"{summary}; orphan removal would be refused: {exc}"
            return
        receipt.would_delete_orphans_count, receipt.would_delete_orphans = len(found), found[:MAX_LISTED]
        receipt.message = f"{summary}, {len(found)} orphan files would be deleted"

    def preview_compaction(self, receipt: TableReceipt) -> None:
        """The files `compact` would rewrite, as Iceberg's bin-pack planners plan them on the head (the
        planners `rewrite_data_files` and `rewrite_position_delete_files` use, with the same options)."""
        jvm, iceberg_table = self._java_table()
        head = iceberg_table.currentSnapshot()
        if head is None:
            return
        actions = jvm.org.apache.iceberg.actions
        planner = actions.BinPackRewriteFilePlanner(iceberg_table, self.compaction_filter(jvm), head.snapshotId(), True)
        planner.init(_java_map(jvm, self.compaction_options()))
        for group in _each(planner.plan().groups()):
            receipt.would_rewrite_groups += 1
            receipt.would_rewrite_data_files += int(group.inputFileNum())
            receipt.would_rewrite_bytes += int(group.inputFilesSizeInBytes())
        if self.upsert:
            planner = actions.BinPackRewritePositionDeletePlanner(iceberg_table, self.compaction_filter(jvm), True)
            planner.init(_java_map(jvm, self.delete_compaction_options()))
            receipt.would_rewrite_delete_files = sum(int(g.inputFileNum()) for g in _each(planner.plan().groups()))


class TimelineMaintenance(TableMaintenance):
    """The pipeline's share of the ops timeline (`ops.pipeline_events`), which takes one small file
    and one snapshot per event commit: compact the files holding this pipeline's events, rewrite
    manifests, expire snapshots older than TIMELINE_SNAPSHOT_AGE (the timeline's rows are its
    history; nothing resumes or time-travels from its snapshots) and remove orphan files."""

    def __init__(self, spark, catalog, spec: PipelineSpec, now: datetime, ownership: OwnershipCheck | None = None,
                 dry_run: bool = False):
        super().__init__(spark, catalog, spec, events.EVENTS_TABLE, now, ownership=ownership, dry_run=dry_run)
        self.upsert = False

    def compaction_scope(self) -> dict[str, str]:
        return {"where": f"\"pipeline = '{self.spec.name}'\""}  # a validated spec name: [a-z0-9_]

    def compaction_filter(self, jvm):
        return jvm.org.apache.iceberg.expressions.Expressions.equal("pipeline", self.spec.name)

    def expiry_cutoff(self) -> datetime:
        return self.now - TIMELINE_SNAPSHOT_AGE

    def keep(self, table: Table) -> set[int]:
        return snapshots_to_keep(table, None)


def run(spec: PipelineSpec, platform: config.PlatformConfig | None = None, spark=None, run_id: str | None = None,
        now: datetime | None = None, actor: events.Actor | None = None, dry_run: bool = False) -> MaintenanceReceipt:
    """Maintain every table of `spec` (with `dry_run`, only say what that would do); one `maintenance`
    event per table on the ops timeline, naming `actor` (default: this process's) and the run id and
    dry-run flag (`details.parameters`).

    Returns the receipt; a table whose maintenance failed in any way has status `failed` and the reason
    in its message, and the other tables are still maintained: never raises for one table's failure.
    A table whose event cannot be recorded is `failed` too (the timeline lacks its receipt).
    """
    platform = platform or config.load()
    actor = actor or events.Actor.of_process()
    spark = spark or sparkenv.session(platform, [spec.catalog], f"lakehouse-maintenance-{spec.name}")
    catalog = open_catalog(platform, spec.catalog)
    now = now or datetime.now(UTC)
    receipt = MaintenanceReceipt(pipeline=spec.name, run_id=run_id or uuid.uuid4().hex, dry_run=dry_run)
    ownership = OwnershipCheck(platform, spec)
    work = [TableMaintenance(spark, catalog, spec, name, now, ownership=ownership, dry_run=dry_run)
            for name in spec.owned_tables]
    events.events_table(platform, spec.catalog)  # the timeline exists from here on
    for maintenance in [*work, TimelineMaintenance(spark, catalog, spec, now, ownership=ownership, dry_run=dry_run)]:
        table_receipt = maintenance.run()
        receipt.tables.append(table_receipt)
        parameters = {"run_id": receipt.run_id, "dry_run": dry_run}
        try:
            events.record(events.Event(
                spec.name, "maintenance", table_receipt.status, table_receipt.message, table_receipt.metrics(),
                {"run_id": receipt.run_id, **table_receipt.to_json(), "parameters": parameters},
                actor=actor), platform=platform, catalog=spec.catalog)
        except Exception as exc:  # noqa: BLE001 - the next table is still maintained
            table_receipt.status = "failed"
            table_receipt.message += (f"; its `maintenance` event could not be recorded on the ops timeline "
                                      f"({sparkenv.describe_error(exc).splitlines()[0]})")
            log.error("%s", table_receipt.message)
    return receipt
