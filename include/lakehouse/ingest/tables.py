"""Table lifecycle: create the data and dead-letter tables from the spec, evolve their schema.

Schema policy (spec `schema_policy`):
- a new optional contract field is additive: `evolve` adds the column (no data
  rewrite), `fail` stops;
- int -> long is a widening Iceberg allows, applied like an additive change;
- a new required field or any other type change is incompatible: `fail` stops
  with an explanation, `quarantine` keeps the table as it is and dead-letters
  records that carry the field (`schema_incompatible`) until someone fixes it.

One table has one owner: every table records the pipeline that created it
(`lakehouse.pipeline`; the platform's property keys are lakehouse.core.table_properties),
and `ensure_tables` refuses a table another pipeline (or nobody) owns. Tables are created
with `write.wap.enabled=true`, so the ingest job's writes are staged and only
lakehouse.ingest.committer makes them visible.

The data tables follow the spec's layout (`apply_layout`, run by `ensure_tables` at every job
start and spec reload): a changed `target.partition_by` is applied as Iceberg partition
evolution (files already written keep their partition spec, new files get the new one;
readers see every row and prune on each file's own spec), and the Iceberg properties the
spec owns (`target.target_file_size_mb`, `target.properties` and the platform's defaults)
are set, or unset when `target.properties` no longer names them. What a table cannot
follow stops the job with an explanation (`LayoutChangeRefused`): another write mode or
upsert key than the one the table was written with (`lakehouse.write-mode`), and, checked
by the ingest job before any table is created, another default table than the one the
pipeline has been writing (`check_default_table`, recorded on the dead-letter table).
`layout_drift` says what differs without changing anything (`lakehouse status`, the page).

An upsert pipeline whose tombstones delete keys keeps a tombstone ledger beside its
default table (`<table>__tombstones`: the key columns and the newest tombstone's
coordinates), so a replay of older records cannot bring back a key that a later
tombstone deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

from lakehouse.core import retry, schemas
from lakehouse.core.errors import LayoutChangeRefused, SchemaIncompatibleError, TableOwnershipError
from lakehouse.core.spec import RESERVED_COLUMNS, FieldSpec, PartitionField, PipelineSpec
from lakehouse.core.table_properties import IcebergProperties, TableProperties
from lakehouse.ingest.layout import DEAD_LETTER_TABLE, SPARK_CDC_STRUCT, SPARK_KAFKA_STRUCT

log = logging.getLogger("lakehouse.tables")

_ICEBERG_PRIMITIVES = ((StringType, "string"), (IntegerType, "int"), (LongType, "long"), (FloatType, "float"),
                       (DoubleType, "double"), (BooleanType, "boolean"), (TimestamptzType, "timestamp"),
                       (TimestampType, "timestamp"), (DateType, "date"), (UUIDType, "string"),
                       (BinaryType, "binary"), (FixedType, "binary"))
# the dead-letter table's column definitions (DDL), from layout.DEAD_LETTER_TABLE
DEAD_LETTER_COLUMNS = tuple(f"{name} {spark_type}" + (f" COMMENT '{comment}'" if comment else "")
                            for name, spark_type, _, comment in DEAD_LETTER_TABLE)


def dead_letter_columns(pipeline: str) -> list:
    """The dead-letter table's columns (layout.DEAD_LETTER_TABLE), in order, as Spark columns over a
    DataFrame of decoded batch rows (`batch_schema`), `pipeline` filling the pipeline's name."""
    from pyspark.sql import functions as F

    return [F.col(source).alias(name) if source else F.lit(pipeline).alias(name)
            for name, _, source, _ in DEAD_LETTER_TABLE]


LAYOUT_ATTEMPTS = 5


@dataclass
class SchemaChanges:
    table: str
    added: list[str] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    incompatible: list[str] = field(default_factory=list)  # human explanations
    quarantined: set[str] = field(default_factory=set)


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_mode(spec: PipelineSpec) -> str:
    """How the spec writes its data tables: "append", or "upsert(k1, k2)" with its key columns."""
    return "append" if spec.target.mode != "upsert" else f"upsert({', '.join(spec.target.key)})"


METADATA_VERSIONS_KEPT = 50  # metadata files a table keeps; older ones are deleted at each commit
MERGE_ON_READ = "merge-on-read"  # how an upsert table's row-level writes change it (Iceberg's write.*.mode)


def _created_properties(spec: PipelineSpec, role: str | None, *, staged: bool) -> dict[str, str]:
    """The properties every table of the pipeline is created with: format version 2, metadata files past the
    newest METADATA_VERSIONS_KEPT deleted at each commit, the owning pipeline and the table's `role` (None: a
    data table). The data and dead-letter tables (`staged`) also write zstd Parquet and stage their writes."""
    props = {IcebergProperties.FORMAT_VERSION: "2",
             IcebergProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
             IcebergProperties.METADATA_PREVIOUS_VERSIONS_MAX: str(METADATA_VERSIONS_KEPT),
             TableProperties.OWNER: spec.name}
    if role is not None:
        props[TableProperties.ROLE] = role
    if staged:
        props.update({IcebergProperties.PARQUET_COMPRESSION: "zstd", TableProperties.STAGING: "true"})
    return props


def table_properties(spec: PipelineSpec) -> dict[str, str]:
    """The properties a data table is created with: the platform's, the spec's (`target.properties`
    last) and the platform's records (owner, staging, write mode, the keys the spec set)."""
    props = _created_properties(spec, None, staged=True)
    props[TableProperties.TARGET_FILE_SIZE] = str(spec.target.target_file_size_bytes)
    props[TableProperties.WRITE_MODE] = write_mode(spec)
    if spec.target.properties:
        props[TableProperties.SPEC_PROPERTIES] = ",".join(sorted(spec.target.properties))
    if spec.target.mode == "upsert":
        props.update(dict.fromkeys((IcebergProperties.MERGE_MODE, IcebergProperties.UPDATE_MODE,
                                    IcebergProperties.DELETE_MODE), MERGE_ON_READ))
    props.update(spec.target.properties)
    return props


def dead_letter_properties(spec: PipelineSpec) -> dict[str, str]:
    """The properties the dead-letter table is created with, the default data table recorded."""
    props = _created_properties(spec, TableProperties.ROLE_DEAD_LETTER, staged=True)
    props[TableProperties.DEFAULT_TABLE] = spec.target.table
    return props


def tombstone_properties(spec: PipelineSpec) -> dict[str, str]:
    """The properties the tombstone ledger is created with."""
    return _created_properties(spec, TableProperties.ROLE_TOMBSTONES, staged=False)


def _tblproperties(props: dict[str, str]) -> str:
    """`props` as a CREATE TABLE's TBLPROPERTIES clause."""
    return "TBLPROPERTIES (" + ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in props.items()) + ")"


def _create_data_table(spark, spec: PipelineSpec, table: str) -> None:
    columns = [f"`{f.name}` {f.spark_type}" + (f" COMMENT {_sql_string(f.doc)}" if f.doc else "")
               for f in spec.contract.fields]
    columns += [f"_kafka {SPARK_KAFKA_STRUCT} COMMENT 'source coordinates'",
                "_ingested_at timestamp COMMENT 'when the pipeline committed the row'"]
    if spec.is_cdc:
        columns.append(f"_cdc {SPARK_CDC_STRUCT} COMMENT 'the change that wrote the row: op, source commit time "
                       f"and log position'")
    partitioned = ""
    if spec.target.partition_by:
        partitioned = "PARTITIONED BY (" + ", ".join(p.spark_sql() for p in spec.target.partition_by) + ")"
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(table)} ({', '.join(columns)}) USING iceberg "
              f"{partitioned} {_tblproperties(table_properties(spec))}")


def _create_dead_letter_table(spark, spec: PipelineSpec) -> None:
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(spec.dead_letter_table)} "
              f"({', '.join(DEAD_LETTER_COLUMNS)}) USING iceberg PARTITIONED BY (days(_ingested_at)) "
              f"{_tblproperties(dead_letter_properties(spec))}")


def _create_tombstone_table(spark, spec: PipelineSpec, ledger: str) -> None:
    keys = [f"`{k}` {spec.contract.field(k).spark_type}" for k in spec.target.key]
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(ledger)} "
              f"({', '.join(keys)}, _kafka {SPARK_KAFKA_STRUCT} COMMENT 'coordinates of the newest tombstone', "
              f"_deleted_at timestamp COMMENT 'when the pipeline applied it') USING iceberg "
              f"{_tblproperties(tombstone_properties(spec))}")


def check_owner(spec: PipelineSpec, name: str, table: Table) -> None:
    """Raise TableOwnershipError unless `table` records `spec`'s pipeline as its owner."""
    key = TableProperties.OWNER
    owner = table.metadata.properties.get(key)
    if owner == spec.name:
        return
    if owner is None:
        raise TableOwnershipError(
            f"{spec.path}: table {spec.qualified(name)} exists but was not created by a lakehouse pipeline (no "
            f"{key} property); writing into it could duplicate rows. Choose another table, or adopt it "
            f"with ALTER TABLE {spec.qualified(name)} SET TBLPROPERTIES ('{key}'='{spec.name}') if it is "
            f"meant for this pipeline")
    raise TableOwnershipError(
        f"{spec.path}: table {spec.qualified(name)} belongs to pipeline {owner!r}; two pipelines writing one "
        f"table would duplicate every row. Choose another table for {spec.name!r}, or, if {owner!r} is gone "
        f"and its table should move to {spec.name!r}, set {key}='{spec.name}' on it")


def _contract_type(t: IcebergType, path: str) -> FieldSpec:
    """An Iceberg column type as the contract type it holds (uuid columns are strings, see SPARK_TYPES)."""
    if isinstance(t, StructType):
        return FieldSpec(path, "struct", fields=tuple(replace(_contract_type(f.field_type, f.name), name=f.name)
                                                      for f in t.fields))
    if isinstance(t, ListType):
        return FieldSpec(path, "list", items=_contract_type(t.element_type, "element"))
    if isinstance(t, MapType):
        return FieldSpec(path, "map", values=_contract_type(t.value_type, "value"),
                         doc="" if isinstance(t.key_type, StringType) else f"keys of type {t.key_type}")
    if isinstance(t, DecimalType):
        return FieldSpec(path, "decimal", precision=t.precision, scale=t.scale)
    for iceberg, name in _ICEBERG_PRIMITIVES:
        if isinstance(t, iceberg):
            return FieldSpec(path, name)
    return FieldSpec(path, str(t))  # a type no contract declares: every comparison with it is incompatible


def _as_stored(f: FieldSpec) -> FieldSpec:
    """Contract field `f` as its column stores it: uuids as strings, constraints and units left out."""
    return FieldSpec(f.name, "string" if f.type == "uuid" else f.type, required=f.required,
                     precision=f.precision, scale=f.scale, fields=tuple(_as_stored(c) for c in f.fields),
                     items=_as_stored(f.items) if f.items else None, values=_as_stored(f.values) if f.values else None)


def _column_path(path: str) -> str:
    """A dotted field path as Spark SQL names the column: each part quoted."""
    return ".".join(f"`{part}`" for part in path.split("."))


def _spec_at(spec: PipelineSpec, path: str) -> FieldSpec:
    parts = path.split(".")
    f = spec.contract.field(parts[0])
    for part in parts[1:]:
        f = f.element if part in ("element", "value") and f.type != "struct" \
            else next(c for c in f.fields if c.name == part)
    return f


def diff_schema(spec: PipelineSpec, table: str, schema) -> SchemaChanges:
    """What it takes to make table `table` (pyiceberg schema) hold the spec's contract, nested fields
    included: columns to add (dotted paths), types to widen in place, incompatible changes."""
    changes = SchemaChanges(table=table)
    existing = tuple(_contract_type(f.field_type, f.name) for f in schema.fields
                     if f.name not in RESERVED_COLUMNS)
    diff = schemas.compare(existing, tuple(_as_stored(f) for f in spec.contract.fields),
                           labels=("the table", "the contract"))
    for path in diff.added:
        if _spec_at(spec, path).required:
            changes.incompatible.append(
                f"new field {path!r} is required: records already ingested (and replays of them) "
                f"lack it; add it as optional first")
            changes.quarantined.add(path.split(".")[0])
        else:
            changes.added.append(path)
    changes.widened.extend(diff.widened)
    changes.incompatible.extend(diff.incompatible)
    changes.quarantined.update(path.split(".")[0] for path in diff.incompatible_paths)
    return changes


def _load_owned(catalog: Catalog, spec: PipelineSpec, name: str) -> Table | None:
    """Table `name` when it exists and belongs to `spec`'s pipeline (staging switched on), else None."""
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        return None
    check_owner(spec, name, table)
    if table.metadata.properties.get(TableProperties.STAGING) != "true":  # created before writes were staged
        with table.transaction() as tx:
            tx.set_properties({TableProperties.STAGING: "true"})
        table = catalog.load_table(name)
    return table


def ensure_tables(spark, catalog: Catalog, spec: PipelineSpec,
                  on_change: Callable[[LayoutDrift], None] | None = None) -> frozenset[str]:
    """Create missing tables, apply the schema policy and the spec's layout (`apply_layout`, which
    calls `on_change` with each data table's applied drift); returns the quarantined fields.

    Raises SchemaIncompatibleError when the policy says to stop, TableOwnershipError when a table
    the spec names belongs to another pipeline, LayoutChangeRefused when a data table cannot follow
    the spec.
    """
    namespaces = {t.split(".")[0] for t in spec.owned_tables}
    existing = {ns[0] for ns in catalog.list_namespaces()}
    for ns in sorted(namespaces - existing):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {spec.catalog}.{ns}")
    loaded = {name: _load_owned(catalog, spec, name) for name in spec.owned_tables}  # every owner checked first
    quarantined: set[str] = set()
    ledger = spec.tombstone_table
    if ledger and loaded[ledger] is None:
        _create_tombstone_table(spark, spec, ledger)
    for table in spec.target.tables:
        held = loaded[table]
        if held is None:
            _create_data_table(spark, spec, table)
            continue
        changes = diff_schema(spec, table, held.schema())
        if changes.added and spec.schema_policy.on_additive == "fail":
            raise SchemaIncompatibleError(
                f"{spec.path}: table {table} lacks fields {changes.added} and schema_policy.on_additive "
                f"is 'fail'; set it to 'evolve' to add them")
        if changes.incompatible:
            if spec.schema_policy.on_incompatible == "fail":
                raise SchemaIncompatibleError(
                    f"{spec.path}: the contract no longer fits table {table}: " + "; ".join(changes.incompatible)
                    + ". Revert the change, or write to a new table, or set schema_policy.on_incompatible "
                      "to 'quarantine' to dead-letter affected records meanwhile.")
            quarantined |= changes.quarantined
        for path in changes.added:
            f = _spec_at(spec, path)
            comment = f" COMMENT {_sql_string(f.doc)}" if f.doc else ""
            spark.sql(f"ALTER TABLE {spec.qualified(table)} ADD COLUMN {_column_path(path)} {f.spark_type}{comment}")
        for path in changes.widened:
            spark.sql(f"ALTER TABLE {spec.qualified(table)} ALTER COLUMN {_column_path(path)} "
                      f"TYPE {_spec_at(spec, path).spark_type}")
    if loaded[spec.dead_letter_table] is None:
        _create_dead_letter_table(spark, spec)
    apply_layout(catalog, spec, on_change)
    return frozenset(quarantined)


# ---------------------------------------------------------------------------- the table follows its spec

def _width(arg: int | None) -> int:
    """A bucket's or truncate's width, PartitionField.arg (the spec parser gives each of them one)."""
    if arg is None:
        raise ValueError("a bucket or truncate partition field needs its width")
    return arg


# spec transform -> pyiceberg transform (arguments: bucket width, truncate width)
TRANSFORMS: dict[str, Callable[[int | None], Transform]] = {
    "identity": lambda _: IdentityTransform(), "year": lambda _: YearTransform(),
    "month": lambda _: MonthTransform(), "day": lambda _: DayTransform(), "hour": lambda _: HourTransform(),
    "bucket": lambda n: BucketTransform(_width(n)), "truncate": lambda w: TruncateTransform(_width(w)),
}


def _spec_field(transform: Transform, column: str) -> PartitionField | None:
    """A table's partition field as the spec writes it (None for a void field, left by a v1 drop)."""
    if isinstance(transform, VoidTransform):
        return None
    if isinstance(transform, BucketTransform):
        return PartitionField("bucket", column, transform.num_buckets)
    if isinstance(transform, TruncateTransform):
        return PartitionField("truncate", column, transform.width)
    return PartitionField(str(transform), column)


def table_partitioning(metadata) -> dict[PartitionField, str]:
    """The table's current (default) partition spec, field by field as the spec writes it, each with
    the partition field's name in the table, in the table's order."""
    schema = metadata.schema()
    found = {}
    for f in metadata.spec().fields:
        column = schema.find_column_name(f.source_id) or f"<dropped column {f.source_id}>"
        as_spec = _spec_field(f.transform, column)
        if as_spec is not None:
            found[as_spec] = f.name
    return found


def owned_properties(spec: PipelineSpec) -> dict[str, str]:
    """The Iceberg properties of a data table that the spec owns: the platform's defaults (file format,
    `target.target_file_size_mb` as write.target-file-size-bytes, metadata retention, an upsert's
    merge-on-read modes) and `target.properties`. Never the platform's records (`lakehouse.*`) nor
    write-audit-publish staging."""
    return {k: v for k, v in table_properties(spec).items()
            if not k.startswith(TableProperties.PREFIX)
            and k not in (TableProperties.STAGING, IcebergProperties.FORMAT_VERSION)}


@dataclass(frozen=True)
class LayoutDrift:
    """How one data table differs from its spec's layout (a value: computing it changes nothing).

    `refused` explains what the table cannot follow (the job stops on it); the rest is what
    `apply_layout` changes: partition fields to add and drop, properties to set (`set_properties`,
    with the table's value now in `was`, None when unset) and to unset. `records` are the platform's
    own bookkeeping properties to write (None: remove), not drift.
    """

    table: str
    partitioning: tuple[str, ...] = ()  # the table's partition fields now, e.g. ("day(event_time)",)
    wanted_partitioning: tuple[str, ...] = ()
    add_partitions: tuple[PartitionField, ...] = ()
    drop_partitions: tuple[PartitionField, ...] = ()
    set_properties: dict[str, str] = field(default_factory=dict)
    was: dict[str, str | None] = field(default_factory=dict)
    unset_properties: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    records: dict[str, str | None] = field(default_factory=dict)

    @property
    def in_sync(self) -> bool:
        """Whether the table already follows the spec (platform records aside)."""
        return not (self.add_partitions or self.drop_partitions or self.set_properties or self.unset_properties
                    or self.refused)

    def describe(self) -> list[str]:
        """One line per difference, for people."""
        lines = list(self.refused)
        if self.add_partitions or self.drop_partitions:
            lines.append(f"partitioning [{', '.join(self.partitioning)}] -> [{', '.join(self.wanted_partitioning)}]")
        lines += [f"property {k}: {self.was.get(k)!r} -> {v!r}" for k, v in sorted(self.set_properties.items())]
        lines += [f"property {k}: unset (no longer in target.properties)" for k in self.unset_properties]
        return lines

    def to_json(self) -> dict:
        return {"table": self.table, "in_sync": self.in_sync, "refused": list(self.refused),
                "partitioning": list(self.partitioning), "wanted_partitioning": list(self.wanted_partitioning),
                "add_partitions": [str(p) for p in self.add_partitions],
                "drop_partitions": [str(p) for p in self.drop_partitions],
                "set_properties": {k: {"table": self.was.get(k), "spec": v} for k, v in self.set_properties.items()},
                "unset_properties": list(self.unset_properties), "changes": self.describe()}


def layout_drift(spec: PipelineSpec, name: str, metadata) -> LayoutDrift:
    """What it takes for data table `name` (its pyiceberg TableMetadata) to follow `spec`'s layout.

    Partition fields are compared as a set (their order only orders the files' paths); properties
    the table has that the spec does not own are left alone.
    """
    props = metadata.properties
    current = table_partitioning(metadata)
    wanted = spec.target.partition_by
    refused = []
    recorded = props.get(TableProperties.WRITE_MODE)
    if recorded is not None and recorded != write_mode(spec):
        refused.append(
            f"table {spec.qualified(name)} was written as {recorded} but the spec now says {write_mode(spec)}: "
            f"Iceberg cannot change how the rows already in it were keyed. Put target.mode and target.key back, "
            f"or build the new table beside it: a candidate pipeline (candidate_for: {spec.name}) with its own "
            f"table ingests the topic from its start, and the cutover DAG moves readers to it once it has "
            f"caught up")
    columns = {f.name for f in metadata.schema().fields}
    for p in wanted:
        if p.column not in columns:
            refused.append(f"partition field {p} of table {spec.qualified(name)} needs column {p.column!r}, which "
                           f"the table does not have (a new required or incompatible field is quarantined); "
                           f"partition by it once the column exists")
    owned = owned_properties(spec)
    set_properties = {k: v for k, v in owned.items() if props.get(k) != v}
    previously = set(filter(None, props.get(TableProperties.SPEC_PROPERTIES, "").split(",")))
    unset = tuple(sorted(k for k in previously - set(owned) if k in props))
    records: dict[str, str | None] = {}
    if recorded is None:  # a table created before the write mode was recorded: it was written as the spec says
        records[TableProperties.WRITE_MODE] = write_mode(spec)
    spec_keys = ",".join(sorted(spec.target.properties)) or None
    if props.get(TableProperties.SPEC_PROPERTIES) != spec_keys:
        records[TableProperties.SPEC_PROPERTIES] = spec_keys
    return LayoutDrift(
        table=spec.qualified(name),
        partitioning=tuple(str(p) for p in current), wanted_partitioning=tuple(str(p) for p in wanted),
        add_partitions=tuple(p for p in wanted if p not in current),
        drop_partitions=tuple(p for p in current if p not in wanted),
        set_properties=set_properties, was={k: props.get(k) for k in set_properties},
        unset_properties=unset, refused=tuple(refused), records=records)


def _apply_drift(table: Table, drift: LayoutDrift) -> None:
    """One metadata commit: the partition spec evolved (fields dropped, then added) and the properties
    set and unset. Raises CommitFailedException when another commit changed the spec meanwhile."""
    names = table_partitioning(table.metadata)
    with table.transaction() as tx:
        if drift.add_partitions or drift.drop_partitions:
            with tx.update_spec() as update:
                for p in drift.drop_partitions:
                    update.remove_field(names[p])
                for p in drift.add_partitions:
                    update.add_field(p.column, TRANSFORMS[p.transform](p.arg))
        updates = {**drift.set_properties, **{k: v for k, v in drift.records.items() if v is not None}}
        if updates:
            tx.set_properties(updates)
        removals = [*drift.unset_properties, *(k for k, v in drift.records.items() if v is None)]
        if removals:
            tx.remove_properties(*removals)


def apply_layout(catalog: Catalog, spec: PipelineSpec,
                 on_change: Callable[[LayoutDrift], None] | None = None) -> list[LayoutDrift]:
    """Make every existing data table of `spec` follow its layout (`layout_drift`): one metadata commit
    per table that drifted, retried when another commit lands first. Returns the drifts applied (and
    passes each to `on_change`); nothing when every table already follows the spec.

    Raises LayoutChangeRefused, before changing any table, when one cannot follow the spec.
    """
    drifts = {}
    for name in spec.target.tables:
        try:
            drifts[name] = layout_drift(spec, name, catalog.load_table(name).metadata)
        except NoSuchTableError:
            continue
    refused = [why for d in drifts.values() for why in d.refused]
    if refused:
        raise LayoutChangeRefused(f"{spec.path}: " + "; ".join(refused))
    applied = []
    for name, drift in drifts.items():
        drift = _follow_layout(catalog, spec, name, drift)
        if not drift.in_sync:
            log.info("%s now follows %s: %s", drift.table, spec.path, "; ".join(drift.describe()))
            applied.append(drift)
            if on_change is not None:
                on_change(drift)
    return applied


def _follow_layout(catalog: Catalog, spec: PipelineSpec, name: str, drift: LayoutDrift) -> LayoutDrift:
    """Apply `drift` to table `name` in one metadata commit (none when there is nothing to change); when another
    commit (the writer's claim, maintenance) lands first, the drift is taken again from the table as it is now,
    up to LAYOUT_ATTEMPTS times (lakehouse.core.retry), then CommitFailedException. Returns the drift applied."""
    def attempt(number: int) -> LayoutDrift:
        nonlocal drift
        if number > 1:
            drift = layout_drift(spec, name, catalog.load_table(name).metadata)
        if drift.in_sync and not drift.records:
            return drift
        try:
            _apply_drift(catalog.load_table(name), drift)
        except ValueError as exc:  # pyiceberg refusing the partition spec (a transform the column cannot take)
            raise LayoutChangeRefused(f"{spec.path}: table {spec.qualified(name)} cannot be partitioned by "
                                      f"{', '.join(drift.wanted_partitioning)}: {exc}") from exc
        return drift

    return retry.commit_conflicts(
        f"the layout change of {spec.qualified(name)}", attempts=LAYOUT_ATTEMPTS, error=CommitFailedException,
        first_wait_s=0.0, next_step=f"The table still has its former layout; start the job again to apply "
                                    f"{spec.path} (other commits kept landing on the table meanwhile).").run(attempt)


def _renamed_table_refusal(spec: PipelineSpec, recorded: str) -> str:
    """Why a spec naming another default table than `recorded` (which still exists) cannot run, and what to do."""
    return (f"target.table is {spec.target.table} but pipeline {spec.name} has been writing {recorded}, which "
            f"still exists (its dead-letter table {spec.dead_letter_table} records it). A new name would start "
            f"an empty table from the oldest record Kafka still holds and leave the rows already ingested "
            f"behind. To rename the table with its rows and positions: ALTER TABLE {spec.qualified(recorded)} RENAME "
            f"TO {spec.target.table} (Spark SQL: the new name without the catalog), then start the job again. To "
            f"build a new table beside it: a candidate pipeline (candidate_for: {spec.name}) writing "
            f"{spec.target.table}, cut over once it has caught up. Or put target.table back to {recorded}")


def recorded_default_table(catalog: Catalog, spec: PipelineSpec) -> tuple[Table | None, str | None, str | None]:
    """(the pipeline's dead-letter table, the default table it records, why the job must not start: the spec
    names another default table while the recorded one still exists, else None). (None, None, None) when
    the dead-letter table does not exist or belongs to another pipeline (ensure_tables refuses that)."""
    try:
        dead_letters = catalog.load_table(spec.dead_letter_table)
    except NoSuchTableError:
        return None, None, None
    if dead_letters.metadata.properties.get(TableProperties.OWNER) != spec.name:
        return None, None, None
    recorded = dead_letters.metadata.properties.get(TableProperties.DEFAULT_TABLE)
    if recorded is None or recorded == spec.target.table or not catalog.table_exists(recorded):
        return dead_letters, recorded, None
    return dead_letters, recorded, _renamed_table_refusal(spec, recorded)


def check_default_table(catalog: Catalog, spec: PipelineSpec) -> None:
    """Before the ingest job creates any table: raise LayoutChangeRefused when `target.table` was renamed
    in the spec while the table the pipeline has been writing still exists (`recorded_default_table`).
    Records the default table on the dead-letter table when it holds none yet, or when the recorded one
    is gone (renamed in the catalog, or dropped on purpose)."""
    dead_letters, recorded, why = recorded_default_table(catalog, spec)
    if why:
        raise LayoutChangeRefused(f"{spec.path}: {why}")
    if dead_letters is not None and recorded != spec.target.table:
        with dead_letters.transaction() as tx:
            tx.set_properties({TableProperties.DEFAULT_TABLE: spec.target.table})
