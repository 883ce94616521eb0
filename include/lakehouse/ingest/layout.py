"""The tables' layout: the columns the platform adds to a data table, the dead-letter table's columns, and
the decoded batch that the reader hands to the writers, in Arrow and in Spark's DDL.

A data table holds the contract's fields, then `_kafka` (the record's coordinates, `KAFKA_STRUCT`),
`_ingested_at` and, for a change stream, `_cdc` (`CDC_STRUCT`). The dead-letter table's columns are
`DEAD_LETTER_TABLE`, the one definition of the mapping from a decoded batch's columns to a dead letter's.
The reader builds batches of `batch_schema`, the tables module creates the tables from these types and the
task writer projects a batch onto them; none of them defines a column of its own.
"""

from __future__ import annotations

import pyarrow as pa

from lakehouse.core.spec import FieldSpec, PipelineSpec

KAFKA_STRUCT = pa.struct([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("key", pa.string()),
])
SPARK_KAFKA_STRUCT = "struct<topic:string,partition:int,offset:bigint,timestamp:timestamp,key:string>"
# A change stream's rows also carry the change that wrote them: Debezium's op, the source's commit time and
# the event's position in the source's log (change_events.source_position), which order a key's changes.
CDC_STRUCT = pa.struct([("op", pa.string()), ("source_ts", pa.timestamp("us", tz="UTC")),
                        ("position", pa.decimal128(38, 0))])
SPARK_CDC_STRUCT = "struct<op:string,source_ts:timestamp,position:decimal(38,0)>"
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SPARK_HEADERS = "array<struct<key:string,value:binary>>"
ARROW_TYPES = {
    "string": pa.string(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32(), "uuid": pa.string(),
    "binary": pa.binary(),
}


def arrow_type(f: FieldSpec) -> pa.DataType:
    """The Arrow type of contract field `f`'s values as the validator returns them (nested ones too)."""
    if f.type == "decimal":
        return pa.decimal128(*f.digits)
    if f.type == "struct":
        return pa.struct([(c.name, arrow_type(c)) for c in f.fields])
    if f.type == "list":
        return pa.list_(arrow_type(f.element))
    if f.type == "map":
        return pa.map_(pa.string(), arrow_type(f.element))
    return ARROW_TYPES[f.type]


# The dead-letter table's columns, in order: (name, Spark type, the decoded batch's column a dead
# letter's value comes from, or None for the pipeline's name, comment). The one definition of the
# mapping: the table's DDL (tables.DEAD_LETTER_COLUMNS), the tasks' Arrow projection
# (taskwriter.DEAD_LETTER_SOURCES), the Spark projection of replays (tables.dead_letter_columns)
# and a batch's `_dlq_*` columns (batch_schema) all follow it.
DEAD_LETTER_TABLE = (
    ("_kafka", SPARK_KAFKA_STRUCT, "_kafka", "source coordinates of the rejected record"),
    ("key", "binary", "_dlq_key", "raw record key"),
    ("value", "binary", "_dlq_value", "raw record value"),
    ("headers", SPARK_HEADERS, "_dlq_headers", "raw record headers"),
    ("error_kind", "string", "_dlq_error_kind", "why the record was rejected"),
    ("error_detail", "string", "_dlq_error_detail", None),
    ("pipeline", "string", None, None),
    ("_ingested_at", "timestamp", "_ingested_at", None),
)
# the batch's columns set on dead letters only, in the order a decoded dead letter carries their values
DEAD_LETTER_BATCH_COLUMNS = tuple(source for _, _, source, _ in DEAD_LETTER_TABLE
                                  if source and source.startswith("_dlq_"))
_DEAD_LETTER_ARROW = {"binary": pa.binary(), "string": pa.string(), SPARK_HEADERS: HEADERS}


def batch_schema(spec: PipelineSpec) -> tuple[pa.Schema, str]:
    """Arrow schema and matching Spark DDL of a decoded batch (table rows and dead letters).

    `_route` names the target table (null for a dead letter); `_op` is `upsert` or
    `delete`; `_dlq_*` columns are set on dead letters only.
    """
    fields = [("_route", pa.string(), "string"), ("_op", pa.string(), "string")]
    fields += [(f.name, arrow_type(f), f.spark_type) for f in spec.contract.fields]
    fields += [
        ("_kafka", KAFKA_STRUCT, SPARK_KAFKA_STRUCT),
        ("_ingested_at", pa.timestamp("us", tz="UTC"), "timestamp"),
    ]
    if spec.is_cdc:
        fields.append(("_cdc", CDC_STRUCT, SPARK_CDC_STRUCT))
    fields += [(source, _DEAD_LETTER_ARROW[spark_type], spark_type)
               for _, spark_type, source, _ in DEAD_LETTER_TABLE if source in DEAD_LETTER_BATCH_COLUMNS]
    schema = pa.schema([(n, t) for n, t, _ in fields])
    ddl = ", ".join(f"`{n}` {s}" for n, _, s in fields)
    return schema, ddl
