"""Checking a spec document and building its PipelineSpec, reporting every mistake it holds at once.

`parse(path, document)` walks the YAML data of one spec file (a lakehouse.core.safe_yaml.YamlDocument)
section by section. Each check that refuses a value records a SpecError (the key path, why, and the
line of the value) and hands on INVALID in its place; a later check that needs that value skips, so
one mistake is reported once, never again by every check that reads it (an unknown field is not also
a missing one, a field whose type is misspelt is not also "not a contract field" where a key or a
partition names it). When the walk is done, the file's problems are raised together as one SpecError
(`SpecError.of`), in line order; a document without any becomes the PipelineSpec.

Unknown keys and values that must be one of a few words (types, formats, modes, transforms, schedules)
name the nearest word the spec could have meant (lakehouse.core.wording.did_you_mean). The reading
itself is lakehouse.core.spec_reader's, the contract's checks lakehouse.core.spec_contract's.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from lakehouse.core.errors import SpecError
from lakehouse.core.naming import OPS_TIMELINE_TABLE, TOPIC_NAME, fanout_view
from lakehouse.core.safe_yaml import YamlDocument
from lakehouse.core.schema_folder import SCHEMA_FOLDER_NAME, read_schema_folder
from lakehouse.core.spec_contract import Columns, derive_contract, read_contract
from lakehouse.core.spec_model import (
    FanoutSpec,
    MaintenanceSpec,
    PartitionField,
    PipelineSpec,
    PublishSpec,
    RetentionSpec,
    SchemaPolicy,
    SloSpec,
    SourceSpec,
    SupervisionSpec,
    TargetSpec,
    TriggerSpec,
    VerifySpec,
)
from lakehouse.core.spec_properties import (
    MAX_PROPERTY_VALUE,
    PROPERTY_FAMILIES,
    PROPERTY_KEY,
    SPEC_COLUMN_PROPERTIES,
    SPEC_PROPERTIES,
    refused_property,
)
from lakehouse.core.spec_reader import INVALID, Reader, Refused, ok
from lakehouse.core.vocabulary import (
    ADDITIVE_POLICIES,
    CAPS,
    CONTRACT_SOURCES,
    ENVELOPES,
    FORMAT_SCHEMA_TYPES,
    INCOMPATIBLE_POLICIES,
    INT64,
    KEY_FORMATS,
    KEY_TYPES,
    MODES,
    NESTED_TYPES,
    PARTITION_SOURCE_TYPES,
    PARTITION_TRANSFORMS,
    RESERVED_COLUMNS,
    SECTION_KEYS,
    TRIGGER_MODES,
    VALUE_FORMATS,
)
from lakehouse.core.wording import closest, did_you_mean, shown

_PARTITION = re.compile(r"(?:(\w+)\((?:([0-9]+),)?(\w+)\)|(\w+))", re.ASCII)
_SHARE = re.compile(r"([0-9]{1,3}(?:\.[0-9]+)?) *%")


# --------------------------------------------------------------------------------------------- source

def read_source(r: Reader, top: dict, path: Path, name: Any, empty_folder: bool = False) -> SourceSpec | Refused:
    """The `source` section of spec document `top` (values with a mistake INVALID); `source.key.field`
    is checked against the contract by the caller. `empty_folder` admits a `source.schemas` folder
    without schemas (to pull them into)."""
    src = r.mapping(r.required(top, "source", ""), "source", SECTION_KEYS["source"])
    if src is INVALID:
        return INVALID
    key = r.mapping(src.get("key"), "source.key", SECTION_KEYS["source.key"])
    topic = r.string(r.required(src, "topic", "source"), "source.topic", TOPIC_NAME,
                     "topic names use letters, digits, '.', '_' and '-', at most 249 characters")
    if topic in (".", ".."):
        topic = r.problem("source.topic", f"{topic!r} is not a topic name Kafka accepts")
    retention = src.get("retention_ms")
    if retention is not None:
        retention = r.integer(retention, "source.retention_ms", -1)
        if retention == 0:
            retention = r.problem("source.retention_ms", "0 would delete records as soon as they arrive; use -1 "
                                                         "for unlimited")
    value_format = r.choice(src.get("value_format", "json"), "source.value_format", VALUE_FORMATS)
    # target.mode cdc: the values are change events, Debezium's unless source.envelope says otherwise
    cdc = isinstance(top.get("target"), dict) and top["target"].get("mode") == "cdc"
    envelope = r.choice(src.get("envelope", ENVELOPES[0] if cdc else None), "source.envelope", ENVELOPES) \
        if cdc or src.get("envelope") is not None else None
    # a change stream's key holds the primary key: a record in the value's format (Debezium's converters)
    key_format = r.choice(r.get(key, "format", value_format if envelope else "string"), "source.key.format",
                          KEY_FORMATS)
    if ok(envelope) and envelope is not None and key_format == "string":
        key_format = r.problem("source.key.format", "a change stream's keys are records holding the primary key "
                                                    f"(Debezium's); use one of {', '.join(VALUE_FORMATS)}")
    schemas, schemas_dir = _schemas(r, src.get("schemas"), path, name, value_format, key_format, empty_folder)
    key_field = r.get(key, "field")
    return SourceSpec(
        topic=topic,
        partitions=r.integer(src.get("partitions", 1), "source.partitions", 1),
        replication_factor=r.integer(src.get("replication_factor", 1), "source.replication_factor", 1),
        retention_ms=retention,
        value_format=value_format,
        schemas=schemas,
        schemas_dir=schemas_dir,
        key_field=key_field,
        key_required=r.boolean(r.get(key, "required", key_field is not None or envelope is not None),
                               "source.key.required"),
        key_format=key_format,
        envelope=envelope,
        max_value_bytes=r.integer(src.get("max_value_bytes", 1_048_576), "source.max_value_bytes", 1),
    )


def _schemas(r: Reader, folder: Any, path: Path, name: Any, value_format: Any, key_format: Any,
             empty_folder: bool) -> tuple[Any, Any]:
    """(schemas, schemas_dir) of `source.schemas` (`folder`): the writer schemas of its folder beside the spec."""
    if folder is None:
        return (), None
    if not ok(value_format, key_format):  # which schemas the folder must hold cannot be told
        return INVALID, INVALID
    wire = [f for f in (value_format, key_format) if f in FORMAT_SCHEMA_TYPES]
    if not wire:
        return r.problem("source.schemas", f"is a folder of writer schemas; value_format {value_format!r} and "
                                           f"key format {key_format!r} have none"), INVALID
    folder = r.string(folder, "source.schemas", SCHEMA_FOLDER_NAME, "a folder path beside the spec, at most 1,024 "
                                                                    "characters")
    if folder is INVALID:
        return INVALID, INVALID
    try:
        schemas_dir = str((Path(path).parent / folder).resolve())
        schemas = read_schema_folder(Path(path).parent / folder)
    except (OSError, ValueError, RuntimeError) as exc:  # a name too long, a symlink loop, too large
        return r.problem("source.schemas", f"{folder!r} cannot be read: {exc}"), INVALID
    types = {FORMAT_SCHEMA_TYPES[f] for f in wire}
    if not schemas:
        if not empty_folder:
            return r.problem("source.schemas", f"{folder!r} is not a folder of <schema id>.avsc, .proto or .json "
                                               f"files (`lakehouse schemas --pipeline "
                                               f"{name if ok(name) else '<name>'} --pull` fills it from the schema "
                                               f"registry)"), INVALID
    elif not any(schema_type in types for _, schema_type, _ in schemas):
        return r.problem("source.schemas", f"{folder!r} holds no {' or '.join(sorted(types))} schema for "
                                           f"{' and '.join(wire)}"), INVALID
    return schemas, schemas_dir


# --------------------------------------------------------------------------------------------- target

def _target(r: Reader, tgt: dict | Refused, source: SourceSpec | Refused, columns: Columns) -> TargetSpec | Refused:
    """The `target` section, checked against the source and the contract."""
    if tgt is INVALID:
        return INVALID
    mode = r.choice(tgt.get("mode", "append"), "target.mode", MODES)
    keys = _keys(r, [] if tgt.get("key") is None else tgt["key"], columns)  # `key: no` is a mistake, not none
    if mode in ("upsert", "cdc") and keys == ():
        r.problem("target.key", f"{mode} mode needs key columns")
    src = source if source is not INVALID else _UNREAD_SOURCE
    if mode == "cdc":
        if ok(src.key_field) and src.key_field is not None:
            r.problem("source.key.field", "a change stream's key is the primary key record; cdc mode takes "
                                          "target.key's columns from it (leave source.key.field out)")
        if src.key_required is False:
            r.problem("source.key.required", "a change stream's deletes and tombstones need their key")
        mode = "upsert"
    elif ok(mode, src.envelope) and src.envelope is not None:
        r.problem("source.envelope", f"change events need target.mode cdc, not {mode!r}")
    if ok(src.envelope) and src.envelope is not None and tgt.get("fanout") is not None:
        r.problem("target.fanout", "a change stream mirrors one source table into one table; fan-out would "
                                   "split a key's inserts and deletes across tables")
    parts = [] if tgt.get("partition_by") is None else tgt["partition_by"]
    if isinstance(parts, str):
        parts = [parts]
    if not isinstance(parts, list):
        partition_by: Any = r.problem("target.partition_by", "must be a list of partition transforms")
    else:
        partition_by = tuple(_partition_field(r, p, f"target.partition_by[{i}]", columns) for i, p in enumerate(parts))
    size = r.integer(tgt.get("target_file_size_mb", 128), "target.target_file_size_mb", 1)
    return TargetSpec(
        catalog=r.identifier(tgt.get("catalog", "lake"), "target.catalog"),
        table=r.table(r.required(tgt, "table", "target"), "target.table"),
        mode=mode, key=keys, partition_by=partition_by,
        fanout=None if tgt.get("fanout") is None else _fanout(r, tgt["fanout"], columns),
        target_file_size_bytes=size * 1024 * 1024 if ok(size) else INVALID,
        properties=_properties(r, tgt.get("properties"), columns),
    )


_UNREAD_SOURCE: Any = SourceSpec(INVALID, envelope=INVALID, key_field=INVALID, key_required=INVALID)  # refused


def _keys(r: Reader, keys: Any, columns: Columns) -> tuple[str, ...] | Refused:
    """`target.key`: a column name or a list of them, each a required contract field of a key type."""
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list):
        return r.problem("target.key", "must be a column name or a list of column names")
    mark = r.mark()
    for i, k in enumerate(keys):
        where = f"target.key[{i}]"
        f = columns.lookup(r, k, where)
        if f is INVALID:
            continue
        if not f.required:
            r.problem(where, f"key column {k!r} must be required in the contract")
        elif f.type in ("double", "float"):  # NaN never equals itself, -0.0 equals 0.0
            r.problem(where, f"key column {k!r} is a {f.type}; floating-point values do not identify rows (NaN, "
                             f"-0.0): use a string, int, long or date key")
        elif f.type not in KEY_TYPES:
            r.problem(where, f"key column {k!r} is a {f.type_text}; a key column is one of {', '.join(KEY_TYPES)}")
    return INVALID if r.failed_since(mark) or not all(isinstance(k, str) for k in keys) else tuple(keys)


def _partition_field(r: Reader, value: Any, where: str, columns: Columns) -> PartitionField | Refused:
    text = r.string(value, where)
    if text is INVALID:
        return INVALID
    match = _PARTITION.fullmatch(text.replace(" ", ""))
    if not match:
        return r.problem(where, f"{shown(value)} is not a partition transform like day(event_time) or "
                                f"bucket(16, id)")
    transform, arg, column, bare = match.groups()
    if bare:
        transform, column = "identity", bare
    if transform not in PARTITION_TRANSFORMS:
        return r.problem(where, f"unknown transform {shown(transform)} (use one of {', '.join(PARTITION_TRANSFORMS)})"
                                f"{did_you_mean(transform, PARTITION_TRANSFORMS)}")
    f = columns.lookup(r, column, where, prefix="column ")
    if f is INVALID:
        return INVALID
    ftype = f.type
    if transform in ("year", "month", "day", "hour") and ftype not in ("timestamp", "date"):
        return r.problem(where, f"{transform}() needs a timestamp or date column, {column!r} is {ftype}")
    if transform == "hour" and ftype != "timestamp":
        return r.problem(where, f"hour() needs a timestamp column, {column!r} is {ftype}")
    allowed = PARTITION_SOURCE_TYPES[transform]
    if ftype not in allowed:
        return r.problem(where, f"{transform} cannot partition {column!r}, a {f.type_text}; it takes "
                                f"{', '.join(allowed)} columns")
    if transform in ("bucket", "truncate"):
        # the length test first: int() refuses strings of more than 4300 digits
        if arg is None or len(arg) > 10 or not 1 <= int(arg) <= CAPS[transform]:
            return r.problem(where, f"{transform}() needs a positive width of at most {CAPS[transform]}, "
                                    f"e.g. {transform}(16, {column})")
    elif arg is not None:
        return r.problem(where, f"{transform}() takes no width")
    return PartitionField(transform=transform, column=column, arg=None if arg is None else int(arg))


def _fanout(r: Reader, raw: Any, columns: Columns) -> FanoutSpec | Refused:
    fo = r.mapping(raw, "target.fanout", SECTION_KEYS["target.fanout"])
    if fo is INVALID:
        return INVALID
    fo_field = r.string(r.required(fo, "field", "target.fanout"), "target.fanout.field")
    f = columns.lookup(r, fo_field, "target.fanout.field")
    if f is not INVALID and f.type not in ("string", "int", "long"):
        r.problem("target.fanout.field", f"{fo_field!r} is a {f.type_text}; routes match string, int or long values")
    routes = r.required(fo, "routes", "target.fanout")
    if routes is INVALID:
        return INVALID
    if not isinstance(routes, dict) or not routes:
        return r.problem("target.fanout.routes", "must map field values to tables")
    tables: dict[str, Any] = {}
    for value, table in routes.items():
        line = r.line_at("target", "fanout", "routes", value)
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)
                                           and INT64[0] <= value <= INT64[1])):
            r.problem("target.fanout.routes", f"route keys are string or integer field values, got {shown(value)}",
                      line)
            continue
        where = f"target.fanout.routes.{str(value)[:60]}"
        if str(value) in tables:  # 1 and "1" would route the same records
            r.problem(where, f"the value {shown(str(value))} is routed twice", line)
            continue
        tables[str(value)] = r.table(table, where)
    return FanoutSpec(field=fo_field, routes=tables)


def _properties(r: Reader, raw: Any, columns: Columns) -> dict[str, str] | Refused:
    """Iceberg table properties as strings: only those of SPEC_PROPERTIES and SPEC_COLUMN_PROPERTIES (on a
    column of the table), each with a value it takes; records why anything else is refused."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return r.problem("target.properties", "must be a mapping of Iceberg table properties")
    mark = r.mark()
    props: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not PROPERTY_KEY.fullmatch(key):
            r.problem("target.properties", f"{shown(key)} is not a property name: use letters, digits, "
                                           f"'.', '_' and '-', e.g. commit.retry.num-retries",
                      r.line_at("target", "properties", key))
            continue
        where = f"target.properties.{key}"
        refused = refused_property(key)
        if refused is not None:
            r.problem(where, refused)
            continue
        values = SPEC_PROPERTIES.get(key)
        if values is None:
            prefix = next((p for p in SPEC_COLUMN_PROPERTIES if key.startswith(p) and len(key) > len(p)), None)
            if prefix is None:
                known = [*SPEC_PROPERTIES, *(f"{p}<column>" for p in SPEC_COLUMN_PROPERTIES)]
                meant = closest(key, known)
                hint = f" (did you mean {meant}?)" if meant else ""
                r.problem(where, f"is not a table property a spec may set{hint}. A spec sets Iceberg's tuning: "
                                 f"{PROPERTY_FAMILIES}; docs/spec.md lists each")
                continue
            column = key[len(prefix):].split(".")[0]
            if column not in RESERVED_COLUMNS and column not in columns.names and columns.complete \
                    and columns.contract is not INVALID:
                r.problem(where, f"{shown(column)} is not a column of the table: name a contract field (or a field "
                                 f"nested in one, field.child){did_you_mean(column, columns.names)}")
                continue
            values = SPEC_COLUMN_PROPERTIES[prefix]
        if isinstance(value, bool):
            text = "true" if value else "false"  # Iceberg reads booleans in lower case
        elif (isinstance(value, int) and INT64[0] <= value <= INT64[1]) or \
                (isinstance(value, float) and math.isfinite(value)):
            text = str(value)
        elif isinstance(value, str) and len(value) <= MAX_PROPERTY_VALUE:
            text = value
        else:
            r.problem(where, f"must be a string of at most {MAX_PROPERTY_VALUE} characters, a finite (64-bit) "
                             f"number or a boolean, got {shown(value)}")
            continue
        why = values.why_not(text)
        if why is not None:
            r.problem(where, f"{why}, got {shown(value)}")
            continue
        props[key] = text
    return INVALID if r.failed_since(mark) else props


# ------------------------------------------------------------------------------------ the whole file

def parse(path: Path, document: YamlDocument) -> PipelineSpec:
    """The PipelineSpec of spec file `path` read as `document`, checked on its own (not against the
    other files of its folder); raises SpecError holding every mistake of the file."""
    r = Reader(path, document)
    spec = _pipeline(r, path, document.data)
    if r.problems:
        raise SpecError.of(r.problems)
    assert isinstance(spec, PipelineSpec)  # without a problem every value was read
    return spec


def _pipeline(r: Reader, path: Path, raw: Any) -> PipelineSpec | Refused:
    if raw is None or raw == {}:
        return r.problem("(file)", "is empty")
    top = r.mapping(raw, "", SECTION_KEYS[""])
    if top is INVALID:
        return INVALID
    name = r.identifier(r.required(top, "name", ""), "name")
    contract_raw = r.mapping(r.required(top, "contract", ""), "contract", SECTION_KEYS["contract"])
    source = read_source(r, top, path, name)
    derived = None
    if contract_raw is not INVALID and contract_raw.get("from") is not None:
        if r.choice(contract_raw["from"], "contract.from", CONTRACT_SOURCES) is INVALID or source is INVALID:
            derived = INVALID
        else:
            derived = derive_contract(r, name, source)
    columns = read_contract(r, contract_raw, derived)
    if source is not INVALID and ok(source.key_field) and source.key_field is not None:
        f = columns.lookup(r, source.key_field, "source.key.field")
        if f is not INVALID and f.type in (*NESTED_TYPES, "binary"):  # the key is compared as text
            r.problem("source.key.field", f"{source.key_field!r} is a {f.type_text}; the Kafka key is text, "
                                          f"compared with a field of a scalar type")
    target = _target(r, r.mapping(r.required(top, "target", ""), "target", SECTION_KEYS["target"]), source, columns)

    dlq = r.mapping(r.required(top, "dead_letter", ""), "dead_letter", SECTION_KEYS["dead_letter"])
    dead_letter_table = r.table(r.required(dlq, "table", "dead_letter"), "dead_letter.table")

    pol, trig, slo, sup, mnt, ret, pub, ver = (
        r.mapping(top.get(section), section, SECTION_KEYS[section])
        for section in ("schema_policy", "trigger", "slo", "supervision", "maintenance", "retention", "publish",
                        "verify"))
    interval_s = r.duration(r.get(trig, "interval", "5s"), "trigger.interval", positive=True)
    raw_write = r.get(trig, "write_interval")
    write_interval_s = None if raw_write is None else r.duration(raw_write, "trigger.write_interval", positive=True)
    if ok(interval_s, write_interval_s) and write_interval_s is not None:
        if write_interval_s > interval_s:
            r.problem("trigger.write_interval", f"{write_interval_s:g}s is longer than trigger.interval "
                                                f"({interval_s:g}s): files are written at least once per commit")
        mode = top["target"].get("mode", "append") if isinstance(top.get("target"), dict) else "append"
        if mode != "append":
            r.problem("trigger.write_interval", f"applies to append pipelines; target.mode {mode} merges its rows "
                                                f"once per batch (leave write_interval out)")
    orphan_window = r.duration(r.get(mnt, "orphan_safety_window", "3d"), "maintenance.orphan_safety_window")
    if ok(interval_s, orphan_window) and orphan_window < max(3600.0, 100 * interval_s):
        r.problem("maintenance.orphan_safety_window",
                  f"{orphan_window:g}s is too short: files of a commit still in flight would be deleted; "
                  f"use at least 1h and 100 trigger intervals")
    delete_after = r.get(ret, "delete_after")
    if ok(delete_after) and delete_after is not None and columns.timestamp_known is False:
        r.problem("retention.delete_after", "needs a timestamp column in the contract to age rows by")
    view = r.get(pub, "view")
    if ok(view) and view is not None:
        view = r.table(view, "publish.view")
    branch = r.identifier(r.get(pub, "branch", "published"), "publish.branch")
    if branch == "main":
        branch = r.problem("publish.branch", "'main' is the audit branch ingestion commits to; readers need their own")
    candidate_for = top.get("candidate_for")
    if candidate_for is not None:
        candidate_for = r.identifier(candidate_for, "candidate_for", "name the live pipeline")
        if ok(candidate_for) and candidate_for == name:
            r.problem("candidate_for", "a pipeline cannot be a candidate for itself")
    description = r.text(top.get("description"), "description")
    spec = PipelineSpec(
        name=name,
        path=str(path),
        description=description.strip() if ok(description) else INVALID,
        source=source,
        target=target,
        dead_letter_table=dead_letter_table,
        contract=columns.contract,
        schema_policy=INVALID if pol is INVALID else SchemaPolicy(
            on_additive=r.choice(pol.get("on_additive", "evolve"), "schema_policy.on_additive", ADDITIVE_POLICIES),
            on_incompatible=r.choice(pol.get("on_incompatible", "fail"), "schema_policy.on_incompatible",
                                     INCOMPATIBLE_POLICIES),
        ),
        trigger=INVALID if trig is INVALID else TriggerSpec(
            interval_s=interval_s,
            write_interval_s=write_interval_s,
            max_records_per_batch=r.integer(trig.get("max_records_per_batch", 100_000),
                                            "trigger.max_records_per_batch", 1),
            mode=r.choice(trig.get("mode", "continuous"), "trigger.mode", TRIGGER_MODES),
            schedule=r.schedule(trig.get("schedule", "*/5 * * * *"), "trigger.schedule"),
        ),
        slo=INVALID if slo is INVALID else SloSpec(
            freshness_s=r.duration(slo.get("freshness", "60s"), "slo.freshness"),
            lag_records=r.integer(slo.get("lag_records", 100_000), "slo.lag_records", 0),
            lag_s=r.duration(slo.get("lag_seconds", "60s"), "slo.lag_seconds"),
        ),
        supervision=INVALID if sup is INVALID else SupervisionSpec(
            hung_after_triggers=r.integer(sup.get("hung_after_triggers", 12), "supervision.hung_after_triggers", 1),
            restart_backoff_s=r.duration(sup.get("restart_backoff", "10s"), "supervision.restart_backoff"),
            max_restarts=r.integer(sup.get("max_restarts", 5), "supervision.max_restarts", 0),
            retry_budget_s=r.duration(sup.get("retry_budget", "5m"), "supervision.retry_budget", positive=True),
        ),
        maintenance=INVALID if mnt is INVALID else MaintenanceSpec(
            schedule=r.schedule(mnt.get("schedule", "@hourly"), "maintenance.schedule"),
            min_input_files=r.integer(mnt.get("min_input_files", 5), "maintenance.min_input_files", 2),
            orphan_safety_window_s=orphan_window,
        ),
        retention=INVALID if ret is INVALID else RetentionSpec(
            outage_budget_s=r.duration(ret.get("outage_budget", "24h"), "retention.outage_budget", positive=True),
            replay_window_s=r.duration(ret.get("replay_window", "3d"), "retention.replay_window", positive=True),
            delete_after_s=None if delete_after is None
            else r.duration(delete_after, "retention.delete_after", positive=True),
            **_retention_guard(r, ret, source),
        ),
        publish=INVALID if pub is INVALID else PublishSpec(
            branch=branch,
            view=view,
            schedule=r.schedule(pub.get("schedule", "*/10 * * * *"), "publish.schedule"),
            suite=None if pub.get("suite") is None else r.identifier(pub["suite"], "publish.suite"),
            spark_audit_rows=r.integer(pub.get("spark_audit_rows", 1_000_000), "publish.spark_audit_rows"),
        ),
        verify=INVALID if ver is INVALID else VerifySpec(
            schedule=r.schedule(ver.get("schedule", "@hourly"), "verify.schedule")),
        candidate_for=candidate_for,
    )
    _check_own_names(r, spec)
    return spec


def _retention_guard(r: Reader, ret: dict, source: SourceSpec | Refused) -> dict:
    """The retention guard's fields of RetentionSpec from section `retention` (`ret`): `guard_threshold`
    (a duration, or a share of the declared retention such as 50%) and `max_retention` (a duration)."""
    declared = source.retention_ms if source is not INVALID and ok(source.retention_ms) else None
    declared = declared if declared and declared > 0 else None
    fields: dict[str, Any] = {}
    threshold = ret.get("guard_threshold")
    share = _SHARE.fullmatch(threshold) if isinstance(threshold, str) else None
    if share:
        fields["guard_threshold_share"] = float(share.group(1)) / 100
        if not 0 < fields["guard_threshold_share"] < 1:
            r.problem("retention.guard_threshold", f"{shown(threshold)}: a share must be above 0% and below 100%")
    elif threshold is not None:
        fields["guard_threshold_s"] = r.duration(threshold, "retention.guard_threshold", positive=True)
        if ok(fields["guard_threshold_s"]) and declared is not None and fields["guard_threshold_s"] * 1000 >= declared:
            r.problem("retention.guard_threshold",
                      f"{shown(threshold)} is not shorter than source.retention_ms ({declared} ms): the guard "
                      f"would act all the time; use a shorter duration or a share such as 50%")
    cap = ret.get("max_retention")
    if cap is not None:
        seconds = r.duration(cap, "retention.max_retention", positive=True)
        fields["max_retention_ms"] = math.ceil(seconds * 1000) if ok(seconds) else INVALID
        if ok(seconds) and declared is not None and fields["max_retention_ms"] < declared:
            r.problem("retention.max_retention", f"{shown(cap)} is below source.retention_ms ({declared} ms): "
                                                 f"the guard may only raise the topic's retention")
    return fields


def claims(spec: PipelineSpec) -> list[tuple[str, str, str]]:
    """(name, field, what) for every table and view the spec claims, in declaration order; a fan-out
    route to the default table (or to another route's table) claims nothing new. Of a spec being
    checked, the names it could not read are left out."""
    found: list[tuple[str, str, str]] = []
    target = spec.target
    if target is not INVALID and ok(target.table):
        found.append((target.table, "target.table", "data table"))
        if target.fanout is not None and target.fanout is not INVALID:
            for value, table in target.fanout.routes.items():
                if ok(table) and all(name != table for name, _, _ in found):
                    found.append((table, f"target.fanout.routes.{value[:60]}", "data table"))
    data_tables = [name for name, _, _ in found]
    if ok(spec.dead_letter_table):
        found.append((spec.dead_letter_table, "dead_letter.table", "dead-letter table"))
    view = None if spec.publish is INVALID else spec.publish.view
    if view is not None and ok(view) and data_tables:
        found.extend((v, "publish.view", "readers' view")
                     for v in (view, *(fanout_view(view, t) for t in data_tables[1:])))
    return found


def _check_own_names(r: Reader, spec: PipelineSpec) -> None:
    """Record each table or view the spec gives the ops timeline's name, or a name it already gave another."""
    seen: dict[str, tuple[str, str]] = {}
    for name, where, what in claims(spec):
        if name == OPS_TIMELINE_TABLE:
            r.problem(where, f"{name!r} is the platform's ops timeline table; choose another name")
        elif name in seen:
            other_where, other_what = seen[name]
            r.problem(where, f"{name!r} is also a {other_what} of this pipeline ({other_where})")
        else:
            seen[name] = (where, what)
