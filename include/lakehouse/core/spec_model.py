"""The pipeline spec as the platform reads it: immutable dataclasses, one per section of a spec file.

`lakehouse.core.spec.load_spec` builds a PipelineSpec from a file (lakehouse.core.spec_parse checks
it); everything else (the Spark job, the DAGs, the sensors, the CLI) reads these values. A section's
defaults here are the ones a spec that leaves the section out gets.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from lakehouse.core.naming import DAG_KINDS, fanout_view
from lakehouse.core.vocabulary import FAST_PATH_TYPES, FORMAT_SCHEMA_TYPES, NESTED_TYPES, SPARK_TYPES


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
            return f"array<{self.element.spark_type}>"
        if self.type == "map":
            return f"map<string,{self.element.spark_type}>"
        return SPARK_TYPES[self.type]

    @property
    def type_text(self) -> str:
        """The type as a spec writes it (`decimal(12,2)`, `list<string>`), for messages."""
        if self.type == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.type == "list":
            return f"list<{self.element.type_text}>"
        if self.type == "map":
            return f"map<string,{self.element.type_text}>"
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
        if self.type in ("list", "map"):
            return (self.element,)
        return ()

    @property
    def digits(self) -> tuple[int, int]:
        """(precision, scale) of a decimal field: every decimal has both (the spec parser and the schema
        translators set them)."""
        if self.precision is None or self.scale is None:
            raise ValueError(f"field {self.name!r} of type {self.type} has no decimal precision and scale")
        return self.precision, self.scale

    @property
    def element(self) -> FieldSpec:
        """The spec of a list's elements (`items`) or of a map's values (`values`): every list and map
        field has one (the spec parser and the schema translators build none without it)."""
        inner = self.items if self.type == "list" else self.values if self.type == "map" else None
        if inner is None:
            raise ValueError(f"field {self.name!r} of type {self.type} has no element spec: only a list "
                             f"(items) or a map (values) has one")
        return inner


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
    # an append pipeline with a write interval shorter than `interval_s` reads and writes data files every
    # write interval and commits them every interval (as the Kafka Connect sink and Flink's Iceberg sink do);
    # None: one read, write and commit per interval
    write_interval_s: float | None = None
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
    """When the `<pipeline>_verify` DAG proves the tables exactly once (lakehouse.audit.verify)."""
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
        table, and for a fan-out table the view named after it in the same namespace
        (lakehouse.core.naming.fanout_view); () without `publish.view`."""
        if self.publish.view is None:
            return ()
        return (self.publish.view, *(fanout_view(self.publish.view, t) for t in self.target.tables[1:]))

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
