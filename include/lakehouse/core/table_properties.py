"""The keys the platform writes into Iceberg: table properties and snapshot summary properties.

One namespace each, like pyiceberg's `TableProperties`: every `lakehouse.*` key the product reads or writes
is spelled here and nowhere else (tests/test_one_definition.py holds this).

- `TableProperties`: properties of a table. The platform's records (`lakehouse.*`: the owning pipeline, the
  table's role, its write mode, the keys the spec set, the default table, the writer's claim) and the Iceberg
  properties whose value the platform decides (write-audit-publish staging, the target file size).
- `SnapshotSummary`: properties of an ingest, replay or retention commit's snapshot summary (`lakehouse.*`):
  the pipeline, the kind of commit, the topic, the offsets it holds and the positions after it
  (lakehouse.core.offsets reads and writes them).

`lakehouse.pipeline` is both: a table's owner and a commit's pipeline, one string in two namespaces.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "lakehouse."  # the platform's family of keys: a spec may not set one (spec_properties)


class TableProperties:
    """Iceberg table property keys the platform reads and writes."""

    PREFIX: Final = PREFIX
    OWNER: Final = PREFIX + "pipeline"  # the pipeline that created the table; ensure_tables refuses another's
    ROLE: Final = PREFIX + "role"  # "dead-letter" or "tombstones"; a data table has none
    ROLE_DEAD_LETTER: Final = "dead-letter"
    ROLE_TOMBSTONES: Final = "tombstones"
    # what a data table was written as: "append" or "upsert(key, ...)"; a table cannot change it in place
    WRITE_MODE: Final = PREFIX + "write-mode"
    # the keys `target.properties` set at the last layout, comma-separated: a key the spec drops is unset
    SPEC_PROPERTIES: Final = PREFIX + "spec-properties"
    # on the dead-letter table: the default data table the pipeline writes (a renamed target.table is refused)
    DEFAULT_TABLE: Final = PREFIX + "default-table"
    # the ingest job instance that holds the table (lakehouse.ingest.committer.Writer): its id, the epoch of
    # its claim (compare-and-set on every commit) and, for people, its host, pid and home
    WRITER_ID: Final = PREFIX + "writer.id"
    WRITER_EPOCH: Final = PREFIX + "writer.epoch"
    WRITER_INFO: Final = PREFIX + "writer.info"
    # Iceberg's: Spark stages writes that carry spark.wap.id (see sparkenv.staged)
    STAGING: Final = "write.wap.enabled"
    # Iceberg's: declared in a spec as target.target_file_size_mb
    TARGET_FILE_SIZE: Final = "write.target-file-size-bytes"


class SnapshotSummary:
    """Snapshot summary keys of the platform's commits (lakehouse.core.offsets reads them back)."""

    PREFIX: Final = PREFIX
    PIPELINE: Final = PREFIX + "pipeline"
    KIND: Final = PREFIX + "kind"  # ingest | replay | dead-letter-replay | retention
    TOPIC: Final = PREFIX + "topic"
    TOPIC_ID: Final = PREFIX + "topic-id"
    RANGES: Final = PREFIX + "offsets"  # {"partition": [start, end)} contained in this commit
    POSITIONS: Final = PREFIX + "positions"  # {"partition": next offset} after this commit (ingest only)
    BATCH: Final = PREFIX + "batch-id"
    MAX_EVENT_TIME: Final = PREFIX + "max-event-time"
    GAPS: Final = PREFIX + "gaps"  # {"partition": [start, end)} aged out of Kafka before ingestion
    MIN_KAFKA_TIME: Final = PREFIX + "min-kafka-time"  # oldest Kafka timestamp read by the batch (ingest only)
    WRITER: Final = PREFIX + "writer"  # the ingest job instance that made the commit (see committer.Writer)
    RETENTION_RUN: Final = PREFIX + "retention-run"  # the data-retention run a delete commit belongs to
