"""Each key's newest record of an upsert batch, as its MERGE applies it (lakehouse.ingest.newest): the order
lakehouse.core.newer defines, on the rows the tasks staged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO

from lakehouse.ingest.layout import CDC_STRUCT, KAFKA_STRUCT
from lakehouse.ingest.newest import newest_rows
from lakehouse.ingest.taskwriter import write_staging
from lakehouse.ingest.upserts import Upserts, ledger_holds, spark_mappable

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def staged(records: list[tuple]) -> pa.Table:
    """Staged rows of records (region, id, partition, offset, timestamp s, position, source_ts s), `_op`
    delete for a change without a source position (a tombstone)."""
    def at(seconds):
        return None if seconds is None else EPOCH + timedelta(seconds=seconds)

    return pa.table({
        "region": pa.array([r[0] for r in records], pa.string()),
        "id": pa.array([r[1] for r in records], pa.int64()),
        "_op": pa.array(["upsert" if r[5] is not None else "delete" for r in records]),
        "_kafka": pa.array([{"topic": "t", "partition": r[2], "offset": r[3], "timestamp": at(r[4]), "key": None}
                            for r in records], KAFKA_STRUCT),
        "_cdc": pa.array([None if r[5] is None and r[6] is None else
                          {"op": "u", "source_ts": at(r[6]), "position": None if r[5] is None else Decimal(r[5])}
                          for r in records], CDC_STRUCT)})


def expected_newest(records: list[tuple]) -> dict[tuple, tuple]:
    """The documented order, written out: in each key's partition the highest offset, a record without a
    source position or time taking those of the record before it there; across partitions the latest source
    position, then source time, then Kafka timestamp, then partition, unknown values last."""
    by_group: dict[tuple, list[tuple]] = {}
    for record in sorted(records, key=lambda r: r[3]):
        by_group.setdefault(((record[0], record[1]), record[2]), []).append(record)
    lasts: dict[tuple, list[tuple]] = {}
    for (key, _), group in by_group.items():
        position = source_ts = None
        for record in group:
            position = record[5] if record[5] is not None else position
            source_ts = record[6] if record[6] is not None else source_ts
        lasts.setdefault(key, []).append((group[-1], position, source_ts))

    def order(item):
        record, position, source_ts = item
        return (position is not None, position or 0, source_ts is not None, source_ts or 0, record[4], record[2])

    return {key: max(items, key=order)[0] for key, items in lasts.items()}


RECORDS = st.lists(st.tuples(st.sampled_from(["eu", "us"]), st.integers(0, 2), st.integers(0, 2),
                             st.integers(0, 40), st.integers(0, 5), st.one_of(st.none(), st.integers(0, 9)),
                             st.one_of(st.none(), st.integers(0, 3))),
                   max_size=40, unique_by=lambda r: (r[2], r[3]))


@given(RECORDS)
def test_each_key_keeps_the_record_the_documented_order_makes_newest(records):
    found = newest_rows(staged(records), ["region", "id"])
    chosen = {(row["region"], row["id"]): (row["_kafka"]["partition"], row["_kafka"]["offset"])
              for row in found.to_pylist()}
    assert found.num_rows == len(chosen)  # one row per key
    assert chosen == {key: (r[2], r[3]) for key, r in expected_newest(records).items()}
    assert found.schema == staged(records).schema  # whole rows, as staged


def test_a_tombstone_after_its_delete_stays_newest_against_an_older_change_from_another_partition():
    # the key's update (position 5) from partition 1 was read in the same batch as partition 0's delete
    # (position 7) and the tombstone after it, which carries no source position of its own
    records = [("eu", 1, 0, 10, 1, 7, 3), ("eu", 1, 0, 11, 1, None, None), ("eu", 1, 1, 3, 4, 5, 2)]
    found = newest_rows(staged(records), ["region", "id"]).to_pylist()
    assert [(r["_kafka"]["partition"], r["_kafka"]["offset"], r["_op"]) for r in found] == [(0, 11, "delete")]


def test_rows_whose_key_has_a_null_are_one_key():
    rows = staged([("eu", 1, 0, 1, 0, 1, 0), ("eu", 1, 0, 2, 0, 2, 0), ("us", 2, 0, 3, 0, 3, 0)])
    rows = rows.set_column(0, "region", pa.array([None, None, "us"], pa.string()))
    found = newest_rows(rows, ["region", "id"]).to_pylist()
    assert [(r["region"], r["_kafka"]["offset"]) for r in found] == [("us", 3), (None, 2)]


def test_the_tasks_staged_files_become_one_file_of_each_keys_newest_row(make_spec, tmp_path):
    """What an upsert batch's MERGE reads: one staging file, whatever the tasks staged."""
    spec = make_spec(fields=[{"name": "region", "type": "string", "required": True},
                             {"name": "id", "type": "long", "required": True}],
                     mode="upsert", table_key=["region", "id"], partition_by=None, key={"field": None})
    io = PyArrowFileIO()
    # ("us", 2) is deleted last; ("eu", 2)'s delete in another partition is older by Kafka timestamp
    records = [("eu", 1, 0, 1, 0, 1, 0), ("eu", 2, 0, 2, 5, 2, 0), ("us", 2, 0, 3, 0, None, None),
               ("eu", 1, 1, 7, 9, 3, 0), ("us", 1, 1, 8, 0, 4, 0), ("eu", 2, 1, 1, 0, None, None)]
    paths = []
    for task, share in enumerate((records[:3], records[3:])):
        paths.append(str(tmp_path / f"task-{task}.parquet"))
        write_staging(io, paths[-1], staged(share).drop_columns(["_cdc"]))

    found = Upserts(None, spec).newest_staged(io, paths, "batch-7")
    assert found.paths == [str(tmp_path / "batch-7-newest.parquet")]
    rows = pq.read_table(found.path).to_pylist()
    assert [(r["region"], r["id"], r["_kafka"]["offset"], r["_op"]) for r in rows] == [
        ("eu", 1, 7, "upsert"), ("eu", 2, 2, "upsert"), ("us", 1, 8, "upsert"), ("us", 2, 3, "delete")]
    assert found.deletes == 1
    nothing = Upserts(None, spec).newest_staged(io, [], "batch-8")
    assert (nothing.paths, nothing.deletes) == ([], 0)
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == [
        "batch-7-newest.parquet", "task-0.parquet", "task-1.parquet"]


def test_tombstones_of_keys_the_ledger_does_not_hold_are_appended_without_spark(make_spec, tmp_path):
    """The batch's deletes become ledger entries (key, coordinates, when applied) in one pyiceberg append: no
    Spark session is given, and none is needed while the ledger holds none of the batch's keys."""
    spec = make_spec(fields=[{"name": "region", "type": "string", "required": True},
                             {"name": "id", "type": "long", "required": True}],
                     mode="upsert", table_key=["region", "id"], partition_by=None, key={"field": None})
    io = PyArrowFileIO()
    write_staging(io, str(tmp_path / "task-0.parquet"), staged(
        [("eu", 1, 0, 1, 0, 1, 0), ("eu", 1, 0, 2, 1, None, None), ("us", 2, 1, 5, 3, None, None),
         ("us", 3, 1, 6, 4, 6, 0)]).drop_columns(["_cdc"]))
    newest = Upserts(None, spec).newest_staged(io, [str(tmp_path / "task-0.parquet")], "batch-1")
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("raw")
    ledger = catalog.create_table("raw.ledger", schema=pa.schema([
        ("region", pa.string()), ("id", pa.int64()), ("_kafka", KAFKA_STRUCT),
        ("_deleted_at", pa.timestamp("us", tz="UTC"))]))
    before = datetime.now(UTC)

    Upserts(None, spec).record_tombstones(ledger, newest.tombstones, latest=None)

    entries = catalog.load_table("raw.ledger").scan().to_arrow().sort_by("id").to_pylist()
    assert [(e["region"], e["id"], e["_kafka"]["partition"], e["_kafka"]["offset"]) for e in entries] == [
        ("eu", 1, 0, 2), ("us", 2, 1, 5)]
    assert all(before <= e["_deleted_at"] <= datetime.now(UTC) for e in entries)
    assert [s.summary.operation.value for s in catalog.load_table("raw.ledger").snapshots()] == ["append"]


@settings(max_examples=25, deadline=None)
@given(held=st.lists(st.sets(st.integers(0, 400), max_size=60), min_size=1, max_size=3),
       batch=st.sets(st.integers(0, 400), min_size=1, max_size=300), region=st.sampled_from(["eu", None]))
def test_the_ledger_is_asked_whether_it_holds_any_of_a_batchs_keys(tmp_path_factory, held, batch, region):
    """Whatever the keys' spread over the ledger's files (its bounds let a scan skip files for up to 200
    values of a column), the answer is whether the ledger holds one of the batch's keys; a key with a null
    column never matches, as in the MERGE's join."""
    home = tmp_path_factory.mktemp("ledger")
    catalog = SqlCatalog("lake", uri=f"sqlite:///{home}/catalog.db", warehouse=(home / "wh").as_uri())
    catalog.create_namespace("raw")
    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("_kafka", KAFKA_STRUCT),
                        ("_deleted_at", pa.timestamp("us", tz="UTC"))])
    ledger = catalog.create_table("raw.ledger", schema=schema)

    def entries(ids, region_of) -> pa.Table:
        ids = sorted(ids)
        return pa.table({"region": pa.array([region_of] * len(ids), pa.string()), "id": pa.array(ids, pa.int64()),
                         "_kafka": pa.array([None] * len(ids), KAFKA_STRUCT),
                         "_deleted_at": pa.array([EPOCH] * len(ids), pa.timestamp("us", tz="UTC"))}, schema=schema)

    for ids in held:  # one file each
        if ids:
            ledger.append(entries(ids, "eu"))
    ledger = catalog.load_table("raw.ledger")
    expected = region == "eu" and bool(set().union(*held) & batch)
    assert ledger_holds(ledger, entries(batch, region), ["region", "id"]) == expected


def _type_pairs(leaf):
    """Arrow types as a staging file may hold them (64-bit-offset kinds among them) beside their 32-bit kin."""
    def nest(children):
        return st.one_of(
            st.tuples(children, st.booleans()).map(
                lambda c: ((pa.large_list if c[1] else pa.list_)(c[0][0]), pa.list_(c[0][1]))),
            st.lists(children, min_size=1, max_size=3).map(
                lambda cs: (pa.struct([(f"f{i}", c[0]) for i, c in enumerate(cs)]),
                            pa.struct([(f"f{i}", c[1]) for i, c in enumerate(cs)]))),
            st.tuples(children).map(lambda c: (pa.map_(pa.large_string(), c[0][0]), pa.map_(pa.string(), c[0][1]))))
    return st.recursive(leaf, nest, max_leaves=6)


LEAVES = st.sampled_from([(pa.large_string(), pa.string()), (pa.string(), pa.string()),
                          (pa.large_binary(), pa.binary()), (pa.int64(), pa.int64()),
                          (pa.decimal128(38, 9), pa.decimal128(38, 9)),
                          (pa.timestamp("us", "UTC"), pa.timestamp("us", "UTC"))])


@settings(max_examples=60, deadline=None)
@given(st.lists(_type_pairs(LEAVES), min_size=1, max_size=4))
def test_spark_is_given_every_staged_type_as_its_32_bit_kin_maps(pairs):
    from pyspark.sql.pandas.types import from_arrow_schema

    staged = pa.schema([(f"c{i}", large) for i, (large, _) in enumerate(pairs)])
    kin = pa.schema([(f"c{i}", plain) for i, (_, plain) in enumerate(pairs)])
    assert spark_mappable(staged) == kin
    assert from_arrow_schema(spark_mappable(staged)) == from_arrow_schema(kin)


KEY_SCHEMA = pa.schema([("region", pa.string()), ("id", pa.int64()), ("_kafka", KAFKA_STRUCT),
                        ("_deleted_at", pa.timestamp("us", tz="UTC"))])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # one spec
@given(in_table=st.sets(st.integers(0, 30), max_size=20), gone=st.sets(st.integers(0, 30), max_size=5),
       in_ledger=st.sets(st.integers(0, 30), max_size=10),
       batch=st.dictionaries(st.integers(0, 30), st.booleans(), min_size=1, max_size=25))
def test_a_batch_into_a_table_without_rows_is_appended_unless_the_ledger_holds_its_keys(
        make_spec, tmp_path_factory, in_table, gone, in_ledger, batch):
    """A batch into a table without rows (none written, or every one deleted), none of whose upserts' keys
    the ledger holds, is inserts: its upserts are appended without the MERGE, its deletes kept in the file
    for the ledger. Any other batch is merged whole."""
    home = tmp_path_factory.mktemp("split")
    spec = make_spec(fields=[{"name": "region", "type": "string", "required": True},
                             {"name": "id", "type": "long", "required": True}],
                     mode="upsert", table_key=["region", "id"], partition_by=None, key={"field": None})
    catalog = SqlCatalog("lake", uri=f"sqlite:///{home}/catalog.db", warehouse=(home / "wh").as_uri())
    catalog.create_namespace("raw")

    def keyed(ids) -> pa.Table:
        ids = sorted(ids)
        return pa.table({"region": pa.array(["eu"] * len(ids)), "id": pa.array(ids, pa.int64()),
                         "_kafka": pa.array([None] * len(ids), KAFKA_STRUCT),
                         "_deleted_at": pa.array([EPOCH] * len(ids), pa.timestamp("us", tz="UTC"))},
                        schema=KEY_SCHEMA)

    table = catalog.create_table("raw.rows", schema=KEY_SCHEMA)
    ledger = catalog.create_table("raw.ledger", schema=KEY_SCHEMA)
    if in_table:
        table.append(keyed(in_table))
        for i in gone & in_table:
            catalog.load_table("raw.rows").delete(f"id = {i}")
    if in_ledger:
        ledger.append(keyed(in_ledger))
    io = PyArrowFileIO()
    path = str(home / "task-0.parquet")
    # (region, id, partition, offset, timestamp, position, source_ts): a position for an upsert, none for a delete
    write_staging(io, path, staged([("eu", i, 0, n, 0, n if upsert else None, None)
                                    for n, (i, upsert) in enumerate(sorted(batch.items()))]).drop_columns(["_cdc"]))

    found = Upserts(None, spec).newest_staged(io, [path], "batch-1", table=catalog.load_table("raw.rows"),
                                              ledger=catalog.load_table("raw.ledger"))

    merges = bool(in_table - gone) or any(upsert and i in in_ledger for i, upsert in batch.items())
    fresh = [] if merges else sorted(i for i, upsert in batch.items() if upsert)
    staged_ids = sorted(i for i, upsert in batch.items() if merges or not upsert)
    assert found.merges == merges
    assert sorted(found.fresh.column("id").to_pylist() if fresh else []) == fresh
    assert "_op" not in found.fresh.column_names
    assert sorted(pq.read_table(found.path).column("id").to_pylist() if found.path else []) == staged_ids
    assert found.deletes == sum(not upsert for upsert in batch.values())
