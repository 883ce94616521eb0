"""The Iceberg table properties a spec's `target.properties` may set, and those it may not, with why.

An allow-list of Iceberg's tuning (`SPEC_PROPERTIES`, `SPEC_COLUMN_PROPERTIES`), never where files go,
what may be deleted or code to import (`REFUSED_PROPERTIES` says why for those that matter).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lakehouse.core.table_properties import IcebergProperties, TableProperties
from lakehouse.core.vocabulary import INT64

MAX_PROPERTY_VALUE = 4096
PROPERTY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # what a property name may look like
TARGET_FILE_SIZE_PROPERTY = TableProperties.TARGET_FILE_SIZE  # declared as target.target_file_size_mb


@dataclass(frozen=True)
class PropertyValues:
    """The values a table property a spec may set takes (Iceberg reads them at write or commit time,
    where a wrong one would stop the pipeline): `kind` is int (from `low`), bool, choice (`choices`),
    metrics (none, counts, full, truncate(N)) or fraction (strictly between 0 and 1)."""

    kind: str
    low: int = 0
    choices: tuple[str, ...] = ()

    def why_not(self, text: str) -> str | None:
        """Why `text` is not one of the values, or None."""
        if self.kind == "int":
            if _WHOLE.fullmatch(text) and self.low <= int(text) <= INT64[1]:
                return None
            return f"must be a whole number from {self.low} to {INT64[1]}"
        if self.kind == "bool":
            return None if text in ("true", "false") else "must be true or false"
        if self.kind == "choice":
            return None if text in self.choices else f"must be one of {', '.join(self.choices)}"
        if self.kind == "metrics":
            found = _METRICS_MODE.fullmatch(text)
            if found and (found[1] is None or 1 <= int(found[1]) <= 2 ** 31 - 1):
                return None
            return "must be none, counts, full or truncate(N) with N from 1"
        try:
            fraction = float(text)
        except ValueError:
            fraction = math.nan
        return None if 0 < fraction < 1 else "must be a number between 0 and 1 (exclusive)"


_WHOLE = re.compile(r"-?[0-9]{1,19}")
_METRICS_MODE = re.compile(r"none|counts|full|truncate\(([0-9]{1,10})\)")
_POSITIVE = PropertyValues("int", 1)
_COUNT = PropertyValues("int", 0)
_SWITCH = PropertyValues("bool")
_CODEC = PropertyValues("choice", choices=("zstd", "gzip", "snappy", "lz4", "brotli", "uncompressed"))
_LEVEL = PropertyValues("int", -(2 ** 31))
_DISTRIBUTION = PropertyValues("choice", choices=("none", "hash", "range"))
_METRICS = PropertyValues("metrics")
# What `target.properties` may set: Iceberg's tuning of file layout, compression, column metrics, write
# distribution, metadata files, commit retries and manifests, and read splits. Every value of these
# leaves the table's files where the catalog put them, in formats every engine reads, and expiry,
# orphan removal and staging in the platform's hands. Anything else is refused (REFUSED_PROPERTIES
# says why for those that matter).
SPEC_PROPERTIES: dict[str, PropertyValues] = {
    **{f"write.{scope}parquet.{name}": _POSITIVE for scope in ("", "delete.")
       for name in ("row-group-size-bytes", "page-size-bytes", "page-row-limit", "dict-size-bytes")},
    **{f"write.{scope}parquet.compression-codec": _CODEC for scope in ("", "delete.")},
    **{f"write.{scope}parquet.compression-level": _LEVEL for scope in ("", "delete.")},
    "write.parquet.row-group-limit": _POSITIVE,  # rows per row group of the ingest tasks' files (pyiceberg's)
    "write.parquet.row-group-check-min-record-count": _POSITIVE,
    "write.parquet.row-group-check-max-record-count": _POSITIVE,
    "write.parquet.bloom-filter-max-bytes": _POSITIVE,
    "write.delete.target-file-size-bytes": _POSITIVE,
    "write.metadata.metrics.default": _METRICS,
    "write.metadata.metrics.max-inferred-column-defaults": _COUNT,
    **{f"write.{scope}distribution-mode": _DISTRIBUTION for scope in ("", "delete.", "update.", "merge.")},
    "write.spark.fanout.enabled": _SWITCH,
    IcebergProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: _SWITCH,
    IcebergProperties.METADATA_PREVIOUS_VERSIONS_MAX: _POSITIVE,
    "write.metadata.compression-codec": PropertyValues("choice", choices=("none", "gzip")),
    **{f"commit.{scope}.{name}": _COUNT for scope in ("retry", "status-check")
       for name in ("num-retries", "min-wait-ms", "max-wait-ms", "total-timeout-ms")},
    "commit.manifest.target-size-bytes": _POSITIVE,
    "commit.manifest.min-count-to-merge": _POSITIVE,
    IcebergProperties.MANIFEST_MERGE_ENABLED: _SWITCH,
    "read.split.target-size": _POSITIVE,
    "read.split.metadata-target-size": _POSITIVE,
    "read.split.planning-lookback": _POSITIVE,
    "read.split.open-file-cost": _COUNT,
    "read.parquet.vectorization.enabled": _SWITCH,
    "read.parquet.vectorization.batch-size": _POSITIVE,
}
# The same per column: the name ends with a column of the table (`...column.customer_id`, `...column.a.b`)
SPEC_COLUMN_PROPERTIES: dict[str, PropertyValues] = {
    "write.parquet.bloom-filter-enabled.column.": _SWITCH,
    "write.parquet.bloom-filter-fpp.column.": PropertyValues("fraction"),
    "write.metadata.metrics.column.": _METRICS,
}
PROPERTY_FAMILIES = ("Parquet layout and compression (write.parquet.*, write.delete.parquet.*, "
                     "write.delete.target-file-size-bytes), column metrics (write.metadata.metrics.*), write "
                     "distribution (write.distribution-mode and its .delete/.update/.merge forms, "
                     "write.spark.fanout.enabled), metadata files (write.metadata.delete-after-commit.enabled, "
                     "write.metadata.previous-versions-max, write.metadata.compression-codec), commits "
                     "(commit.retry.*, commit.status-check.*, commit.manifest.*, commit.manifest-merge.enabled) and "
                     "reads (read.split.*, read.parquet.vectorization.*)")
_LOCATION_WHY = ("a table's files stay under the location its catalog and warehouse assign it: maintenance deletes "
                 "what lies there unreferenced, so files written elsewhere could be another table's, or never "
                 "cleaned up; remove it")
# Properties refused with the reason (names in lower case; a name ending in "." is a family). Unknown names
# are refused too; these are the ones that matter, and those a spec might reach for.
REFUSED_PROPERTIES: dict[str, str] = {
    TableProperties.PREFIX: "properties are the platform's: it records there the pipeline that owns the table and its "
                  "writer state; remove it",
    **dict.fromkeys(("uuid", "snapshot-count", "current-snapshot-id", "current-snapshot-summary",
                     "current-snapshot-timestamp-ms", "current-schema", "default-partition-spec",
                     "default-sort-order", TableProperties.STAGING),
                    "is managed by Iceberg or by the platform (write-audit-publish staging) and cannot be set from "
                    "a spec; remove it"),
    TARGET_FILE_SIZE_PROPERTY: "is target.target_file_size_mb (the tasks' writes and compaction both use it); "
                               "set that instead",
    "location": f"decides where the table's files are written: {_LOCATION_WHY}",
    IcebergProperties.WRITE_DATA_LOCATION: f"decides where the table's data files are written: {_LOCATION_WHY}",
    IcebergProperties.WRITE_METADATA_LOCATION:
        f"decides where the table's metadata files are written: {_LOCATION_WHY}",
    IcebergProperties.WRITE_FOLDER_STORAGE_LOCATION:
        f"decides where the table's data files are written: {_LOCATION_WHY}",
    "write.object-storage.": f"decides where and how the table's data files are laid out: {_LOCATION_WHY}",
    IcebergProperties.WRITE_LOCATION_PROVIDER_IMPL:
        f"names a Java class that decides where the table's files are written: {_LOCATION_WHY}",
    IcebergProperties.WRITE_PY_LOCATION_PROVIDER_IMPL:
        "names a Python class that pyiceberg imports and runs in every writer process: a spec cannot bring code "
        "into the platform; remove it",
    IcebergProperties.GC_ENABLED:
        "would let or stop Iceberg deleting the table's files: the platform's maintenance decides what may be "
        "deleted (snapshot expiry, orphan removal) and needs Iceberg's garbage collection on; remove it",
    IcebergProperties.FORMAT_VERSION:
        "is the platform's: it creates its tables at format version 2, which its writers and maintenance are "
        "built for; remove it",
    "history.expire.": "is Iceberg's own snapshot expiry: the platform's maintenance expires snapshots itself, "
                       "keeping retention.replay_window and what resume and publication need (max-ref-age-ms "
                       "would let Iceberg drop the published branch); set retention.replay_window instead",
    IcebergProperties.MERGE_MODE: "follows target.mode (an upsert table is merge-on-read); remove it",
    IcebergProperties.UPDATE_MODE: "follows target.mode (an upsert table is merge-on-read); remove it",
    IcebergProperties.DELETE_MODE: "follows target.mode (an upsert table is merge-on-read); remove it",
    "write.format.default": "is the platform's: its writers write Parquet; remove it",
    "write.delete.format.default": "is the platform's: its writers write Parquet; remove it",
    "write.spark.accept-any-schema": "would let a writer change the table's schema: the contract and "
                                     "schema_policy decide that; remove it",
}


def refused_property(key: str) -> str | None:
    """Why `target.properties` may not set `key` (REFUSED_PROPERTIES, in any letter case), or None."""
    lower = key.lower()
    for name, why in REFUSED_PROPERTIES.items():
        if lower == name or (name.endswith(".") and lower.startswith(name)):
            return why
    return None

