"""The ownership guard: orphan removal runs only on a table proven to own every file under its location.

`OwnershipCheck.prove` gathers what the table's catalog assigns it (`storage_paths.assigned_locations`)
and what every configured catalog's tables keep where (`take_inventory`, one `TableFiles` per table), and
`ownership_refusal` says why the proof fails, naming the offending table or setting and what to do: a
location that is not plain or not the assigned one, GC disabled, a location provider of the table's own,
a path property outside the location, a catalog that could not be listed, or another table that keeps a
folder or a file inside the location or holds it inside its own. Maintenance (`lakehouse.upkeep.maintenance`)
then deletes nothing and says so in the table's receipt.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from lakehouse.core import config, sparkenv
from lakehouse.core import spec as spec_module
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import OwnershipError
from lakehouse.core.spec import PipelineSpec
from lakehouse.core.table_properties import IcebergProperties
from lakehouse.upkeep.storage_paths import (
    StoragePath,
    assigned_locations,
    canonical_path,
    catalog_server,
    readings,
)

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
                                          f"maintenance lists to prove it (ownership.INVENTORY_MAX_TABLES)")
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
                                      f"(ownership.INVENTORY_TIMEOUT_S)")
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
