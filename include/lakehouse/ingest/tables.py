"""Table lifecycle: create the data and dead-letter tables from the spec, evolve their schema.

Schema policy (spec `schema_policy`):
- a new optional contract field is additive: `evolve` adds the column (no data
  rewrite), `fail` stops;
- int -> long is a widening Iceberg allows, applied like an additive change;
- a new required field or any other type change is incompatible: `fail` stops
  with an explanation, `quarantine` keeps the table as it is and dead-letters
  records that carry the field (`schema_incompatible`) until someone fixes it.

One table has one owner: every table records the pipeline that created it
(`lakehouse.pipeline`), and `ensure_tables` refuses a table another pipeline (or
nobody) owns. Tables are created with `write.wap.enabled=true`, so the ingest job's
writes are staged and only lakehouse.ingest.committer makes them visible.

An upsert pipeline whose tombstones delete keys keeps a tombstone ledger beside its
default table (`<table>__tombstones`: the key columns and the newest tombstone's
coordinates), so a replay of older records cannot bring back a key that a later
tombstone deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
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

from lakehouse.core.errors import ConfigurationError, TableStateError
from lakehouse.core import schemas
from lakehouse.core.spec import RESERVED_COLUMNS, FieldSpec, PipelineSpec
from lakehouse.ingest.reader import DEAD_LETTER_TABLE, SPARK_CDC_STRUCT, SPARK_KAFKA_STRUCT

_ICEBERG_PRIMITIVES = ((StringType, "string"), (IntegerType, "int"), (LongType, "long"), (FloatType, "float"),
                       (DoubleType, "double"), (BooleanType, "boolean"), (TimestamptzType, "timestamp"),
                       (TimestampType, "timestamp"), (DateType, "date"), (UUIDType, "string"),
                       (BinaryType, "binary"), (FixedType, "binary"))
# the dead-letter table's column definitions (DDL), from reader.DEAD_LETTER_TABLE
DEAD_LETTER_COLUMNS = tuple(f"{name} {spark_type}" + (f" COMMENT '{comment}'" if comment else "")
                            for name, spark_type, _, comment in DEAD_LETTER_TABLE)


def dead_letter_columns(pipeline: str) -> list:
    """The dead-letter table's columns (reader.DEAD_LETTER_TABLE), in order, as Spark columns over a
    DataFrame of decoded batch rows (`batch_schema`), `pipeline` filling the pipeline's name."""
    from pyspark.sql import functions as F

    return [F.col(source).alias(name) if source else F.lit(pipeline).alias(name)
            for name, _, source, _ in DEAD_LETTER_TABLE]


OWNER = "lakehouse.pipeline"
STAGING = "write.wap.enabled"  # Spark stages writes that carry spark.wap.id (see sparkenv.staged)


class SchemaIncompatibleError(ConfigurationError):
    """The spec changed the contract in a way the table cannot take under the pipeline's policy."""


class TableOwnershipError(ConfigurationError):
    """A table the spec names belongs to another pipeline (or was not created by one)."""


def require_staging(table: Table, name: str) -> None:
    """Raise TableStateError unless `table` stages Spark writes (else a write would bypass the committer
    and become visible without its positions)."""
    if table.metadata.properties.get(STAGING) != "true":
        raise TableStateError(f"table {name} has {STAGING}={table.metadata.properties.get(STAGING)!r}: the ingest "
                              f"job stages its writes and publishes them with their positions; set it back with "
                              f"ALTER TABLE ... SET TBLPROPERTIES ('{STAGING}'='true')")


@dataclass
class SchemaChanges:
    table: str
    added: list[str] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    incompatible: list[str] = field(default_factory=list)  # human explanations
    quarantined: set[str] = field(default_factory=set)


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def table_properties(spec: PipelineSpec) -> dict[str, str]:
    props = {
        "format-version": "2",
        "write.parquet.compression-codec": "zstd",
        "write.target-file-size-bytes": str(spec.target.target_file_size_bytes),
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "50",
        OWNER: spec.name,
        STAGING: "true",
    }
    if spec.target.mode == "upsert":
        props.update({"write.merge.mode": "merge-on-read", "write.update.mode": "merge-on-read",
                      "write.delete.mode": "merge-on-read"})
    props.update(spec.target.properties)
    return props


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
    props = ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in table_properties(spec).items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(table)} ({', '.join(columns)}) USING iceberg "
              f"{partitioned} TBLPROPERTIES ({props})")


def _create_dead_letter_table(spark, spec: PipelineSpec) -> None:
    props = {"format-version": "2", "write.parquet.compression-codec": "zstd",
             OWNER: spec.name, "lakehouse.role": "dead-letter", STAGING: "true",
             "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "50"}
    rendered = ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in props.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(spec.dead_letter_table)} "
              f"({', '.join(DEAD_LETTER_COLUMNS)}) USING iceberg PARTITIONED BY (days(_ingested_at)) "
              f"TBLPROPERTIES ({rendered})")


def _create_tombstone_table(spark, spec: PipelineSpec) -> None:
    keys = [f"`{k}` {spec.contract.field(k).spark_type}" for k in spec.target.key]
    props = {"format-version": "2", OWNER: spec.name, "lakehouse.role": "tombstones",
             "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "50"}
    rendered = ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in props.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(spec.tombstone_table)} "
              f"({', '.join(keys)}, _kafka {SPARK_KAFKA_STRUCT} COMMENT 'coordinates of the newest tombstone', "
              f"_deleted_at timestamp COMMENT 'when the pipeline applied it') USING iceberg "
              f"TBLPROPERTIES ({rendered})")


def check_owner(spec: PipelineSpec, name: str, table: Table) -> None:
    """Raise TableOwnershipError unless `table` records `spec`'s pipeline as its owner."""
    owner = table.metadata.properties.get(OWNER)
    if owner == spec.name:
        return
    if owner is None:
        raise TableOwnershipError(
            f"{spec.path}: table {spec.qualified(name)} exists but was not created by a lakehouse pipeline (no "
            f"{OWNER} property); writing into it could duplicate rows. Choose another table, or adopt it "
            f"with ALTER TABLE {spec.qualified(name)} SET TBLPROPERTIES ('{OWNER}'='{spec.name}') if it is "
            f"meant for this pipeline")
    raise TableOwnershipError(
        f"{spec.path}: table {spec.qualified(name)} belongs to pipeline {owner!r}; two pipelines writing one "
        f"table would duplicate every row. Choose another table for {spec.name!r}, or, if {owner!r} is gone "
        f"and its table should move to {spec.name!r}, set {OWNER}='{spec.name}' on it")


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
        f = {"element": f.items, "value": f.values}[part] if part in ("element", "value") and f.type != "struct" \
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
    if table.metadata.properties.get(STAGING) != "true":  # created before writes were staged
        with table.transaction() as tx:
            tx.set_properties({STAGING: "true"})
        table = catalog.load_table(name)
    return table


def ensure_tables(spark, catalog: Catalog, spec: PipelineSpec) -> frozenset[str]:
    """Create missing tables and apply the schema policy; returns the quarantined fields.

    Raises SchemaIncompatibleError when the policy says to stop, TableOwnershipError when a table
    the spec names belongs to another pipeline.
    """
    namespaces = {t.split(".")[0] for t in spec.owned_tables}
    existing = {ns[0] for ns in catalog.list_namespaces()}
    for ns in sorted(namespaces - existing):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {spec.catalog}.{ns}")
    loaded = {name: _load_owned(catalog, spec, name) for name in spec.owned_tables}  # every owner checked first
    quarantined: set[str] = set()
    if spec.tombstone_table and loaded[spec.tombstone_table] is None:
        _create_tombstone_table(spark, spec)
    for table in spec.target.tables:
        if loaded[table] is None:
            _create_data_table(spark, spec, table)
            continue
        changes = diff_schema(spec, table, loaded[table].schema())
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
    return frozenset(quarantined)
