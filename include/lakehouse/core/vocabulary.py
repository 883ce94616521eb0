"""The words of a pipeline spec: the contract's types, the wire formats, the modes and policies, the
keys each section may hold, and the caps that bound every size, count and duration.

Nothing here reads a file or checks a document (lakehouse.core.spec_parse does); the dataclasses a
spec becomes are lakehouse.core.spec_model's.
"""

from __future__ import annotations

from lakehouse.core.durations import MAX_DURATION_S

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
# The types lakehouse.ingest.json_fast_path decodes; a contract with others takes the reference.
FAST_PATH_TYPES = ("string", "int", "long", "float", "double", "boolean", "timestamp", "date")
KEY_TYPES = ("string", "int", "long", "date", "timestamp", "uuid", "decimal", "boolean")
# Type changes a table may take without rewriting data: Iceberg's allowed promotions between two types
# (lakehouse.core.schemas.promotes, the one rule, adds a decimal's precision grown at the same scale).
WIDENINGS = {("int", "long"), ("float", "double")}
# json: plain JSON values; the others are the Confluent wire format (magic byte 0, a 4-byte schema id,
# the payload; lakehouse.ingest.wire) with writer schemas by id from `source.schemas` or a schema registry
# (lakehouse.ingest.schema_store)
VALUE_FORMATS = ("json", "avro", "protobuf", "json_schema")
# a key is UTF-8 text (string) or, like a value, a record: a Debezium key holds the primary key's columns
KEY_FORMATS = ("string", *VALUE_FORMATS)
# the change-event envelopes a `mode: cdc` pipeline reads (lakehouse.ingest.change_events)
ENVELOPES = ("debezium",)
# the schema type each wire format's writer schemas have
FORMAT_SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}

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
INT64 = (-(2 ** 63), 2 ** 63 - 1)  # the range of an integer enum value, fan-out route or table property

MAX_CONTRACT_DEPTH = 16  # struct, list and map levels of one field
CONTRACT_SOURCES = ("writer_schema",)  # `contract.from`
# Tighter caps of some durations (seconds): a trigger or a restart delay longer than a day is a typo.
DURATION_CAPS_S = {"trigger.interval": 86400.0, "trigger.write_interval": 86400.0,
                   "supervision.restart_backoff": 86400.0, "supervision.retry_budget": 7 * 86400.0}
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

# The keys each section of a spec file may hold ("" is the document's top level, "source.key" the
# mapping under source's key): the parser refuses any other, naming the nearest of these, and the JSON
# Schema for editors (lakehouse.core.spec_schema) lists them.
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "": ("name", "description", "source", "target", "dead_letter", "contract", "schema_policy", "trigger", "slo",
         "supervision", "maintenance", "retention", "publish", "verify", "candidate_for"),
    "source": ("topic", "partitions", "replication_factor", "retention_ms", "value_format", "key", "max_value_bytes",
               "schemas", "envelope"),
    "source.key": ("field", "required", "format"),
    "target": ("catalog", "table", "mode", "key", "partition_by", "fanout", "target_file_size_mb", "properties"),
    "target.fanout": ("field", "routes"),
    "dead_letter": ("table",),
    "contract": ("fields", "from"),
    "schema_policy": ("on_additive", "on_incompatible"),
    "trigger": ("interval", "write_interval", "max_records_per_batch", "mode", "schedule"),
    "slo": ("freshness", "lag_records", "lag_seconds"),
    "supervision": ("hung_after_triggers", "restart_backoff", "max_restarts", "retry_budget"),
    "maintenance": ("schedule", "min_input_files", "orphan_safety_window"),
    "retention": ("outage_budget", "replay_window", "delete_after", "guard_threshold", "max_retention"),
    "publish": ("branch", "view", "schedule", "suite", "spark_audit_rows"),
    "verify": ("schedule",),
}
# The keys of a contract field; a list's `items` and a map's `values` take the same but `name` and `doc`.
FIELD_KEYS = ("name", "type", "required", "enum", "min", "max", "pattern", "max_length", "doc", "unit", "fields",
              "items", "values")
ELEMENT_KEYS = tuple(key for key in FIELD_KEYS if key not in ("name", "doc"))
