"""Maintenance receipts: what a maintenance run did (or, dry, would do) to each table of a pipeline.

A `TableReceipt` per table, gathered in a `MaintenanceReceipt`; each table's receipt is its `maintenance`
event on the ops timeline (numbers as metrics, the rest as details), `render` shows a receipt as text and
`receipt_from_events` reads a run's receipt back from its events (the Airflow operator's XCom).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime

from lakehouse.core import config, events

# file paths and snapshots a receipt lists (its counts are exact): a receipt is a timeline event and an XCom
MAX_LISTED = 500


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
    ingestion appended meanwhile do not blur the comparison; without compaction both are the head.

    A dry run fills the `would_*` fields instead and changes nothing: files and bytes are the head's
    before and after, rows and checksums are not computed. Lists hold at most MAX_LISTED entries;
    the counts beside them are exact."""

    table: str
    status: str = "ok"  # ok | skipped (table missing or empty; a dry run) | failed
    message: str = ""
    dry_run: bool = False
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
    expired_snapshot_ids: list[int] = field(default_factory=list)
    orphans_removed: int = 0
    removed_orphan_files: list[str] = field(default_factory=list)
    orphan_older_than: str | None = None
    orphans_refused: str | None = None  # why orphan removal was refused (OwnershipError), if it was
    # dry run: what a run would do
    would_rewrite_data_files: int = 0
    would_rewrite_bytes: int = 0
    would_rewrite_groups: int = 0
    would_rewrite_delete_files: int = 0
    would_expire_count: int = 0
    would_expire: list[dict] = field(default_factory=list)  # {"snapshot_id", "timestamp"}, oldest first
    would_delete_orphans_count: int = 0
    would_delete_orphans: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def content_unchanged(self) -> bool:
        return all(c.before == c.after for c in self.compactions)

    def metrics(self) -> dict[str, float]:
        """The numbers for the ops timeline (checksums are in the details: a double cannot hold them)."""
        keys = ("data_files_before", "data_files_after", "delete_files_before", "delete_files_after",
                "bytes_before", "bytes_after", "rows_before", "rows_after", "rewritten_data_files",
                "added_data_files", "rewritten_delete_files", "manifests_rewritten", "snapshots_expired",
                "orphans_removed", "would_rewrite_data_files", "would_rewrite_delete_files", "would_expire_count",
                "would_delete_orphans_count", "seconds")
        return {**{k: float(getattr(self, k)) for k in keys},
                "content_unchanged": float(self.content_unchanged), "dry_run": float(self.dry_run),
                "orphans_refused": float(self.orphans_refused is not None)}

    def to_json(self) -> dict:
        return {**asdict(self), "content_unchanged": self.content_unchanged}


@dataclass
class MaintenanceReceipt:
    pipeline: str
    run_id: str
    tables: list[TableReceipt] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return all(t.status != "failed" for t in self.tables)

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "run_id": self.run_id, "ok": self.ok, "dry_run": self.dry_run,
                "tables": [t.to_json() for t in self.tables]}


def render(receipt: MaintenanceReceipt) -> str:
    """The receipt as text: a line per table and, for a dry run, the snapshots it would expire and the
    orphan files it would delete (at most MAX_LISTED of each)."""
    lines = [f"dry run of {receipt.pipeline}'s maintenance: nothing was rewritten, expired or deleted"] \
        if receipt.dry_run else []
    for table in receipt.tables:
        lines.append(f"{table.status:<8} {table.message}")
        if not table.dry_run:
            continue
        if table.would_expire_count:
            lines.append(f"  snapshots that would expire ({table.would_expire_count}):")
            lines += [f"    {s['snapshot_id']}  {s['timestamp']}" for s in table.would_expire]
            if table.would_expire_count > len(table.would_expire):
                lines.append(f"    ... and {table.would_expire_count - len(table.would_expire)} more")
        if table.would_delete_orphans_count:
            lines.append(f"  orphan files that would be deleted ({table.would_delete_orphans_count}, older than "
                         f"{table.orphan_older_than}):")
            lines += [f"    {path}" for path in table.would_delete_orphans]
            if table.would_delete_orphans_count > len(table.would_delete_orphans):
                lines.append(f"    ... and {table.would_delete_orphans_count - len(table.would_delete_orphans)} more")
    return "\n".join(lines)


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
            "dry_run": any(t.get("dry_run") for t in tables), "tables": tables}
