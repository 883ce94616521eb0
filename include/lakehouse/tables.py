"""Table lifecycle: create the data and dead-letter tables from the spec, evolve their schema.

Schema policy (spec `schema_policy`):
- a new optional contract field is additive: `evolve` adds the column (no data
  rewrite), `fail` stops;
- int -> long is a widening Iceberg allows, applied like an additive change;
- a new required field or any other type change is incompatible: `fail` stops
  with an explanation, `quarantine` keeps the table as it is and dead-letters
  records that carry the field (`schema_incompatible`) until someone fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.types import (BooleanType, DateType, DoubleType, IntegerType, LongType, StringType,
                             TimestampType, TimestamptzType)

from lakehouse.kafka_source import SPARK_HEADERS, SPARK_KAFKA_STRUCT
from lakehouse.spec import PipelineSpec

ICEBERG_TYPES = {
    "string": (StringType,), "int": (IntegerType,), "long": (LongType,), "double": (DoubleType,),
    "boolean": (BooleanType,), "timestamp": (TimestamptzType, TimestampType), "date": (DateType,),
}
DEAD_LETTER_COLUMNS = (
    f"_kafka {SPARK_KAFKA_STRUCT} COMMENT 'source coordinates of the rejected record'",
    "key binary COMMENT 'raw record key'",
    "value binary COMMENT 'raw record value'",
    f"headers {SPARK_HEADERS} COMMENT 'raw record headers'",
    "error_kind string COMMENT 'why the record was rejected'",
    "error_detail string",
    "pipeline string",
    "_ingested_at timestamp",
)


class SchemaIncompatibleError(RuntimeError):
    """The spec changed the contract in a way the table cannot take under the pipeline's policy."""


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
        "lakehouse.pipeline": spec.name,
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
    partitioned = ""
    if spec.target.partition_by:
        partitioned = "PARTITIONED BY (" + ", ".join(p.spark_sql() for p in spec.target.partition_by) + ")"
    props = ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in table_properties(spec).items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(table)} ({', '.join(columns)}) USING iceberg "
              f"{partitioned} TBLPROPERTIES ({props})")


def _create_dead_letter_table(spark, spec: PipelineSpec) -> None:
    props = {"format-version": "2", "write.parquet.compression-codec": "zstd",
             "lakehouse.pipeline": spec.name, "lakehouse.role": "dead-letter",
             "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "50"}
    rendered = ", ".join(f"{_sql_string(k)}={_sql_string(v)}" for k, v in props.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {spec.qualified(spec.dead_letter_table)} "
              f"({', '.join(DEAD_LETTER_COLUMNS)}) USING iceberg PARTITIONED BY (days(_ingested_at)) "
              f"TBLPROPERTIES ({rendered})")


def diff_schema(spec: PipelineSpec, table: str, schema) -> SchemaChanges:
    """What it takes to make table `table` (pyiceberg schema) hold the spec's contract."""
    changes = SchemaChanges(table=table)
    existing = {f.name: f for f in schema.fields}
    for f in spec.contract.fields:
        col = existing.get(f.name)
        if col is None:
            if f.required:
                changes.incompatible.append(
                    f"new field {f.name!r} is required: records already ingested (and replays of them) "
                    f"lack it; add it as optional first")
                changes.quarantined.add(f.name)
            else:
                changes.added.append(f.name)
            continue
        if isinstance(col.field_type, ICEBERG_TYPES[f.type]):
            continue
        if f.type == "long" and isinstance(col.field_type, IntegerType):
            changes.widened.append(f.name)
            continue
        changes.incompatible.append(
            f"field {f.name!r} is {col.field_type} in the table but {f.type} in the contract; "
            f"Iceberg cannot change it in place")
        changes.quarantined.add(f.name)
    return changes


def ensure_tables(spark, catalog: Catalog, spec: PipelineSpec) -> frozenset[str]:
    """Create missing tables and apply the schema policy; returns the quarantined fields.

    Raises SchemaIncompatibleError when the policy says to stop.
    """
    namespaces = {t.split(".")[0] for t in (*spec.target.tables, spec.dead_letter_table)}
    existing = {ns[0] for ns in catalog.list_namespaces()}
    for ns in sorted(namespaces - existing):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {spec.catalog}.{ns}")
    quarantined: set[str] = set()
    for table in spec.target.tables:
        try:
            schema = catalog.load_table(table).schema()
        except NoSuchTableError:
            _create_data_table(spark, spec, table)
            continue
        changes = diff_schema(spec, table, schema)
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
        for name in changes.added:
            f = spec.contract.field(name)
            comment = f" COMMENT {_sql_string(f.doc)}" if f.doc else ""
            spark.sql(f"ALTER TABLE {spec.qualified(table)} ADD COLUMN `{name}` {f.spark_type}{comment}")
        for name in changes.widened:
            spark.sql(f"ALTER TABLE {spec.qualified(table)} ALTER COLUMN `{name}` TYPE bigint")
    try:
        catalog.load_table(spec.dead_letter_table)
    except NoSuchTableError:
        _create_dead_letter_table(spark, spec)
    return frozenset(quarantined)
