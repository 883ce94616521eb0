"""The table follows its spec: partitioning evolves, the properties the spec owns are applied, and
what a table cannot follow (write mode, upsert key, a renamed default table) stops with an
explanation. The unit tests drive pyiceberg tables in a private SQLite catalog; the end-to-end tests
change the partitioning of a pipeline under continuous ingestion and check exactly-once, the files'
partition specs, pruning, status and the page.

The unit half; the end-to-end half is tests/e2e/test_table_layout_e2e.py.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from e2e import assert_exactly_once, pipeline, rows, run_cli, send, table  # noqa: F401 - pipeline is a fixture
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.transforms import BucketTransform

from lakehouse.core import errors, events
from lakehouse.core.spec import PartitionField, PipelineSpec, SpecError, load_spec
from lakehouse.core.table_properties import TableProperties
from lakehouse.ingest import committer, tables, upserts
from lakehouse.ingest.layout import ARROW_TYPES, KAFKA_STRUCT


def edit(spec: PipelineSpec, target: dict) -> PipelineSpec:
    """Rewrite `spec`'s file with `target` merged into its target section (None removes a key)."""
    raw = yaml.safe_load(Path(spec.path).read_text())
    for key, value in target.items():
        if value is None:
            raw["target"].pop(key, None)
        else:
            raw["target"][key] = value
    Path(spec.path).write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_spec(spec.path)


# ---------------------------------------------------------------------------- unit: pyiceberg only

@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    home = tmp_path / "home"
    home.mkdir()
    found = SqlCatalog("lake", uri=f"sqlite:///{home}/catalog.db", warehouse=(home / "warehouse").as_uri())
    found.create_namespace("raw")
    return found


def arrow_schema(spec: PipelineSpec) -> pa.Schema:
    return pa.schema([(f.name, ARROW_TYPES[f.type]) for f in spec.contract.fields]
                     + [("_kafka", KAFKA_STRUCT), ("_ingested_at", pa.timestamp("us", tz="UTC"))])


def create_as_ingestion_does(catalog: SqlCatalog, spec: PipelineSpec):
    """The data table as `ensure_tables` creates it (properties, partitioning) and the dead-letter table's
    record of the default table, without Spark."""
    created = catalog.create_table(spec.target.table, schema=arrow_schema(spec),
                                   properties=tables.table_properties(spec))
    with created.update_spec() as update:
        for p in spec.target.partition_by:
            update.add_field(p.column, tables.TRANSFORMS[p.transform](p.arg))
    catalog.create_table(spec.dead_letter_table, schema=pa.schema([("reason", pa.string())]),
                         properties={TableProperties.OWNER: spec.name,
                                     TableProperties.DEFAULT_TABLE: spec.target.table})
    return catalog.load_table(spec.target.table)


def test_each_table_is_created_with_its_exact_properties(make_spec):
    """The data, dead-letter and tombstone tables share the platform's base (format version 2, metadata files
    kept to 50, the owner); the data and dead-letter tables stage their writes and write zstd Parquet; an
    upsert table is merge-on-read; the spec's own properties come last. The ops timeline keeps 20 metadata
    files and merges its manifests."""
    base = {"format-version": "2", "write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": "50"}
    appends = make_spec()
    assert tables.table_properties(appends) == {
        **base, "write.parquet.compression-codec": "zstd", "write.target-file-size-bytes": str(128 * 1024 * 1024),
        "lakehouse.pipeline": appends.name, "write.wap.enabled": "true", "lakehouse.write-mode": "append"}
    upserts = make_spec(mode="upsert", table_key=["order_id"],
                        target={"target_file_size_mb": 64, "properties": {"write.metadata.previous-versions-max": 7,
                                                                          "commit.retry.num-retries": 3}})
    assert tables.table_properties(upserts) == {
        **base, "write.parquet.compression-codec": "zstd", "write.target-file-size-bytes": str(64 * 1024 * 1024),
        "lakehouse.pipeline": upserts.name, "write.wap.enabled": "true", "lakehouse.write-mode": "upsert(order_id)",
        "lakehouse.spec-properties": "commit.retry.num-retries,write.metadata.previous-versions-max",
        "write.merge.mode": "merge-on-read", "write.update.mode": "merge-on-read", "write.delete.mode": "merge-on-read",
        "write.metadata.previous-versions-max": "7", "commit.retry.num-retries": "3"}
    assert tables.dead_letter_properties(upserts) == {
        **base, "write.parquet.compression-codec": "zstd", "lakehouse.pipeline": upserts.name,
        "lakehouse.role": "dead-letter", "write.wap.enabled": "true", "lakehouse.default-table": upserts.target.table}
    assert tables.tombstone_properties(upserts) == {**base, "lakehouse.pipeline": upserts.name,
                                                    "lakehouse.role": "tombstones"}
    assert events.PROPERTIES == {"format-version": "2", "commit.manifest-merge.enabled": "true",
                                 "write.metadata.delete-after-commit.enabled": "true",
                                 "write.metadata.previous-versions-max": "20"}


def test_a_table_created_from_its_spec_follows_it(catalog, make_spec):
    spec = make_spec(partition_by=["day(event_time)"])
    created = create_as_ingestion_does(catalog, spec)
    drift = tables.layout_drift(spec, spec.target.table, created.metadata)
    assert drift.in_sync and not drift.records and drift.describe() == []
    assert drift.partitioning == ("day(event_time)",)
    assert tables.apply_layout(catalog, spec) == []
    assert catalog.load_table(spec.target.table).metadata.default_spec_id == created.metadata.default_spec_id


def test_partitioning_and_properties_follow_an_edited_spec_in_one_commit(catalog, make_spec):
    spec = make_spec(partition_by=["day(event_time)"])
    create_as_ingestion_does(catalog, spec)
    edited = edit(spec, {"partition_by": ["hour(event_time)", "bucket(8, order_id)"], "target_file_size_mb": 64,
                         "properties": {"commit.retry.num-retries": 7, "read.split.target-size": "67108864"}})
    before = catalog.load_table(spec.target.table).metadata
    drift = tables.layout_drift(edited, spec.target.table, before)
    assert set(drift.add_partitions) == {PartitionField("hour", "event_time"), PartitionField("bucket", "order_id", 8)}
    assert drift.drop_partitions == (PartitionField("day", "event_time"),)
    assert drift.set_properties == {"write.target-file-size-bytes": str(64 * 1024 * 1024),
                                    "commit.retry.num-retries": "7", "read.split.target-size": "67108864"}
    assert drift.was["write.target-file-size-bytes"] == str(128 * 1024 * 1024)
    assert drift.was["commit.retry.num-retries"] is None
    seen = []
    applied = tables.apply_layout(catalog, edited, seen.append)
    assert [d.table for d in applied] == [edited.qualified(spec.target.table)] and seen == applied

    after = catalog.load_table(spec.target.table).metadata
    assert len(after.metadata_log) == len(before.metadata_log) + 1  # one metadata commit for all of it
    assert after.default_spec_id == 2 and set(after.specs()) == {0, 1, 2}  # 0 unpartitioned, 1 day, 2 now
    assert {str(f.transform) for f in after.spec().fields} == {"hour", "bucket[8]"}
    assert after.properties["write.target-file-size-bytes"] == str(64 * 1024 * 1024)
    assert after.properties[TableProperties.SPEC_PROPERTIES] == "commit.retry.num-retries,read.split.target-size"
    assert tables.layout_drift(edited, spec.target.table, after).in_sync
    assert tables.apply_layout(catalog, edited) == []  # nothing left to do

    # a key the spec no longer sets is unset; a platform default changed by hand is set back
    trimmed = edit(edited, {"properties": {"read.split.target-size": "67108864"}})
    with catalog.load_table(spec.target.table).transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "snappy", "write.summary.partition-limit": "10"})
    drift = tables.layout_drift(trimmed, spec.target.table, catalog.load_table(spec.target.table).metadata)
    assert drift.unset_properties == ("commit.retry.num-retries",)
    assert drift.set_properties == {"write.parquet.compression-codec": "zstd"}
    assert "property commit.retry.num-retries: unset (no longer in target.properties)" in drift.describe()
    tables.apply_layout(catalog, trimmed)
    props = catalog.load_table(spec.target.table).metadata.properties
    assert "commit.retry.num-retries" not in props and props["write.parquet.compression-codec"] == "zstd"
    assert props["write.summary.partition-limit"] == "10"  # not the spec's: left alone
    assert props[TableProperties.SPEC_PROPERTIES] == "read.split.target-size"


def test_a_table_widened_past_its_contract_still_holds_it(catalog, make_spec):
    """A column a newer writer schema widened (int to long) holds the contract's narrower type as it is:
    a restart whose contract comes from the older schemas only (the registry is down) neither stops nor
    quarantines; a column of another type still does."""
    base = [{"name": "order_id", "type": "string", "required": True},
            {"name": "event_time", "type": "timestamp", "required": True}]
    wide = make_spec(fields=[*base, {"name": "qty", "type": "long"}, {"name": "price", "type": "double"}])
    create_as_ingestion_does(catalog, wide)
    narrow = make_spec(fields=[*base, {"name": "qty", "type": "int"}, {"name": "price", "type": "float"}])
    changes = tables.diff_schema(narrow, wide.target.table, catalog.load_table(wide.target.table).schema())
    assert not changes.incompatible and not changes.added and not changes.widened and not changes.quarantined
    other = make_spec(fields=[*base, {"name": "qty", "type": "string"}, {"name": "price", "type": "double"}])
    changes = tables.diff_schema(other, wide.target.table, catalog.load_table(wide.target.table).schema())
    assert changes.quarantined == {"qty"} and "is long in the table but string in the contract" in changes.incompatible[0]


def test_a_changed_write_mode_or_key_is_refused_before_any_table_changes(catalog, make_spec):
    spec = make_spec(partition_by=["day(event_time)"])
    create_as_ingestion_does(catalog, spec)
    rekeyed = edit(spec, {"mode": "upsert", "key": ["order_id"], "partition_by": ["hour(event_time)"]})
    before = catalog.load_table(spec.target.table).metadata
    with pytest.raises(errors.LayoutChangeRefused) as refused:
        tables.apply_layout(catalog, rekeyed)
    message = str(refused.value)
    assert "was written as append but the spec now says upsert(order_id)" in message
    assert f"candidate_for: {spec.name}" in message and "Put target.mode and target.key back" in message
    after = catalog.load_table(spec.target.table).metadata
    assert after.default_spec_id == before.default_spec_id and after.properties == before.properties
    assert tables.layout_drift(rekeyed, spec.target.table, after).refused  # what status shows


def test_partitioning_by_a_column_the_table_lacks_is_refused(catalog, make_spec):
    spec = make_spec(partition_by=["day(event_time)"])
    create_as_ingestion_does(catalog, spec)
    fields = [*yaml.safe_load(Path(spec.path).read_text())["contract"]["fields"],
              {"name": "region", "type": "string", "required": True}]
    raw = yaml.safe_load(Path(spec.path).read_text())
    raw["contract"]["fields"] = fields
    raw["target"]["partition_by"] = ["day(event_time)", "region"]
    Path(spec.path).write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(errors.LayoutChangeRefused, match="needs column 'region', which the table does not have"):
        tables.apply_layout(catalog, load_spec(spec.path))


def test_a_tables_created_before_the_records_adopt_the_spec_quietly(catalog, make_spec):
    spec = make_spec(partition_by=["day(event_time)"])
    create_as_ingestion_does(catalog, spec)
    with catalog.load_table(spec.target.table).transaction() as tx:
        tx.remove_properties(TableProperties.WRITE_MODE)
    assert tables.apply_layout(catalog, spec) == []  # no drift: only the record is written
    assert catalog.load_table(spec.target.table).metadata.properties[TableProperties.WRITE_MODE] == "append"


def test_a_renamed_default_table_is_refused_while_the_old_one_exists(catalog, make_spec):
    spec = make_spec()
    create_as_ingestion_does(catalog, spec)
    renamed = edit(spec, {"table": spec.target.table + "_v2"})
    with pytest.raises(errors.LayoutChangeRefused) as refused:
        tables.check_default_table(catalog, renamed)
    message = str(refused.value)
    assert message.endswith(tables.recorded_default_table(catalog, renamed)[2])  # what status shows
    assert f"has been writing {spec.target.table}, which still exists" in message
    assert f"ALTER TABLE lake.{spec.target.table} RENAME TO {spec.target.table}_v2" in message
    assert f"candidate_for: {spec.name}" in message
    catalog.rename_table(spec.target.table, renamed.target.table)  # what the message says to do
    tables.check_default_table(catalog, renamed)
    dlq = catalog.load_table(spec.dead_letter_table).metadata.properties
    assert dlq[TableProperties.DEFAULT_TABLE] == renamed.target.table


def written_files(table, batch: pa.Table) -> list:
    """`batch` written as the ingest tasks write it, under `table`'s metadata, with the spec id the job gives
    the files (pyiceberg's writer leaves it unset)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    files = list(_dataframe_to_data_files(table.metadata, batch, table.io))
    for data_file in files:
        data_file.spec_id = table.metadata.default_spec_id
    return files


def test_the_committer_appends_only_files_of_the_tables_current_partition_spec(catalog, make_spec):
    spec = make_spec(partition_by=["day(event_time)"])
    old = create_as_ingestion_does(catalog, spec)
    now = datetime.now(timezone.utc)
    batch = pa.Table.from_pylist([{"order_id": "o-1", "customer_id": "c", "amount": 1.0, "currency": "EUR",
                                   "status": "created", "event_time": now,
                                   "_kafka": {"topic": "t", "partition": 0, "offset": 0, "timestamp": now, "key": "o-1"},
                                   "_ingested_at": now}], schema=arrow_schema(spec))
    files = written_files(old, batch)
    fence = committer.Writer(spec.name, "w", 1).fence(None)
    tables.apply_layout(catalog, edit(spec, {"partition_by": ["hour(event_time)"]}))
    with pytest.raises(ValueError, match="cannot be appended under the table's default spec 2"):
        committer.append_files(catalog, catalog.load_table(spec.target.table), files, {}, fence)
    # files of the current spec, committed on a table loaded before another evolution: the catalog refuses
    current = catalog.load_table(spec.target.table)
    with current.transaction() as tx:
        tx.set_properties({TableProperties.WRITER_ID: "w"})
    current = catalog.load_table(spec.target.table)
    files = written_files(current, batch)
    with catalog.load_table(spec.target.table).update_spec() as update:
        update.add_field("order_id", BucketTransform(4))
    with pytest.raises(CommitFailedException, match="default spec id has changed"):
        committer.append_files(catalog, current, files, {}, fence)


def test_the_spec_declares_the_target_file_size_once(make_spec):
    with pytest.raises(SpecError, match="is target.target_file_size_mb"):
        make_spec(target={"properties": {"write.target-file-size-bytes": 1024}})


def test_an_upsert_batch_of_new_keys_is_appended_as_the_tasks_write_files(catalog, make_spec):
    """The driver writes an upsert batch that holds only new keys as the table's data files (its partition
    spec, one file per bucket), which the committer appends like an append task's."""
    spec = make_spec(partition_by=["bucket(4, order_id)"])
    table = create_as_ingestion_does(catalog, spec)
    with table.transaction() as tx:
        tx.set_properties({TableProperties.WRITER_ID: "w"})
    now = datetime.now(timezone.utc)
    ids = [f"o-{i}" for i in range(40)]
    batch = pa.Table.from_pylist([{"order_id": i, "customer_id": "c", "amount": 1.0, "currency": "EUR",
                                   "status": "created", "event_time": now,
                                   "_kafka": {"topic": "t", "partition": 0, "offset": n, "timestamp": now, "key": i},
                                   "_ingested_at": now} for n, i in enumerate(ids)], schema=arrow_schema(spec))
    loaded = catalog.load_table(spec.target.table)
    assert loaded.metadata.default_spec_id != 0  # a spec id the writer would leave unset

    files = upserts.insert_files(loaded, batch)
    committer.append_files(catalog, loaded, files, {}, committer.Writer(spec.name, "w", 1).fence(None))

    assert {f.spec_id for f in files} == {loaded.metadata.default_spec_id} and len(files) == 4
    landed = catalog.load_table(spec.target.table).scan().to_arrow()
    assert sorted(landed.column("order_id").to_pylist()) == sorted(ids)
    assert upserts.insert_files(loaded, batch.slice(0, 0)) == []


# ---------------------------------------------------------------------------- end to end
