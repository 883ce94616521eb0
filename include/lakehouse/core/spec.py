"""The pipeline spec: declared once in YAML under include/pipelines, read everywhere.

`load_spec(path)` returns one file's validated, immutable `PipelineSpec` or raises
`SpecError` naming the file, the field and why. The pipelines folder is read as a whole
by `load_specs(directory)`: a `SpecSet` with the valid specs and, separately, each broken
file's error, so one broken file never hides the other pipelines. Across the folder a
table or view has one owner: two specs claiming the same data, dead-letter or fan-out
table or readers' view (or the same pipeline name) are both broken, each error naming
the other file. `load_all` (the valid specs) and `load_pipeline(name)` build on it.

Hostile input is bounded: a spec file is at most 1 MiB of plain YAML (no aliases, no
duplicate keys, at most 32 levels deep); names are matched in full (a trailing newline
is not part of a name); durations, sizes and counts are finite and capped (`CAPS`,
`DURATION_CAPS_S`, `MAX_DURATION_S`); `target.properties` is an allow-list of Iceberg's tuning
(`SPEC_PROPERTIES`), never where files go, what may be deleted or code to import
(`REFUSED_PROPERTIES` says why); contract patterns run on RE2 in linear time (`contract_pattern`);
the schema folder is read as regular files only, each bounded (`read_schema_folder`).
"""

from __future__ import annotations

import difflib
import errno
import functools
import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import re2
import yaml
from croniter import croniter
from re2 import _re2

from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError

# The contract's types. Primitives map one to one onto Iceberg's; `uuid` is stored as its canonical text
# (Spark has no UUID type), `decimal(P,S)` is written with its precision and scale. Nested types hold
# further field specs: a struct its `fields`, a list its `items`, a map (string keys) its `values`.
PRIMITIVE_TYPES = ("string", "int", "long", "float", "double", "boolean", "timestamp", "date", "decimal", "uuid",
                   "binary")
NESTED_TYPES = ("struct", "list", "map")
FIELD_TYPES = (*PRIMITIVE_TYPES, *NESTED_TYPES)
SPARK_TYPES = {
    "string": "string",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "date": "date",
    "uuid": "string",
    "binary": "binary",
}
MAX_DECIMAL_PRECISION = 38  # Iceberg's and Spark's
# Epoch units a timestamp or date field may also take numbers in (Debezium's and Connect's encodings):
# seconds, milliseconds, microseconds since the epoch for timestamps, days for dates.
TIMESTAMP_UNITS = ("s", "ms", "us")
DATE_UNITS = ("days",)
# Types a key column (target.key), a fan-out field or a Kafka-key field may have: values that identify.
# The types lakehouse.ingest.records' JSON fast path decodes; a contract with others takes the reference.
FAST_PATH_TYPES = ("string", "int", "long", "float", "double", "boolean", "timestamp", "date")
KEY_TYPES = ("string", "int", "long", "date", "timestamp", "uuid", "decimal", "boolean")
# Type changes a table may take without rewriting data (Iceberg's allowed promotions; a decimal's
# precision may grow at the same scale).
WIDENINGS = {("int", "long"), ("float", "double")}
# json: plain JSON values; the others are the Confluent wire format (magic byte 0, a 4-byte schema id,
# the payload) with writer schemas by id from `source.schemas` or a schema registry (lakehouse.ingest.formats)
VALUE_FORMATS = ("json", "avro", "protobuf", "json_schema")
# a key is UTF-8 text (string) or, like a value, a record: a Debezium key holds the primary key's columns
KEY_FORMATS = ("string", *VALUE_FORMATS)
# the change-event envelopes a `mode: cdc` pipeline reads (lakehouse.ingest.changes)
ENVELOPES = ("debezium",)
# the schema registry's schema types by the extension of a file in a `source.schemas` folder
SCHEMA_FILE_TYPES = {".avsc": "AVRO", ".proto": "PROTOBUF", ".json": "JSON"}
# the schema type each wire format's writer schemas have
FORMAT_SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}
_SCHEMA_FOLDER = re.compile(r"[^\x00-\x1f]{1,1024}")
MAX_SCHEMA_FILES = 1000
MAX_SCHEMA_BYTES = 1024 * 1024  # one writer schema; a larger file is a mistake
# all of a folder's schemas: they are read at every spec load and travel to every Spark task with the spec
MAX_SCHEMA_FOLDER_BYTES = 64 * 1024 * 1024
MAX_SCHEMA_FOLDER_ENTRIES = 100_000  # names looked at in a folder, schemas or not
_SCHEMA_FILE = re.compile(r"([0-9]{1,10})(\.avsc|\.proto|\.json)")


_NOT_REGULAR = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def _not_regular(name: str, mode: int) -> ValueError:
    """The refusal of schema file `name`, which is not a regular file (`mode`), naming what it is."""
    if stat.S_ISLNK(mode):
        return ValueError(f"{name} is a symbolic link; a schema folder holds regular files only (a link may lead "
                          f"anywhere on this host): copy the schema into the folder instead")
    kind = next((kind for test, kind in _NOT_REGULAR if test(mode)), "not a regular file")
    return ValueError(f"{name} is {kind}, not a regular file; a schema folder holds regular files only: "
                      f"remove it or give it another name")


def _read_schema_file(folder_fd: int, name: str) -> bytes:
    """The bytes of regular file `name` in the folder open as `folder_fd`, at most MAX_SCHEMA_BYTES.

    Looked at without following it (lstat), then opened without following a link (O_NOFOLLOW) and
    without blocking (O_NONBLOCK: a FIFO swapped in meanwhile opens at once) and checked again on the
    open file (fstat), so that nothing but a regular file of the folder is ever read."""
    mode = os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(name, mode)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise _not_regular(name, stat.S_IFLNK) from None
        raise
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _not_regular(name, opened.st_mode)
        if opened.st_size > MAX_SCHEMA_BYTES:
            raise ValueError(f"{name} is larger than {MAX_SCHEMA_BYTES} bytes")
        chunks, size = [], 0
        while size <= MAX_SCHEMA_BYTES:  # one byte more than allowed tells a file that grew meanwhile
            chunk = os.read(fd, MAX_SCHEMA_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"{name} is larger than {MAX_SCHEMA_BYTES} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_schema_folder(folder: Path) -> tuple[tuple[int, str, str], ...]:
    """The writer schemas of `folder`, (id, schema type, text) of each `<id>.avsc` (AVRO), `<id>.proto`
    (PROTOBUF) or `<id>.json` (JSON) file by id; () when there are none.

    The folder is where the spec's writers put schemas, not a place to trust: only regular files are
    read. A symbolic link (wherever it points), a FIFO, a device, a socket or a folder named like a
    schema is refused, never followed nor opened to block; each file is at most MAX_SCHEMA_BYTES, all
    of them MAX_SCHEMA_FOLDER_BYTES, and at most MAX_SCHEMA_FILES schemas (MAX_SCHEMA_FOLDER_ENTRIES
    names) are looked at. Raises OSError for a folder that cannot be read, ValueError (naming the file
    and what to do) for those, a file that is not UTF-8, or one id given twice (`3.avsc` beside
    `3.proto`)."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        return ()
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        named: list[tuple[int, str, str]] = []
        with os.scandir(folder_fd) as entries:
            for seen, entry in enumerate(entries):
                if seen >= MAX_SCHEMA_FOLDER_ENTRIES:
                    raise ValueError(f"more than {MAX_SCHEMA_FOLDER_ENTRIES} names in the folder; keep only the "
                                     f"writer schemas there")
                parsed = _SCHEMA_FILE.fullmatch(entry.name)
                if parsed is not None and int(parsed[1]) < 2 ** 31:
                    named.append((int(parsed[1]), SCHEMA_FILE_TYPES[parsed[2]], entry.name))
        if len(named) > MAX_SCHEMA_FILES:
            raise ValueError(f"{len(named)} schema files, at most {MAX_SCHEMA_FILES}")
        found: list[tuple[int, str, str]] = []
        total = 0
        for schema_id, schema_type, name in sorted(named):
            if found and found[-1][0] == schema_id:
                raise ValueError(f"schema id {schema_id} is given twice ({name} and another file)")
            data = _read_schema_file(folder_fd, name)
            total += len(data)
            if total > MAX_SCHEMA_FOLDER_BYTES:
                raise ValueError(f"the schemas add up to more than {MAX_SCHEMA_FOLDER_BYTES} bytes; remove the "
                                 f"versions no producer writes any more")
            try:
                found.append((schema_id, schema_type, data.decode("utf-8")))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        return tuple(found)
    finally:
        os.close(folder_fd)


# cdc: an upsert table fed by change events (source.envelope); the spec keeps it as mode upsert
MODES = ("append", "upsert", "cdc")
TRIGGER_MODES = ("continuous", "scheduled")
ADDITIVE_POLICIES = ("evolve", "fail")
INCOMPATIBLE_POLICIES = ("fail", "quarantine")
PARTITION_TRANSFORMS = ("identity", "year", "month", "day", "hour", "bucket", "truncate")
# the column types each transform takes (Iceberg's partition transforms)
PARTITION_SOURCE_TYPES = {
    "identity": ("string", "int", "long", "float", "double", "boolean", "timestamp", "date", "decimal", "uuid",
                 "binary"),
    "year": ("timestamp", "date"), "month": ("timestamp", "date"), "day": ("timestamp", "date"),
    "hour": ("timestamp",),
    "bucket": ("string", "int", "long", "timestamp", "date", "decimal", "uuid", "binary"),
    "truncate": ("string", "int", "long", "decimal", "binary"),
}
RESERVED_COLUMNS = ("_kafka", "_ingested_at", "_cdc")
# Airflow's cron presets; any other schedule is a five-field cron expression.
SCHEDULE_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")

# Every pattern is matched with fullmatch: `$` would also match before a final newline, and
# "raw.orders\n" would then name a table that Spark and pyiceberg resolve differently.
_NAME = r"[a-z_][a-z0-9_]{0,127}"  # at most 128 characters: DAG ids, lock files and catalog columns stay short
IDENTIFIER = re.compile(_NAME)
TABLE_NAME = re.compile(rf"{_NAME}\.{_NAME}")  # namespace.table, as every table and view in a spec
# TABLE_NAME for JSON Schema (Airflow's forms check with Python's re.search, browsers with JavaScript): a `$`
# anchor would let "raw.x\n" through in Python, `(?![\s\S])` (nothing follows) means the end of the text in both.
TABLE_NAME_FORM_PATTERN = rf"^{TABLE_NAME.pattern}(?![\s\S])"
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's own rule
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?) *(ms|s|m|h|d)")
_PARTITION = re.compile(r"(?:(\w+)\((?:([0-9]+),)?(\w+)\)|(\w+))", re.ASCII)
_PROPERTY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_INT64 = (-(2 ** 63), 2 ** 63 - 1)

# Contract patterns run on producer-controlled values, so they run on RE2, whose matching takes time
# linear in the value (no backtracking: `(a+)+$` cannot explode). RE2 has no lookarounds (`(?=`,
# `(?!`, `(?<=`), backreferences (`\1`), atomic groups or possessive repeats, and reads `\d`, `\w`,
# `\s` and `\b` as ASCII (`\p{Nd}`, `\p{L}` are Unicode's). A pattern is also one Python's `re` reads,
# as the development tools generate sample values with it. Values longer than MAX_MATCHED_CHARS are
# refused before matching.
MAX_PATTERN_CHARS = 1000
MAX_MATCHED_CHARS = 65_536
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print each refused pattern on the process's stderr
_RE2_OPTIONS.never_capture = True  # a yes or no is all a contract asks
_RE2_OPTIONS.max_mem = 8 << 20  # per pattern; a larger program is refused at compile time
_ANCHOR_BOTH = _re2.RE2.Anchor.ANCHOR_BOTH
# `{,n}`: Python's re reads it as {0,n}, RE2 as the text "{,n}"; one pattern must mean one thing
_OPEN_REPEAT = re.compile(r"(?<!\\)\{,")


class PatternError(ConfigurationError):
    """A contract pattern the platform does not run; the message says why and what to write instead."""


@functools.lru_cache(maxsize=512)
def contract_pattern(pattern: str) -> Callable[[str], bool]:
    """Whether a text matches `pattern` in full, as a function run on RE2 (linear time, thread-safe);
    raises PatternError for a pattern RE2 or Python's re cannot compile, or longer than
    MAX_PATTERN_CHARS. Callers bound the text first (MAX_MATCHED_CHARS).

    The function calls RE2's binding directly (`re2._re2`): `re2.compile(...).fullmatch` builds a match
    object per call, several times slower on the reader's hot path."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"is {len(pattern)} characters long, at most {MAX_PATTERN_CHARS}")
    if _OPEN_REPEAT.search(pattern):
        raise PatternError("uses {,n}, which Python's re reads as {0,n} and RE2 as text: write {0,n}")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:  # deep nesting overflows the regex parser
        raise PatternError(f"is not a regular expression: {exc} (a pattern is the syntax Python's re and RE2 "
                           f"share)") from None
    try:
        compiled = _re2.RE2(pattern.encode("utf-8"), _RE2_OPTIONS)
    except UnicodeEncodeError:
        raise PatternError("holds a lone surrogate, which is not Unicode") from None
    if not compiled.ok():
        why = compiled.error()
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise PatternError(f"is not a pattern RE2 runs ({why}): contract patterns run in linear time, without "
                           f"lookarounds (?= (?! (?<=, backreferences \\1, atomic groups or possessive repeats; "
                           f"\\Z is written \\z")
    match = compiled.Match

    def fullmatch(text: str) -> bool:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no Unicode pattern matches it
            return False
        return match(_ANCHOR_BOTH, data, 0, len(data))[0][0] >= 0

    return fullmatch

# The platform's own table in every catalog (= lakehouse.core.events.EVENTS_TABLE, which is not imported
# here: events pulls in pyiceberg; a test keeps the two equal).
OPS_TIMELINE_TABLE = "ops.pipeline_events"

# The Airflow DAGs: per pipeline one of each kind, `dag_id(pipeline, kind)`, and the ones every pipeline shares.
DAG_KINDS = ("ingest", "maintenance", "publish", "backfill", "cutover", "verify")
RETENTION_DAG_ID = "retention_alignment"
RETENTION_GUARD_DAG_ID = "retention_guard"
SHARED_DAG_IDS = (RETENTION_DAG_ID, RETENTION_GUARD_DAG_ID)

MAX_SPEC_BYTES = 1024 * 1024  # a spec is a page of YAML; a larger file is a mistake or an attack
MAX_YAML_DEPTH = 32
MAX_DURATION_S = 10 * 365 * 86400.0  # any duration: 10 years
# Tighter caps of some durations (seconds): a trigger or a restart delay longer than a day is a typo.
DURATION_CAPS_S = {"trigger.interval": 86400.0, "supervision.restart_backoff": 86400.0,
                   "supervision.retry_budget": 7 * 86400.0}
# Upper bounds of sizes and counts: far above any real deployment, low enough that what is computed
# from them stays safe (milliseconds in int64, Kafka's int32 sizes, a backoff that doubles per restart).
CAPS = {
    "source.partitions": 100_000,
    "source.replication_factor": 32,
    "source.retention_ms": int(MAX_DURATION_S) * 1000,  # or -1: unlimited
    "source.max_value_bytes": 128 * 1024 * 1024,  # Kafka's message.max.bytes is an int32; 1 MiB is its default
    "target.target_file_size_mb": 16 * 1024,
    "trigger.max_records_per_batch": 100_000_000,
    "slo.lag_records": 10 ** 12,
    "publish.spark_audit_rows": 10 ** 12,
    "supervision.hung_after_triggers": 10_000,
    "supervision.max_restarts": 100,
    "maintenance.min_input_files": 10_000,
    "bucket": 100_000,  # partition transform widths
    "truncate": 2 ** 31 - 1,  # Iceberg stores the width as an int
}
MAX_PROPERTY_VALUE = 4096
TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"  # declared as target.target_file_size_mb


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
            if _WHOLE.fullmatch(text) and self.low <= int(text) <= _INT64[1]:
                return None
            return f"must be a whole number from {self.low} to {_INT64[1]}"
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
    "write.metadata.delete-after-commit.enabled": _SWITCH,
    "write.metadata.previous-versions-max": _POSITIVE,
    "write.metadata.compression-codec": PropertyValues("choice", choices=("none", "gzip")),
    **{f"commit.{scope}.{name}": _COUNT for scope in ("retry", "status-check")
       for name in ("num-retries", "min-wait-ms", "max-wait-ms", "total-timeout-ms")},
    "commit.manifest.target-size-bytes": _POSITIVE,
    "commit.manifest.min-count-to-merge": _POSITIVE,
    "commit.manifest-merge.enabled": _SWITCH,
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
    "lakehouse.": "properties are the platform's: it records there the pipeline that owns the table and its "
                  "writer state; remove it",
    **dict.fromkeys(("uuid", "snapshot-count", "current-snapshot-id", "current-snapshot-summary",
                     "current-snapshot-timestamp-ms", "current-schema", "default-partition-spec",
                     "default-sort-order", "write.wap.enabled"),
                    "is managed by Iceberg or by the platform (write-audit-publish staging) and cannot be set from "
                    "a spec; remove it"),
    TARGET_FILE_SIZE_PROPERTY: "is target.target_file_size_mb (the tasks' writes and compaction both use it); "
                               "set that instead",
    "location": f"decides where the table's files are written: {_LOCATION_WHY}",
    "write.data.path": f"decides where the table's data files are written: {_LOCATION_WHY}",
    "write.metadata.path": f"decides where the table's metadata files are written: {_LOCATION_WHY}",
    "write.folder-storage.path": f"decides where the table's data files are written: {_LOCATION_WHY}",
    "write.object-storage.": f"decides where and how the table's data files are laid out: {_LOCATION_WHY}",
    "write.location-provider.impl": f"names a Java class that decides where the table's files are written: "
                                    f"{_LOCATION_WHY}",
    "write.py-location-provider.impl": "names a Python class that pyiceberg imports and runs in every writer "
                                       "process: a spec cannot bring code into the platform; remove it",
    "gc.enabled": "would let or stop Iceberg deleting the table's files: the platform's maintenance decides what "
                  "may be deleted (snapshot expiry, orphan removal) and needs Iceberg's garbage collection on; "
                  "remove it",
    "format-version": "is the platform's: it creates its tables at format version 2, which its writers and "
                      "maintenance are built for; remove it",
    "history.expire.": "is Iceberg's own snapshot expiry: the platform's maintenance expires snapshots itself, "
                       "keeping retention.replay_window and what resume and publication need (max-ref-age-ms "
                       "would let Iceberg drop the published branch); set retention.replay_window instead",
    "write.merge.mode": "follows target.mode (an upsert table is merge-on-read); remove it",
    "write.update.mode": "follows target.mode (an upsert table is merge-on-read); remove it",
    "write.delete.mode": "follows target.mode (an upsert table is merge-on-read); remove it",
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


class SpecError(ConfigurationError):
    """A pipeline spec is invalid. The message names the file, the field and why."""

    def __init__(self, path: Path | str, field_path: str, why: str):
        self.path = str(path)
        self.field = field_path
        self.why = why
        super().__init__(f"{path}: {field_path}: {why}")


class UnknownPipelineError(ConfigurationError, LookupError):
    """No spec file declares the pipeline asked for."""


class BrokenSpecsError(ConfigurationError):
    """Some spec files of the pipelines folder do not load; the message lists each with its error."""

    def __init__(self, errors: dict[str, SpecError]):
        self.errors = dict(errors)
        super().__init__(f"{len(errors)} pipeline spec file(s) do not load, so their pipelines are left out "
                         f"until fixed:\n" + "\n".join(f"- {error}" for error in errors.values()))


def dag_id(pipeline: str, kind: str) -> str:
    """The id of pipeline `pipeline`'s DAG of `kind` (one of DAG_KINDS; ValueError otherwise)."""
    if kind not in DAG_KINDS:
        raise ValueError(f"{kind!r} is not a DAG kind: {', '.join(DAG_KINDS)}")
    return f"{pipeline}_{kind}"


def is_table_name(text: Any) -> bool:
    """Whether `text` is a table or view name as specs write them: `namespace.name`, lower case, in full."""
    return isinstance(text, str) and TABLE_NAME.fullmatch(text) is not None


def _shown(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters: error messages echo hostile values, not megabytes of them."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit: YAML's hex and base-60 integers have none
        return "a value too large to show"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _duration_text(seconds: float) -> str:
    """`seconds` in the largest unit that divides it: 86400 -> '1d', 90 -> '90s'."""
    for unit in ("d", "h", "m"):
        if seconds % _DURATION_UNITS[unit] == 0:
            return f"{seconds / _DURATION_UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


def _as_float(value: int | float) -> float:
    """`value` as a float; infinity for an integer too large for one."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def parse_duration(value: Any, *, positive: bool = False, maximum: float = MAX_DURATION_S) -> float:
    """Seconds in a duration such as `5s`, `500ms`, `2m`, `7d`; a bare number is seconds.

    Returns a finite number from 0 (above 0 when `positive`) to `maximum` (default 10 years).
    Raises ValueError for anything else: NaN, infinity, negative, too long, or not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = _as_float(value)
    else:
        match = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if not match:
            raise ValueError(f"{_shown(value)} is not a duration like 500ms, 5s, 2m, 1h or 7d")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{_shown(value)} is not a duration: it must be finite and 0 or more")
    if seconds > maximum:
        raise ValueError(f"{_shown(value)} is longer than {_duration_text(maximum)}, the longest allowed here")
    if positive and seconds == 0:
        raise ValueError(f"{_shown(value)} must be longer than 0")
    return seconds


def parse_instant(text: str) -> datetime:
    """A point in time from ISO-8601 text (UTC when it has no offset), in UTC. Raises ValueError."""
    try:
        parsed = datetime.fromisoformat(text)
        parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        return datetime.fromtimestamp(parsed.timestamp(), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        raise ValueError(f"{str(text)[:60]!r} is not an ISO-8601 time, e.g. 2026-11-21T10:00:00Z") from None


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """A point in time (UTC): ISO-8601 (UTC when it has no offset) or a duration meaning that long before
    `now` (`30m`, `2h`, `7d`). Raises ValueError saying both forms for anything else."""
    now = now or datetime.now(UTC)
    try:
        return now - timedelta(seconds=parse_duration(text))
    except (ValueError, OverflowError):
        pass
    try:
        return parse_instant(text)
    except ValueError:
        raise ValueError(f"{str(text)[:60]!r} is neither an ISO-8601 time (2026-11-21T10:00:00Z) nor a duration "
                         f"ago (30m, 2h, 7d)") from None


@dataclass(frozen=True)
class FieldSpec:
    """One field of the record contract; enum, range and pattern are part of its type.

    `type` is one of FIELD_TYPES. A decimal has `precision` and `scale`; a timestamp or date may have a
    `unit` (TIMESTAMP_UNITS, DATE_UNITS): then numbers since the epoch in that unit are accepted beside
    ISO-8601 text. A struct has `fields`, a list its element spec `items`, a map its value spec `values`
    (keys are strings); `required` of an element or a map value means it may not be null.
    """

    name: str
    type: str
    required: bool = False
    enum: tuple | None = None
    min: float | None = None
    max: float | None = None
    pattern: str | None = None
    max_length: int | None = None
    doc: str = ""
    precision: int | None = None
    scale: int | None = None
    unit: str | None = None
    fields: tuple[FieldSpec, ...] = ()
    items: FieldSpec | None = None
    values: FieldSpec | None = None

    @property
    def spark_type(self) -> str:
        """The Spark SQL type of the field's column, e.g. `decimal(12,2)` or `struct<`a`:int>`."""
        if self.type == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.type == "struct":
            return "struct<" + ",".join(f"`{f.name}`:{f.spark_type}" for f in self.fields) + ">"
        if self.type == "list":
            return f"array<{self.items.spark_type}>"
        if self.type == "map":
            return f"map<string,{self.values.spark_type}>"
        return SPARK_TYPES[self.type]

    @property
    def type_text(self) -> str:
        """The type as a spec writes it (`decimal(12,2)`, `list<string>`), for messages."""
        if self.type == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.type == "list":
            return f"list<{self.items.type_text}>"
        if self.type == "map":
            return f"map<string,{self.values.type_text}>"
        if self.type == "struct":
            return "struct<" + ",".join(f"{f.name}:{f.type_text}" for f in self.fields) + ">"
        return self.type

    @property
    def nested(self) -> bool:
        return self.type in NESTED_TYPES

    def walk(self, path: str = "") -> Iterator[tuple[str, FieldSpec]]:
        """(dotted path, spec) of this field and every field inside it, depth first; list elements and
        map values are named `element` and `value` in the path, as Iceberg names them."""
        here = f"{path}.{self.name}" if path else self.name
        yield here, self
        for child in self.children:
            yield from child.walk(here)

    @property
    def children(self) -> tuple[FieldSpec, ...]:
        if self.type == "struct":
            return self.fields
        if self.type == "list":
            return (self.items,)
        if self.type == "map":
            return (self.values,)
        return ()


@dataclass(frozen=True)
class Contract:
    fields: tuple[FieldSpec, ...]
    # `contract.from: writer_schema`: the fields follow the writer schemas (a new compatible one evolves
    # the table); else they are declared and each writer schema is checked against them
    from_writer_schema: bool = False

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def walk(self) -> Iterator[tuple[str, FieldSpec]]:
        """(dotted path, spec) of every field, nested ones included (FieldSpec.walk)."""
        for f in self.fields:
            yield from f.walk()

    @property
    def has_decimals(self) -> bool:
        return any(f.type == "decimal" for _, f in self.walk())

    @property
    def primitive(self) -> bool:
        """Whether every field is one of the original scalar types the JSON fast path mirrors."""
        return all(f.type in FAST_PATH_TYPES for f in self.fields)


@dataclass(frozen=True)
class PartitionField:
    transform: str  # identity | year | month | day | hour | bucket | truncate
    column: str
    arg: int | None = None

    def spark_sql(self) -> str:
        if self.transform == "identity":
            return self.column
        if self.transform in ("bucket", "truncate"):
            return f"{self.transform}({self.arg}, {self.column})"
        return f"{self.transform}s({self.column})"  # days(event_time), hours(...)

    def __str__(self) -> str:
        if self.transform == "identity":
            return self.column
        if self.arg is not None:
            return f"{self.transform}({self.arg}, {self.column})"
        return f"{self.transform}({self.column})"


@dataclass(frozen=True)
class SourceSpec:
    topic: str
    partitions: int = 1
    replication_factor: int = 1
    retention_ms: int | None = None
    value_format: str = "json"
    # the wire formats' writer schemas (id, schema type AVRO/PROTOBUF/JSON, text), read from the folder
    # `source.schemas` names beside the spec (air-gapped, the embedded stack) when the spec is loaded, so
    # that Spark tasks on any host get them with the spec; (): the schema registry
    # (LAKEHOUSE_SCHEMA_REGISTRY_URL)
    schemas: tuple[tuple[int, str, str], ...] = ()
    schemas_dir: str | None = None  # the folder `source.schemas` names, resolved (its changes reload the spec)
    key_field: str | None = None  # the Kafka key must equal this field of the value
    key_required: bool = False
    key_format: str = "string"  # KEY_FORMATS; a record key's field `key_field` is compared, not the whole key
    envelope: str | None = None  # ENVELOPES: values are change events (target mode cdc)
    max_value_bytes: int = 1_048_576


@dataclass(frozen=True)
class FanoutSpec:
    field: str
    routes: dict  # field value -> table


@dataclass(frozen=True)
class TargetSpec:
    catalog: str
    table: str
    mode: str = "append"
    key: tuple[str, ...] = ()
    partition_by: tuple[PartitionField, ...] = ()
    fanout: FanoutSpec | None = None
    target_file_size_bytes: int = 128 * 1024 * 1024
    properties: dict = field(default_factory=dict)

    @property
    def tables(self) -> tuple[str, ...]:
        """Every data table this pipeline writes, the default table first."""
        extra = [] if self.fanout is None else [t for t in self.fanout.routes.values() if t != self.table]
        return tuple(dict.fromkeys([self.table, *extra]))


@dataclass(frozen=True)
class SchemaPolicy:
    on_additive: str = "evolve"
    on_incompatible: str = "fail"


@dataclass(frozen=True)
class TriggerSpec:
    interval_s: float = 5.0
    max_records_per_batch: int = 100_000
    mode: str = "continuous"  # continuous: one long-running job; scheduled: `--once` on `schedule`
    schedule: str = "*/5 * * * *"


@dataclass(frozen=True)
class SupervisionSpec:
    """How the supervision DAG keeps a continuous job alive."""
    hung_after_triggers: int = 12  # no commit within this many triggers while lag grows = hung
    restart_backoff_s: float = 10.0  # first restart delay; doubles per restart
    max_restarts: int = 5  # per supervision run, then the task fails and Airflow retries it
    # how long the job itself retries transient failures (catalog locked or unreachable, broker
    # stalled) before it gives up: from the first failure of a batch to the last retry
    retry_budget_s: float = 300.0


@dataclass(frozen=True)
class MaintenanceSpec:
    schedule: str = "@hourly"
    min_input_files: int = 5  # compact a partition only when it has at least this many small files
    orphan_safety_window_s: float = 3 * 86400  # orphans younger than this are kept (in-flight commits)


@dataclass(frozen=True)
class RetentionSpec:
    outage_budget_s: float = 86400.0  # the longest writer or catalog outage to survive
    replay_window_s: float = 3 * 86400.0  # how far back replay and time travel must reach
    delete_after_s: float | None = None  # data retention on the event-time column; None keeps rows
    # The retention guard acts when the oldest record not yet ingested gets this close to the topic's
    # retention horizon: `guard_threshold_s` seconds, or (None) `guard_threshold_share` of the declared retention.
    guard_threshold_s: float | None = None
    guard_threshold_share: float = 0.5
    max_retention_ms: int | None = None  # the most the guard may raise retention.ms to; None: it only alerts

    def guard_threshold_ms(self, declared_ms: int) -> int:
        """How close (ms) to the retention horizon of a topic declared to keep records `declared_ms` the
        oldest record not yet ingested may get before the retention guard acts."""
        if self.guard_threshold_s is not None:
            return math.ceil(self.guard_threshold_s * 1000)
        return math.ceil(declared_ms * self.guard_threshold_share)


@dataclass(frozen=True)
class PublishSpec:
    """Write-audit-publish: ingestion and maintenance commit to `main` (the audit branch); readers
    use `branch`, fast-forwarded only after quality checks and SLOs pass, through `view`."""
    branch: str = "published"
    view: str | None = None  # namespace.view readers query; it selects from the published branch
    schedule: str = "*/10 * * * *"
    suite: str | None = None  # include/expectations/<suite>.json; None = the pipeline name
    # an audit window (a table's new rows, counted from its manifests) of at least this many rows is
    # validated in Spark, where the data is, instead of in pandas on the worker (lakehouse.wap.quality)
    spark_audit_rows: int = 1_000_000


@dataclass(frozen=True)
class VerifySpec:
    """When the `<pipeline>_verify` DAG proves the tables exactly once (lakehouse.ops.verify)."""
    schedule: str = "@hourly"


@dataclass(frozen=True)
class SloSpec:
    freshness_s: float = 60.0
    lag_records: int = 100_000
    lag_s: float = 60.0


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    path: str
    source: SourceSpec
    target: TargetSpec
    dead_letter_table: str
    contract: Contract
    schema_policy: SchemaPolicy
    trigger: TriggerSpec
    slo: SloSpec
    supervision: SupervisionSpec = SupervisionSpec()
    maintenance: MaintenanceSpec = MaintenanceSpec()
    retention: RetentionSpec = RetentionSpec()
    publish: PublishSpec = PublishSpec()
    verify: VerifySpec = VerifySpec()
    candidate_for: str | None = None  # the live pipeline this one is a candidate replacement of
    description: str = ""

    @property
    def catalog(self) -> str:
        return self.target.catalog

    def qualified(self, table: str) -> str:
        return f"{self.target.catalog}.{table}"

    @property
    def tombstones_delete(self) -> bool:
        """Whether a tombstone (a record without value) deletes its key: an upsert pipeline keyed by the
        Kafka key."""
        if self.source.envelope is not None:  # a change stream's tombstone follows the delete of its key
            return True
        return self.target.mode == "upsert" and self.source.key_field is not None \
            and self.target.key == (self.source.key_field,)

    @property
    def is_cdc(self) -> bool:
        """Whether the values are change events applied to an upsert table (`target.mode: cdc`)."""
        return self.source.envelope is not None

    @property
    def wire_formats(self) -> tuple[str, ...]:
        """The formats of this pipeline's keys and values that carry a writer schema id (FORMAT_SCHEMA_TYPES)."""
        return tuple(dict.fromkeys(f for f in (self.source.value_format, self.source.key_format)
                                   if f in FORMAT_SCHEMA_TYPES))

    @property
    def tombstone_table(self) -> str | None:
        """The tombstone ledger beside the default table (`<table>__tombstones`: each deleted key with its
        newest tombstone's coordinates) when tombstones delete keys, else None. Replays read it so that
        old records cannot bring back a deleted key."""
        return f"{self.target.table}__tombstones" if self.tombstones_delete else None

    @property
    def dag_kinds(self) -> tuple[str, ...]:
        """The kinds (DAG_KINDS) of the DAGs generated for this pipeline: a cutover DAG only for a
        pipeline that serves readers through a view and is not itself a candidate."""
        return tuple(kind for kind in DAG_KINDS
                     if kind != "cutover" or (self.publish.view and not self.candidate_for))

    @property
    def positioned_tables(self) -> tuple[str, ...]:
        """The tables whose commits carry the pipeline's positions (every offset lands in one of them):
        its data tables (fan-out included), then the dead-letter table."""
        return (*self.target.tables, self.dead_letter_table)

    @property
    def owned_tables(self) -> tuple[str, ...]:
        """Every table this pipeline writes: its data tables (fan-out included), the tombstone ledger
        if any, then the dead-letter table."""
        ledger = (self.tombstone_table,) if self.tombstone_table else ()
        return (*self.target.tables, *ledger, self.dead_letter_table)

    @property
    def views(self) -> tuple[str, ...]:
        """The readers' views this pipeline serves, one per data table: `publish.view` for the default
        table, and for a fan-out table the view named after it in the same namespace (the rule of
        lakehouse.wap.publish.view_name); () without `publish.view`."""
        if self.publish.view is None:
            return ()
        namespace = self.publish.view.split(".")[0]
        return (self.publish.view, *(f"{namespace}.{t.split('.')[1]}" for t in self.target.tables[1:]))

    @property
    def consumer_group(self) -> str:
        return f"lakehouse-{self.name}"

    @property
    def event_time_field(self) -> str | None:
        """The column whose maximum tells freshness (and that data retention ages rows by)."""
        return event_time_column(self.contract, self.target.partition_by)


def event_time_column(contract: Contract, partition_by: tuple[PartitionField, ...]) -> str | None:
    """The time-partition column, else the contract's first timestamp column, else None."""
    for p in partition_by:
        if p.transform in ("year", "month", "day", "hour"):
            return p.column
    for f in contract.fields:
        if f.type == "timestamp":
            return f.name
    return None


class _Reader:
    """Walks the raw YAML mapping, turning every problem into a precise SpecError."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, why: str) -> SpecError:
        return SpecError(self.path, where or "(file)", why)

    def mapping(self, raw: Any, where: str, allowed: set[str]) -> dict:
        """`raw` as a mapping ({} for None) whose keys are all in `allowed`; raises SpecError otherwise."""
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(where, f"must be a mapping, got {type(raw).__name__}")
        for key in raw:
            if not isinstance(key, str):
                raise self.fail(where, f"field names must be strings, got {_shown(key)}")
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise self.fail(f"{where}.{unknown[0][:60]}" if where else unknown[0][:60],
                            f"unknown field (allowed: {', '.join(sorted(allowed))})")
        return raw

    def required(self, raw: dict, key: str, where: str) -> Any:
        if key not in raw or raw[key] is None:
            raise self.fail(f"{where}.{key}" if where else key, "is required")
        return raw[key]

    def string(self, value: Any, where: str, pattern: re.Pattern | None = None, hint: str = "") -> str:
        """`value` as a non-empty string matching `pattern` in full; raises SpecError otherwise."""
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"must be a non-empty string, got {_shown(value)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(where, f"{_shown(value)} is not valid{': ' + hint if hint else ''}")
        return value

    def identifier(self, value: Any, where: str, hint: str = "use lower_snake_case") -> str:
        return self.string(value, where, IDENTIFIER, f"{hint}, at most 128 characters")

    def integer(self, value: Any, where: str, minimum: int = 0, maximum: int | None = None) -> int:
        """`value` as an integer from `minimum` to `maximum` (default CAPS[where]); raises SpecError otherwise."""
        maximum = CAPS[where] if maximum is None else maximum
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"must be an integer, got {_shown(value)}")
        if value < minimum:
            raise self.fail(where, f"must be >= {minimum}, got {_shown(value)}")
        if value > maximum:
            raise self.fail(where, f"must be <= {maximum} (the platform's cap), got {_shown(value)}")
        return value

    def number(self, value: Any, where: str) -> float:
        """`value` as a finite float; raises SpecError for anything else (NaN and infinity included)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"must be a number, got {_shown(value)}")
        number = _as_float(value)
        if not math.isfinite(number):
            raise self.fail(where, f"must be a finite number, got {_shown(value)}")
        return number

    def text(self, value: Any, where: str) -> str:
        """Free text (a description): a string, '' when absent."""
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, got {_shown(value)}; quote it")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"must be true or false, got {_shown(value)}")
        return value

    def choice(self, value: Any, where: str, choices: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.fail(where, f"{_shown(value)} is not one of {', '.join(choices)}")
        return value

    def duration(self, value: Any, where: str, positive: bool = False) -> float:
        """Seconds of duration `value`, at most DURATION_CAPS_S[where] (default MAX_DURATION_S)."""
        try:
            return parse_duration(value, positive=positive, maximum=DURATION_CAPS_S.get(where, MAX_DURATION_S))
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None

    def table(self, value: Any, where: str) -> str:
        return self.string(value, where, TABLE_NAME,
                           "use namespace.table in lower case, e.g. raw.orders, at most 128 characters each")

    def schedule(self, value: Any, where: str) -> str:
        """An Airflow schedule: one of SCHEDULE_PRESETS or a five-field cron expression."""
        text = self.string(value, where)
        if text in SCHEDULE_PRESETS or (len(text.split()) == 5 and croniter.is_valid(text)):
            return text
        raise self.fail(where, f"{_shown(value)} is not a schedule: use a cron expression such as "
                               f"'*/10 * * * *' or one of {', '.join(SCHEDULE_PRESETS)}")


# Contract field names: Avro's and Protobuf's rule (letters, digits, underscores), so that a contract
# derived from a writer schema keeps its names; two names of one record may not differ only in case
# (Spark resolves columns case-insensitively).
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_DECIMAL = re.compile(r"decimal\( *([0-9]{1,3}) *, *([0-9]{1,3}) *\)")
MAX_CONTRACT_DEPTH = 16  # struct, list and map levels of one field
_FIELD_KEYS = {"name", "type", "required", "enum", "min", "max", "pattern", "max_length", "doc", "unit", "fields",
               "items", "values"}
CONTRACT_SOURCES = ("writer_schema",)


def _contract(r: _Reader, raw: Any, derived: tuple[FieldSpec, ...] | None = None) -> Contract:
    """The contract: the declared `fields`, or with `from: writer_schema` the `derived` fields."""
    raw = r.mapping(raw, "contract", {"fields", "from"})
    if raw.get("from") is not None:
        r.choice(raw["from"], "contract.from", CONTRACT_SOURCES)
        if raw.get("fields") is not None:
            raise r.fail("contract.fields", "a contract derived from the writer schema declares no fields; "
                                            "remove `from` to declare them instead")
        for path, _ in (p for top in derived for p in top.walk()):
            if path in RESERVED_COLUMNS:
                raise r.fail("contract.from", f"the writer schema's field {path!r} is reserved for source "
                                              f"coordinates; rename it in the schema")
        return Contract(derived, from_writer_schema=True)
    items = r.required(raw, "fields", "contract")
    return Contract(_fields(r, items, "contract.fields", top=True, depth=0))


def _fields(r: _Reader, items: Any, where: str, top: bool, depth: int) -> tuple[FieldSpec, ...]:
    if not isinstance(items, list) or not items:
        raise r.fail(where, "must be a non-empty list of fields")
    fields: list[FieldSpec] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        item = r.mapping(item, f"{where}[{i}]", _FIELD_KEYS)
        name = r.string(r.required(item, "name", f"{where}[{i}]"), f"{where}[{i}].name", FIELD_NAME,
                        "letters, digits and underscores, not starting with a digit, at most 128 characters")
        here = f"{where}[{name}]"
        if name.lower() in seen:
            raise r.fail(here, "is declared twice" if seen[name.lower()] == name
                         else f"differs from field {seen[name.lower()]!r} only in case, which Spark cannot tell apart")
        if top and name in RESERVED_COLUMNS:
            raise r.fail(here, f"{name!r} is reserved for source coordinates")
        seen[name.lower()] = name
        fields.append(_field(r, item, here, name, depth))
    return tuple(fields)


def _field(r: _Reader, item: dict, where: str, name: str, depth: int) -> FieldSpec:
    """One field (or a list's element, a map's value) of the contract, checked."""
    if depth >= MAX_CONTRACT_DEPTH:
        raise r.fail(where, f"nests deeper than {MAX_CONTRACT_DEPTH} levels")
    type_text = r.string(r.required(item, "type", where), f"{where}.type")
    precision = scale = None
    decimal = _DECIMAL.fullmatch(type_text)
    if decimal:
        ftype, precision, scale = "decimal", int(decimal.group(1)), int(decimal.group(2))
        if not 1 <= precision <= MAX_DECIMAL_PRECISION or scale > precision:
            raise r.fail(f"{where}.type", f"decimal({precision},{scale}) needs a precision from 1 to "
                                          f"{MAX_DECIMAL_PRECISION} and a scale from 0 to the precision")
    elif type_text == "decimal":
        raise r.fail(f"{where}.type", "a decimal needs its precision and scale, e.g. decimal(12,2)")
    else:
        ftype = r.choice(type_text, f"{where}.type", FIELD_TYPES)
    for key, owner in (("fields", "struct"), ("items", "list"), ("values", "map")):
        if item.get(key) is not None and ftype != owner:
            raise r.fail(f"{where}.{key}", f"only a {owner} has {key}, not a {type_text}")
    nested: dict[str, Any] = {}
    if ftype == "struct":
        nested["fields"] = _fields(r, r.required(item, "fields", where), f"{where}.fields", top=False,
                                   depth=depth + 1)
    for key, child in (("items", "element"), ("values", "value")):
        if ftype == {"items": "list", "values": "map"}[key]:
            raw = r.mapping(r.required(item, key, where), f"{where}.{key}", _FIELD_KEYS - {"name", "doc"})
            nested[key] = _field(r, raw, f"{where}.{key}", child, depth + 1)
    enum = item.get("enum")
    if enum is not None:
        if not isinstance(enum, list) or not enum:
            raise r.fail(f"{where}.enum", "must be a non-empty list")
        if ftype not in ("string", "int", "long"):
            raise r.fail(f"{where}.enum", f"is only allowed for string, int and long fields, not {ftype}")
        for value in enum:
            if ftype == "string":
                ok = isinstance(value, str)
            else:
                ok = isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value <= _INT64[1]
            if not ok:
                raise r.fail(f"{where}.enum", f"{_shown(value)} is not a {ftype}")
        enum = tuple(enum)
    lo = item.get("min")
    hi = item.get("max")
    for key, bound in (("min", lo), ("max", hi)):
        if bound is not None and ftype not in ("int", "long", "float", "double", "decimal"):
            raise r.fail(f"{where}.{key}", f"ranges apply to numeric fields, not {ftype}")
    lo = None if lo is None else r.number(lo, f"{where}.min")
    hi = None if hi is None else r.number(hi, f"{where}.max")
    if lo is not None and hi is not None and lo > hi:
        raise r.fail(f"{where}.min", f"{lo} is greater than max {hi}")
    pattern = item.get("pattern")
    if pattern is not None:
        if ftype != "string":
            raise r.fail(f"{where}.pattern", f"patterns apply to string fields, not {ftype}")
        try:
            contract_pattern(r.string(pattern, f"{where}.pattern"))
        except PatternError as exc:
            raise r.fail(f"{where}.pattern", str(exc)) from None
    max_length = item.get("max_length")
    if max_length is not None:
        if ftype != "string":
            raise r.fail(f"{where}.max_length", f"applies to string fields, not {ftype}")
        max_length = r.integer(max_length, f"{where}.max_length", 1, CAPS["source.max_value_bytes"])
        if pattern is not None and max_length > MAX_MATCHED_CHARS:
            raise r.fail(f"{where}.max_length", f"a field with a pattern holds at most {MAX_MATCHED_CHARS} "
                                                f"characters (longer values are refused before matching); lower "
                                                f"max_length or drop the pattern")
    unit = item.get("unit")
    if unit is not None:
        units = {"timestamp": TIMESTAMP_UNITS, "date": DATE_UNITS}.get(ftype)
        if units is None:
            raise r.fail(f"{where}.unit", f"applies to timestamp and date fields, not {ftype}")
        unit = r.choice(unit, f"{where}.unit", units)
    return FieldSpec(
        name=name, type=ftype,
        required=r.boolean(item.get("required", False), f"{where}.required"),
        enum=enum, min=lo, max=hi, pattern=pattern, max_length=max_length,
        doc=r.text(item.get("doc"), f"{where}.doc"),
        precision=precision, scale=scale, unit=unit, **nested,
    )


def _partition_field(r: _Reader, value: Any, where: str, contract: Contract) -> PartitionField:
    text = r.string(value, where).replace(" ", "")
    match = _PARTITION.fullmatch(text)
    if not match:
        raise r.fail(where, f"{_shown(value)} is not a partition transform like day(event_time) or bucket(16, id)")
    transform, arg, column, bare = match.groups()
    if bare:
        transform, column = "identity", bare
    if transform not in PARTITION_TRANSFORMS:
        raise r.fail(where, f"unknown transform {_shown(transform)} (use one of {', '.join(PARTITION_TRANSFORMS)})")
    if column not in contract.names:
        raise r.fail(where, f"column {_shown(column)} is not a contract field")
    ftype = contract.field(column).type
    if transform in ("year", "month", "day", "hour") and ftype not in ("timestamp", "date"):
        raise r.fail(where, f"{transform}() needs a timestamp or date column, {column!r} is {ftype}")
    if transform == "hour" and ftype != "timestamp":
        raise r.fail(where, f"hour() needs a timestamp column, {column!r} is {ftype}")
    allowed = PARTITION_SOURCE_TYPES[transform]
    if ftype not in allowed:
        raise r.fail(where, f"{transform} cannot partition {column!r}, a {contract.field(column).type_text}; "
                            f"it takes {', '.join(allowed)} columns")
    if transform in ("bucket", "truncate"):
        # the length test first: int() refuses strings of more than 4300 digits
        if arg is None or len(arg) > 10 or not 1 <= int(arg) <= CAPS[transform]:
            raise r.fail(where, f"{transform}() needs a positive width of at most {CAPS[transform]}, "
                                f"e.g. {transform}(16, {column})")
    elif arg is not None:
        raise r.fail(where, f"{transform}() takes no width")
    return PartitionField(transform=transform, column=column, arg=None if arg is None else int(arg))


def _fanout(r: _Reader, raw: Any, contract: Contract) -> FanoutSpec:
    fo = r.mapping(raw, "target.fanout", {"field", "routes"})
    fo_field = r.string(r.required(fo, "field", "target.fanout"), "target.fanout.field")
    if fo_field not in contract.names:
        raise r.fail("target.fanout.field", f"{_shown(fo_field)} is not a contract field")
    if contract.field(fo_field).type not in ("string", "int", "long"):
        raise r.fail("target.fanout.field", f"{fo_field!r} is a {contract.field(fo_field).type_text}; routes "
                                            f"match string, int or long values")
    routes = r.required(fo, "routes", "target.fanout")
    if not isinstance(routes, dict) or not routes:
        raise r.fail("target.fanout.routes", "must map field values to tables")
    tables: dict[str, str] = {}
    for value, table in routes.items():
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)
                                           and _INT64[0] <= value <= _INT64[1])):
            raise r.fail("target.fanout.routes", f"route keys are string or integer field values, "
                                                 f"got {_shown(value)}")
        where = f"target.fanout.routes.{str(value)[:60]}"
        if str(value) in tables:  # 1 and "1" would route the same records
            raise r.fail(where, f"the value {_shown(str(value))} is routed twice")
        tables[str(value)] = r.table(table, where)
    return FanoutSpec(field=fo_field, routes=tables)


def _properties(r: _Reader, raw: Any, contract: Contract) -> dict[str, str]:
    """Iceberg table properties as strings: only those of SPEC_PROPERTIES and SPEC_COLUMN_PROPERTIES (on a
    column of the table), each with a value it takes; raises SpecError naming why anything else is refused."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise r.fail("target.properties", "must be a mapping of Iceberg table properties")
    props: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _PROPERTY_KEY.fullmatch(key):
            raise r.fail("target.properties", f"{_shown(key)} is not a property name: use letters, digits, "
                                              f"'.', '_' and '-', e.g. commit.retry.num-retries")
        where = f"target.properties.{key}"
        refused = refused_property(key)
        if refused is not None:
            raise r.fail(where, refused)
        values = SPEC_PROPERTIES.get(key)
        if values is None:
            prefix = next((p for p in SPEC_COLUMN_PROPERTIES if key.startswith(p) and len(key) > len(p)), None)
            if prefix is None:
                known = [*SPEC_PROPERTIES, *(f"{p}<column>" for p in SPEC_COLUMN_PROPERTIES)]
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise r.fail(where, f"is not a table property a spec may set{hint}. A spec sets Iceberg's tuning: "
                                    f"{PROPERTY_FAMILIES}; docs/spec.md lists each")
            column = key[len(prefix):].split(".")[0]
            if column not in contract.names and column not in RESERVED_COLUMNS:
                raise r.fail(where, f"{_shown(column)} is not a column of the table: name a contract field "
                                    f"(or a field nested in one, field.child)")
            values = SPEC_COLUMN_PROPERTIES[prefix]
        if isinstance(value, bool):
            text = "true" if value else "false"  # Iceberg reads booleans in lower case
        elif (isinstance(value, int) and _INT64[0] <= value <= _INT64[1]) or \
                (isinstance(value, float) and math.isfinite(value)):
            text = str(value)
        elif isinstance(value, str) and len(value) <= MAX_PROPERTY_VALUE:
            text = value
        else:
            raise r.fail(where, f"must be a string of at most {MAX_PROPERTY_VALUE} characters, a finite (64-bit) "
                                f"number or a boolean, got {_shown(value)}")
        why = values.why_not(text)
        if why is not None:
            raise r.fail(where, f"{why}, got {_shown(value)}")
        props[key] = text
    return props


def _claims(spec: PipelineSpec) -> list[tuple[str, str, str]]:
    """(name, field, what) for every table and view the spec claims, in declaration order; a fan-out
    route to the default table (or to another route's table) claims nothing new."""
    claims = [(spec.target.table, "target.table", "data table")]
    if spec.target.fanout is not None:
        for value, table in spec.target.fanout.routes.items():
            if all(name != table for name, _, _ in claims):
                claims.append((table, f"target.fanout.routes.{value[:60]}", "data table"))
    claims.append((spec.dead_letter_table, "dead_letter.table", "dead-letter table"))
    claims.extend((view, "publish.view", "readers' view") for view in spec.views)
    return claims


def _check_own_names(r: _Reader, spec: PipelineSpec) -> None:
    """Raise SpecError when the spec claims the ops timeline, or one name for two of its tables or views."""
    seen: dict[str, tuple[str, str]] = {}
    for name, where, what in _claims(spec):
        if name == OPS_TIMELINE_TABLE:
            raise r.fail(where, f"{name!r} is the platform's ops timeline table; choose another name")
        if name in seen:
            other_where, other_what = seen[name]
            raise r.fail(where, f"{name!r} is also a {other_what} of this pipeline ({other_where})")
        seen[name] = (where, what)


def _derived_fields(r: _Reader, name: str, value_format: str, key_format: str, envelope: str | None,
                    schemas: tuple[tuple[int, str, str], ...]) -> tuple[FieldSpec, ...]:
    """`contract.from: writer_schema`: the fields that fit every value writer schema of `source.schemas`
    (lakehouse.core.schemas.derive, merged oldest id first), checked as declared fields are."""
    from lakehouse.core import schemas as translate

    schema_type = FORMAT_SCHEMA_TYPES.get(value_format)
    if schema_type is None:
        raise r.fail("contract.from", f"value_format {value_format!r} carries no writer schema; declare "
                                      f"contract.fields instead")
    if not schemas:
        raise r.fail("contract.from", "a contract derived from the writer schema needs the writer schemas beside "
                                      "the spec: set source.schemas to a folder of <schema id>.avsc, .proto or "
                                      f".json files (`lakehouse schemas --pipeline {name} --pull` fills it from "
                                      "the schema registry)")
    if envelope is None and FORMAT_SCHEMA_TYPES.get(key_format) == schema_type:
        raise r.fail("contract.from", f"the keys and values are both {schema_type} records, so the folder's "
                                      f"schemas cannot be told apart; declare contract.fields instead")
    fields: tuple[FieldSpec, ...] | None = None
    for schema_id, found_type, text in schemas:
        if found_type != schema_type:
            continue
        try:
            record = translate.record_type(schema_type, text)
            if envelope is not None and not translate.is_change_event(record):
                continue  # the change stream's key schema
            version = translate.derive(schema_type, text, envelope)
            if fields is not None:
                diff = translate.compare(fields, version)
                if diff.incompatible:
                    raise translate.SchemaTranslationError("; ".join(diff.incompatible))
                version = translate.merge(fields, version)
        except translate.SchemaTranslationError as exc:
            raise r.fail("contract.from", f"writer schema {schema_id}: {exc}") from None
        fields = version
    if fields is None:
        raise r.fail("contract.from", f"source.schemas holds no {schema_type} "
                                      f"{'change event ' if envelope else ''}schema to derive the contract from")
    for top in fields:
        for path, f in top.walk():
            if not FIELD_NAME.fullmatch(f.name):
                raise r.fail("contract.from", f"the writer schema's field {path[:200]!r} is not a column name "
                                              f"(letters, digits and underscores); rename it in the schema")
        _check_case(r, top)
    _check_case(r, FieldSpec("", "struct", fields=fields))
    return fields


def _check_case(r: _Reader, f: FieldSpec) -> None:
    """Raise SpecError when two fields of one derived struct differ only in case."""
    for path, spec in f.walk():
        if spec.type == "struct":
            lowered = [c.name.lower() for c in spec.fields]
            if len(set(lowered)) < len(lowered):
                raise r.fail("contract.from", f"the writer schema's record {path or '(top)'} has fields that differ "
                                              f"only in case, which Spark cannot tell apart")


def _source(r: _Reader, top: dict, path: Path, name: str, empty_folder: bool = False) -> SourceSpec:
    """The `source` section of spec document `top`; `source.key.field` is checked against the contract by
    the caller. `empty_folder` admits a `source.schemas` folder without schemas (to pull them into)."""
    src = r.mapping(r.required(top, "source", ""), "source",
                    {"topic", "partitions", "replication_factor", "retention_ms", "value_format", "key",
                     "max_value_bytes", "schemas", "envelope"})
    key = r.mapping(src.get("key"), "source.key", {"field", "required", "format"})
    topic = r.string(r.required(src, "topic", "source"), "source.topic", _TOPIC,
                     "topic names use letters, digits, '.', '_' and '-', at most 249 characters")
    if topic in (".", ".."):
        raise r.fail("source.topic", f"{topic!r} is not a topic name Kafka accepts")
    retention = src.get("retention_ms")
    if retention is not None and r.integer(retention, "source.retention_ms", -1) == 0:
        raise r.fail("source.retention_ms", "0 would delete records as soon as they arrive; use -1 for unlimited")
    value_format = r.choice(src.get("value_format", "json"), "source.value_format", VALUE_FORMATS)
    # target.mode cdc: the values are change events, Debezium's unless source.envelope says otherwise
    cdc = isinstance(top.get("target"), dict) and top["target"].get("mode") == "cdc"
    envelope = r.choice(src.get("envelope", ENVELOPES[0] if cdc else None), "source.envelope", ENVELOPES) \
        if cdc or src.get("envelope") is not None else None
    # a change stream's key holds the primary key: a record in the value's format (Debezium's converters)
    key_format = r.choice(key.get("format", value_format if envelope else "string"), "source.key.format",
                          KEY_FORMATS)
    if envelope is not None and key_format == "string":
        raise r.fail("source.key.format", "a change stream's keys are records holding the primary key "
                                          f"(Debezium's); use one of {', '.join(VALUE_FORMATS)}")
    schemas: tuple[tuple[int, str, str], ...] = ()
    schemas_dir = None
    wire = [f for f in (value_format, key_format) if f in FORMAT_SCHEMA_TYPES]
    if src.get("schemas") is not None:
        if not wire:
            raise r.fail("source.schemas", f"is a folder of writer schemas; value_format {value_format!r} and "
                                           f"key format {key_format!r} have none")
        folder = r.string(src["schemas"], "source.schemas", _SCHEMA_FOLDER,
                          "a folder path beside the spec, at most 1,024 characters")
        try:
            schemas_dir = str((Path(path).parent / folder).resolve())
            schemas = read_schema_folder(Path(path).parent / folder)
        except (OSError, ValueError, RuntimeError) as exc:  # a name too long, a symlink loop, too large
            raise r.fail("source.schemas", f"{folder!r} cannot be read: {exc}") from None
        types = {FORMAT_SCHEMA_TYPES[f] for f in wire}
        if not schemas:
            if not empty_folder:
                raise r.fail("source.schemas", f"{folder!r} is not a folder of <schema id>.avsc, .proto or .json "
                                               f"files (`lakehouse schemas --pipeline {name} --pull` fills it from "
                                               f"the schema registry)")
        elif not any(schema_type in types for _, schema_type, _ in schemas):
            raise r.fail("source.schemas", f"{folder!r} holds no {' or '.join(sorted(types))} schema for "
                                           f"{' and '.join(wire)}")
    key_field = key.get("field")
    return SourceSpec(
        topic=topic,
        partitions=r.integer(src.get("partitions", 1), "source.partitions", 1),
        replication_factor=r.integer(src.get("replication_factor", 1), "source.replication_factor", 1),
        retention_ms=retention,
        value_format=value_format,
        schemas=schemas,
        schemas_dir=schemas_dir,
        key_field=key_field,
        key_required=r.boolean(key.get("required", key_field is not None or envelope is not None),
                               "source.key.required"),
        key_format=key_format,
        envelope=envelope,
        max_value_bytes=r.integer(src.get("max_value_bytes", 1_048_576), "source.max_value_bytes", 1),
    )


def _parse(path: Path, raw: Any) -> PipelineSpec:
    r = _Reader(path)
    top = r.mapping(raw, "", {"name", "description", "source", "target", "dead_letter", "contract",
                              "schema_policy", "trigger", "slo", "supervision", "maintenance", "retention",
                              "publish", "verify", "candidate_for"})
    if not top:
        raise r.fail("(file)", "is empty")
    name = r.identifier(r.required(top, "name", ""), "name")
    contract_raw = r.mapping(r.required(top, "contract", ""), "contract", {"fields", "from"})

    source = _source(r, top, path, name)
    derived = None if contract_raw.get("from") is None else _derived_fields(
        r, name, source.value_format, source.key_format, source.envelope, source.schemas)
    contract = _contract(r, contract_raw, derived)
    key_field = source.key_field
    if key_field is not None:
        if key_field not in contract.names:
            raise r.fail("source.key.field", f"{_shown(key_field)} is not a contract field")
        if contract.field(key_field).type in (*NESTED_TYPES, "binary"):  # the key is compared as text
            raise r.fail("source.key.field", f"{key_field!r} is a {contract.field(key_field).type_text}; the Kafka "
                                             f"key is text, compared with a field of a scalar type")

    tgt = r.mapping(r.required(top, "target", ""), "target",
                    {"catalog", "table", "mode", "key", "partition_by", "fanout", "target_file_size_mb",
                     "properties"})
    mode = r.choice(tgt.get("mode", "append"), "target.mode", MODES)
    keys = tgt.get("key") or []
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list):
        raise r.fail("target.key", "must be a column name or a list of column names")
    for i, k in enumerate(keys):
        if k not in contract.names:
            raise r.fail(f"target.key[{i}]", f"{_shown(k)} is not a contract field")
        if not contract.field(k).required:
            raise r.fail(f"target.key[{i}]", f"key column {k!r} must be required in the contract")
        if contract.field(k).type in ("double", "float"):  # NaN never equals itself, -0.0 equals 0.0
            raise r.fail(f"target.key[{i}]", f"key column {k!r} is a {contract.field(k).type}; floating-point values "
                                             f"do not identify rows (NaN, -0.0): use a string, int, long or date key")
        if contract.field(k).type not in KEY_TYPES:
            raise r.fail(f"target.key[{i}]", f"key column {k!r} is a {contract.field(k).type_text}; a key column is "
                                             f"one of {', '.join(KEY_TYPES)}")
    if mode in ("upsert", "cdc") and not keys:
        raise r.fail("target.key", f"{mode} mode needs key columns")
    if mode == "cdc":
        if source.key_field is not None:
            raise r.fail("source.key.field", "a change stream's key is the primary key record; cdc mode takes "
                                             "target.key's columns from it (leave source.key.field out)")
        if not source.key_required:
            raise r.fail("source.key.required", "a change stream's deletes and tombstones need their key")
        mode = "upsert"
    elif source.envelope is not None:
        raise r.fail("source.envelope", f"change events need target.mode cdc, not {mode!r}")
    if source.envelope is not None and tgt.get("fanout") is not None:
        raise r.fail("target.fanout", "a change stream mirrors one source table into one table; fan-out would "
                                      "split a key's inserts and deletes across tables")
    parts = tgt.get("partition_by") or []
    if isinstance(parts, str):
        parts = [parts]
    if not isinstance(parts, list):
        raise r.fail("target.partition_by", "must be a list of partition transforms")
    partition_by = tuple(_partition_field(r, p, f"target.partition_by[{i}]", contract) for i, p in enumerate(parts))
    table = r.table(r.required(tgt, "table", "target"), "target.table")
    fanout = None if tgt.get("fanout") is None else _fanout(r, tgt["fanout"], contract)
    target = TargetSpec(
        catalog=r.identifier(tgt.get("catalog", "lake"), "target.catalog"),
        table=table, mode=mode, key=tuple(keys), partition_by=partition_by, fanout=fanout,
        target_file_size_bytes=r.integer(tgt.get("target_file_size_mb", 128), "target.target_file_size_mb", 1)
        * 1024 * 1024,
        properties=_properties(r, tgt.get("properties"), contract),
    )

    dlq = r.mapping(r.required(top, "dead_letter", ""), "dead_letter", {"table"})
    dead_letter_table = r.table(r.required(dlq, "table", "dead_letter"), "dead_letter.table")

    pol = r.mapping(top.get("schema_policy"), "schema_policy", {"on_additive", "on_incompatible"})
    trig = r.mapping(top.get("trigger"), "trigger", {"interval", "max_records_per_batch", "mode", "schedule"})
    slo = r.mapping(top.get("slo"), "slo", {"freshness", "lag_records", "lag_seconds"})
    sup = r.mapping(top.get("supervision"), "supervision",
                    {"hung_after_triggers", "restart_backoff", "max_restarts", "retry_budget"})
    mnt = r.mapping(top.get("maintenance"), "maintenance", {"schedule", "min_input_files", "orphan_safety_window"})
    ret = r.mapping(top.get("retention"), "retention",
                    {"outage_budget", "replay_window", "delete_after", "guard_threshold", "max_retention"})
    pub = r.mapping(top.get("publish"), "publish", {"branch", "view", "schedule", "suite", "spark_audit_rows"})
    ver = r.mapping(top.get("verify"), "verify", {"schedule"})
    interval_s = r.duration(trig.get("interval", "5s"), "trigger.interval", positive=True)
    orphan_window = r.duration(mnt.get("orphan_safety_window", "3d"), "maintenance.orphan_safety_window")
    if orphan_window < max(3600.0, 100 * interval_s):
        raise r.fail("maintenance.orphan_safety_window",
                     f"{orphan_window:g}s is too short: files of a commit still in flight would be deleted; "
                     f"use at least 1h and 100 trigger intervals")
    delete_after = ret.get("delete_after")
    if delete_after is not None and event_time_column(contract, ()) is None:
        raise r.fail("retention.delete_after", "needs a timestamp column in the contract to age rows by")
    view = pub.get("view")
    if view is not None:
        view = r.table(view, "publish.view")
    branch = r.identifier(pub.get("branch", "published"), "publish.branch")
    if branch == "main":
        raise r.fail("publish.branch", "'main' is the audit branch ingestion commits to; readers need their own")
    candidate_for = top.get("candidate_for")
    if candidate_for is not None:
        candidate_for = r.identifier(candidate_for, "candidate_for", "name the live pipeline")
        if candidate_for == name:
            raise r.fail("candidate_for", "a pipeline cannot be a candidate for itself")
    spec = PipelineSpec(
        name=name,
        path=str(path),
        description=r.text(top.get("description"), "description").strip(),
        source=source,
        target=target,
        dead_letter_table=dead_letter_table,
        contract=contract,
        schema_policy=SchemaPolicy(
            on_additive=r.choice(pol.get("on_additive", "evolve"), "schema_policy.on_additive", ADDITIVE_POLICIES),
            on_incompatible=r.choice(pol.get("on_incompatible", "fail"), "schema_policy.on_incompatible",
                                     INCOMPATIBLE_POLICIES),
        ),
        trigger=TriggerSpec(
            interval_s=interval_s,
            max_records_per_batch=r.integer(trig.get("max_records_per_batch", 100_000),
                                            "trigger.max_records_per_batch", 1),
            mode=r.choice(trig.get("mode", "continuous"), "trigger.mode", TRIGGER_MODES),
            schedule=r.schedule(trig.get("schedule", "*/5 * * * *"), "trigger.schedule"),
        ),
        slo=SloSpec(
            freshness_s=r.duration(slo.get("freshness", "60s"), "slo.freshness"),
            lag_records=r.integer(slo.get("lag_records", 100_000), "slo.lag_records", 0),
            lag_s=r.duration(slo.get("lag_seconds", "60s"), "slo.lag_seconds"),
        ),
        supervision=SupervisionSpec(
            hung_after_triggers=r.integer(sup.get("hung_after_triggers", 12), "supervision.hung_after_triggers", 1),
            restart_backoff_s=r.duration(sup.get("restart_backoff", "10s"), "supervision.restart_backoff"),
            max_restarts=r.integer(sup.get("max_restarts", 5), "supervision.max_restarts", 0),
            retry_budget_s=r.duration(sup.get("retry_budget", "5m"), "supervision.retry_budget", positive=True),
        ),
        maintenance=MaintenanceSpec(
            schedule=r.schedule(mnt.get("schedule", "@hourly"), "maintenance.schedule"),
            min_input_files=r.integer(mnt.get("min_input_files", 5), "maintenance.min_input_files", 2),
            orphan_safety_window_s=orphan_window,
        ),
        retention=RetentionSpec(
            outage_budget_s=r.duration(ret.get("outage_budget", "24h"), "retention.outage_budget", positive=True),
            replay_window_s=r.duration(ret.get("replay_window", "3d"), "retention.replay_window", positive=True),
            delete_after_s=None if delete_after is None
            else r.duration(delete_after, "retention.delete_after", positive=True),
            **_retention_guard(r, ret, source),
        ),
        publish=PublishSpec(
            branch=branch,
            view=view,
            schedule=r.schedule(pub.get("schedule", "*/10 * * * *"), "publish.schedule"),
            suite=None if pub.get("suite") is None else r.identifier(pub["suite"], "publish.suite"),
            spark_audit_rows=r.integer(pub.get("spark_audit_rows", 1_000_000), "publish.spark_audit_rows"),
        ),
        verify=VerifySpec(schedule=r.schedule(ver.get("schedule", "@hourly"), "verify.schedule")),
        candidate_for=candidate_for,
    )
    _check_own_names(r, spec)
    return spec


_SHARE = re.compile(r"([0-9]{1,3}(?:\.[0-9]+)?) *%")


def _retention_guard(r: _Reader, ret: dict, source: SourceSpec) -> dict:
    """The retention guard's fields of RetentionSpec from section `retention` (`ret`): `guard_threshold`
    (a duration, or a share of the declared retention such as 50%) and `max_retention` (a duration)."""
    declared = source.retention_ms if source.retention_ms and source.retention_ms > 0 else None
    fields: dict[str, Any] = {}
    threshold = ret.get("guard_threshold")
    share = _SHARE.fullmatch(threshold) if isinstance(threshold, str) else None
    if share:
        fields["guard_threshold_share"] = float(share.group(1)) / 100
        if not 0 < fields["guard_threshold_share"] < 1:
            raise r.fail("retention.guard_threshold", f"{_shown(threshold)}: a share must be above 0% and below 100%")
    elif threshold is not None:
        fields["guard_threshold_s"] = r.duration(threshold, "retention.guard_threshold", positive=True)
        if declared is not None and fields["guard_threshold_s"] * 1000 >= declared:
            raise r.fail("retention.guard_threshold",
                         f"{_shown(threshold)} is not shorter than source.retention_ms ({declared} ms): the guard "
                         f"would act all the time; use a shorter duration or a share such as 50%")
    cap = ret.get("max_retention")
    if cap is not None:
        fields["max_retention_ms"] = math.ceil(r.duration(cap, "retention.max_retention", positive=True) * 1000)
        if declared is not None and fields["max_retention_ms"] < declared:
            raise r.fail("retention.max_retention", f"{_shown(cap)} is below source.retention_ms ({declared} ms): "
                                                    f"the guard may only raise the topic's retention")
    return fields


class _SpecYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (`*ref` expands into billions of nodes), duplicate keys
    (the second silently wins) or nesting deeper than MAX_YAML_DEPTH (the composer recurses)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in pipeline specs: write the value out",
                self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nests deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"found duplicate key {_shown(key_node.value)}", key_node.start_mark)
                    seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> Any:
    """The YAML document in spec file `path`; raises SpecError when the file is not a readable regular
    file of at most MAX_SPEC_BYTES UTF-8 bytes holding plain YAML."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or a device would block or never end
            raise SpecError(path, "(file)", "is not a regular file")
        with path.open("rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(path, "(file)", f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(path, "(file)", f"is larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is a page of YAML")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(path, "(file)", f"is not UTF-8 text: {exc}") from None
    loader = _SpecYamlLoader(text)
    loader.name = path.name  # error marks say 'in "orders.yaml", line 3', not '<unicode string>'
    try:
        return loader.get_single_data()
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
        raise SpecError(path, "(file)", f"is not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def load_spec(path: Path | str) -> PipelineSpec:
    """Load and validate one pipeline spec file on its own (no checks against its siblings).

    Raises SpecError naming the file, the field and why.
    """
    path = Path(path)
    return _parse(path, _read_yaml(path))


@dataclass(frozen=True)
class SpecSet:
    """The pipelines folder read as a whole: the valid specs, and every broken file's error.

    `specs` maps pipeline names to valid specs, in file order. `errors` maps each broken file's
    path to its SpecError, in path order. `declared` maps each broken file's path to the pipeline
    it declares: its top-level `name` when that is readable, else the file's stem.
    """

    directory: Path
    specs: dict[str, PipelineSpec]
    errors: dict[str, SpecError]
    declared: dict[str, str]

    def error_for(self, name: str) -> SpecError | None:
        """The error of a broken file that declares pipeline `name` (by its `name` or its stem), else None."""
        for path, error in self.errors.items():
            if name in (self.declared[path], Path(path).stem):
                return error
        return None

    def raise_errors(self) -> None:
        """Raise BrokenSpecsError listing every broken file; return when there is none."""
        if self.errors:
            raise BrokenSpecsError(self.errors)


def _declared_name(raw: Any, path: Path) -> str:
    """The pipeline name a (possibly broken) spec document declares, else the file's stem."""
    name = raw.get("name") if isinstance(raw, dict) else None
    return name if isinstance(name, str) and IDENTIFIER.fullmatch(name) else path.stem


def _conflicts(specs: list[PipelineSpec]) -> dict[str, SpecError]:
    """An error for every spec whose pipeline name, table or view another spec of `specs` also claims
    (in the same catalog), naming the other file(s); the first conflict of each file is reported."""
    errors: dict[str, SpecError] = {}
    by_name: dict[str, list[PipelineSpec]] = {}
    for spec in specs:
        by_name.setdefault(spec.name, []).append(spec)
    for name, group in by_name.items():
        for spec in group if len(group) > 1 else ():
            others = ", ".join(o.path for o in group if o is not spec)
            errors[spec.path] = SpecError(spec.path, "name", f"pipeline {name!r} is also declared in {others}; "
                                                             f"pipeline names must be unique")
    claimed: dict[tuple[str, str], list[tuple[PipelineSpec, str, str]]] = {}
    for spec in specs:
        for name, where, what in _claims(spec):
            claimed.setdefault((spec.catalog, name), []).append((spec, where, what))
    for (_, name), claims in claimed.items():
        if len(claims) < 2:
            continue
        for spec, where, _ in claims:
            others = " and ".join(f"a {what} of pipeline {o.name!r} ({o.path})"
                                  for o, _, what in claims if o is not spec)
            errors.setdefault(spec.path, SpecError(
                spec.path, where, f"{name!r} is also {others}; a table or view has one owner: give each "
                                  f"pipeline (a candidate too) its own tables and views"))
    return errors


def load_specs(directory: Path | str | None = None) -> SpecSet:
    """Every spec file (`*.yaml`, `*.yml`) of the pipelines folder (default: config.pipelines_dir()),
    each validated on its own and then against the others. Never raises for a broken file: its
    error is in the result's `errors`, and its pipeline is not in `specs`."""
    directory = Path(directory) if directory else config.pipelines_dir()
    loaded: dict[str, PipelineSpec] = {}
    errors: dict[str, SpecError] = {}
    declared: dict[str, str] = {}
    for path in sorted(directory.glob("*.y*ml")):
        raw = None
        try:
            raw = _read_yaml(path)
            loaded[str(path)] = _parse(path, raw)
        except SpecError as exc:
            errors[str(path)] = exc
            declared[str(path)] = _declared_name(raw, path)
    for path, exc in _conflicts(list(loaded.values())).items():
        errors[path] = exc
        declared[path] = loaded.pop(path).name
    return SpecSet(directory=directory, specs={s.name: s for s in loaded.values()},
                   errors=dict(sorted(errors.items())), declared=declared)


def load_all(directory: Path | str | None = None) -> dict[str, PipelineSpec]:
    """Every valid pipeline of the pipelines folder, by name; broken files are left out (see load_specs)."""
    return load_specs(directory).specs


@dataclass(frozen=True)
class SchemaSource:
    """What pulling a pipeline's writer schemas needs of its spec (`lakehouse schemas --pull`), read even
    while the spec does not load because its contract comes from a schema folder that is still empty."""

    name: str
    path: str
    source: SourceSpec


def load_schema_source(name: str, directory: Path | str | None = None) -> SchemaSource:
    """The `source` section of the spec file that declares pipeline `name` (by its `name` or its stem),
    checked as `load_spec` checks it except that its `source.schemas` folder may hold no schema yet.

    Raises SpecError when the file's name or source section is broken, UnknownPipelineError when no
    file declares `name`.
    """
    directory = Path(directory) if directory else config.pipelines_dir()
    for path in sorted(directory.glob("*.y*ml")):
        try:
            raw = _read_yaml(path)
        except SpecError:
            continue
        if name not in (_declared_name(raw, path), path.stem):
            continue
        r = _Reader(path)
        top = r.mapping(raw, "", set(raw) if isinstance(raw, dict) else set())
        declared = r.identifier(r.required(top, "name", ""), "name")
        return SchemaSource(declared, str(path), _source(r, top, path, declared, empty_folder=True))
    known = ", ".join(sorted(load_specs(directory).specs)) or "none"
    raise UnknownPipelineError(f"no pipeline named {name!r} in {directory} (known: {known})")


def load_pipeline(name: str, directory: Path | str | None = None) -> PipelineSpec:
    """The spec of pipeline `name`, valid even when sibling files are broken.

    Raises the SpecError of the file that declares `name` (by its `name` or its stem) when that file
    is broken or overlaps another, else UnknownPipelineError listing the known pipelines.
    """
    found = load_specs(directory)
    if name in found.specs:
        return found.specs[name]
    error = found.error_for(name)
    if error is not None:
        raise error
    known = ", ".join(sorted(found.specs)) or "none"
    raise UnknownPipelineError(f"no pipeline named {name!r} in {found.directory} (known: {known})")
