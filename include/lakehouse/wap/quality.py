"""The audit in write-audit-publish: validate what arrived since the last publication.

`audit(spec)` pins each data table's current `main` snapshot S and validates the rows
of S that live in data files added by the snapshots of main's lineage after the
published branch head P (P exclusive, S inclusive); every row of S when nothing was
published yet. Lineage, not Kafka offsets, decides what is new: replays, backfills and
dead-letter replays add rows below the published positions, and they are audited like
ingested rows. The files are read as of S, so rows deleted since (merge-on-read
position deletes of upsert tables, a key updated again) are not audited. A compaction
(`replace`) in the lineage adds files that also hold rows published before; those rows
are audited again, which is conservative: it never lets an unaudited row through.

The lineage must be complete: when a snapshot between P and S was expired, the rows it
added cannot be known and the audit fails closed with LineageBrokenError; when S does
not descend from P (main rolled back below the published head) it fails with
LineageDivergedError.

The rows are validated with Great Expectations 1.x against the suite
`<spec.publish.suite or spec.name>.json` of the expectations folder (LAKEHOUSE_EXPECTATIONS_DIR,
by default include/expectations/; GE's own suite JSON). For upsert pipelines a uniqueness
expectation on `spec.target.key` is added automatically. Each table gets a checkpoint in a file-backed GE context
under `LAKEHOUSE_HOME/quality/<pipeline>/`, which also renders the Data Docs
site there. The returned `AuditResult` names the snapshot audited per table, the
lineage it covered, the Kafka offsets of the audited rows, the per-expectation
results and the Kafka coordinates of failing rows.

Where the rows are validated depends on how many there are, counted from the manifests
(the record counts of the data files planned, nothing read): a table's window of fewer
than `spec.publish.spark_audit_rows` rows (default 1,000,000) is read into pandas on
this process, as GE's pandas datasource needs; a larger one is validated by GE's Spark
datasource on a DataFrame of the same rows read through the Iceberg catalog at the same
snapshot, with the offsets audited computed by Spark aggregates. Only aggregates and at
most MAX_OFFENDING failing rows per expectation reach this process then, so its memory
does not grow with the window. Both give the same verdict, counts and offsets; the
Spark path lists a sample of at most MAX_OFFENDING failing rows per expectation (which
ones is Spark's choice), while `offending_total` still counts them all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    LessThan,
    Or,
)
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot, ancestors_between_ids, is_ancestor_of

from lakehouse.audit.coordinates import integer_bound
from lakehouse.core import config, events
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import LineageBrokenError, LineageDivergedError, LineageError, QualityConfigError
from lakehouse.core.spec import PipelineSpec

CLOCK_SKEW = timedelta(minutes=5)  # producers' clocks may run this far ahead of ours
MAX_OFFENDING = 100  # offending offsets kept in a result (and the ops event)
MAX_EXAMPLES = 10  # unexpected values quoted per expectation
COORDINATES = ("_kafka_partition", "_kafka_offset")  # flattened `_kafka`, how GE points at failing rows
_FILE = "__lakehouse_file"  # the Spark path's column of each row's data file (Iceberg's `_file`), dropped before GE


@dataclass(frozen=True)
class TableAudit:
    """What was audited in one table: its pinned snapshot, the lineage covered and the rows' offsets."""

    table: str
    snapshot_id: int | None  # main's snapshot audited; None when the table has no data yet
    published_snapshot_id: int | None  # head of the readers' branch when the audit started
    # snapshots whose added files were audited, oldest first: after the published head (exclusive) up
    # to snapshot_id (inclusive); [] when nothing was published yet (every row of snapshot_id was
    # audited), when nothing is new, and in window mode
    lineage: list[int] = field(default_factory=list)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (lowest, highest) offset audited
    rows: int = 0
    success: bool = True
    docs_page: str | None = None
    engine: str | None = None  # where the rows were validated: "pandas" (on this process) or "spark"; None: no data


@dataclass(frozen=True)
class AuditResult:
    pipeline: str
    suite: str
    success: bool
    rows: int
    tables: dict[str, TableAudit]
    expectations: list[dict]
    offending_offsets: list[dict]  # {table, topic, partition, offset, expectation, column, value}, capped
    offending_total: int
    docs: str  # the Data Docs site's index.html
    audited_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def snapshots(self) -> dict[str, int]:
        """The audited snapshot id per table (tables without data are left out)."""
        return {t: a.snapshot_id for t, a in self.tables.items() if a.snapshot_id is not None}

    @property
    def failed_expectations(self) -> int:
        return sum(1 for e in self.expectations if not e["success"])

    @property
    def unexpected_count(self) -> int:
        return sum(e["unexpected_count"] or 0 for e in self.expectations)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (for XCom): every field plus snapshots and the failure counts."""
        out = asdict(self)
        out["tables"] = {t: {**asdict(a), "offsets": _offsets_json(a.offsets)} for t, a in self.tables.items()}
        out.update(snapshots={t: s for t, s in self.snapshots.items()},
                   failed_expectations=self.failed_expectations, unexpected_count=self.unexpected_count)
        return out

    def summary(self) -> str:
        """One readable paragraph: the verdict, the counts, and the first offending offsets."""
        head = (f"{self.pipeline}: {'passed' if self.success else 'FAILED'} suite {self.suite!r} on {self.rows} "
                f"new row(s) of " + ", ".join(f"{t} (snapshot {a.snapshot_id})" for t, a in self.tables.items()))
        if self.success:
            return head
        failed = "; ".join(f"{e['table']}: {e['expectation']}({e['column'] or ''}) "
                           f"{e['unexpected_count'] or 0} unexpected"
                           + (f" [{e['exception']}]" if e["exception"] else "")
                           for e in self.expectations if not e["success"])
        where = ", ".join(f"{o['topic']}[{o['partition']}]@{o['offset']}" for o in self.offending_offsets[:10])
        more = f" (+{self.offending_total - 10} more)" if self.offending_total > 10 else ""
        return f"{head}. Failed: {failed}. Offending offsets: {where or '-'}{more}. Data Docs: {self.docs}"


def suite_path(spec: PipelineSpec, directory: Path | None = None) -> Path:
    """The suite file of `spec` in `directory` (default: LAKEHOUSE_EXPECTATIONS_DIR, config.expectations_dir)."""
    return (directory or config.expectations_dir()) / f"{spec.publish.suite or spec.name}.json"


def load_suite(spec: PipelineSpec, directory: Path | None = None) -> dict:
    """The suite as GE suite JSON, plus key uniqueness for upsert pipelines.

    Raises QualityConfigError when the file is missing, not JSON or not a suite.
    """
    path = suite_path(spec, directory)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise QualityConfigError(f"{spec.path}: publish.suite: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise QualityConfigError(f"{path}: is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("expectations"), list):
        raise QualityConfigError(f"{path}: must be an object with an 'expectations' list (GE suite JSON)")
    for i, item in enumerate(raw["expectations"]):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str) \
                or not isinstance(item.get("kwargs", {}), dict):
            raise QualityConfigError(f"{path}: expectations[{i}] needs a 'type' string and a 'kwargs' object")
    raw = {**raw, "name": raw.get("name") or path.stem, "expectations": list(raw["expectations"])}
    try:
        built = _suite(raw)
    except Exception as exc:  # noqa: BLE001 - GE raises its own errors and pydantic's ValueError for bad arguments
        raise QualityConfigError(f"{path}: not a valid expectation suite: {str(exc).strip()[:1000]}") from None
    # GE drops some unknown expectation types silently: a typo must not switch a check off
    known = {e.expectation_type for e in built.expectations}
    dropped = sorted({e["type"] for e in raw["expectations"]} - known)
    if dropped:
        raise QualityConfigError(f"{path}: not a valid expectation suite: unknown expectation type(s) {dropped}")
    if spec.target.mode == "upsert":
        keys = list(spec.target.key)
        generated = ({"type": "expect_column_values_to_be_unique", "kwargs": {"column": keys[0]}} if len(keys) == 1
                     else {"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": keys}})
        declared = [(e["type"], e.get("kwargs", {})) for e in raw["expectations"]]
        if (generated["type"], generated["kwargs"]) not in declared:
            raw["expectations"].append({**generated, "meta": {"generated_from": "target.key"}})
    return raw


def _suite(suite_json: dict):
    """The GE ExpectationSuite of suite JSON; raises GE's or pydantic's errors for bad expectations."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no telemetry from a data platform's workers
    import great_expectations as gx

    return gx.ExpectationSuite(**{k: v for k, v in suite_json.items() if k in ("name", "expectations", "meta",
                                                                              "notes")})


def is_ancestor(table: Table, ancestor_id: int, snapshot_id: int) -> bool:
    """Whether `ancestor_id` is `snapshot_id` or one of its ancestors still in the table's metadata;
    False when `snapshot_id` is not in the table."""
    if table.metadata.snapshot_by_id(snapshot_id) is None:
        return False
    return is_ancestor_of(snapshot_id, ancestor_id, table.metadata)


def lineage(spec: PipelineSpec, table: Table, name: str, since_id: int, snapshot_id: int) -> list[Snapshot] | None:
    """The snapshots of `snapshot_id`'s ancestry after `since_id` (exclusive) up to `snapshot_id`
    (inclusive), oldest first: [] when both are the same snapshot, None when `snapshot_id` does not
    descend from `since_id`.

    Sequence numbers grow along a lineage (format v2), so the walk stops at the first
    ancestor no newer than `since_id` instead of walking the whole history. `name` is the
    table's name in `spec` (for the message). Raises LineageBrokenError when the walk ends
    at an ancestor whose parent is gone (expired) before meeting `since_id`: whether
    `snapshot_id` descends from it, and what was added in between, cannot be known.
    """
    since = table.metadata.snapshot_by_id(since_id)
    bound = since.sequence_number if since is not None else None  # 0 in format v1: no bound
    chain: list[Snapshot] = []
    for snapshot in ancestors_between_ids(since_id, snapshot_id, table.metadata):
        if bound and (snapshot.sequence_number or 0) <= bound:
            return None
        chain.append(snapshot)
    if not chain or chain[-1].parent_snapshot_id == since_id:
        return chain[::-1]
    raise LineageBrokenError(_broken_message(spec, table, name, since_id, snapshot_id, chain[-1]))


def _broken_message(spec: PipelineSpec, table: Table, name: str, since_id: int, snapshot_id: int,
                    orphan: Snapshot) -> str:
    """Why the lineage from `since_id` to `snapshot_id` is broken at `orphan`, and how to publish again."""
    qualified = spec.qualified(name)
    ref = table.metadata.refs.get(spec.publish.branch)
    since = (f"the {spec.publish.branch!r} head {since_id}" if ref is not None and ref.snapshot_id == since_id
             else f"snapshot {since_id}")
    # Iceberg's Java expiry keeps the dangling parent id; pyiceberg's removes it from the child
    parent = (f"its parent {orphan.parent_snapshot_id} is" if orphan.parent_snapshot_id is not None
              else "its parent is")
    return (f"{qualified}: the lineage of main from {since} to snapshot {snapshot_id} is broken at "
            f"snapshot {orphan.snapshot_id}: {parent} no longer in the table (expired), so the rows added in "
            f"between cannot be known; nothing is audited or published (failing closed). To publish again, audit "
            f"every row of main: drop the readers' branch (Spark SQL: ALTER TABLE {qualified} DROP BRANCH "
            f"`{spec.publish.branch}`; readers' queries of it fail until the next publication), then run the "
            f"pipeline's publish DAG, which audits the whole table and creates the branch again. Snapshot "
            f"expiry must keep every snapshot after the published head.")


def added_files(table: Table, snapshots: list[Snapshot]) -> set[str]:
    """Paths of the data files each of `snapshots` added (its manifest entries with status ADDED)."""
    return {data_file.file_path for data_file in _added_data_files(table, snapshots)}


def _added_data_files(table: Table, snapshots: list[Snapshot]) -> list[DataFile]:
    """The data files each of `snapshots` added (its manifest entries with status ADDED), with their metrics."""
    found: list[DataFile] = []
    for snapshot in snapshots:
        for manifest in snapshot.manifests(table.io):
            # a snapshot's added entries are in the manifests it wrote; delete files add no rows
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            found += [entry.data_file for entry in manifest.fetch_manifest_entry(table.io)
                      if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id]
    return found


def _coordinate_bounds(table: Table, data_files: list[DataFile]) -> dict[int, tuple[int, int]] | None:
    """Per Kafka partition, the lowest and highest offset the rows of `data_files` can hold, from the
    files' column bounds (nothing read); None when a file's bounds do not pin it to one partition or do
    not bound its offsets (then they cannot narrow a scan)."""
    schema = table.schema()
    try:
        partition_field, offset_field = (schema.find_field(f"_kafka.{name}") for name in ("partition", "offset"))
    except ValueError:
        return None
    bounds: dict[int, tuple[int, int]] = {}
    for data_file in data_files:
        lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
        ids = (partition_field.field_id, offset_field.field_id)
        if not all(i in lower and i in upper for i in ids):
            return None
        partition = integer_bound(partition_field.field_type, lower[ids[0]])
        if partition is None or partition != integer_bound(partition_field.field_type, upper[ids[0]]):
            return None
        low, high = (integer_bound(offset_field.field_type, found[ids[1]]) for found in (lower, upper))
        if low is None or high is None:
            return None
        known = bounds.get(partition)
        bounds[partition] = (low, high) if known is None else (min(known[0], low), max(known[1], high))
    return bounds


def _window_filter(window: dict[int, tuple[int, int]]) -> BooleanExpression:
    """Rows whose offset lies in [start, end) of their partition's entry in `window`."""
    condition: BooleanExpression = AlwaysFalse()
    for partition, (start, end) in window.items():
        condition = Or(condition, And(EqualTo(term="_kafka.partition", value=partition),
                                      And(GreaterThanOrEqual(term="_kafka.offset", value=start),
                                          LessThan(term="_kafka.offset", value=end))))
    return condition


def _planned(table: Table, snapshot_id: int, row_filter: BooleanExpression,
             files: set[str] | None) -> list[FileScanTask]:
    """The scan tasks holding the rows `rows_for_audit` reads, planned from the manifests only."""
    scan = table.scan(snapshot_id=snapshot_id, row_filter=row_filter)
    return [task for task in scan.plan_files() if files is None or task.file.file_path in files]


def rows_for_audit(table: Table, snapshot_id: int, row_filter: BooleanExpression = AlwaysTrue(),
                   files: set[str] | None = None, tasks: list[FileScanTask] | None = None) -> pa.Table:
    """Rows of `snapshot_id` matching `row_filter`, with `_kafka` flattened into `_kafka_*` columns.

    With `files`, only rows of those data files. Either way the files are read as of
    `snapshot_id` with the delete files that apply to them there, so deleted rows are left out.
    `tasks`, when given, are `_planned`'s for the same arguments (not planned again).
    """
    scan = table.scan(snapshot_id=snapshot_id, row_filter=row_filter)
    if tasks is None:
        tasks = _planned(table, snapshot_id, row_filter, files)
    data = ArrowScan(scan.table_metadata, scan.io, scan.projection(), scan.row_filter,
                     scan.case_sensitive).to_table(tasks)
    kafka = data.column("_kafka")
    data = data.drop_columns(["_kafka"])
    for name in ("topic", "partition", "offset"):
        data = data.append_column(f"_kafka_{name}", pc.struct_field(kafka, name))
    return data


def offsets_audited(rows: pa.Table) -> dict[int, tuple[int, int]]:
    """Per Kafka partition, the lowest and highest offset among `rows` (from `rows_for_audit`); rows
    without coordinates (written by something other than the pipeline) have none to report."""
    if not rows.num_rows:
        return {}
    grouped = rows.group_by("_kafka_partition").aggregate([("_kafka_offset", "min"), ("_kafka_offset", "max")])
    return {int(p): (int(lo), int(hi)) for p, lo, hi in zip(grouped["_kafka_partition"].to_pylist(),
                                                             grouped["_kafka_offset_min"].to_pylist(),
                                                             grouped["_kafka_offset_max"].to_pylist(), strict=True)
            if p is not None and lo is not None}


def _offsets_json(found: dict[int, tuple[int, int]]) -> dict[str, list[int]]:
    """`offsets_audited` as JSON: {"partition": [lowest, highest]}."""
    return {str(p): [lo, hi] for p, (lo, hi) in sorted(found.items())}


def _context(pipeline: str, home: Path):
    """A file-backed GE context under `home/quality/<pipeline>/`, progress bars off."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    root = home / "quality" / pipeline
    root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(root))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.variables.save()
    return context


def _checkpoint(context, suite_json: dict, table: str, in_spark: bool = False):
    """Data source, asset, batch definition, suite, validation definition and checkpoint for one table:
    on a pandas DataFrame, or (`in_spark`) on a Spark DataFrame, GE's Spark datasource then neither
    caching it (that would hold the window in the JVM) nor collecting more than MAX_OFFENDING failing
    rows per expectation (result format SUMMARY; COMPLETE collects every failing row's coordinates)."""
    import great_expectations as gx

    source = (context.data_sources.add_or_update_spark("lakehouse_spark", persist=False) if in_spark
              else context.data_sources.add_or_update_pandas("lakehouse"))
    try:
        asset = source.get_asset(table)
    except LookupError:
        asset = source.add_dataframe_asset(name=table)
    try:
        batch = asset.get_batch_definition("new rows")
    except KeyError:
        batch = asset.add_batch_definition_whole_dataframe("new rows")
    suite = context.suites.add_or_update(_suite(suite_json))
    validation = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=table, data=batch, suite=suite))
    return context.checkpoints.add_or_update(gx.Checkpoint(
        name=table, validation_definitions=[validation],
        actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")],
        result_format={"result_format": "SUMMARY", "unexpected_index_column_names": list(COORDINATES),
                       "partial_unexpected_count": MAX_OFFENDING} if in_spark else
        {"result_format": "COMPLETE", "unexpected_index_column_names": list(COORDINATES),
         "partial_unexpected_count": MAX_EXAMPLES}))


def _plain(value):
    """`value` with numpy scalars, timestamps and other GE result values turned into JSON types (for XCom)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return str(value)


def _expectation_results(table: str, validation) -> tuple[list[dict], list[dict], int]:
    """Readable per-expectation results, the failing rows' coordinates, and how many failing rows have
    coordinates, of one validation result. A COMPLETE result lists every failing row; a SUMMARY result
    (the Spark path) a sample of them, counted in full by the expectation's unexpected count."""
    results, offending, total = [], [], 0
    for res in validation.results:
        cfg = res.expectation_config
        kwargs = cfg.kwargs
        column = kwargs.get("column") or ",".join(kwargs.get("column_list") or [])
        result = res.result or {}
        exc = res.exception_info or {}
        raised = exc.get("raised_exception") and (exc.get("exception_message") or "exception")
        counted, unexpected = _plain(result.get("element_count")), _plain(result.get("unexpected_count"))
        if counted == 0 and unexpected is None:  # an empty batch: GE's pandas engine says None, its Spark one 0
            unexpected = 0
        results.append({
            "table": table, "expectation": cfg.type, "column": column or None, "success": bool(res.success),
            "element_count": counted, "unexpected_count": unexpected,
            "examples": _plain(list(result.get("partial_unexpected_list") or [])[:MAX_EXAMPLES]),
            "exception": raised or None,
        })
        if res.success:
            continue
        complete, partial = result.get("unexpected_index_list"), result.get("partial_unexpected_index_list")
        listed = [row for row in (complete if complete is not None else partial or [])
                  if isinstance(row, dict) and _has_coordinates(row)]
        for row in listed:
            value = _plain({k: v for k, v in row.items() if k not in COORDINATES})
            offending.append({"table": table, "partition": int(row["_kafka_partition"]),
                              "offset": int(row["_kafka_offset"]), "expectation": cfg.type,
                              "column": column or None, "value": value})
        # a sample: every failing row has its coordinates unless the sample shows one without
        sampled = complete is None and listed and partial is not None and len(listed) == len(partial)
        total += int(result.get("unexpected_count") or 0) if sampled else len(listed)
    return results, offending, total


def _has_coordinates(row: dict) -> bool:
    """Whether a failing row's index entry holds a Kafka partition and offset (rows written by something
    other than the pipeline have none: null in Spark, NaN in pandas)."""
    for name in COORDINATES:
        value = row.get(name)
        if value is None or value != value:  # NaN
            return False
    return True


@dataclass(frozen=True)
class _Window:
    """The rows one table's audit validates, planned from the manifests but not read: the rows of
    main's snapshot `snapshot_id` in the data files `tasks` (those matching `window`'s offsets in
    window mode; in lineage mode, `by_file`, the files the lineage added that the snapshot still
    has), read as of that snapshot with the delete files that apply there."""

    table: Table
    name: str
    snapshot_id: int
    tasks: list[FileScanTask]
    window: dict[int, tuple[int, int]] | None = None
    by_file: bool = False  # lineage mode: only the rows of `tasks`' files (the lineage added them)

    @property
    def planned_rows(self) -> int:
        """The rows the planned data files hold (their manifests' record counts), rows deleted as of the
        snapshot (upsert tables' position deletes) included: the size that decides where to validate."""
        return sum(task.file.record_count for task in self.tasks)

    @property
    def row_filter(self) -> BooleanExpression:
        return AlwaysTrue() if self.window is None else _window_filter(self.window)

    def rows(self) -> pa.Table:
        """The rows, read into this process (`rows_for_audit`)."""
        return rows_for_audit(self.table, self.snapshot_id, self.row_filter, tasks=self.tasks)

    def spark_rows(self, spark, spec: PipelineSpec):
        """The same rows as a Spark DataFrame read through the catalog at the same snapshot, with `_kafka`
        flattened the same way; nothing is read until Spark runs a job on it."""
        from pyspark.sql import functions as F

        data = spark.sql(f"SELECT *, _file AS {_FILE} FROM {spec.qualified(self.name)} "
                         f"VERSION AS OF {int(self.snapshot_id)}")
        partition, offset = F.col("_kafka.partition"), F.col("_kafka.offset")
        if self.window is not None:
            data = data.where(_spark_window(self.window, partition, offset))
        if self.by_file:
            files = [task.file for task in self.tasks]
            paths = sorted({f.file_path for f in files})
            bounds = _coordinate_bounds(self.table, files)
            if bounds is not None:  # prunes, at planning, the files that cannot hold the added rows
                data = data.where(_spark_window({p: (lo, hi + 1) for p, (lo, hi) in bounds.items()}, partition,
                                                offset) | partition.isNull() | offset.isNull())
            # a set literal (Spark's InSet): no shuffle, and no Python worker to turn a local list into rows
            data = data.where(F.col(_FILE).isin(paths))
        kept = [F.col(f"`{c}`") for c in data.columns if c not in ("_kafka", _FILE)]
        return data.select(*kept, *(F.col(f"_kafka.{n}").alias(f"_kafka_{n}") for n in ("topic", "partition",
                                                                                          "offset")))


def _spark_window(window: dict[int, tuple[int, int]], partition, offset):
    """`_window_filter` as a Spark Column: rows whose offset lies in [start, end) of their partition's entry."""
    from functools import reduce

    from pyspark.sql import functions as F

    return reduce(lambda a, b: a | b, ((partition == p) & (offset >= start) & (offset < end)
                                       for p, (start, end) in sorted(window.items())), F.lit(False))


def spark_offsets_audited(rows) -> tuple[dict[int, tuple[int, int]], int]:
    """`offsets_audited` of a Spark DataFrame of `_Window.spark_rows`, and its row count, by Spark aggregates:
    one row per Kafka partition reaches this process, whatever the number of rows."""
    from pyspark.sql import functions as F

    grouped = rows.groupBy("_kafka_partition").agg(F.min("_kafka_offset").alias("lo"),
                                                   F.max("_kafka_offset").alias("hi"), F.count(F.lit(1)).alias("n"))
    found, count = {}, 0
    for row in grouped.collect():
        count += row["n"]
        if row["_kafka_partition"] is not None and row["lo"] is not None:
            found[int(row["_kafka_partition"])] = (int(row["lo"]), int(row["hi"]))
    return found, count


def _scope(spec: PipelineSpec, catalog: Catalog, name: str,
           window: dict[int, tuple[int, int]] | None) -> tuple[TableAudit, _Window | None]:
    """What the audit of table `name` covers (offsets, rows and success not yet known), and the rows it
    validates, planned but not read: None when the table has no data yet. Raises LineageBrokenError or
    LineageDivergedError when the rows added since the published head cannot be known (not in window mode)."""
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:  # the pipeline has not run yet
        return TableAudit(name, None, None), None
    current = table.current_snapshot()
    ref = table.metadata.refs.get(spec.publish.branch)
    published = ref.snapshot_id if ref else None
    if current is None:
        return TableAudit(name, None, published), None
    covered: list[int] = []
    if window is not None:
        planned = _Window(table, name, current.snapshot_id,
                          _planned(table, current.snapshot_id, _window_filter(window), None), window=window)
    elif published is None:
        planned = _Window(table, name, current.snapshot_id, _planned(table, current.snapshot_id, AlwaysTrue(), None))
    else:
        snapshots = lineage(spec, table, name, published, current.snapshot_id)
        if snapshots is None:
            raise LineageDivergedError(_diverged_message(spec, name, published, current.snapshot_id))
        covered = [s.snapshot_id for s in snapshots]
        planned = _Window(table, name, current.snapshot_id,
                          _planned(table, current.snapshot_id, AlwaysTrue(), added_files(table, snapshots)),
                          by_file=True)
    return TableAudit(name, current.snapshot_id, published, covered), planned


def _diverged_message(spec: PipelineSpec, name: str, published: int, snapshot_id: int) -> str:
    """Why main's `snapshot_id` cannot be audited against the `published` head, and what to do."""
    qualified = spec.qualified(name)
    return (f"{qualified}: main's snapshot {snapshot_id} does not descend from the {spec.publish.branch!r} head "
            f"{published} (main was rolled back below the published snapshot), and publishing from it would "
            f"drop rows readers already see. Set main back to a descendant of {published} (Spark SQL: CALL "
            f"{spec.catalog}.system.set_current_snapshot('{name}', <snapshot id>)), or, to publish main as it "
            f"is, drop the readers' branch (ALTER TABLE {qualified} DROP BRANCH `{spec.publish.branch}`) so "
            f"that the next audit covers every row of main.")


def audit(spec: PipelineSpec, platform: config.PlatformConfig | None = None, now: datetime | None = None,
          expectations_dir: Path | None = None, record_event: bool = True,
          window: dict[int, tuple[int, int]] | None = None,
          spark_factory: Callable[[], object] | None = None) -> AuditResult:
    """Validate every data table's rows added since the published branch head; see the module doc.

    With `window` (partition -> [start, end) offsets) the rows of that offset window in
    main's snapshot are validated instead, e.g. the overlap of a candidate pipeline with
    the live one; the lineage is not looked at then.

    A table whose rows number `spec.publish.spark_audit_rows` or more (by its manifests) is
    validated in Spark: `spark_factory()`, default an in-process session with the pipeline's
    catalog, asked only then.

    Records a `quality` event on the ops timeline unless `record_event` is False, a
    failed one when the lineage cannot be audited. Raises QualityConfigError for a
    missing or malformed suite; LineageBrokenError when a snapshot after the published
    head was expired; LineageDivergedError when main does not descend from it.
    """
    platform = platform or config.load()
    now = now or datetime.now(UTC)
    suite_json = load_suite(spec, expectations_dir)
    catalog = open_catalog(platform, spec.catalog)
    try:  # every table's scope first: a broken lineage fails the audit before anything is validated
        scopes = [_scope(spec, catalog, name, window) for name in spec.target.tables]
    except LineageError as exc:
        if record_event:
            events.record(events.Event(spec.name, "quality", "failed", str(exc),
                                       details={"error": type(exc).__name__, "suite": suite_json["name"]}),
                          platform=platform, catalog=spec.catalog)
        raise
    context = _context(spec.name, platform.home)
    parameters = {"now": now.isoformat(), "now_plus_clock_skew": (now + CLOCK_SKEW).isoformat()}
    tables: dict[str, TableAudit] = {}
    expectations: list[dict] = []
    offending: list[dict] = []
    offending_total = 0
    spark = None
    for scope, planned in scopes:
        if planned is None:
            tables[scope.table] = scope
            continue
        in_spark = planned.planned_rows >= spec.publish.spark_audit_rows
        if in_spark:
            spark = spark or (spark_factory or (lambda: _session(spec, platform)))()
            data = planned.spark_rows(spark, spec)
            offsets, count = spark_offsets_audited(data)
        else:
            rows = planned.rows()
            offsets, count, data = offsets_audited(rows), rows.num_rows, rows.to_pandas()
            del rows
        checkpoint = _checkpoint(context, suite_json, scope.table, in_spark)
        run = checkpoint.run(batch_parameters={"dataframe": data}, expectation_parameters=parameters)
        del data
        identifier, validation = next(iter(run.run_results.items()))
        found, bad, total = _expectation_results(scope.table, validation)
        expectations += found
        offending += bad
        offending_total += total
        pages = context.get_docs_sites_urls(resource_identifier=identifier)
        page = next((p["site_url"] for p in pages if p.get("site_url")), None)
        tables[scope.table] = replace(scope, offsets=offsets, rows=count, success=bool(validation.success),
                                      docs_page=page, engine="spark" if in_spark else "pandas")
    for item in offending:
        item["topic"] = spec.source.topic
    offending.sort(key=lambda o: (o["table"], o["partition"], o["offset"]))
    docs = Path(context.root_directory) / "uncommitted" / "data_docs" / "local_site"
    result = AuditResult(
        pipeline=spec.name, suite=suite_json["name"], success=all(a.success for a in tables.values()),
        rows=sum(a.rows for a in tables.values()), tables=tables, expectations=expectations,
        offending_offsets=offending[:MAX_OFFENDING], offending_total=offending_total,
        docs=str(docs / "index.html"), audited_at=now.isoformat())
    if record_event:
        covered = {t: {"published_snapshot_id": a.published_snapshot_id, "lineage": a.lineage,
                       "offsets": _offsets_json(a.offsets)} for t, a in tables.items() if a.snapshot_id is not None}
        events.record(events.Event(
            spec.name, "quality", "ok" if result.success else "failed", result.summary(),
            metrics={"rows": result.rows, "failed_expectations": result.failed_expectations,
                     "unexpected_count": result.unexpected_count},
            details={"snapshots": result.snapshots, "tables": covered, "offending_offsets": result.offending_offsets,
                     "offending_total": result.offending_total, "docs": result.docs, "suite": result.suite}),
            platform=platform, catalog=spec.catalog)
    return result


def _session(spec: PipelineSpec, platform: config.PlatformConfig):
    from lakehouse.core import sparkenv

    return sparkenv.session(platform, [spec.catalog], f"lakehouse-quality-{spec.name}")
