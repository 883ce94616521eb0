"""The audit in write-audit-publish: validate what arrived since the last publication.

`audit(spec)` pins each data table's current `main` snapshot S and reads the rows
of S whose Kafka coordinates lie at or past the positions of the published branch
(the `lakehouse.positions` of the newest positions-carrying ancestor of the
branch head; every row when nothing was published yet). Because positions are
per partition, this works for append tables and for upsert tables alike: a key
updated since the last publication carries its new offset.

The rows are validated with Great Expectations 1.x against the suite
`include/expectations/<spec.publish.suite or spec.name>.json` (GE's own suite
JSON). For upsert pipelines a uniqueness expectation on `spec.target.key` is
added automatically. Each table gets a checkpoint in a file-backed GE context
under `LAKEHOUSE_HOME/quality/<pipeline>/`, which also renders the Data Docs
site there. The returned `AuditResult` names the snapshot audited per table, the
per-expectation results and the Kafka coordinates of failing rows.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (AlwaysFalse, AlwaysTrue, And, BooleanExpression, EqualTo, GreaterThanOrEqual, In,
                                  LessThan, Not, Or)
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakehouse import config, events, offsets
from lakehouse.spec import PipelineSpec

EXPECTATIONS_DIR = config.REPO_ROOT / "include" / "expectations"
CLOCK_SKEW = timedelta(minutes=5)  # producers' clocks may run this far ahead of ours
MAX_OFFENDING = 100  # offending offsets kept in a result (and the ops event)
MAX_EXAMPLES = 10  # unexpected values quoted per expectation
COORDINATES = ("_kafka_partition", "_kafka_offset")  # flattened `_kafka`, how GE points at failing rows


class QualityConfigError(ValueError):
    """The expectation suite is missing or unreadable."""


@dataclass(frozen=True)
class TableAudit:
    """What was audited in one table: its pinned snapshot and the rows added since publication."""

    table: str
    snapshot_id: int | None  # main's snapshot audited; None when the table has no data yet
    published_snapshot_id: int | None  # head of the readers' branch when the audit started
    since_positions: dict[int, int]  # rows at or past these offsets were validated; {} = all rows
    rows: int = 0
    success: bool = True
    docs_page: str | None = None


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
    audited_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())

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
        out["tables"] = {t: {**asdict(a), "since_positions": {str(p): o for p, o in a.since_positions.items()}}
                         for t, a in self.tables.items()}
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
    return (directory or EXPECTATIONS_DIR) / f"{spec.publish.suite or spec.name}.json"


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
    except Exception as exc:  # GE raises its own errors and pydantic's ValueError for bad arguments
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


def _snapshot_chain(table: Table, snapshot_id: int):
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    snap = by_id.get(snapshot_id)
    while snap is not None:
        yield snap
        snap = by_id.get(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None


def positions_at(table: Table, snapshot_id: int, pipeline: str) -> dict[int, int]:
    """`lakehouse.positions` of the newest ancestor of `snapshot_id` (itself included) that carries
    positions of `pipeline`; {} when none does."""
    for snap in _snapshot_chain(table, snapshot_id):
        props = offsets.summary_properties(snap)
        if props.get(offsets.K_PIPELINE) == pipeline and offsets.K_POSITIONS in props:
            return offsets.decode_positions(props[offsets.K_POSITIONS])
    return {}


def is_ancestor(table: Table, ancestor_id: int, snapshot_id: int) -> bool:
    """Whether `ancestor_id` is `snapshot_id` or one of its ancestors."""
    return any(s.snapshot_id == ancestor_id for s in _snapshot_chain(table, snapshot_id))


def _since_filter(positions: dict[int, int]) -> BooleanExpression:
    """Rows at or past `positions` in their partition; rows of partitions without a position all count."""
    if not positions:
        return AlwaysTrue()
    condition: BooleanExpression = Not(In("_kafka.partition", set(positions)))
    for partition, position in positions.items():
        condition = Or(condition, And(EqualTo("_kafka.partition", partition),
                                      GreaterThanOrEqual("_kafka.offset", position)))
    return condition


def _window_filter(window: dict[int, tuple[int, int]]) -> BooleanExpression:
    """Rows whose offset lies in [start, end) of their partition's entry in `window`."""
    condition: BooleanExpression = AlwaysFalse()
    for partition, (start, end) in window.items():
        condition = Or(condition, And(EqualTo("_kafka.partition", partition),
                                      And(GreaterThanOrEqual("_kafka.offset", start), LessThan("_kafka.offset", end))))
    return condition


def rows_for_audit(table: Table, snapshot_id: int, row_filter: BooleanExpression) -> pa.Table:
    """Rows of `snapshot_id` matching `row_filter`, with `_kafka` flattened into `_kafka_*` columns."""
    data = table.scan(snapshot_id=snapshot_id, row_filter=row_filter).to_arrow()
    kafka = data.column("_kafka")
    data = data.drop_columns(["_kafka"])
    for name in ("topic", "partition", "offset"):
        data = data.append_column(f"_kafka_{name}", pc.struct_field(kafka, name))
    return data


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


def _checkpoint(context, suite_json: dict, table: str):
    """Data source, asset, batch definition, suite, validation definition and checkpoint for one table."""
    import great_expectations as gx

    source = context.data_sources.add_or_update_pandas("lakehouse")
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
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": list(COORDINATES),
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


def _expectation_results(table: str, validation) -> tuple[list[dict], list[dict]]:
    """Readable per-expectation results, and the failing rows' coordinates, of one validation result."""
    results, offending = [], []
    for res in validation.results:
        cfg = res.expectation_config
        kwargs = cfg.kwargs
        column = kwargs.get("column") or ",".join(kwargs.get("column_list") or [])
        result = res.result or {}
        exc = res.exception_info or {}
        raised = exc.get("raised_exception") and (exc.get("exception_message") or "exception")
        results.append({
            "table": table, "expectation": cfg.type, "column": column or None, "success": bool(res.success),
            "element_count": _plain(result.get("element_count")),
            "unexpected_count": _plain(result.get("unexpected_count")),
            "examples": _plain(list(result.get("partial_unexpected_list") or [])[:MAX_EXAMPLES]),
            "exception": raised or None,
        })
        if res.success:
            continue
        for row in result.get("unexpected_index_list") or []:
            if isinstance(row, dict) and all(c in row for c in COORDINATES):
                value = _plain({k: v for k, v in row.items() if k not in COORDINATES})
                offending.append({"table": table, "partition": int(row["_kafka_partition"]),
                                  "offset": int(row["_kafka_offset"]), "expectation": cfg.type,
                                  "column": column or None, "value": value})
    return results, offending


def audit(spec: PipelineSpec, platform: config.PlatformConfig | None = None, now: datetime | None = None,
          expectations_dir: Path | None = None, record_event: bool = True,
          window: dict[int, tuple[int, int]] | None = None) -> AuditResult:
    """Validate every data table's rows added since the published branch head; see the module doc.

    With `window` (partition -> [start, end) offsets) the rows of that offset window are
    validated instead, e.g. the overlap of a candidate pipeline with the live one.

    Records a `quality` event on the ops timeline unless `record_event` is False.
    Raises QualityConfigError for a missing or malformed suite.
    """
    platform = platform or config.load()
    now = now or datetime.now(timezone.utc)
    suite_json = load_suite(spec, expectations_dir)
    catalog = offsets.open_catalog(platform, spec.catalog)
    context = _context(spec.name, platform.home)
    parameters = {"now": now.isoformat(), "now_plus_clock_skew": (now + CLOCK_SKEW).isoformat()}
    tables: dict[str, TableAudit] = {}
    expectations: list[dict] = []
    offending: list[dict] = []
    for name in spec.target.tables:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:  # the pipeline has not run yet
            tables[name] = TableAudit(name, None, None, {})
            continue
        current = table.current_snapshot()
        branch = table.metadata.refs.get(spec.publish.branch)
        published = branch.snapshot_id if branch else None
        if current is None:
            tables[name] = TableAudit(name, None, published, {})
            continue
        since = positions_at(table, published, spec.name) if published is not None else {}
        row_filter = _since_filter(since) if window is None else _window_filter(window)
        rows = rows_for_audit(table, current.snapshot_id, row_filter)
        checkpoint = _checkpoint(context, suite_json, name)
        run = checkpoint.run(batch_parameters={"dataframe": rows.to_pandas()}, expectation_parameters=parameters)
        identifier, validation = next(iter(run.run_results.items()))
        found, bad = _expectation_results(name, validation)
        expectations += found
        offending += bad
        pages = context.get_docs_sites_urls(resource_identifier=identifier)
        page = next((p["site_url"] for p in pages if p.get("site_url")), None)
        tables[name] = TableAudit(name, current.snapshot_id, published, since, rows.num_rows,
                                  bool(validation.success), page)
    for item in offending:
        item["topic"] = spec.source.topic
    offending.sort(key=lambda o: (o["table"], o["partition"], o["offset"]))
    docs = Path(context.root_directory) / "uncommitted" / "data_docs" / "local_site"
    result = AuditResult(
        pipeline=spec.name, suite=suite_json["name"], success=all(a.success for a in tables.values()),
        rows=sum(a.rows for a in tables.values()), tables=tables, expectations=expectations,
        offending_offsets=offending[:MAX_OFFENDING], offending_total=len(offending),
        docs=str(docs / "index.html"), audited_at=now.isoformat())
    if record_event:
        events.record(events.Event(
            spec.name, "quality", "ok" if result.success else "failed", result.summary(),
            metrics={"rows": result.rows, "failed_expectations": result.failed_expectations,
                     "unexpected_count": result.unexpected_count},
            details={"snapshots": result.snapshots, "offending_offsets": result.offending_offsets,
                     "offending_total": result.offending_total, "docs": result.docs, "suite": result.suite}),
            platform=platform, catalog=spec.catalog)
    return result
