"""Table maintenance: compaction, manifest rewrite, snapshot expiry and orphan removal, with receipts.

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
             `maintenance.orphan_safety_window` (a commit in flight is never that old).

Then the same steps for the pipeline's events in the ops timeline (`TimelineMaintenance`),
which otherwise grows by one small file and one snapshot per event.

Rewrites commit with Iceberg's optimistic concurrency: a concurrent append is
rebased under the rewrite, a conflicting commit (new deletes against rewritten files)
fails it, and it is retried from the new head up to COMMIT_ATTEMPTS times; after that
the table's receipt says `failed` and why. Each table gets one `maintenance` event on
the ops timeline with the receipt's numbers as metrics.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, TypeVar
from urllib.parse import urlsplit

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakehouse.core import config, errors, events, offsets, sparkenv
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec

log = logging.getLogger("lakehouse.maintenance")
COMMIT_ATTEMPTS = 4
# snapshot ids per expire_snapshots call (a SQL array literal)
EXPIRE_CHUNK = 500
# the ops timeline keeps its snapshots this long: enough for readers scanning it while it is maintained
TIMELINE_SNAPSHOT_AGE = timedelta(hours=1)
# summary keys only a data-file or delete-file rewrite writes (rewrite_manifests writes neither)
_REWRITE_KEYS = ("deleted-data-files", "removed-delete-files", "removed-position-delete-files")
T = TypeVar("T")


class MaintenanceError(errors.LakehouseError, RuntimeError):
    """A maintenance step on one table failed (after retries) or broke an invariant; says which and why."""


@dataclass(frozen=True)
class Content:
    """Row count and order-independent content hash of one snapshot."""

    rows: int
    checksum: str  # exact decimal sum of xxhash64 over all columns of every row


@dataclass
class CompactionCommit:
    """One rewrite commit and the snapshot it was applied to, with their content."""

    snapshot_id: int
    parent_id: int
    before: Content
    after: Content


@dataclass
class TableReceipt:
    """What maintenance did to one table. Files, bytes and content are measured on the snapshot the
    first compaction replaced (before) and on the last compaction commit (after), so rows that
    ingestion appended meanwhile do not blur the comparison; without compaction both are the head."""

    table: str
    status: str = "ok"  # ok | skipped (table missing or empty) | failed
    message: str = ""
    data_files_before: int = 0
    data_files_after: int = 0
    delete_files_before: int = 0
    delete_files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    rows_before: int = 0
    rows_after: int = 0
    checksum_before: str = "0"
    checksum_after: str = "0"
    rewritten_data_files: int = 0
    added_data_files: int = 0
    rewritten_delete_files: int = 0
    compaction_attempts: int = 0
    compactions: list[CompactionCommit] = field(default_factory=list)
    manifests_rewritten: int = 0
    snapshots_expired: int = 0
    expire_older_than: str | None = None
    kept_for_resume: int = 0  # snapshots older than the window kept because resume or an audit walks them
    positions_snapshot_id: int | None = None
    orphans_removed: int = 0
    orphan_older_than: str | None = None
    seconds: float = 0.0

    @property
    def content_unchanged(self) -> bool:
        return all(c.before == c.after for c in self.compactions)

    def metrics(self) -> dict[str, float]:
        """The numbers for the ops timeline (checksums are in the details: a double cannot hold them)."""
        keys = ("data_files_before", "data_files_after", "delete_files_before", "delete_files_after",
                "bytes_before", "bytes_after", "rows_before", "rows_after", "rewritten_data_files",
                "added_data_files", "rewritten_delete_files", "manifests_rewritten", "snapshots_expired",
                "orphans_removed", "seconds")
        return {**{k: float(getattr(self, k)) for k in keys},
                "content_unchanged": float(self.content_unchanged)}

    def to_json(self) -> dict:
        return {**asdict(self), "content_unchanged": self.content_unchanged}


@dataclass
class MaintenanceReceipt:
    pipeline: str
    run_id: str
    tables: list[TableReceipt] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.status != "failed" for t in self.tables)

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "run_id": self.run_id, "ok": self.ok,
                "tables": [t.to_json() for t in self.tables]}


def _is_retryable(exc: BaseException) -> bool:
    """Another commit won (Iceberg's optimistic concurrency) or the catalog was briefly unavailable."""
    return errors.commit_conflict(exc) or errors.transient_cause(exc) is not None


def retrying(what: str, fn: Callable[[], T]) -> tuple[T, int]:
    """(fn(), attempts), retrying commit conflicts; MaintenanceError once attempts run out or on other errors."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return fn(), attempt
        except Exception as exc:  # py4j wraps Iceberg's exceptions
            if not _is_retryable(exc) or attempt == COMMIT_ATTEMPTS:
                raise MaintenanceError(f"{what} failed after {attempt} attempt(s): "
                                       f"{sparkenv.describe_error(exc)}") from exc
            log.warning("%s conflicted with another commit (attempt %d), retrying", what, attempt)
            time.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


def timestamp_literal(at: datetime) -> str:
    """A Spark SQL TIMESTAMP literal in UTC (the session time zone is UTC)."""
    return "TIMESTAMP '" + at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


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

    `run()` returns the table's receipt; a step that fails after its retries, or a compaction that
    changed the content, stops the table's remaining steps and marks the receipt `failed`."""

    def __init__(self, spark, catalog, spec: PipelineSpec, table: str, now: datetime):
        self.spark = spark
        self.catalog = catalog
        self.spec = spec
        self.table = table
        self.qualified = spec.qualified(table)
        self.now = now
        # merge-on-read tables also carry delete files to compact
        self.upsert = spec.target.mode == "upsert" and table in spec.target.tables

    def _call(self, procedure: str, **args: str):
        sql_args = ", ".join(f"{k} => {v}" for k, v in {"table": f"'{self.table}'", **args}.items())
        return self.spark.sql(f"CALL {self.spec.catalog}.system.{procedure}({sql_args})").collect()

    @staticmethod
    def _options(options: dict[str, object]) -> str:
        return "map(" + ", ".join(f"'{k}', '{v}'" for k, v in options.items()) + ")"

    def run(self) -> TableReceipt:
        started = time.monotonic()
        receipt = TableReceipt(table=self.spec.qualified(self.table))
        try:
            table = self.catalog.load_table(self.table)
        except NoSuchTableError:
            receipt.status, receipt.message = "skipped", "table does not exist yet"
            return receipt
        head = table.current_snapshot()
        if head is None:
            receipt.status, receipt.message = "skipped", "table has no snapshot yet"
            return receipt
        try:
            self.compact(receipt, head.snapshot_id)
            receipt.manifests_rewritten = self.rewrite_manifests()
            self.expire(receipt)
            self.remove_orphans(receipt)
        except MaintenanceError as exc:  # the steps done so far stay in the receipt
            receipt.status, receipt.message = "failed", str(exc)
            log.error("%s", exc)
        else:
            receipt.message = (f"{receipt.table}: data files {receipt.data_files_before}->"
                               f"{receipt.data_files_after}, delete files {receipt.delete_files_before}->"
                               f"{receipt.delete_files_after}, {receipt.snapshots_expired} snapshots expired, "
                               f"{receipt.orphans_removed} orphans removed")
        receipt.seconds = round(time.monotonic() - started, 3)
        return receipt

    def compact(self, receipt: TableReceipt, head_id: int) -> None:
        """Rewrite small data files (and, for upsert tables, files with deletes and the delete files),
        then check each rewrite commit left the content of the snapshot it replaced unchanged."""
        since_ms = int(time.time() * 1000) - 1000  # rewrite commits are stamped by this process' clock
        options = {"min-input-files": self.spec.maintenance.min_input_files,
                   "target-file-size-bytes": self.spec.target.target_file_size_bytes}
        if self.upsert:
            options["delete-file-threshold"] = self.spec.maintenance.min_input_files
        rows, receipt.compaction_attempts = retrying(f"compaction of {receipt.table}", lambda: self._call(
            "rewrite_data_files", options=self._options(options), **self.compaction_scope()))
        receipt.rewritten_data_files = int(rows[0]["rewritten_data_files_count"])
        receipt.added_data_files = int(rows[0]["added_data_files_count"])
        if self.upsert:
            rows, _ = retrying(f"delete-file compaction of {receipt.table}", lambda: self._call(
                "rewrite_position_delete_files",
                options=self._options({"min-input-files": self.spec.maintenance.min_input_files})))
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

    def expire(self, receipt: TableReceipt) -> None:
        """Expire the snapshots older than the cutoff that nothing needs, by id (expire_snapshots with
        `snapshot_ids`, nothing expired by age alone), then check the resume chain is intact."""
        table = self.catalog.load_table(self.table)
        cutoff = self.expiry_cutoff()
        receipt.expire_older_than = cutoff.isoformat()
        point = offsets.resume_point(table.metadata, self.spec.name)
        receipt.positions_snapshot_id = point.snapshot.snapshot_id if point.snapshot is not None else None
        keep = self.keep(table)
        old = [s for s in table.metadata.snapshots if s.timestamp_ms < cutoff.timestamp() * 1000]
        doomed = sorted(s.snapshot_id for s in old if s.snapshot_id not in keep)
        receipt.kept_for_resume = len(old) - len(doomed)
        before = {s.snapshot_id for s in table.metadata.snapshots}
        for i in range(0, len(doomed), EXPIRE_CHUNK):
            ids = ", ".join(f"{int(sid)}L" for sid in doomed[i:i + EXPIRE_CHUNK])
            # older_than at the epoch: the explicit ids are all that expires (Iceberg would otherwise
            # also expire by the table's max-snapshot-age)
            retrying(f"snapshot expiry of {receipt.table}", lambda: self._call(
                "expire_snapshots", older_than="TIMESTAMP '1970-01-01 00:00:00.001'", snapshot_ids=f"array({ids})"))
        table = self.catalog.load_table(self.table)
        receipt.snapshots_expired = len(before - {s.snapshot_id for s in table.metadata.snapshots})
        if receipt.positions_snapshot_id is not None:
            progress = offsets.progress_of(table, self.table, self.spec.name)
            if progress.snapshot_id is None:
                raise MaintenanceError(f"snapshot expiry of {receipt.table} lost the positions snapshot "
                                       f"{receipt.positions_snapshot_id}: the next ingest run cannot resume; "
                                       f"stop ingestion and restore the table's metadata")

    def remove_orphans(self, receipt: TableReceipt) -> None:
        """Delete files no snapshot references that are older than the orphan safety window.

        The Action API, not the procedure: the procedure refuses windows under 24 hours, while the
        spec allows down to one hour (and 100 trigger intervals)."""
        older_than = self.now - timedelta(seconds=self.spec.maintenance.orphan_safety_window_s)
        receipt.orphan_older_than = older_than.isoformat()
        jvm = self.spark.sparkContext._jvm
        iceberg_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self.qualified)
        action = jvm.org.apache.iceberg.spark.actions.SparkActions.get(self.spark._jsparkSession) \
            .deleteOrphanFiles(iceberg_table).olderThan(int(older_than.timestamp() * 1000))
        if urlsplit(iceberg_table.location()).scheme in config.S3_SCHEMES:
            action = action.usePrefixListing(True)  # list through the table's S3FileIO, not Hadoop
        result = action.execute()
        receipt.orphans_removed = sum(1 for _ in result.orphanFileLocations())


class TimelineMaintenance(TableMaintenance):
    """The pipeline's share of the ops timeline (`ops.pipeline_events`), which takes one small file
    and one snapshot per event commit: compact the files holding this pipeline's events, rewrite
    manifests, expire snapshots older than TIMELINE_SNAPSHOT_AGE (the timeline's rows are its
    history; nothing resumes or time-travels from its snapshots) and remove orphan files."""

    def __init__(self, spark, catalog, spec: PipelineSpec, now: datetime):
        super().__init__(spark, catalog, spec, events.EVENTS_TABLE, now)
        self.upsert = False

    def compaction_scope(self) -> dict[str, str]:
        return {"where": f"\"pipeline = '{self.spec.name}'\""}  # a validated spec name: [a-z0-9_]

    def expiry_cutoff(self) -> datetime:
        return self.now - TIMELINE_SNAPSHOT_AGE

    def keep(self, table: Table) -> set[int]:
        return snapshots_to_keep(table, None)


def run(spec: PipelineSpec, platform: config.PlatformConfig | None = None, spark=None, run_id: str | None = None,
        now: datetime | None = None, actor: events.Actor | None = None) -> MaintenanceReceipt:
    """Maintain every table of `spec`; one `maintenance` event per table on the ops timeline, naming
    `actor` (default: this process's) and the run id (`details.parameters`).

    Returns the receipt; a table whose maintenance failed has status `failed` and the reason
    in its message (the other tables are still maintained). Never raises for one table's failure.
    """
    platform = platform or config.load()
    actor = actor or events.Actor.of_process()
    spark = spark or sparkenv.session(platform, [spec.catalog], f"lakehouse-maintenance-{spec.name}")
    catalog = open_catalog(platform, spec.catalog)
    now = now or datetime.now(timezone.utc)
    receipt = MaintenanceReceipt(pipeline=spec.name, run_id=run_id or uuid.uuid4().hex)
    work = [TableMaintenance(spark, catalog, spec, name, now) for name in spec.owned_tables]
    events.events_table(platform, spec.catalog)  # the timeline exists from here on
    for maintenance in [*work, TimelineMaintenance(spark, catalog, spec, now)]:
        table_receipt = maintenance.run()
        receipt.tables.append(table_receipt)
        events.record(events.Event(
            spec.name, "maintenance", table_receipt.status, table_receipt.message, table_receipt.metrics(),
            {"run_id": receipt.run_id, **table_receipt.to_json(), "parameters": {"run_id": receipt.run_id}},
            actor=actor), platform=platform, catalog=spec.catalog)
    return receipt


def receipt_from_events(pipeline: str, run_id: str, since: datetime | None = None,
                        platform: config.PlatformConfig | None = None, catalog: str = "lake") -> dict:
    """The receipt of maintenance run `run_id` as its `maintenance` events recorded it (one per table),
    in the shape of `MaintenanceReceipt.to_json()`; `tables` is empty when the run recorded nothing."""
    rows = events.recent(pipeline, "maintenance", since=since, limit=1000, platform=platform, catalog=catalog)
    tables = [row["details"] for row in reversed(rows) if row["details"].get("run_id") == run_id]
    for table in tables:
        for audit_only in ("run_id", "parameters", "actor"):
            table.pop(audit_only, None)
    return {"pipeline": pipeline, "run_id": run_id, "ok": all(t["status"] != "failed" for t in tables),
            "tables": tables}
