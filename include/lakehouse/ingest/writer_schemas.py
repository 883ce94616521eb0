"""Writer schemas, as a reader task sees them: what the ingest job's driver tells its tasks about them
(`WriterSchemas`), and whether the pipeline takes the records of one (`SchemaGate`), asked once per
schema id before its first record is decoded. The schemas themselves are lakehouse.ingest.schema_store's,
how their records decode lakehouse.ingest.wire_decoders'; what a writer schema means for the contract is
lakehouse.core.schemas'.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakehouse.core import errors, schemas
from lakehouse.core.spec import PipelineSpec


@dataclass(frozen=True)
class WriterSchemas:
    """What the ingest job's driver tells reader tasks about writer schemas (lakehouse.ingest.schema_store):
    whether it resolves ids the tasks were not shipped (it has a registry), the ids it evolved the tables
    for or quarantined (SchemaGate), and the ids no registry has (their records are dead letters)."""

    resolvable: bool = False
    accepted: frozenset[int] = frozenset()
    missing: frozenset[int] = frozenset()


class SchemaGate:
    """Whether a pipeline takes the records of a writer schema, asked once per schema id by the wire
    decoders (lakehouse.ingest.wire_decoders) before its first record is decoded.

    A declared contract takes a writer schema whose fields it can read (schemas.conflicts); a contract
    that follows the writer schemas takes one that adds nothing to it (schemas.compare). Otherwise:
    - a compatible change of a followed contract raises SchemaChangeError (the driver evolves the table
      and writes the batch again);
    - an incompatible writer schema under `schema_policy.on_incompatible: fail` raises
      WriterSchemaIncompatibleError (the job stops), under `quarantine` its records are dead-lettered
      as `schema_incompatible` (the returned reason).
    """

    def __init__(self, spec: PipelineSpec, accepted: frozenset[int] = frozenset()):
        self.spec = spec
        self.accepted = accepted  # ids the driver already evolved the table for, or quarantined

    def __call__(self, writer) -> str | None:
        contract = self.spec.contract
        try:
            fields = writer.fields(self.spec.source.envelope)
        except errors.SchemaTranslationError as exc:
            return self._incompatible(writer.schema_id, [str(exc)])
        if not contract.from_writer_schema:
            return self._incompatible(writer.schema_id, schemas.conflicts(contract.fields, fields))
        diff = schemas.compare(contract.fields, fields)
        if diff.incompatible:
            return self._incompatible(writer.schema_id, diff.incompatible)
        if diff.evolves and writer.schema_id not in self.accepted:
            raise errors.SchemaChangeError(
                f"writer schema {writer.schema_id} changes the contract ({diff.changes()[:500]}) "
                f"{errors.task_marker('schema-change', schema_id=writer.schema_id)}")
        return None

    def _incompatible(self, schema_id: int, why: list[str]) -> str | None:
        if not why:
            return None
        reason = f"writer schema {schema_id} does not fit the contract: " + "; ".join(why)[:1500]
        if self.spec.schema_policy.on_incompatible == "quarantine" or schema_id in self.accepted:
            return reason
        raise errors.WriterSchemaIncompatibleError(
            f"{reason}. schema_policy.on_incompatible is 'fail': fix the producer, or set it to 'quarantine' "
            f"to dead-letter its records {errors.task_marker('schema-incompatible', schema_id=schema_id)}")
