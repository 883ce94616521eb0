"""The JSON Schema of a pipeline spec file, for editors: completion and hover text for every key, and
the mistakes a schema can tell (unknown keys, misspelt words, values out of range) while typing.

`lakehouse pipelines --schema` prints it; docs/spec.schema.json is a copy that editors point at, e.g.
with the YAML language server's first-line comment
`# yaml-language-server: $schema=../../docs/spec.schema.json`.

It is built from the vocabulary the parser checks with (lakehouse.core.vocabulary: the keys of each
section, the words, the caps), so the two cannot drift: every key of SECTION_KEYS needs its entry in
KEYS here, and the tests check that docs/spec.schema.json is this schema and that every spec the
platform loads is valid under it. The schema is looser than the parser: the rules between fields (a
key column must be a required field, a time partition needs a timestamp column, one owner per table)
are the parser's alone, and `lakehouse pipelines` / `lakehouse check` report them with their lines.
"""

from __future__ import annotations

from typing import Any

from lakehouse.core.durations import DURATION_PATTERN, MAX_DURATION_S
from lakehouse.core.naming import FIELD_NAME, IDENTIFIER, TABLE_NAME, TOPIC_NAME
from lakehouse.core.patterns import MAX_PATTERN_CHARS
from lakehouse.core.spec_properties import SPEC_COLUMN_PROPERTIES, SPEC_PROPERTIES
from lakehouse.core.vocabulary import (
    ADDITIVE_POLICIES,
    CAPS,
    CONTRACT_SOURCES,
    DATE_UNITS,
    ELEMENT_KEYS,
    ENVELOPES,
    FIELD_KEYS,
    FIELD_TYPES,
    INCOMPATIBLE_POLICIES,
    KEY_FORMATS,
    MODES,
    SCHEDULE_PRESETS,
    SECTION_KEYS,
    TIMESTAMP_UNITS,
    TRIGGER_MODES,
    VALUE_FORMATS,
)


def anchored(pattern: str) -> str:
    """`pattern` matched in full by JSON Schema's searching regexes, in JavaScript and Python alike (`$`
    would also match before a final newline in Python: `(?![\\s\\S])` is the end of the text in both)."""
    return f"^(?:{pattern})(?![\\s\\S])"


def _text(pattern: str, description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": anchored(pattern), "description": description}


def _choice(words: tuple[str, ...], description: str) -> dict[str, Any]:
    return {"enum": list(words), "description": description}


def _integer(description: str, minimum: int, cap: str | None = None) -> dict[str, Any]:
    bounds = {"minimum": minimum, **({"maximum": CAPS[cap]} if cap else {})}
    return {"type": "integer", **bounds, "description": description}


def _duration(description: str) -> dict[str, Any]:
    return {"description": description + " (500ms, 5s, 2m, 1h, 7d; a bare number is seconds)",
            "anyOf": [{"type": "string", "pattern": anchored(DURATION_PATTERN)},
                      {"type": "number", "minimum": 0, "maximum": MAX_DURATION_S}]}


def _schedule(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description + " (a five-field cron expression or "
                                                           + ", ".join(SCHEDULE_PRESETS) + ")",
            "anyOf": [{"enum": list(SCHEDULE_PRESETS)}, {"pattern": anchored(r"\S+( +\S+){4}")}]}


def _boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def _section(name: str, description: str) -> dict[str, Any]:
    return {"$ref": f"#/definitions/{name}", "description": description}


_IDENTIFIER = IDENTIFIER.pattern
_TABLE = TABLE_NAME.pattern
_TABLE_HINT = "namespace.table in lower case, e.g. raw.orders"
_SCALAR_VALUE = {"type": ["string", "number", "boolean"]}

# What each key of each section takes, by "section.key" ("" is the top level): one entry per key of
# vocabulary.SECTION_KEYS.
KEYS: dict[str, dict[str, Any]] = {
    ".name": _text(_IDENTIFIER, "The pipeline's name: lower_snake_case, at most 128 characters; its DAGs are "
                                "named after it."),
    ".description": {"type": "string", "description": "What the pipeline carries, shown on its DAGs."},
    ".source": _section("source", "The Kafka topic read, and how its keys and values are encoded."),
    ".target": _section("target", "The Iceberg table written, its mode, key, partitioning and fan-out."),
    ".dead_letter": _section("dead_letter", "Where records that cannot be decoded or break the contract go."),
    ".contract": _section("contract", "The fields each value must have: declared, or derived from the writer "
                                      "schemas."),
    ".schema_policy": _section("schema_policy", "What a new writer schema may change."),
    ".trigger": _section("trigger", "How often the pipeline commits, and whether it runs continuously."),
    ".slo": _section("slo", "The freshness and lag promised to readers; publication is gated on them."),
    ".supervision": _section("supervision", "How a continuous job is kept alive."),
    ".maintenance": _section("maintenance", "Compaction, snapshot expiry and orphan removal."),
    ".retention": _section("retention", "How long Kafka and the table must keep data, and the retention guard."),
    ".publish": _section("publish", "Write-audit-publish: the readers' branch and view, gated on quality."),
    ".verify": _section("verify", "When the tables are proven to hold each offset exactly once."),
    ".candidate_for": _text(_IDENTIFIER, "The live pipeline this one is a candidate replacement of."),
    "source.topic": _text(TOPIC_NAME.pattern, "The Kafka topic."),
    "source.partitions": _integer("The topic's partitions (when the platform creates it).", 1, "source.partitions"),
    "source.replication_factor": _integer("The topic's replication factor (when the platform creates it).", 1,
                                          "source.replication_factor"),
    "source.retention_ms": {"type": "integer", "minimum": -1, "maximum": CAPS["source.retention_ms"],
                            "not": {"const": 0},
                            "description": "The topic's retention.ms; -1 keeps records for ever."},
    "source.value_format": _choice(VALUE_FORMATS, "How values are encoded: JSON, or the Confluent wire format."),
    "source.key": _section("source_key", "The Kafka key: its format, and the value field it must equal."),
    "source.max_value_bytes": _integer("The largest value accepted; larger ones are dead-lettered.", 1,
                                       "source.max_value_bytes"),
    "source.schemas": {"type": "string", "minLength": 1, "maxLength": 1024,
                       "description": "A folder beside the spec of writer schemas (<id>.avsc, <id>.proto, "
                                      "<id>.json) instead of a schema registry."},
    "source.envelope": _choice(ENVELOPES, "The change-event envelope of a target.mode cdc pipeline."),
    "source.key.field": _text(FIELD_NAME.pattern, "The contract field the key must equal."),
    "source.key.required": _boolean("Whether a record without a key is dead-lettered."),
    "source.key.format": _choice(KEY_FORMATS, "How keys are encoded: text, or a record like the values."),
    "target.catalog": _text(_IDENTIFIER, "The Iceberg catalog (default lake)."),
    "target.table": _text(_TABLE, f"The table written: {_TABLE_HINT}."),
    "target.mode": _choice(MODES, "append every record, upsert by target.key, or cdc (change events)."),
    "target.key": {"description": "The key column(s) of an upsert or cdc table: required contract fields.",
                   "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "target.partition_by": {"description": "Partition transforms: day(event_time), bucket(16, id), a column.",
                            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "target.fanout": _section("fanout", "Route records to other tables by a field's value."),
    "target.target_file_size_mb": _integer("The size data files are written and compacted to.", 1,
                                           "target.target_file_size_mb"),
    "target.properties": {"$ref": "#/definitions/properties",
                          "description": "Iceberg table properties: Iceberg's tuning only (docs/spec.md)."},
    "target.fanout.field": _text(FIELD_NAME.pattern, "The contract field (string, int or long) routed on."),
    "target.fanout.routes": {"type": "object", "minProperties": 1, "additionalProperties": _text(_TABLE, _TABLE_HINT),
                             "description": "Field value -> table."},
    "dead_letter.table": _text(_TABLE, f"The dead-letter table: {_TABLE_HINT}."),
    "contract.fields": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/field"},
                        "description": "The value's fields."},
    "contract.from": _choice(CONTRACT_SOURCES, "Derive the fields from the writer schemas of source.schemas."),
    "schema_policy.on_additive": _choice(ADDITIVE_POLICIES, "A new optional field: evolve the table, or fail."),
    "schema_policy.on_incompatible": _choice(INCOMPATIBLE_POLICIES, "An incompatible change: fail, or quarantine "
                                                                    "its records."),
    "trigger.interval": _duration("Time between commits, at most 1d"),
    "trigger.write_interval": _duration("Append pipelines: read and write data files this often, commit them every "
                                        "trigger.interval (at most the interval)"),
    "trigger.max_records_per_batch": _integer("Records per batch at most.", 1, "trigger.max_records_per_batch"),
    "trigger.mode": _choice(TRIGGER_MODES, "continuous: one long-running job; scheduled: a job per schedule."),
    "trigger.schedule": _schedule("When a scheduled pipeline runs"),
    "slo.freshness": _duration("How old the newest published row may be"),
    "slo.lag_records": _integer("Records not yet ingested, at most.", 0, "slo.lag_records"),
    "slo.lag_seconds": _duration("How far ingestion may trail the topic"),
    "supervision.hung_after_triggers": _integer("Triggers without a commit while lag grows before a restart.", 1,
                                                "supervision.hung_after_triggers"),
    "supervision.restart_backoff": _duration("The first restart delay, doubled per restart, at most 1d"),
    "supervision.max_restarts": _integer("Restarts per supervision run.", 0, "supervision.max_restarts"),
    "supervision.retry_budget": _duration("How long transient failures are retried, at most 7d"),
    "maintenance.schedule": _schedule("When maintenance runs"),
    "maintenance.min_input_files": _integer("Small files a partition needs before it is compacted.", 2,
                                            "maintenance.min_input_files"),
    "maintenance.orphan_safety_window": _duration("How old an unreferenced file must be before it is removed "
                                                  "(at least 1h and 100 trigger intervals)"),
    "retention.outage_budget": _duration("The longest writer or catalog outage Kafka must outlast"),
    "retention.replay_window": _duration("How far back replay and time travel reach"),
    "retention.delete_after": _duration("Rows older than this (by event time) are deleted"),
    "retention.guard_threshold": {"description": "How close to the topic's retention horizon the oldest record "
                                                 "not yet ingested may get: a duration, or a share such as 50%.",
                                  "anyOf": [{"type": "string"}, {"type": "number", "minimum": 0}]},
    "retention.max_retention": _duration("The most the retention guard may raise the topic's retention.ms to"),
    "publish.branch": _text(_IDENTIFIER, "The readers' branch (not main, the audit branch)."),
    "publish.view": _text(_TABLE, f"The view readers query: {_TABLE_HINT}."),
    "publish.schedule": _schedule("When publication runs"),
    "publish.suite": _text(_IDENTIFIER, "The expectation suite (include/expectations/<suite>.json); default the "
                                        "pipeline's name."),
    "publish.spark_audit_rows": _integer("Audit windows of at least this many rows are validated in Spark.", 0,
                                         "publish.spark_audit_rows"),
    "verify.schedule": _schedule("When the exactly-once proof runs"),
}

_FIELD: dict[str, dict[str, Any]] = {
    "name": _text(FIELD_NAME.pattern, "The column's name: letters, digits and underscores."),
    "type": {"type": "string", "description": "One of " + ", ".join(FIELD_TYPES) + ", or decimal(P,S).",
             "anyOf": [{"enum": list(FIELD_TYPES)},
                       {"pattern": anchored(r"decimal\( *[0-9]{1,3} *, *[0-9]{1,3} *\)")}]},
    "required": _boolean("Whether a value without it (or with null) is dead-lettered."),
    "enum": {"type": "array", "minItems": 1, "items": {"type": ["string", "integer"]},
             "description": "The values allowed (string, int and long fields)."},
    "min": {"type": "number", "description": "The smallest value allowed (numeric fields)."},
    "max": {"type": "number", "description": "The largest value allowed (numeric fields)."},
    "pattern": {"type": "string", "maxLength": MAX_PATTERN_CHARS,
                "description": "A regular expression the whole value must match (RE2: no lookarounds or "
                               "backreferences)."},
    "max_length": _integer("The longest value allowed, in characters.", 1, "source.max_value_bytes"),
    "doc": {"type": "string", "description": "What the field means."},
    "unit": _choice((*TIMESTAMP_UNITS, *DATE_UNITS), "Numbers since the epoch accepted beside ISO-8601 text: s, "
                                                     "ms, us for timestamps, days for dates."),
    "fields": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/field"},
               "description": "A struct's fields."},
    "items": {"$ref": "#/definitions/element", "description": "A list's element."},
    "values": {"$ref": "#/definitions/element", "description": "A map's value (keys are strings)."},
}


# Keys a spec may also write with no value (`view:`, `schema_policy:`): the parser reads them as left out.
NULLABLE = {".description", ".candidate_for", ".schema_policy", ".trigger", ".slo", ".supervision", ".maintenance",
            ".retention", ".publish", ".verify", "source.key", "source.retention_ms", "source.schemas",
            "source.envelope", "source.key.field", "target.key", "target.partition_by", "target.fanout",
            "target.properties", "contract.from", "publish.view", "publish.suite", "retention.delete_after",
            "retention.guard_threshold", "retention.max_retention"}
NULLABLE_FIELD_KEYS = {"enum", "min", "max", "pattern", "max_length", "doc", "unit", "fields", "items", "values"}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or no value at all."""
    rest = {k: v for k, v in schema.items() if k != "description"}
    return {"description": schema["description"], "anyOf": [rest, {"type": "null"}]}


def _object(section: str) -> dict[str, Any]:
    keys = {key: KEYS[f"{section}.{key}"] for key in SECTION_KEYS[section]}
    return {"type": "object", "additionalProperties": False,
            "properties": {key: _or_null(value) if f"{section}.{key}" in NULLABLE else value
                           for key, value in keys.items()}}


def _field_keys(keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: _or_null(_FIELD[key]) if key in NULLABLE_FIELD_KEYS else _FIELD[key] for key in keys}


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft-07, which editors support best) of a pipeline spec file."""
    definitions: dict[str, Any] = {
        name: _object(section) for name, section in (
            ("source", "source"), ("source_key", "source.key"), ("target", "target"), ("fanout", "target.fanout"),
            ("dead_letter", "dead_letter"), ("contract", "contract"), ("schema_policy", "schema_policy"),
            ("trigger", "trigger"), ("slo", "slo"), ("supervision", "supervision"), ("maintenance", "maintenance"),
            ("retention", "retention"), ("publish", "publish"), ("verify", "verify"))}
    for required, name in ((("topic",), "source"), (("table",), "target"), (("table",), "dead_letter"),
                           (("field", "routes"), "fanout")):
        definitions[name]["required"] = list(required)
    definitions["field"] = {"type": "object", "additionalProperties": False, "required": ["name", "type"],
                            "properties": _field_keys(FIELD_KEYS)}
    definitions["element"] = {"type": "object", "additionalProperties": False, "required": ["type"],
                              "properties": _field_keys(ELEMENT_KEYS)}
    definitions["properties"] = {
        "type": "object",
        "properties": {key: _SCALAR_VALUE for key in SPEC_PROPERTIES},
        "patternProperties": {"^" + prefix.replace(".", r"\.") + ".+": _SCALAR_VALUE
                              for prefix in SPEC_COLUMN_PROPERTIES},
        "additionalProperties": False,
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "lakehouse pipeline spec",
        "description": "One pipeline: a Kafka topic ingested into an Iceberg table (docs/spec.md).",
        "type": "object",
        "required": ["name", "source", "target", "dead_letter", "contract"],
        **{key: value for key, value in _object("").items() if key != "type"},
        "definitions": definitions,
    }
