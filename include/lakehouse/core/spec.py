"""The pipeline spec: declared once in YAML under include/pipelines, read everywhere.

`load_spec(path)` returns one file's validated, immutable `PipelineSpec` or raises `SpecError`
naming, for every mistake of the file, its line, the field and why
(`orders.yaml:14: contract.fields[amount].type: 'strng' is not one of ...; did you mean 'string'?`).
The pipelines folder is read as a whole by `load_specs(directory)`: a `SpecSet` with the valid specs
and, separately, each broken file's error, so one broken file never hides the other pipelines. Across
the folder a table or view has one owner: two specs claiming the same data, dead-letter or fan-out
table or readers' view (or the same pipeline name) are both broken, each error naming the other file.
`load_all` (the valid specs) and `load_pipeline(name)` build on it.

The spec's parts live in modules of their own, and this module names them all for its callers:

    lakehouse.core.vocabulary       the words: types, formats, modes, the keys of each section, the caps
    lakehouse.core.spec_model       the dataclasses a spec becomes (PipelineSpec and its sections)
    lakehouse.core.spec_parse       the checks, every mistake of a file at once, with "did you mean"
    lakehouse.core.spec_contract    the contract's checks (declared fields, or derived from writer schemas)
    lakehouse.core.spec_reader      the reading that records each problem with its line and goes on
    lakehouse.core.spec_properties  the Iceberg table properties a spec may set, and those it may not
    lakehouse.core.spec_schema      the JSON Schema of a spec file, for editors (docs/spec.schema.json)
    lakehouse.core.safe_yaml        the bounded YAML loader that knows each value's line
    lakehouse.core.durations        durations and instants (also the CLI's and the UI's)
    lakehouse.core.naming           names: tables, topics, fields, DAG ids, fan-out views
    lakehouse.core.patterns         contract patterns on RE2
    lakehouse.core.schema_folder    a `source.schemas` folder of writer schemas
    lakehouse.core.errors           PatternError, SpecError, UnknownPipelineError, BrokenSpecsError

Hostile input is bounded: a spec file is at most 1 MiB of plain YAML (no aliases, no duplicate keys,
at most 32 levels deep); names are matched in full (a trailing newline is not part of a name);
durations, sizes and counts are finite and capped (`CAPS`, `DURATION_CAPS_S`, `MAX_DURATION_S`);
`target.properties` is an allow-list of Iceberg's tuning (`SPEC_PROPERTIES`), never where files go,
what may be deleted or code to import (`REFUSED_PROPERTIES` says why); contract patterns run on RE2 in
linear time (`contract_pattern`); the schema folder is read as regular files only, each bounded
(`read_schema_folder`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakehouse.core import config
from lakehouse.core.durations import MAX_DURATION_S, parse_duration, parse_instant, parse_moment
from lakehouse.core.errors import BrokenSpecsError, PatternError, SpecError, UnknownPipelineError
from lakehouse.core.naming import (
    DAG_KINDS,
    FIELD_NAME,
    IDENTIFIER,
    OPS_TIMELINE_TABLE,
    RETENTION_DAG_ID,
    RETENTION_GUARD_DAG_ID,
    SHARED_DAG_IDS,
    TABLE_NAME,
    TABLE_NAME_FORM_PATTERN,
    dag_id,
    fanout_view,
    is_table_name,
)
from lakehouse.core.patterns import MAX_MATCHED_CHARS, MAX_PATTERN_CHARS, contract_pattern
from lakehouse.core.safe_yaml import MAX_SPEC_BYTES, MAX_YAML_DEPTH, YamlDocument, read_yaml_file
from lakehouse.core.schema_folder import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_FILES,
    MAX_SCHEMA_FOLDER_BYTES,
    MAX_SCHEMA_FOLDER_ENTRIES,
    SCHEMA_FILE_TYPES,
    read_schema_folder,
)
from lakehouse.core.spec_model import (
    Contract,
    FanoutSpec,
    FieldSpec,
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
    event_time_column,
)
from lakehouse.core.spec_parse import claims, parse, read_source
from lakehouse.core.spec_properties import (
    MAX_PROPERTY_VALUE,
    PROPERTY_FAMILIES,
    REFUSED_PROPERTIES,
    SPEC_COLUMN_PROPERTIES,
    SPEC_PROPERTIES,
    TARGET_FILE_SIZE_PROPERTY,
    PropertyValues,
    refused_property,
)
from lakehouse.core.spec_reader import Reader
from lakehouse.core.vocabulary import (
    ADDITIVE_POLICIES,
    CAPS,
    CONTRACT_SOURCES,
    DATE_UNITS,
    DURATION_CAPS_S,
    ENVELOPES,
    FAST_PATH_TYPES,
    FIELD_TYPES,
    FORMAT_SCHEMA_TYPES,
    INCOMPATIBLE_POLICIES,
    KEY_FORMATS,
    KEY_TYPES,
    MAX_CONTRACT_DEPTH,
    MAX_DECIMAL_PRECISION,
    MODES,
    NESTED_TYPES,
    PARTITION_SOURCE_TYPES,
    PARTITION_TRANSFORMS,
    PRIMITIVE_TYPES,
    RESERVED_COLUMNS,
    SCHEDULE_PRESETS,
    SPARK_TYPES,
    TIMESTAMP_UNITS,
    TRIGGER_MODES,
    VALUE_FORMATS,
    WIDENINGS,
)

__all__ = [
    # loading (this module)
    "SchemaSource", "SpecSet", "load_all", "load_pipeline", "load_schema_source", "load_spec", "load_specs",
    # errors
    "BrokenSpecsError", "PatternError", "SpecError", "UnknownPipelineError",
    # the model
    "Contract", "FanoutSpec", "FieldSpec", "MaintenanceSpec", "PartitionField", "PipelineSpec", "PublishSpec",
    "RetentionSpec", "SchemaPolicy", "SloSpec", "SourceSpec", "SupervisionSpec", "TargetSpec", "TriggerSpec",
    "VerifySpec", "event_time_column",
    # the vocabulary
    "ADDITIVE_POLICIES", "CAPS", "CONTRACT_SOURCES", "DATE_UNITS", "DURATION_CAPS_S", "ENVELOPES", "FAST_PATH_TYPES",
    "FIELD_TYPES", "FORMAT_SCHEMA_TYPES", "INCOMPATIBLE_POLICIES", "KEY_FORMATS", "KEY_TYPES", "MAX_CONTRACT_DEPTH",
    "MAX_DECIMAL_PRECISION", "MODES", "NESTED_TYPES", "PARTITION_SOURCE_TYPES", "PARTITION_TRANSFORMS",
    "PRIMITIVE_TYPES", "RESERVED_COLUMNS", "SCHEDULE_PRESETS", "SPARK_TYPES", "TIMESTAMP_UNITS", "TRIGGER_MODES",
    "VALUE_FORMATS", "WIDENINGS",
    # table properties
    "MAX_PROPERTY_VALUE", "PROPERTY_FAMILIES", "REFUSED_PROPERTIES", "SPEC_COLUMN_PROPERTIES", "SPEC_PROPERTIES",
    "TARGET_FILE_SIZE_PROPERTY", "PropertyValues", "refused_property",
    # names
    "DAG_KINDS", "FIELD_NAME", "IDENTIFIER", "OPS_TIMELINE_TABLE", "RETENTION_DAG_ID", "RETENTION_GUARD_DAG_ID",
    "SHARED_DAG_IDS", "TABLE_NAME", "TABLE_NAME_FORM_PATTERN", "dag_id", "is_table_name",
    # durations and instants
    "MAX_DURATION_S", "parse_duration", "parse_instant", "parse_moment",
    # YAML, patterns, schema folders
    "MAX_SPEC_BYTES", "MAX_YAML_DEPTH", "MAX_MATCHED_CHARS", "MAX_PATTERN_CHARS", "contract_pattern",
    "MAX_SCHEMA_BYTES", "MAX_SCHEMA_FILES", "MAX_SCHEMA_FOLDER_BYTES", "MAX_SCHEMA_FOLDER_ENTRIES", "SCHEMA_FILE_TYPES",
    "read_schema_folder",
]


def load_spec(path: Path | str) -> PipelineSpec:
    """Load and validate one pipeline spec file on its own (no checks against its siblings).

    Raises SpecError naming the file and, for every mistake it holds, the line, the field and why.
    """
    path = Path(path)
    return parse(path, read_yaml_file(path))


@dataclass(frozen=True)
class SpecSet:
    """The pipelines folder read as a whole: the valid specs, and every broken file's error.

    `specs` maps pipeline names to valid specs, in file order. `errors` maps each broken file's
    path to its SpecError (every mistake of the file: `SpecError.problems`), in path order. `declared`
    maps each broken file's path to the pipeline it declares: its top-level `name` when that is
    readable, else the file's stem.
    """

    directory: Path
    specs: dict[str, PipelineSpec]
    errors: dict[str, SpecError]
    declared: dict[str, str]

    def error_for(self, name: str) -> SpecError | None:
        """The error of a broken file that declares pipeline `name` (by its `name` or its stem), else None."""
        for path, error in self.errors.items():
            if name in (self.declared[path], Path(path).stem):
                return error
        return None

    def raise_errors(self) -> None:
        """Raise BrokenSpecsError listing every mistake of every broken file; return when there is none."""
        if self.errors:
            raise BrokenSpecsError(self.errors)


def _declared_name(raw: Any, path: Path) -> str:
    """The pipeline name a (possibly broken) spec document declares, else the file's stem."""
    name = raw.get("name") if isinstance(raw, dict) else None
    return name if isinstance(name, str) and IDENTIFIER.fullmatch(name) else path.stem


def _conflicts(specs: list[PipelineSpec], documents: dict[str, YamlDocument]) -> dict[str, SpecError]:
    """An error for every spec whose pipeline name, tables or views another spec of `specs` also claims
    (in the same catalog), naming the other file(s): the name alone when two files declare one pipeline,
    else each table and view claimed twice, at its line of `documents` (by path)."""
    problems: dict[str, list[SpecError]] = {}

    def conflict(spec: PipelineSpec, where: str, why: str) -> None:
        problems.setdefault(spec.path, []).append(
            SpecError(spec.path, where, why, documents[spec.path].line_of(where)))

    by_name: dict[str, list[PipelineSpec]] = {}
    for spec in specs:
        by_name.setdefault(spec.name, []).append(spec)
    for name, group in by_name.items():
        for spec in group if len(group) > 1 else ():
            others = ", ".join(o.path for o in group if o is not spec)
            conflict(spec, "name", f"pipeline {name!r} is also declared in {others}; pipeline names must be unique")
    claimed: dict[tuple[str, str], list[tuple[PipelineSpec, str, str]]] = {}
    for spec in specs:
        for name, where, what in claims(spec):
            claimed.setdefault((spec.catalog, name), []).append((spec, where, what))
    named_twice = set(problems)
    tables_twice: dict[str, set[str]] = {}  # by path: the data tables another spec claims too
    for (_, name), claimers in claimed.items():
        for spec, _, what in claimers if len(claimers) > 1 else ():
            if what == "data table":
                tables_twice.setdefault(spec.path, set()).add(name)
    for (_, name), claimers in claimed.items():
        if len(claimers) < 2:
            continue
        for spec, where, what in claimers:
            if spec.path in named_twice or (what == "readers' view" and spec.publish.view is not None and any(
                    name == fanout_view(spec.publish.view, table) for table in tables_twice.get(spec.path, ()))):
                continue  # the same mistake: two files of one pipeline, the view of a fan-out table claimed twice
            others = " and ".join(f"a {what} of pipeline {o.name!r} ({o.path})"
                                  for o, _, what in claimers if o is not spec)
            conflict(spec, where, f"{name!r} is also {others}; a table or view has one owner: give each "
                                  f"pipeline (a candidate too) its own tables and views")
    return {path: SpecError.of(found) for path, found in problems.items()}


def load_specs(directory: Path | str | None = None) -> SpecSet:
    """Every spec file (`*.yaml`, `*.yml`) of the pipelines folder (default: config.pipelines_dir()),
    each validated on its own and then against the others. Never raises for a broken file: its
    error is in the result's `errors`, and its pipeline is not in `specs`."""
    directory = Path(directory) if directory else config.pipelines_dir()
    loaded: dict[str, PipelineSpec] = {}
    documents: dict[str, YamlDocument] = {}
    errors: dict[str, SpecError] = {}
    declared: dict[str, str] = {}
    for path in sorted(directory.glob("*.y*ml")):
        document = None
        try:
            document = read_yaml_file(path)
            loaded[str(path)] = parse(path, document)
            documents[str(path)] = document
        except SpecError as exc:
            errors[str(path)] = exc
            declared[str(path)] = _declared_name(None if document is None else document.data, path)
    for overlapping, error in _conflicts(list(loaded.values()), documents).items():
        errors[overlapping] = error
        declared[overlapping] = loaded.pop(overlapping).name
    return SpecSet(directory=directory, specs={s.name: s for s in loaded.values()},
                   errors=dict(sorted(errors.items())), declared=declared)


def load_all(directory: Path | str | None = None) -> dict[str, PipelineSpec]:
    """Every valid pipeline of the pipelines folder, by name; broken files are left out (see load_specs)."""
    return load_specs(directory).specs


@dataclass(frozen=True)
class SchemaSource:
    """What pulling a pipeline's writer schemas needs of its spec (`lakehouse schemas --pull`), read even
    while the spec does not load because its contract comes from a schema folder that is still empty."""

    name: str
    path: str
    source: SourceSpec


def load_schema_source(name: str, directory: Path | str | None = None) -> SchemaSource:
    """The `source` section of the spec file that declares pipeline `name` (by its `name` or its stem),
    checked as `load_spec` checks it except that its `source.schemas` folder may hold no schema yet.

    Raises SpecError when the file's name or source section is broken, UnknownPipelineError when no
    file declares `name`.
    """
    directory = Path(directory) if directory else config.pipelines_dir()
    for path in sorted(directory.glob("*.y*ml")):
        try:
            document = read_yaml_file(path)
        except SpecError:
            continue
        raw = document.data
        if name not in (_declared_name(raw, path), path.stem):
            continue
        r = Reader(path, document)
        top = r.mapping(raw, "", tuple(raw) if isinstance(raw, dict) else ())
        declared = r.identifier(r.required(top, "name", ""), "name")
        source = read_source(r, top, path, declared, empty_folder=True)
        if r.problems:
            raise SpecError.of(r.problems)
        return SchemaSource(declared, str(path), source)
    known = ", ".join(sorted(load_specs(directory).specs)) or "none"
    raise UnknownPipelineError(f"no pipeline named {name!r} in {directory} (known: {known})")


def load_pipeline(name: str, directory: Path | str | None = None) -> PipelineSpec:
    """The spec of pipeline `name`, valid even when sibling files are broken.

    Raises the SpecError of the file that declares `name` (by its `name` or its stem) when that file
    is broken or overlaps another, else UnknownPipelineError listing the known pipelines.
    """
    found = load_specs(directory)
    if name in found.specs:
        return found.specs[name]
    error = found.error_for(name)
    if error is not None:
        raise error
    known = ", ".join(sorted(found.specs)) or "none"
    raise UnknownPipelineError(f"no pipeline named {name!r} in {found.directory} (known: {known})")
