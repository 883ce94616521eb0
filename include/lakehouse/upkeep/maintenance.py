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
             `maintenance.orphan_safety_window` (a commit in flight is never that old), but only
             once the table is proven to own its folder (`OwnershipCheck`): its location is the one
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
event on the ops timeline with the receipt's numbers as metrics.

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
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from lakehouse.core import config, errors, events, offsets, retry, sparkenv
from lakehouse.core import spec as spec_module
from lakehouse.core.adapters import pyspark_internals
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import MaintenanceError, OwnershipError
from lakehouse.core.spec import PipelineSpec
from lakehouse.core.table_properties import IcebergProperties

log = logging.getLogger("lakehouse.maintenance")
COMMIT_ATTEMPTS = 4
# snapshot ids per expire_snapshots call (a SQL array literal)
EXPIRE_CHUNK = 500
# the ops timeline keeps its snapshots this long: enough for readers scanning it while it is maintained
TIMELINE_SNAPSHOT_AGE = timedelta(hours=1)
# summary keys only a data-file or delete-file rewrite writes (rewrite_manifests writes neither)
_REWRITE_KEYS = ("deleted-data-files", "removed-delete-files", "removed-position-delete-files")
# file paths and snapshots a receipt lists (its counts are exact): a receipt is a timeline event and an XCom
MAX_LISTED = 500
# Table properties that put a table's files somewhere else than <location>/data and <location>/metadata
# (Iceberg's Java names; write.folder-storage.path is the older name of write.data.path).
PATH_PROPERTIES = (IcebergProperties.WRITE_DATA_LOCATION, IcebergProperties.WRITE_METADATA_LOCATION,
                   IcebergProperties.OBJECT_STORE_PATH, IcebergProperties.WRITE_FOLDER_STORAGE_LOCATION)
# A location provider of the table's own (Java or pyiceberg) may place files anywhere.
LOCATION_PROVIDER_PROPERTIES = (IcebergProperties.WRITE_LOCATION_PROVIDER_IMPL,
                                IcebergProperties.WRITE_PY_LOCATION_PROVIDER_IMPL)
GC_ENABLED = IcebergProperties.GC_ENABLED
# The catalogs listed to prove that no other table shares a table's folder: at most this many tables,
# loaded this many at a time, within this many seconds; beyond either bound nothing is proven.
INVENTORY_MAX_TABLES = 5000
INVENTORY_THREADS = 8
INVENTORY_TIMEOUT_S = 300.0
_NAMESPACE_DEPTH = 8  # nested namespaces listed this deep
T = TypeVar("T")


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


# ---------------------------------------------------------------------------- what a table owns

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(.*)", re.DOTALL)  # two letters at least: C:/ is a drive
# Schemes that name the same objects: Iceberg's S3FileIO (s3) and Hadoop's S3A (s3a, and the older s3n).
_SAME_SCHEME = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class StoragePath:
    """A folder or file of a filesystem or object store, compared segment by segment: `s3://b/wh/t` holds
    `s3a://b/wh/t/data/x.parquet` but not `s3://b/wh/t_dlq` (a prefix of the text is not a folder)."""

    scheme: str
    authority: str
    segments: tuple[str, ...]

    def within(self, other: StoragePath) -> bool:
        """Whether this is `other` or lies inside it."""
        return ((self.scheme, self.authority) == (other.scheme, other.authority)
                and self.segments[:len(other.segments)] == other.segments)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/{'/'.join(self.segments)}"


def _split(uri: str) -> tuple[str, str, str] | None:
    """(scheme, authority, path) of `uri` read literally, or None for a relative path. A bare absolute path
    is a file: path; s3a and s3n are s3; a file: URI's `localhost` authority is none."""
    found = _SCHEME.fullmatch(uri)
    if found is None:
        if not uri.startswith("/"):
            return None
        scheme, rest = "file", uri
    else:
        scheme, rest = found.group(1).lower(), found.group(2)
    scheme = _SAME_SCHEME.get(scheme, scheme)
    authority = ""
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
    authority = authority.lower()
    if scheme == "file" and authority == "localhost":
        authority = ""
    return scheme, authority, rest


def canonical_path(uri: str) -> StoragePath | None:
    """`uri` as the one place every client takes it for, or None when clients may disagree about it: a
    relative path, `.` or `..` segments (an object store keeps them as key characters, a filesystem
    resolves them), an empty segment (`a//b`), a query, fragment or percent-escape (some clients cut or
    decode them, others do not), a backslash or a control character, or an opaque `scheme:path` whose path
    does not start at a root (`a0:0`: a folder "0" to one client, the root to another). A table is proven to
    own only a location of this plain form."""
    if not uri or any(c in uri for c in "?#%\\") or any(ord(c) < 32 or ord(c) == 127 for c in uri):
        return None
    parts = _split(uri)
    if parts is None:
        return None
    scheme, authority, path = parts
    if path and not path.startswith("/"):
        return None
    segments = path.rstrip("/").split("/")[1:] if path.rstrip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        return None
    return StoragePath(scheme, authority, tuple(segments))


def _resolved(segments: Iterable[str]) -> tuple[str, ...]:
    """`segments` with `.` dropped and `..` taking the one before it, as a filesystem resolves them."""
    out: list[str] = []
    for segment in segments:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return tuple(out)


def readings(uri: str) -> set[StoragePath]:
    """Every place some client may take `uri` for: read literally or with its query and fragment cut off,
    percent-escapes kept or decoded, backslashes kept or taken as slashes, `.` and `..` segments kept (an
    object store's key) or resolved (a filesystem), empty segments dropped. Empty for a relative path.
    Another table's paths are checked in every reading, so that no spelling of them hides an overlap."""
    texts = {uri, re.split(r"[?#]", uri, maxsplit=1)[0]}
    texts |= {unquote(text) for text in texts}
    texts |= {text.replace("\\", "/") for text in texts}
    found = set()
    for text in texts:
        parts = _split(text)
        if parts is None:
            continue
        scheme, authority, path = parts
        segments = [s for s in path.split("/") if s]
        found.add(StoragePath(scheme, authority, tuple(segments)))
        found.add(StoragePath(scheme, authority, _resolved(segments)))
    return found


def assigned_locations(kind: str, warehouse: str | None, namespace: tuple[str, ...], name: str,
                       namespace_location: str | None) -> list[str]:
    """Where a catalog of type `kind` puts table `namespace`.`name` when nobody names a location: inside
    the namespace's `location` when it has one (pyiceberg's catalogs; a REST server over Iceberg's
    JdbcCatalog reports its default there), and inside the warehouse as that type lays tables out:
    `<warehouse>/<ns>/<table>` for JDBC and REST (Iceberg's JdbcCatalog and pyiceberg's SqlCatalog alike),
    `<warehouse>/<ns>.db/<table>` for Hive and Glue."""
    found = []
    if namespace_location:
        found.append(f"{namespace_location.rstrip('/')}/{name}")
    if warehouse:
        base = warehouse.rstrip("/")
        if kind in ("hive", "glue"):
            found.append(f"{base}/{'.'.join(namespace)}.db/{name}")
        else:
            found.append(f"{base}/{'/'.join(namespace)}/{name}")
    return list(dict.fromkeys(found))


def catalog_server(settings: config.CatalogConfig) -> tuple:
    """Which catalog `settings` opens, so that one table listed under two names is known as one: a JDBC
    catalog is its database and its name (Iceberg keys a JDBC catalog's tables by catalog name, so two
    names are two catalogs), any other catalog the service it talks to (two names of one REST server list
    the same tables; they are told apart by their tables' UUIDs)."""
    if settings.type == "jdbc":
        return ("jdbc", settings.uri, settings.name)
    return (settings.type, settings.uri, settings.properties.get("prefix", ""))


@dataclass(frozen=True)
class TableFiles:
    """Where one table keeps its files, as its current metadata says: its location, the file-placing
    properties it sets (PATH_PROPERTIES, LOCATION_PROVIDER_PROPERTIES, GC_ENABLED) and the files its
    metadata names without reading further (the metadata file, the earlier ones it logs, each snapshot's
    manifest list). `catalog` is the name it was listed under, `server` which catalog that is
    (`catalog_server`); `unreadable` says why nothing else is known."""

    catalog: str
    server: tuple
    identifier: str  # namespace.table
    uuid: str = ""
    location: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    files: tuple[tuple[str, str], ...] = ()  # (what, URI)
    unreadable: str | None = None

    @property
    def name(self) -> str:
        return f"{self.catalog}.{self.identifier}"

    def is_same_table(self, other: TableFiles) -> bool:
        return (self.server, self.identifier, self.uuid) == (other.server, other.identifier, other.uuid)

    def folders(self) -> list[tuple[str, str]]:
        """(what, URI) of each folder the table writes files into: its location and the path properties set."""
        return [("location", self.location),
                *((key, self.properties[key]) for key in PATH_PROPERTIES if self.properties.get(key))]

    @classmethod
    def of(cls, catalog: str, server: tuple, identifier: str, table: Table) -> TableFiles:
        metadata = table.metadata
        files = [("metadata file", table.metadata_location),
                 *(("earlier metadata file", entry.metadata_file) for entry in metadata.metadata_log),
                 *((f"manifest list of snapshot {snap.snapshot_id}", snap.manifest_list)
                   for snap in metadata.snapshots if snap.manifest_list)]
        placing = (*PATH_PROPERTIES, *LOCATION_PROVIDER_PROPERTIES, GC_ENABLED)
        return cls(catalog=catalog, server=server, identifier=identifier, uuid=str(metadata.table_uuid),
                   location=table.location(),
                   properties={k: str(v) for k, v in table.properties.items() if k in placing},
                   files=tuple((what, uri) for what, uri in files if uri))


@dataclass
class Inventory:
    """The tables of the catalogs listed (`take_inventory`) and what kept any of them from being listed."""

    tables: list[TableFiles] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _first_line(exc: BaseException) -> str:
    return sparkenv.describe_error(exc).splitlines()[0][:300]


def _overlaps(own: StoragePath, other: TableFiles) -> list[str]:
    """How `other` keeps files inside `own` (or holds it inside a folder of its own), as phrases; [] for none."""
    if other.unreadable is not None:
        return [(f"{other.name} could not be read ({other.unreadable}), so where its files lie is unknown; "
                 f"repair or drop it")]
    found = [f"{other.name} places its files with a location provider of its own ({key}={other.properties[key]})"
             for key in LOCATION_PROVIDER_PROPERTIES if other.properties.get(key)]
    for what, uri in other.folders():
        seen = readings(uri)
        if not seen:
            found.append(f"{other.name}'s {what} {uri!r} is a relative path, which lies anywhere")
        elif any(place.within(own) for place in seen):
            found.append(f"{other.name}'s {what} {uri} lies inside it")
        elif any(own.within(place) for place in seen):
            found.append(f"it lies inside {other.name}'s {what} {uri}")
    for what, uri in other.files:
        if any(place.within(own) for place in readings(uri)):
            found.append(f"{other.name}'s {what} {uri} lies inside it")
            break  # one of its files tells enough
    return found


def ownership_refusal(subject: TableFiles, assigned: list[str], inventory: Inventory) -> str | None:
    """Why orphan removal must not run on `subject`, or None when it owns every file under its location:
    the location is plain (`canonical_path`) and inside one of the `assigned` ones (`assigned_locations`),
    GC is enabled, no location provider of its own places files, each path property lies inside the
    location, every catalog was listed, and no other table of `inventory` keeps a folder or a file inside
    the location or holds it inside a folder of its own. The reason names the offending table or setting
    and what to do."""
    own = canonical_path(subject.location)
    if own is None:
        return (f"its location {subject.location!r} is not a plain absolute URI (it is relative or holds '.', "
                f"'..', '//', a query, a fragment, a percent-escape or a backslash), which clients may take for "
                f"different places; recreate the table at the location its catalog assigns")
    homes = [home for home in (canonical_path(a) for a in assigned) if home is not None]
    if not any(own.within(home) for home in homes):
        where = " or ".join(assigned) or "none: the catalog names no warehouse and the namespace no location"
        return (f"its location {subject.location} is not where catalog {subject.catalog!r} puts the table (it "
                f"assigns {where}), so files of others may share that folder; recreate the table at its "
                f"assigned location, or remove orphan files by hand after checking the folder")
    props = subject.properties
    if props.get(GC_ENABLED, "true").strip().lower() == "false":
        return (f"the table sets {GC_ENABLED}=false: its files may be shared with another table (a snapshot or "
                f"a migrated table); set it to true only once the table owns all its files")
    for key in LOCATION_PROVIDER_PROPERTIES:
        if props.get(key):
            return (f"the table sets {key}={props[key]}: a location provider of its own may place files "
                    f"anywhere; unset it (ALTER TABLE ... UNSET TBLPROPERTIES ('{key}'))")
    for key in PATH_PROPERTIES:
        value = props.get(key)
        if value:
            place = canonical_path(value)
            if place is None or not place.within(own):
                return (f"the table sets {key}={value}, which is not a plain path inside its location "
                        f"{subject.location}: files there may be another table's, and the table's own files "
                        f"there are never listed; unset it (ALTER TABLE ... UNSET TBLPROPERTIES ('{key}')) and "
                        f"rewrite the table's files into its location")
    if inventory.problems:
        more = f" (and {len(inventory.problems) - 3} more)" if len(inventory.problems) > 3 else ""
        return ("it cannot be proven that no other table keeps files inside its location: "
                + "; ".join(inventory.problems[:3]) + more)
    conflicts = [c for other in inventory.tables if not other.is_same_table(subject) for c in _overlaps(own, other)]
    if conflicts:
        more = f"; and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        return (f"its location {subject.location} is shared: " + "; ".join(conflicts[:5]) + more
                + ". Give each table a folder of its own (drop or recreate one of them at its assigned location, "
                  "or unset the path property that points into the other), then run maintenance again")
    return None


class _TooManyTables(Exception):
    pass


def _list_tables(catalog, deadline: float, budget: int) -> list[tuple[str, ...]]:
    """Every table identifier of `catalog`, nested namespaces down to _NAMESPACE_DEPTH levels. Raises
    _TooManyTables past `budget` tables, TimeoutError past `deadline` (time.monotonic())."""
    found: list[tuple[str, ...]] = []
    queue: list[tuple[str, ...]] = [()]
    seen: set[tuple[str, ...]] = set()
    while queue:
        if time.monotonic() > deadline:
            raise TimeoutError("listing took too long")
        parent = queue.pop()
        for child in (catalog.list_namespaces(parent) if parent else catalog.list_namespaces()):
            child = tuple(child)
            if (child not in seen and len(parent) < len(child) <= _NAMESPACE_DEPTH
                    and child[:len(parent)] == parent):
                seen.add(child)
                queue.append(child)
        if parent:
            try:
                found.extend(tuple(t) for t in catalog.list_tables(parent))
            except NoSuchNamespaceError:  # dropped meanwhile
                continue
            if len(found) > budget:
                raise _TooManyTables
    return found


def take_inventory(platform: config.PlatformConfig, names: Iterable[str], max_tables: int = INVENTORY_MAX_TABLES,
                   timeout_s: float = INVENTORY_TIMEOUT_S) -> Inventory:
    """Every table of catalogs `names`, with where it keeps its files (TableFiles), loaded INVENTORY_THREADS at
    a time. Never raises: a catalog that cannot be opened or listed, more than `max_tables` tables or more
    than `timeout_s` seconds is a problem in the result; a table that cannot be read is in it as unreadable;
    one dropped meanwhile is left out. Each catalog service is listed once."""
    deadline = time.monotonic() + timeout_s
    inventory = Inventory()
    pending: dict = {}
    listed: set[tuple] = set()
    pool = ThreadPoolExecutor(INVENTORY_THREADS, thread_name_prefix="lakehouse-inventory")
    try:
        for name in sorted(set(names)):
            try:
                server = catalog_server(platform.catalog(name))
                if server in listed:
                    continue
                listed.add(server)
                catalog = open_catalog(platform, name)
                identifiers = _list_tables(catalog, deadline, max_tables - len(pending))
            except _TooManyTables:
                inventory.problems.append(f"the configured catalogs hold more than {max_tables} tables, more than "
                                          f"maintenance lists to prove it (maintenance.INVENTORY_MAX_TABLES)")
                return inventory
            except Exception as exc:  # noqa: BLE001 - TimeoutError among them: the catalog stays unproven
                inventory.problems.append(f"catalog {name!r} could not be opened or listed ({_first_line(exc)}); "
                                          f"check that it is reachable, or take it out of the configuration")
                continue
            for identifier in identifiers:
                pending[pool.submit(catalog.load_table, identifier)] = (name, server, ".".join(identifier))
        try:
            for future in as_completed(pending, timeout=max(deadline - time.monotonic(), 0)):
                name, server, identifier = pending[future]
                try:
                    inventory.tables.append(TableFiles.of(name, server, identifier, future.result()))
                except NoSuchTableError:
                    continue  # dropped meanwhile
                except Exception as exc:  # noqa: BLE001 - corrupt or missing metadata, a refusal, ...
                    inventory.tables.append(TableFiles(name, server, identifier, unreadable=_first_line(exc)))
        except TimeoutError:  # concurrent.futures' is the builtin since 3.11
            inventory.problems.append(f"reading {len(pending)} tables' metadata took more than {timeout_s:g} s "
                                      f"(maintenance.INVENTORY_TIMEOUT_S)")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    inventory.tables.sort(key=lambda t: t.name)
    return inventory


class OwnershipCheck:
    """Proves, before orphan removal, that a table of `spec` owns every file under its location
    (`ownership_refusal`). The catalogs are listed once per maintenance run, at its first proof: the
    pipeline's catalog, every catalog named in pyiceberg's configuration, those of the valid specs in the
    spec's folder and in the pipelines folder."""

    def __init__(self, platform: config.PlatformConfig, spec: PipelineSpec):
        self.platform = platform
        self.spec = spec
        self._inventory: Inventory | None = None

    def catalog_names(self) -> list[str]:
        names = {self.spec.catalog, *self.platform.catalog_settings}
        for folder in {Path(self.spec.path).parent, config.pipelines_dir()}:
            if folder.is_dir():
                names.update(s.catalog for s in spec_module.load_all(folder).values())
        return sorted(names)

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = take_inventory(self.platform, self.catalog_names())
        return self._inventory

    def prove(self, catalog, table_name: str, table: Table) -> TableFiles:
        """`table` (`table_name` of the pipeline's catalog, opened as `catalog`) as proven to own every file
        under its location; raises OwnershipError saying why not."""
        settings = self.platform.catalog(self.spec.catalog)
        *namespace, name = table_name.split(".")
        try:
            namespace_location = catalog.load_namespace_properties(tuple(namespace)).get("location")
        except NoSuchNamespaceError:
            namespace_location = None
        warehouse = catalog.properties.get("warehouse") or settings.warehouse
        assigned = assigned_locations(settings.type, warehouse, tuple(namespace), name, namespace_location)
        subject = TableFiles.of(self.spec.catalog, catalog_server(settings), table_name, table)
        reason = ownership_refusal(subject, assigned, self.inventory())
        if reason is not None:
            raise OwnershipError(f"orphan removal of {self.spec.catalog}.{table_name} refused, nothing deleted: "
                                 f"{reason}")
        return subject


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
        if self.upsert:
            options["delete-file-threshold"] = self.spec.maintenance.min_input_files
        return options

    def compact(self, receipt: TableReceipt, head_id: int) -> None:
        """Rewrite small data files (and, for upsert tables, files with deletes and the delete files),
        then check each rewrite commit left the content of the snapshot it replaced unchanged."""
        since_ms = int(time.time() * 1000) - 1000  # rewrite commits are stamped by this process' clock
        options = self.compaction_options()
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
            planner.init(_java_map(jvm, {"min-input-files": self.spec.maintenance.min_input_files}))
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
