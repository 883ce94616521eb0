"""The writer schemas an ingest job's driver follows, for a pipeline in a wire format (Avro, Protobuf, JSON Schema).

Only the driver talks to the schema registry. At start it fetches every version of the topic's subjects, so
that tasks rarely meet an id they were not shipped (`prefetch`); reader tasks get the schemas it resolved with
the spec (`task_spec`) and what it knows beyond them (`writer_schemas`). A task that meets an id it was not
shipped, or a compatible change of a contract that follows the writer schemas, stops with a marker; the
driver acts on it (`act_on`) and the batch is written again. Evolving the tables is the job's: a follower
only says which contract the tables must now follow (`Evolution`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from lakehouse.core import errors, schemas
from lakehouse.core.schemas import SchemaDiff
from lakehouse.core.spec import FORMAT_SCHEMA_TYPES, PipelineSpec
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.schema_store import schema_store
from lakehouse.ingest.writer_schemas import WriterSchemas

log = logging.getLogger("lakehouse.ingest")


@dataclass(frozen=True)
class Evolution:
    """Writer schema `schema_id` changes the contract: the tables must follow `spec`, by `diff`."""

    schema_id: int
    spec: PipelineSpec
    diff: SchemaDiff

    def describe(self) -> str:
        return "; ".join(f"{what} {', '.join(paths)}" for what, paths in
                         (("added", self.diff.added), ("widened", self.diff.widened),
                          ("now optional", self.diff.relaxed)) if paths)


class SchemaFollower:
    """The writer schemas of one pipeline as its driver knows them: `registry` is the platform's schema
    registry settings (None: none configured)."""

    def __init__(self, spec: PipelineSpec, registry: dict | None):
        self.store = schema_store(spec, registry) if spec.wire_formats else None
        self.accepted: dict[int, tuple] = {}  # id -> fields: the tables were evolved for it
        self.resolved: dict[int, tuple[int, str, str]] = {}  # ids fetched from the registry, as shipped
        self.missing: set[int] = set()  # ids the registry does not have

    def reload(self, spec: PipelineSpec, registry: dict | None) -> None:
        """Follow an edited `spec`: the folder's writer schemas as they are now."""
        if spec.wire_formats:
            self.store = schema_store(spec, registry)

    def prefetch(self, spec: PipelineSpec) -> PipelineSpec:
        """Fetch every version of the topic's subjects (`<topic>-value`, `<topic>-key`: Confluent's default
        naming) from the registry; a contract that follows the writer schemas takes the compatible ones now
        (returned: `spec` with them). A registry that does not answer is logged: the ids are fetched when met."""
        store = self.store
        if store is None or store.registry is None:
            return spec
        subjects = [(f"{spec.source.topic}-value", True)]
        if spec.source.key_format in FORMAT_SCHEMA_TYPES:
            subjects.append((f"{spec.source.topic}-key", False))
        for subject, values in subjects:
            try:
                ids = store.subject_versions(subject)
            except errors.SchemaRegistryUnavailableError as exc:
                log.warning("pipeline %s: %s; writer schemas are fetched when the tasks meet them", spec.name, exc)
                return spec
            for schema_id in ids:
                self.ship(schema_id)
                if values and spec.contract.from_writer_schema:
                    spec = self.accept_if_compatible(spec, schema_id)
        return spec

    def ship(self, schema_id: int) -> None:
        """Send writer schema `schema_id` (resolved from the registry) to the tasks from now on."""
        if self.store is not None and schema_id not in self.store.declared:
            self.resolved[schema_id] = self.store.shipped(schema_id)

    def accept_if_compatible(self, spec: PipelineSpec, schema_id: int) -> PipelineSpec:
        """`spec` following writer schema `schema_id` too when its contract can (else `spec`)."""
        if self.store is None:
            return spec
        writer = self.store.resolve(schema_id)
        if writer.schema_type != FORMAT_SCHEMA_TYPES[spec.source.value_format]:
            return spec
        try:
            found = writer.fields(spec.source.envelope)
        except errors.SchemaTranslationError:
            return spec  # met in a record, it follows schema_policy then
        diff = schemas.compare(spec.contract.fields, found)
        if diff.incompatible or (diff.added and spec.schema_policy.on_additive == "fail"):
            return spec
        self.accepted[schema_id] = found
        return self.with_accepted(spec)

    def with_accepted(self, spec: PipelineSpec) -> PipelineSpec:
        """`spec` whose contract follows the writer schemas, with the writer schemas the tables were already
        evolved for merged in (a reloaded spec derives its contract from the folder only)."""
        if not spec.contract.from_writer_schema or not self.accepted:
            return spec
        fields = spec.contract.fields
        for found in self.accepted.values():
            fields = schemas.merge(fields, found)
        return replace(spec, contract=replace(spec.contract, fields=fields))

    def task_spec(self, spec: PipelineSpec) -> PipelineSpec:
        """`spec` as reader tasks get it: with the writer schemas the driver fetched from the registry."""
        if not self.resolved:
            return spec
        shipped = (*spec.source.schemas, *(self.resolved[i] for i in sorted(self.resolved)))
        return replace(spec, source=replace(spec.source, schemas=shipped))

    def writer_schemas(self) -> WriterSchemas:
        """What reader tasks are told of writer schemas beyond those shipped (lakehouse.ingest.writer_schemas)."""
        return WriterSchemas(resolvable=self.store is not None and self.store.registry is not None,
                             accepted=frozenset(self.accepted), missing=frozenset(self.missing))

    def evolve_for(self, spec: PipelineSpec, schema_id: int) -> Evolution:
        """The contract following writer schema `schema_id`, which a task met first: its fields added, its
        types widened (schema_policy.on_additive 'fail' refuses new fields: SchemaIncompatibleError)."""
        if self.store is None:
            raise errors.ConfigurationError(f"{spec.path}: writer schema {schema_id} met without writer schemas")
        found = self.store.resolve(schema_id).fields(spec.source.envelope)
        diff = schemas.compare(spec.contract.fields, found)
        if diff.added and spec.schema_policy.on_additive == "fail":
            raise errors.SchemaIncompatibleError(
                f"{spec.path}: writer schema {schema_id} adds {', '.join(diff.added)} and "
                f"schema_policy.on_additive is 'fail'; set it to 'evolve' to add them to the tables")
        self.accepted[schema_id] = found
        return Evolution(schema_id, self.with_accepted(spec), diff)

    def act_on(self, spec: PipelineSpec, text: str) -> tuple[bool, Evolution | None]:
        """Act on what a reader task reported of a writer schema (`text`, the message of its error with a
        marker): an id it was not shipped (`schema-unknown`) is fetched from the registry, or recorded as
        missing; a compatible change of a contract that follows the writer schemas (`schema-change`) is an
        Evolution for the tables to follow. Returns whether the batch should be written again, and the
        evolution if any. A writer schema that does not fit under schema_policy 'fail'
        (`schema-incompatible`) raises WriterSchemaIncompatibleError."""
        failed = errors.marker_in(text)
        if failed is None:
            return False, None
        kind, where = failed
        if kind == "schema-incompatible":
            raise errors.WriterSchemaIncompatibleError(text.split(" [lakehouse:")[0]) from None
        store = self.store
        if kind not in ("schema-change", "schema-unknown") or store is None:
            return False, None
        schema_id = int(where["schema_id"])
        if kind == "schema-unknown":
            if schema_id in self.resolved or schema_id in self.missing:
                return False, None  # shipping it did not help: the failure is something else
            try:
                store.resolve(schema_id)  # SchemaRegistryUnavailableError: retried by the job's batch
            except Rejected as rejected:
                log.warning("pipeline %s: %s; its records are dead letters", spec.name, rejected.detail)
                self.missing.add(schema_id)
                return True, None
            self.ship(schema_id)
            return True, None
        if schema_id in self.accepted:
            return False, None  # evolving did not help: the failure is something else
        return True, self.evolve_for(spec, schema_id)
