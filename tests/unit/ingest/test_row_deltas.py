"""An upsert batch applied on the driver as a row delta (lakehouse.ingest.row_deltas): batch after batch, the
table holds what the MERGE it replaces would leave (each key's newer record, lakehouse.core.newer), one live row
per key, with position delete files that each name the one data file they delete rows of."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFileContent
from pyiceberg.transforms import BucketTransform

from lakehouse.core.newer import Coordinates, is_newer
from lakehouse.ingest import committer, row_deltas
from lakehouse.ingest.layout import CDC_STRUCT, KAFKA_STRUCT
from lakehouse.ingest.newest import newest_rows
from lakehouse.ingest.upserts import after_ledger, insert_files

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = pa.schema([pa.field("region", pa.string(), nullable=False), pa.field("id", pa.int64(), nullable=False),
                    ("v", pa.int64()), ("_kafka", KAFKA_STRUCT), ("_cdc", CDC_STRUCT)])
KEYS = ["region", "id"]

# an event: (id, is an upsert, partition, Kafka timestamp s, source position or None); offsets follow per partition
EVENTS = st.tuples(st.integers(0, 12), st.booleans(), st.integers(0, 2), st.integers(0, 4),
                   st.one_of(st.none(), st.integers(0, 30)))
BATCHES = st.lists(st.lists(EVENTS, min_size=1, max_size=30), min_size=1, max_size=4)


def staged(events: list[tuple], offsets: dict[int, int], value: int) -> pa.Table:
    rows = []
    for n, (i, upsert, partition, ts, position) in enumerate(events):
        offsets[partition] = offsets.get(partition, -1) + 1
        rows.append({"region": "eu", "id": i, "v": value * 1000 + n,
                     "_kafka": {"topic": "t", "partition": partition, "offset": offsets[partition],
                                "timestamp": EPOCH + timedelta(seconds=ts), "key": None},
                     "_cdc": None if position is None else {"op": "u", "source_ts": None,
                                                            "position": Decimal(position)},
                     "_op": "upsert" if upsert else "delete"})
    return pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("_op", pa.string())))


def coordinates(row: dict) -> Coordinates:
    kafka, cdc = row["_kafka"], row["_cdc"] or {}
    return Coordinates(kafka["partition"], kafka["offset"], kafka["timestamp"], cdc.get("position"),
                       cdc.get("source_ts"))


def merged(model: dict, newest: pa.Table) -> dict:
    """What the MERGE leaves (lakehouse.ingest.upserts.Upserts.merge_latest), written out per key."""
    model = dict(model)
    for s in newest.to_pylist():
        key, t = (s["region"], s["id"]), model.get((s["region"], s["id"]))
        if t is None:
            if s["_op"] == "upsert":
                model[key] = s
        elif is_newer(coordinates(s), coordinates(t), by_source=True):
            if s["_op"] == "upsert":
                model[key] = s
            else:
                del model[key]
    return model


def table_of(tmp_path_factory, partitioned: bool):
    home = tmp_path_factory.mktemp("delta")
    catalog = SqlCatalog("lake", uri=f"sqlite:///{home}/catalog.db", warehouse=(home / "wh").as_uri())
    catalog.create_namespace("raw")
    table = catalog.create_table("raw.rows", schema=SCHEMA, properties={"format-version": "2"})
    if partitioned:
        with table.update_spec() as update:
            update.add_field("id", BucketTransform(3), "id_bucket")
    return catalog


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=BATCHES, partitioned=st.booleans())
def test_batch_after_batch_the_table_holds_what_the_merge_would(tmp_path_factory, batches, partitioned):
    catalog = table_of(tmp_path_factory, partitioned)
    model: dict = {}
    offsets: dict[int, int] = {}
    deleted: list[tuple[str, int]] = []
    for number, events in enumerate(batches):
        table = catalog.load_table("raw.rows")
        newest = newest_rows(staged(events, offsets, number), KEYS)
        delta = row_deltas.plan(table, newest, KEYS)
        deletes = row_deltas.delete_files(table, delta)
        committer.commit_files(table, insert_files(table, delta.inserts), deletes)
        model = merged(model, newest)

        table = catalog.load_table("raw.rows")
        live = table.scan().to_arrow().to_pylist() if table.current_snapshot() else []
        assert sorted((r["id"], r["v"]) for r in live) == sorted((k[1], r["v"]) for k, r in model.items())
        for delete in deletes:  # each names the one data file it deletes rows of, in its partition and spec
            assert delete.content == DataFileContent.POSITION_DELETES
            rows = pq.read_table(delete.file_path.removeprefix("file://"))
            [path] = pc.unique(rows.column("file_path")).to_pylist()
            [target] = [f for f in delta.files if f.file_path == path]
            assert (delete.spec_id, delete.partition) == (target.spec_id, target.partition)
            assert rows.column("pos").to_pylist() == sorted(set(rows.column("pos").to_pylist()))
            assert max(rows.column("pos").to_pylist()) < target.record_count
            deleted += [(path, pos) for pos in rows.column("pos").to_pylist()]
        assert len(deleted) == len(set(deleted))  # a deleted row is not held any more: never deleted again


def test_a_row_deleted_by_an_earlier_batch_is_not_held(tmp_path_factory):
    """After a key's row is deleted, an older record of the key from another partition finds no row: it is
    inserted, as the MERGE inserts it (a change stream's ledger keeps such a key deleted: `after_ledger`)."""
    catalog = table_of(tmp_path_factory, partitioned=False)
    offsets: dict[int, int] = {}
    batches = [[(1, True, 0, 5, None)], [(1, False, 0, 6, None)], [(1, True, 1, 0, None)]]
    for number, events in enumerate(batches):
        table = catalog.load_table("raw.rows")
        delta = row_deltas.plan(table, newest_rows(staged(events, offsets, number), KEYS), KEYS)
        committer.commit_files(table, insert_files(table, delta.inserts), row_deltas.delete_files(table, delta))
    rows = catalog.load_table("raw.rows").scan().to_arrow().to_pylist()
    assert [(r["id"], r["v"], r["_kafka"]["partition"]) for r in rows] == [(1, 2000, 1)]


def test_a_batch_written_again_changes_nothing(tmp_path_factory):
    """A batch committed twice (its commit tried again after it landed) deletes nothing and adds nothing: every
    held row is as new as the batch's."""
    catalog = table_of(tmp_path_factory, partitioned=True)
    newest = newest_rows(staged([(1, True, 0, 0, 5), (2, True, 0, 0, 6), (3, False, 1, 0, 7)], {}, 0), KEYS)
    for _ in range(2):
        table = catalog.load_table("raw.rows")
        delta = row_deltas.plan(table, newest, KEYS)
        committer.commit_files(table, insert_files(table, delta.inserts), row_deltas.delete_files(table, delta))
    table = catalog.load_table("raw.rows")
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2]
    assert len(table.snapshots()) == 1 and delta.inserts.num_rows == 0 and delta.deleted.num_rows == 0


def test_an_update_and_a_delete_land_in_one_overwrite_snapshot(tmp_path_factory):
    catalog = table_of(tmp_path_factory, partitioned=False)
    offsets: dict[int, int] = {}
    batches = [[(1, True, 0, 0, 1), (2, True, 0, 0, 2)], [(1, True, 0, 1, 3), (2, False, 0, 1, 4)]]
    for number, events in enumerate(batches):
        table = catalog.load_table("raw.rows")
        delta = row_deltas.plan(table, newest_rows(staged(events, offsets, number), KEYS), KEYS)
        committer.commit_files(table, insert_files(table, delta.inserts), row_deltas.delete_files(table, delta))
    table = catalog.load_table("raw.rows")
    head = table.current_snapshot()
    assert [s.summary.operation.value for s in table.snapshots()] == ["append", "overwrite"]
    assert head.summary["added-position-deletes"] == "2" and head.summary["added-delete-files"] == "1"
    assert [(r["id"], r["v"]) for r in table.scan().to_arrow().to_pylist()] == [(1, 1000)]


@pytest.mark.parametrize("tombstone_offset, kept", [(0, True), (9, False)])
def test_an_upsert_older_than_its_keys_tombstone_is_left_out(tmp_path_factory, tombstone_offset, kept):
    """The tombstone ledger keeps a deleted key deleted against older records (Kafka's order); deletes pass."""
    home = tmp_path_factory.mktemp("ledger")
    catalog = SqlCatalog("lake", uri=f"sqlite:///{home}/catalog.db", warehouse=(home / "wh").as_uri())
    catalog.create_namespace("raw")
    ledger = catalog.create_table("raw.ledger", schema=pa.schema([
        pa.field("region", pa.string(), nullable=False), pa.field("id", pa.int64(), nullable=False),
        ("_kafka", KAFKA_STRUCT), ("_deleted_at", pa.timestamp("us", tz="UTC"))]))
    ledger.append(pa.Table.from_pylist([{"region": "eu", "id": 1, "_deleted_at": EPOCH, "_kafka": {
        "topic": "t", "partition": 0, "offset": tombstone_offset, "timestamp": EPOCH, "key": None}}],
        schema=ledger.schema().as_arrow()))
    rows = staged([(9, False, 0, 0, None), (1, True, 0, 0, None), (2, True, 0, 0, None)], {0: 0}, 0)
    found = after_ledger(row_deltas.held_rows(catalog.load_table("raw.ledger"), KEYS, rows.select(KEYS)), rows, KEYS)
    assert sorted(found.column("id").to_pylist()) == ([1, 2, 9] if kept else [2, 9])
