"""The keys the platform writes into Iceberg: table properties and snapshot summary properties.

One namespace each, like pyiceberg's `TableProperties`: every `lakehouse.*` key the product reads or writes,
and every Iceberg key it names, is spelled here and nowhere else (tests/unit/house/test_one_definition.py
holds this).

- `IcebergProperties`: Iceberg's own table property keys that the platform names (named as Iceberg's Java
  `TableProperties` constants): those it creates its tables with, those maintenance reads (where a table's
  files go, whether Iceberg may delete them) and those a spec may not set because the platform decides them.
  The other Iceberg keys a spec may set are spelled once, as data, in lakehouse.core.spec_properties.
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


class IcebergProperties:
    """Iceberg's table property keys that the platform names, as Iceberg's Java TableProperties names them."""

    FORMAT_VERSION: Final = "format-version"
    PARQUET_COMPRESSION: Final = "write.parquet.compression-codec"
    WRITE_TARGET_FILE_SIZE_BYTES: Final = "write.target-file-size-bytes"
    METADATA_DELETE_AFTER_COMMIT_ENABLED: Final = "write.metadata.delete-after-commit.enabled"
    METADATA_PREVIOUS_VERSIONS_MAX: Final = "write.metadata.previous-versions-max"
    MANIFEST_MERGE_ENABLED: Final = "commit.manifest-merge.enabled"
    WRITE_AUDIT_PUBLISH_ENABLED: Final = "write.wap.enabled"
    # how a row-level write changes a table: copy-on-write or merge-on-read
    MERGE_MODE: Final = "write.merge.mode"
    UPDATE_MODE: Final = "write.update.mode"
    DELETE_MODE: Final = "write.delete.mode"
    # where a table's files go and who may delete them (maintenance reads these before it deletes anything)
    WRITE_DATA_LOCATION: Final = "write.data.path"
    WRITE_METADATA_LOCATION: Final = "write.metadata.path"
    WRITE_FOLDER_STORAGE_LOCATION: Final = "write.folder-storage.path"  # the older name of write.data.path
    OBJECT_STORE_PATH: Final = "write.object-storage.path"
    WRITE_LOCATION_PROVIDER_IMPL: Final = "write.location-provider.impl"  # a Java class
    WRITE_PY_LOCATION_PROVIDER_IMPL: Final = "write.py-location-provider.impl"  # pyiceberg's: a Python class
    GC_ENABLED: Final = "gc.enabled"


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
    STAGING: Final = IcebergProperties.WRITE_AUDIT_PUBLISH_ENABLED
    # Iceberg's: declared in a spec as target.target_file_size_mb
    TARGET_FILE_SIZE: Final = IcebergProperties.WRITE_TARGET_FILE_SIZE_BYTES


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
