"""The pipeline spec: declared once in YAML under include/pipelines, read everywhere.

`load_spec(path)` and `load_pipeline(name)` return a validated, immutable
`PipelineSpec` or raise `SpecError` naming the file, the field and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lakehouse import config

FIELD_TYPES = ("string", "int", "long", "double", "boolean", "timestamp", "date")
SPARK_TYPES = {
    "string": "string",
    "int": "int",
    "long": "bigint",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "date": "date",
}
# Type changes a table may take without rewriting data (Iceberg's allowed promotions).
WIDENINGS = {("int", "long")}
VALUE_FORMATS = ("json",)
MODES = ("append", "upsert")
TRIGGER_MODES = ("continuous", "scheduled")
ADDITIVE_POLICIES = ("evolve", "fail")
INCOMPATIBLE_POLICIES = ("fail", "quarantine")
PARTITION_TRANSFORMS = ("identity", "year", "month", "day", "hour", "bucket", "truncate")
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_TABLE = re.compile(r"^[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*$")
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_PARTITION = re.compile(r"^(?:(\w+)\((?:(\d+)\s*,\s*)?(\w+)\)|(\w+))$")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
RESERVED_COLUMNS = ("_kafka", "_ingested_at")


class SpecError(ValueError):
    """A pipeline spec is invalid. The message names the file, the field and why."""

    def __init__(self, path: Path | str, field_path: str, why: str):
        self.path = str(path)
        self.field = field_path
        self.why = why
        super().__init__(f"{path}: {field_path}: {why}")


class UnknownPipelineError(LookupError):
    """No spec file declares the pipeline asked for."""


def parse_duration(value: Any) -> float:
    """Seconds in a duration such as `5s`, `500ms`, `2m`, `7d`; a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return float(value)
    match = _DURATION.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration like 500ms, 5s, 2m, 1h or 7d")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


@dataclass(frozen=True)
class FieldSpec:
    """One field of the record contract; enum, range and pattern are part of its type."""

    name: str
    type: str
    required: bool = False
    enum: tuple | None = None
    min: float | None = None
    max: float | None = None
    pattern: str | None = None
    max_length: int | None = None
    doc: str = ""

    @property
    def spark_type(self) -> str:
        return SPARK_TYPES[self.type]


@dataclass(frozen=True)
class Contract:
    fields: tuple[FieldSpec, ...]

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


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
    key_field: str | None = None  # the Kafka key must equal this field of the value
    key_required: bool = False
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


@dataclass(frozen=True)
class PublishSpec:
    """Write-audit-publish: ingestion and maintenance commit to `main` (the audit branch); readers
    use `branch`, fast-forwarded only after quality checks and SLOs pass, through `view`."""
    branch: str = "published"
    view: str | None = None  # namespace.view readers query; it selects from the published branch
    schedule: str = "*/10 * * * *"
    suite: str | None = None  # include/expectations/<suite>.json; None = the pipeline name


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
    candidate_for: str | None = None  # the live pipeline this one is a candidate replacement of
    description: str = ""

    @property
    def catalog(self) -> str:
        return self.target.catalog

    def qualified(self, table: str) -> str:
        return f"{self.target.catalog}.{table}"

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
        return SpecError(self.path, where, why)

    def mapping(self, raw: Any, where: str, allowed: set[str]) -> dict:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise self.fail(where, f"must be a mapping, got {type(raw).__name__}")
        unknown = sorted(set(map(str, raw)) - allowed)
        if unknown:
            raise self.fail(f"{where}.{unknown[0]}" if where else unknown[0],
                            f"unknown field (allowed: {', '.join(sorted(allowed))})")
        return raw

    def required(self, raw: dict, key: str, where: str) -> Any:
        if key not in raw or raw[key] is None:
            raise self.fail(f"{where}.{key}" if where else key, "is required")
        return raw[key]

    def string(self, value: Any, where: str, pattern: re.Pattern | None = None, hint: str = "") -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"must be a non-empty string, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(where, f"{value!r} is not valid{': ' + hint if hint else ''}")
        return value

    def integer(self, value: Any, where: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(where, f"must be >= {minimum}, got {value}")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"must be a number, got {value!r}")
        return float(value)

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"must be true or false, got {value!r}")
        return value

    def choice(self, value: Any, where: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(where, f"{value!r} is not one of {', '.join(choices)}")
        return value

    def duration(self, value: Any, where: str) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None

    def table(self, value: Any, where: str) -> str:
        return self.string(value, where, _TABLE, "use namespace.table in lower case, e.g. raw.orders")


def _contract(r: _Reader, raw: Any) -> Contract:
    raw = r.mapping(raw, "contract", {"fields"})
    items = r.required(raw, "fields", "contract")
    if not isinstance(items, list) or not items:
        raise r.fail("contract.fields", "must be a non-empty list of fields")
    fields: list[FieldSpec] = []
    seen: set[str] = set()
    allowed = {"name", "type", "required", "enum", "min", "max", "pattern", "max_length", "doc"}
    for i, item in enumerate(items):
        where = f"contract.fields[{i}]"
        item = r.mapping(item, where, allowed)
        name = r.string(r.required(item, "name", where), f"{where}.name", _IDENT, "use lower_snake_case")
        where = f"contract.fields[{name}]"
        if name in seen:
            raise r.fail(where, "is declared twice")
        if name in RESERVED_COLUMNS:
            raise r.fail(where, f"{name!r} is reserved for source coordinates")
        seen.add(name)
        ftype = r.choice(r.required(item, "type", where), f"{where}.type", FIELD_TYPES)
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
                    ok = isinstance(value, int) and not isinstance(value, bool)
                if not ok:
                    raise r.fail(f"{where}.enum", f"{value!r} is not a {ftype}")
            enum = tuple(enum)
        lo = item.get("min")
        hi = item.get("max")
        for key, bound in (("min", lo), ("max", hi)):
            if bound is not None:
                if ftype not in ("int", "long", "double"):
                    raise r.fail(f"{where}.{key}", f"ranges apply to numeric fields, not {ftype}")
                r.number(bound, f"{where}.{key}")
        if lo is not None and hi is not None and lo > hi:
            raise r.fail(f"{where}.min", f"{lo} is greater than max {hi}")
        pattern = item.get("pattern")
        if pattern is not None:
            if ftype != "string":
                raise r.fail(f"{where}.pattern", f"patterns apply to string fields, not {ftype}")
            try:
                re.compile(r.string(pattern, f"{where}.pattern"))
            except re.error as exc:
                raise r.fail(f"{where}.pattern", f"is not a regular expression: {exc}") from None
        max_length = item.get("max_length")
        if max_length is not None:
            if ftype != "string":
                raise r.fail(f"{where}.max_length", f"applies to string fields, not {ftype}")
            max_length = r.integer(max_length, f"{where}.max_length", 1)
        fields.append(FieldSpec(
            name=name, type=ftype,
            required=r.boolean(item.get("required", False), f"{where}.required"),
            enum=enum,
            min=None if lo is None else float(lo),
            max=None if hi is None else float(hi),
            pattern=pattern, max_length=max_length,
            doc=str(item.get("doc", "")),
        ))
    return Contract(tuple(fields))


def _partition_field(r: _Reader, value: Any, where: str, contract: Contract) -> PartitionField:
    text = r.string(value, where).replace(" ", "")
    match = _PARTITION.match(text)
    if not match:
        raise r.fail(where, f"{value!r} is not a partition transform like day(event_time) or bucket(16, id)")
    transform, arg, column, bare = match.groups()
    if bare:
        transform, column = "identity", bare
    if transform not in PARTITION_TRANSFORMS:
        raise r.fail(where, f"unknown transform {transform!r} (use one of {', '.join(PARTITION_TRANSFORMS)})")
    if column not in contract.names:
        raise r.fail(where, f"column {column!r} is not a contract field")
    ftype = contract.field(column).type
    if transform in ("year", "month", "day", "hour") and ftype not in ("timestamp", "date"):
        raise r.fail(where, f"{transform}() needs a timestamp or date column, {column!r} is {ftype}")
    if transform == "hour" and ftype != "timestamp":
        raise r.fail(where, f"hour() needs a timestamp column, {column!r} is {ftype}")
    if transform in ("bucket", "truncate"):
        if arg is None or int(arg) < 1:
            raise r.fail(where, f"{transform}() needs a positive width, e.g. {transform}(16, {column})")
    elif arg is not None:
        raise r.fail(where, f"{transform}() takes no width")
    return PartitionField(transform=transform, column=column, arg=None if arg is None else int(arg))


def _parse(path: Path, raw: Any) -> PipelineSpec:
    r = _Reader(path)
    top = r.mapping(raw, "", {"name", "description", "source", "target", "dead_letter", "contract",
                              "schema_policy", "trigger", "slo", "supervision", "maintenance", "retention",
                              "publish", "candidate_for"})
    if not top:
        raise r.fail("(file)", "is empty")
    name = r.string(r.required(top, "name", ""), "name", _IDENT, "use lower_snake_case")
    contract = _contract(r, r.required(top, "contract", ""))

    src = r.mapping(r.required(top, "source", ""), "source",
                    {"topic", "partitions", "replication_factor", "retention_ms", "value_format", "key",
                     "max_value_bytes"})
    key = r.mapping(src.get("key"), "source.key", {"field", "required"})
    key_field = key.get("field")
    if key_field is not None and key_field not in contract.names:
        raise r.fail("source.key.field", f"{key_field!r} is not a contract field")
    retention = src.get("retention_ms")
    source = SourceSpec(
        topic=r.string(r.required(src, "topic", "source"), "source.topic", _TOPIC,
                       "topic names use letters, digits, '.', '_' and '-'"),
        partitions=r.integer(src.get("partitions", 1), "source.partitions", 1),
        replication_factor=r.integer(src.get("replication_factor", 1), "source.replication_factor", 1),
        retention_ms=None if retention is None else r.integer(retention, "source.retention_ms", -1),
        value_format=r.choice(src.get("value_format", "json"), "source.value_format", VALUE_FORMATS),
        key_field=key_field,
        key_required=r.boolean(key.get("required", key_field is not None), "source.key.required"),
        max_value_bytes=r.integer(src.get("max_value_bytes", 1_048_576), "source.max_value_bytes", 1),
    )

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
            raise r.fail(f"target.key[{i}]", f"{k!r} is not a contract field")
        if not contract.field(k).required:
            raise r.fail(f"target.key[{i}]", f"key column {k!r} must be required in the contract")
    if mode == "upsert" and not keys:
        raise r.fail("target.key", "upsert mode needs key columns")
    parts = tgt.get("partition_by") or []
    if isinstance(parts, str):
        parts = [parts]
    if not isinstance(parts, list):
        raise r.fail("target.partition_by", "must be a list of partition transforms")
    partition_by = tuple(_partition_field(r, p, f"target.partition_by[{i}]", contract) for i, p in enumerate(parts))
    table = r.table(r.required(tgt, "table", "target"), "target.table")
    fanout = None
    if tgt.get("fanout") is not None:
        fo = r.mapping(tgt["fanout"], "target.fanout", {"field", "routes"})
        fo_field = r.string(r.required(fo, "field", "target.fanout"), "target.fanout.field")
        if fo_field not in contract.names:
            raise r.fail("target.fanout.field", f"{fo_field!r} is not a contract field")
        routes = r.mapping(r.required(fo, "routes", "target.fanout"), "target.fanout.routes",
                           set(map(str, fo.get("routes") or {})))
        if not routes:
            raise r.fail("target.fanout.routes", "must map field values to tables")
        fanout = FanoutSpec(field=fo_field, routes={str(v): r.table(t, f"target.fanout.routes.{v}")
                                                     for v, t in routes.items()})
    props = tgt.get("properties") or {}
    if not isinstance(props, dict):
        raise r.fail("target.properties", "must be a mapping of Iceberg table properties")
    target = TargetSpec(
        catalog=r.string(tgt.get("catalog", "lake"), "target.catalog", _IDENT, "use lower_snake_case"),
        table=table, mode=mode, key=tuple(keys), partition_by=partition_by, fanout=fanout,
        target_file_size_bytes=r.integer(tgt.get("target_file_size_mb", 128), "target.target_file_size_mb", 1)
        * 1024 * 1024,
        properties={str(k): str(v) for k, v in props.items()},
    )

    dlq = r.mapping(r.required(top, "dead_letter", ""), "dead_letter", {"table"})
    dead_letter_table = r.table(r.required(dlq, "table", "dead_letter"), "dead_letter.table")
    if dead_letter_table in target.tables:
        raise r.fail("dead_letter.table", f"{dead_letter_table!r} is also a data table")

    pol = r.mapping(top.get("schema_policy"), "schema_policy", {"on_additive", "on_incompatible"})
    trig = r.mapping(top.get("trigger"), "trigger", {"interval", "max_records_per_batch", "mode", "schedule"})
    slo = r.mapping(top.get("slo"), "slo", {"freshness", "lag_records", "lag_seconds"})
    sup = r.mapping(top.get("supervision"), "supervision", {"hung_after_triggers", "restart_backoff", "max_restarts"})
    mnt = r.mapping(top.get("maintenance"), "maintenance", {"schedule", "min_input_files", "orphan_safety_window"})
    ret = r.mapping(top.get("retention"), "retention", {"outage_budget", "replay_window", "delete_after"})
    pub = r.mapping(top.get("publish"), "publish", {"branch", "view", "schedule", "suite"})
    interval_s = r.duration(trig.get("interval", "5s"), "trigger.interval")
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
        if view in (*target.tables, dead_letter_table):
            raise r.fail("publish.view", f"{view!r} is a table this pipeline writes")
    candidate_for = top.get("candidate_for")
    if candidate_for is not None:
        candidate_for = r.string(candidate_for, "candidate_for", _IDENT, "name the live pipeline")
        if candidate_for == name:
            raise r.fail("candidate_for", "a pipeline cannot be a candidate for itself")
    return PipelineSpec(
        name=name,
        path=str(path),
        description=str(top.get("description", "")).strip(),
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
            schedule=r.string(trig.get("schedule", "*/5 * * * *"), "trigger.schedule"),
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
        ),
        maintenance=MaintenanceSpec(
            schedule=r.string(mnt.get("schedule", "@hourly"), "maintenance.schedule"),
            min_input_files=r.integer(mnt.get("min_input_files", 5), "maintenance.min_input_files", 2),
            orphan_safety_window_s=orphan_window,
        ),
        retention=RetentionSpec(
            outage_budget_s=r.duration(ret.get("outage_budget", "24h"), "retention.outage_budget"),
            replay_window_s=r.duration(ret.get("replay_window", "3d"), "retention.replay_window"),
            delete_after_s=None if delete_after is None else r.duration(delete_after, "retention.delete_after"),
        ),
        publish=PublishSpec(
            branch=r.string(pub.get("branch", "published"), "publish.branch", _IDENT, "use lower_snake_case"),
            view=view,
            schedule=r.string(pub.get("schedule", "*/10 * * * *"), "publish.schedule"),
            suite=None if pub.get("suite") is None else r.string(pub["suite"], "publish.suite", _IDENT),
        ),
        candidate_for=candidate_for,
    )


def load_spec(path: Path | str) -> PipelineSpec:
    """Load and validate one pipeline spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(path, "(file)", f"cannot be read: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(path, "(file)", f"is not valid YAML: {exc}") from None
    return _parse(path, raw)


def load_all(directory: Path | str | None = None) -> dict[str, PipelineSpec]:
    """Every pipeline declared in the pipelines folder, by name."""
    directory = Path(directory) if directory else config.pipelines_dir()
    specs: dict[str, PipelineSpec] = {}
    for path in sorted(directory.glob("*.y*ml")):
        spec = load_spec(path)
        if spec.name in specs:
            raise SpecError(path, "name", f"pipeline {spec.name!r} is already declared in {specs[spec.name].path}")
        specs[spec.name] = spec
    return specs


def load_pipeline(name: str, directory: Path | str | None = None) -> PipelineSpec:
    """The spec of pipeline `name`, or UnknownPipelineError listing the known ones."""
    specs = load_all(directory)
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise UnknownPipelineError(
            f"no pipeline named {name!r} in {directory or config.pipelines_dir()} (known: {known})")
    return specs[name]
