"""Each key's newest record of an upsert batch, as the batch applies it (lakehouse.ingest.newest): the order
lakehouse.core.newer defines, on the rows the tasks staged; and which of two records is newer, row by row over
columns (`newer_than`), exactly as lakehouse.core.newer's `is_newer` decides it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO

from lakehouse.core.newer import KAFKA_FIELDS, Coordinates, is_newer
from lakehouse.ingest.layout import CDC_STRUCT, KAFKA_STRUCT
from lakehouse.ingest.newest import COORDINATES, coordinates_of, newer_than, newest_rows
from lakehouse.ingest.taskwriter import write_staging
from lakehouse.ingest.upserts import Upserts

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


# ---------------------------------------------------------------------------- which of two records is newer

# small ranges, so that equal partitions, offsets, timestamps and source positions are frequent, and unknown
# values in any field, though rarely enough that rows where several rules have a say are frequent too
small = st.sampled_from([None, 0, 1, 2, 3])
COORDINATE = st.builds(Coordinates, partition=st.sampled_from([None, 0, 1, 2]), offset=small, timestamp=small,
                       position=small, source_ts=small)
PAIRS = st.lists(st.tuples(COORDINATE, COORDINATE), max_size=60)


def columns(found: list[Coordinates], by_source: bool, split: int = 0) -> dict[str, pa.ChunkedArray]:
    """The coordinates' columns (Kafka's partition an int32, as `_kafka` holds it; the source's only for a
    change stream), each in two chunks split at `split`."""
    names = COORDINATES if by_source else KAFKA_FIELDS
    split = min(split, len(found))
    return {name: pa.chunked_array([pa.array([getattr(c, name) for c in part],
                                             pa.int32() if name == "partition" else pa.int64())
                                    for part in (found[:split], found[split:])])
            for name in names}


def verdicts(pairs: list[tuple[Coordinates, Coordinates]], by_source: bool = False) -> list[bool]:
    """`newer_than` on the pairs' columns: whether each pair's first record is newer than its second."""
    return newer_than(columns([s for s, _ in pairs], by_source),
                      columns([t for _, t in pairs], by_source)).tolist()


@pytest.mark.parametrize("by_source", [False, True], ids=["kafka", "change stream"])
@settings(max_examples=200, deadline=None)  # rows where both source rules have a say are a few in a hundred
@given(pairs=PAIRS, split=st.integers(0, 60))
def test_newer_than_decides_every_row_as_is_newer_does(by_source, pairs, split):
    s = columns([s for s, _ in pairs], by_source, split)
    t = columns([t for _, t in pairs], by_source)  # chunked unlike `s`
    found = newer_than(s, t)
    assert found.dtype == bool and found.shape == (len(pairs),)
    assert found.tolist() == [is_newer(a, b, by_source) for a, b in pairs]


RECORD = st.tuples(st.just("eu"), st.just(1), st.sampled_from([None, 0, 1, 2]), small, small, small, small)


@settings(deadline=None)
@given(st.lists(st.tuples(RECORD, RECORD), max_size=30))
def test_newer_than_decides_staged_rows_by_their_structs_as_is_newer_does(pairs):
    """On `_kafka` and `_cdc` as a batch stages them (timestamps, decimal positions, a null `_cdc` for a
    change without a source position or time)."""
    def coordinates(records):
        rows = staged(records)
        return coordinates_of(rows.column("_kafka"), rows.column("_cdc"))

    def as_coordinates(r: tuple) -> Coordinates:
        return Coordinates(partition=r[2], offset=r[3], timestamp=r[4], position=r[5], source_ts=r[6])

    found = newer_than(coordinates([s for s, _ in pairs]), coordinates([t for _, t in pairs]))
    assert found.tolist() == [is_newer(as_coordinates(s), as_coordinates(t), by_source=True) for s, t in pairs]


def test_a_null_struct_has_every_coordinate_unknown():
    kafka = pa.array([{"topic": "t", "partition": 0, "offset": 5, "timestamp": EPOCH, "key": None}, None],
                     KAFKA_STRUCT)
    cdc = pa.chunked_array([pa.array([None, {"op": "u", "source_ts": EPOCH, "position": Decimal(3)}], CDC_STRUCT)])
    found = coordinates_of(kafka, cdc)
    assert set(found) == set(COORDINATES)
    assert {name: column.to_pylist() for name, column in found.items()} == {
        "partition": [0, None], "offset": [5, None], "timestamp": [EPOCH, None], "position": [None, Decimal(3)],
        "source_ts": [None, EPOCH]}
    assert set(coordinates_of(kafka)) == set(KAFKA_FIELDS)  # no change stream, no source coordinates


def test_in_one_partition_the_higher_offset_wins():
    assert verdicts([(Coordinates(0, 5, 1), Coordinates(0, 4, 9)),  # whatever the Kafka timestamps
                     (Coordinates(0, 4, 9), Coordinates(0, 5, 1)),
                     (Coordinates(0, 4, 9), Coordinates(0, 4, 9))]) == [True, False, False]  # not newer than itself
    # in one partition the source's order does not count
    assert verdicts([(Coordinates(0, 5, 1, 1, 1), Coordinates(0, 4, 9, 9, 9))], by_source=True) == [True]


def test_across_partitions_a_change_streams_later_source_position_wins():
    pairs = [(Coordinates(1, 0, 1, 8, 1), Coordinates(0, 0, 9, 7, 9)),  # whatever the times
             (Coordinates(1, 0, 9, 7, 9), Coordinates(0, 0, 1, 8, 1)),
             (Coordinates(1, 0, 1, 7, 9), Coordinates(0, 0, 9, 7, 1)),  # the same position: the later source time
             (Coordinates(1, 0, 1, 7, 1), Coordinates(0, 0, 9, 7, 1))]  # the same both: the Kafka timestamp
    assert verdicts(pairs, by_source=True) == [True, False, True, False]
    # records that are no change stream's are ordered by their Kafka timestamps alone
    assert verdicts(pairs) == [False, True, False, False]
    only_one_side = newer_than(columns([pairs[0][0]], by_source=True), columns([pairs[0][1]], by_source=False))
    assert only_one_side.tolist() == [False]


def test_across_partitions_a_kafka_timestamp_tie_goes_to_the_incoming_record():
    assert verdicts([(Coordinates(1, 0, 5), Coordinates(0, 9, 5)),
                     (Coordinates(0, 9, 5), Coordinates(1, 0, 5)),  # either way round
                     (Coordinates(1, 0, 4), Coordinates(0, 9, 5)),
                     (Coordinates(1, 0, 6), Coordinates(0, 9, 5))]) == [True, True, False, True]


def test_a_null_decides_nothing():
    assert verdicts([(Coordinates(0, None, 1), Coordinates(0, 4, 1)),  # an unknown offset
                     (Coordinates(0, 4, 1), Coordinates(0, None, 1)),
                     (Coordinates(None, 5, 9), Coordinates(0, 4, 1)),  # an unknown partition
                     (Coordinates(1, 0, None), Coordinates(0, 0, 1)),  # an unknown Kafka timestamp
                     (Coordinates(1, 0, 1), Coordinates(0, 0, None))]) == [False] * 5
    # an unknown source position leaves the decision to the source time, then to the Kafka timestamp
    assert verdicts([(Coordinates(1, 0, 1, None, 9), Coordinates(0, 0, 9, 7, 1)),
                     (Coordinates(1, 0, 9, 8, None), Coordinates(0, 0, 1, None, None)),
                     (Coordinates(1, 0, 1, 8, None), Coordinates(0, 0, 9, None, None))], by_source=True) == [
        True, True, False]


def test_the_tasks_staged_files_become_each_keys_newest_row(make_spec, tmp_path):
    """What an upsert batch applies: one row per key, whatever the tasks staged."""
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

    found = Upserts(None, spec).newest_staged(io, paths)
    assert [(r["region"], r["id"], r["_kafka"]["offset"], r["_op"]) for r in found.rows.to_pylist()] == [
        ("eu", 1, 7, "upsert"), ("eu", 2, 2, "upsert"), ("us", 1, 8, "upsert"), ("us", 2, 3, "delete")]
    assert found.deletes == 1
    assert [(r["region"], r["id"], r["_kafka"]["offset"]) for r in found.tombstones.to_pylist()] == [("us", 2, 3)]
    nothing = Upserts(None, spec).newest_staged(io, [])
    assert (nothing.rows.num_rows, nothing.deletes) == (0, 0)


def test_tombstones_are_kept_in_the_ledger_one_per_key_the_newer_winning_without_spark(make_spec, tmp_path):
    """The batch's deletes become ledger entries (key, coordinates, when applied) without a Spark session: an
    append while the ledger holds none of the batch's keys; later, a key's newer tombstone replaces its entry (a
    row delta) and an older one changes nothing."""
    spec = make_spec(fields=[{"name": "region", "type": "string", "required": True},
                             {"name": "id", "type": "long", "required": True}],
                     mode="upsert", table_key=["region", "id"], partition_by=None, key={"field": None})
    io = PyArrowFileIO()
    write_staging(io, str(tmp_path / "task-0.parquet"), staged(
        [("eu", 1, 0, 1, 0, 1, 0), ("eu", 1, 0, 2, 1, None, None), ("us", 2, 1, 5, 3, None, None),
         ("us", 3, 1, 6, 4, 6, 0)]).drop_columns(["_cdc"]))
    newest = Upserts(None, spec).newest_staged(io, [str(tmp_path / "task-0.parquet")])
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("raw")
    ledger = catalog.create_table("raw.ledger", schema=pa.schema([
        ("region", pa.string()), ("id", pa.int64()), ("_kafka", KAFKA_STRUCT),
        ("_deleted_at", pa.timestamp("us", tz="UTC"))]))
    before = datetime.now(UTC)

    Upserts(None, spec).record_tombstones(ledger, newest.tombstones)

    entries = catalog.load_table("raw.ledger").scan().to_arrow().sort_by("id").to_pylist()
    assert [(e["region"], e["id"], e["_kafka"]["partition"], e["_kafka"]["offset"]) for e in entries] == [
        ("eu", 1, 0, 2), ("us", 2, 1, 5)]
    assert all(before <= e["_deleted_at"] <= datetime.now(UTC) for e in entries)
    assert [s.summary.operation.value for s in catalog.load_table("raw.ledger").snapshots()] == ["append"]

    later = staged([("eu", 1, 0, 9, 1, None, None), ("us", 2, 1, 4, 3, None, None)]).drop_columns(["_cdc"])
    write_staging(io, str(tmp_path / "task-1.parquet"), later)
    newest = Upserts(None, spec).newest_staged(io, [str(tmp_path / "task-1.parquet")])
    Upserts(None, spec).record_tombstones(catalog.load_table("raw.ledger"), newest.tombstones)

    entries = catalog.load_table("raw.ledger").scan().to_arrow().sort_by("id").to_pylist()
    assert [(e["region"], e["id"], e["_kafka"]["partition"], e["_kafka"]["offset"]) for e in entries] == [
        ("eu", 1, 0, 9), ("us", 2, 1, 5)]
    assert [s.summary.operation.value for s in catalog.load_table("raw.ledger").snapshots()] == [
        "append", "overwrite"]
