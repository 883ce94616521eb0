"""What `lakehouse schemas` shows and pulls: each writer schema of a pipeline (its folder's, and its registry
subjects' versions) with what the contract makes of it (`describe_schemas`), and the registry's versions the
folder lacks written into it (`pull_schemas`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

from lakehouse.core import errors, schemas
from lakehouse.core.errors import SchemaTranslationError
from lakehouse.core.spec import FORMAT_SCHEMA_TYPES, PipelineSpec, SchemaSource
from lakehouse.ingest.schema_store import registry_client, schema_store

log = logging.getLogger("lakehouse.ingest.schema_reports")


@dataclass(frozen=True)
class SchemaReport:
    """One writer schema of a pipeline, as `lakehouse schemas` shows it: where it is and whether the
    contract takes it (`verdict`: fits, evolves, incompatible or untranslatable, with `why`)."""

    schema_id: int
    schema_type: str
    where: str  # folder | registry
    verdict: str
    why: str = ""


def _subjects(spec: PipelineSpec | SchemaSource) -> list[str]:
    """The registry subjects of a pipeline's writer schemas under Confluent's default naming."""
    found = [f"{spec.source.topic}-value"]
    if spec.source.key_format in FORMAT_SCHEMA_TYPES:
        found.append(f"{spec.source.topic}-key")
    return found


def describe_schemas(spec: PipelineSpec, registry: dict | None) -> list[SchemaReport]:
    """Every writer schema of the pipeline (its folder's, and the registry subjects' versions when a registry
    is configured), each with what the contract makes of it. Raises SchemaRegistryUnavailableError."""
    store = schema_store(spec, registry)
    ids = sorted(store.declared)
    if registry is not None:
        ids = sorted({*ids, *(i for subject in _subjects(spec) for i in store.subject_versions(subject))})
    value_type = FORMAT_SCHEMA_TYPES.get(spec.source.value_format)
    found = []
    for schema_id in ids:
        writer = store.resolve(schema_id)
        where = "folder" if schema_id in store.declared else "registry"
        if writer.schema_type != value_type:
            found.append(SchemaReport(schema_id, writer.schema_type, where, "key", "a key schema (or another format)"))
            continue
        try:
            fields = writer.fields(spec.source.envelope)
        except SchemaTranslationError as exc:
            found.append(SchemaReport(schema_id, writer.schema_type, where, "untranslatable", str(exc)))
            continue
        if spec.contract.from_writer_schema:
            diff = schemas.compare(spec.contract.fields, fields)
            if diff.incompatible:
                verdict, why = "incompatible", "; ".join(diff.incompatible)
            elif diff.evolves:
                verdict, why = "evolves", diff.changes()
            else:
                verdict, why = "fits", ""
        else:
            conflicts = schemas.conflicts(spec.contract.fields, fields)
            verdict, why = ("incompatible", "; ".join(conflicts)) if conflicts else ("fits", "")
        found.append(SchemaReport(schema_id, writer.schema_type, where, verdict, why))
    return found


_EXTENSIONS = {"AVRO": ".avsc", "PROTOBUF": ".proto", "JSON": ".json"}


def pull_schemas(spec: PipelineSpec | SchemaSource, registry: dict) -> list[tuple[int, str, str]]:
    """Write every version of the pipeline's registry subjects that its `source.schemas` folder lacks into
    the folder (`<id>.avsc`, `.proto`, `.json`); (id, type, path) of each file written. `spec` may be a
    SchemaSource, the source section of a spec that does not load until its folder holds schemas. A
    Protobuf schema the registry keeps only as descriptors is left out (logged). Raises
    ConfigurationError without a folder, SchemaRegistryUnavailableError when the registry does not answer."""
    from pathlib import Path

    if spec.source.schemas_dir is None:
        raise errors.ConfigurationError(f"{spec.path}: source.schemas names no folder to pull the writer schemas "
                                        f"into; add e.g. `schemas: schemas` under source")
    folder = Path(spec.source.schemas_dir)
    folder.mkdir(parents=True, exist_ok=True)
    store = schema_store(spec, registry)
    client = registry_client(registry)
    written = []
    for subject in _subjects(spec):
        for schema_id in store.subject_versions(subject):
            if schema_id in store.declared:
                continue
            schema = store.ask(schema_id, partial(client.get_schema, schema_id))
            schema_type = schema.schema_type or "AVRO"
            if schema_type == "PROTOBUF":
                try:
                    schemas.compile_proto(schema.schema_str)
                except SchemaTranslationError:
                    log.warning("writer schema %d is kept as descriptors in the registry, not .proto text; not "
                                "pulled (the ingest job fetches it when it meets it)", schema_id)
                    continue
            path = folder / f"{schema_id}{_EXTENSIONS[schema_type]}"
            path.write_text(schema.schema_str, encoding="utf-8")
            written.append((schema_id, schema_type, str(path)))
    return written
