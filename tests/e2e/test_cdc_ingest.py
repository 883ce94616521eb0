"""A Debezium change stream applied to an upsert table on the real broker, Spark and catalog: the snapshot
phase, creates, updates, deletes with their tombstones and re-created keys end in exactly the source's
final state, the events that are not row changes are dead letters, and a kill -9 at any point of a batch
neither loses nor re-applies a change (JSON and Avro change events)."""

from __future__ import annotations

import json
import signal
import time
from decimal import Decimal
from random import Random

import pytest
from tests.unit.ingest.test_cdc import FIELDS, avro_cdc_spec, avro_change, event, key, row

from e2e import (  # noqa: F401 (fixture)
    FORMAT_KILL_POINTS,
    KILL_POINTS,
    killed_at_every_point_then_resumed,
    lakehouse,
    log_ends,
    pipeline,
    rows,
    run_cli,
    send,
    summaries,
    table,
)
from lakehouse.core import offsets
from lakehouse.core.table_properties import SnapshotSummary

pytestmark = pytest.mark.slow


def change_stream(keys: int, changes: int, seed: int = 3) -> tuple[list[tuple[bytes, bytes | None]], dict, int]:
    """A source table's life as Debezium writes it: a snapshot of `keys` rows (op r), then `changes` random
    creates, updates and deletes (each delete followed by its tombstone), one broken event in fifty.
    Returns the records, the table's final state {id: (email, balance)} and the count of broken events."""
    rng = Random(seed)
    state: dict[int, dict] = {}
    records: list[tuple[bytes, bytes | None]] = []
    lsn = 1000
    broken = 0

    def row(i: int) -> dict:
        return {"id": i, "email": f"user{i}-{rng.randrange(1000)}@shop.test", "balance": f"{rng.randrange(10**6)}.25",
                "updated_at": 1_764_000_000_000_000 + lsn}

    for i in range(keys):
        lsn += 1
        state[i] = row(i)
        records.append((key(i), event("r", None, state[i], lsn=lsn, snapshot="true" if i < keys - 1 else "last")))
    next_id = keys
    for n in range(changes):
        lsn += 1
        if n % 50 == 49:
            broken += 1
            records.append((key(0), event("t", None, None, lsn=lsn)))  # a truncate: dead-lettered, not applied
            continue
        choice = rng.random()
        if choice < 0.25 or not state:
            i = next_id if rng.random() < 0.7 or not state else rng.choice(sorted(set(range(next_id)) - set(state))
                                                                            or [next_id])
            next_id = max(next_id, i + 1)
            state[i] = row(i)
            records.append((key(i), event("c", None, state[i], lsn=lsn, wrapped=rng.random() < 0.3)))
        elif choice < 0.8:
            i = rng.choice(sorted(state))
            before, state[i] = state[i], row(i)
            records.append((key(i), event("u", before, state[i], lsn=lsn)))
        else:
            i = rng.choice(sorted(state))
            records.append((key(i), event("d", state.pop(i), None, lsn=lsn)))
            records.append((key(i), None))  # the tombstone that lets Kafka compact the key away
    final = {i: (r["email"], Decimal(r["balance"])) for i, r in state.items()}
    return records, final, broken


def cdc_pipeline(pipeline, partitions: int = 2):
    return pipeline(fields=FIELDS, mode="cdc", table_key=["id"], partition_by=None, publish={"view": None},
                    source={"key": {"field": None}, "partitions": partitions})


def send_by_key(platform, spec, records):
    """Each key's changes to one partition, in order (Debezium keys by the primary key)."""
    partitions = spec.source.partitions
    for p in range(partitions):
        mine = [(k, v) for k, v in records if json.loads(k)["id"] % partitions == p]
        send(platform, spec.source.topic, mine, partition=p)


def table_state(platform, spec) -> dict:
    return {r["id"]: (r["email"], r["balance"]) for r in rows(platform, spec, spec.target.table)}


def assert_applied_once(platform, spec, final: dict, broken: int) -> None:
    """The table holds exactly the source's final state; each broken event is one dead letter; both tables'
    positions are the log ends; no deleted key is in the table."""
    assert table_state(platform, spec) == final
    letters = rows(platform, spec, spec.dead_letter_table)
    assert len(letters) == broken and {r["error_kind"] for r in letters} <= {"unsupported_change"}
    assert len({(r["_kafka"]["partition"], r["_kafka"]["offset"]) for r in letters}) == broken
    ends = log_ends(platform, spec.source.topic)
    for name in (spec.target.table, spec.dead_letter_table):
        assert offsets.decode_positions(summaries(platform, spec, name)[-1][SnapshotSummary.POSITIONS]) == ends


def test_a_change_stream_ends_in_the_source_tables_final_state(platform, pipeline, spark):
    spec = cdc_pipeline(pipeline)
    records, final, broken = change_stream(keys=40, changes=300)
    half = len(records) // 2
    send_by_key(platform, spec, records[:half])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    send_by_key(platform, spec, records[half:])  # the rest in a second batch: changes across batches
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert_applied_once(platform, spec, final, broken)
    landed = rows(platform, spec, spec.target.table)
    assert {r["_cdc"]["op"] for r in landed} <= {"r", "c", "u"} and all(r["_cdc"]["position"] for r in landed)
    # the ledger keeps each key's newest delete (replays skip older records); a key re-created since has a row
    # written by a later change of its partition
    # (the second batch deletes keys the first deleted: its ledger write compares them, one entry per key)
    ledger = rows(platform, spec, spec.tombstone_table)
    deleted = {r["id"]: r["_kafka"] for r in ledger}
    assert len(ledger) == len(deleted), "one ledger entry per key"
    written = {r["id"]: r["_kafka"] for r in landed}
    assert deleted and set(deleted) - set(final), "the stream deletes keys for good"
    for i in set(deleted) & set(written):
        assert (written[i]["partition"], written[i]["offset"]) > (deleted[i]["partition"], deleted[i]["offset"])
    # the first batch, into an empty table, is all inserts: an append; the second changes keys the first wrote: a
    # row delta, its position deletes beside its files. One snapshot each, on main one after the other
    data = table(platform, spec, spec.target.table)
    first, second = offsets.ingest_commits(data, spec.name)
    assert (first.summary.operation.value, second.summary.operation.value) == ("append", "overwrite")
    assert int(second.summary["added-position-deletes"]) > 0 and second.parent_snapshot_id == first.snapshot_id


def test_an_older_change_from_another_partition_does_not_bring_back_a_key_deleted_in_an_earlier_batch(
        platform, pipeline, spark):
    """A repartitioned topic: key 1 is created and deleted (with its tombstone) on partition 0; a later batch
    reads an update of key 1 that happened before the delete, from partition 1. The tombstone ledger keeps
    the key deleted; a create written after the delete, also on partition 1, brings key 2 back. Key 3's
    create, delete and tombstone (partition 0) and an update between them (partition 1) are read in one
    batch: the tombstone is as new as the delete before it, so the key stays deleted."""
    from confluent_kafka import Producer

    spec = cdc_pipeline(pipeline)
    # Kafka timestamps of a minute ago: the test broker enforces retention every 5 s, so a fixed date more than
    # the topic's retention ago would have these records deleted before (or between) the batches
    now = int(time.time() * 1000) - 60_000

    def produce(partition: int, records: list[tuple[bytes, bytes | None, int]]) -> None:
        producer = Producer(platform.kafka())
        for k, v, ts in records:
            producer.produce(spec.source.topic, key=k, value=v, partition=partition, timestamp=ts)
        assert producer.flush(30) == 0

    produce(0, [(key(1), event("c", None, row(1, "first@x"), lsn=10), now),
                (key(2), event("c", None, row(2, "two@x"), lsn=11), now + 1),
                (key(1), event("d", row(1, "first@x"), None, lsn=30), now + 3000), (key(1), None, now + 3000),
                (key(2), event("d", row(2, "two@x"), None, lsn=31), now + 3000), (key(2), None, now + 3000)])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    assert table_state(platform, spec) == {}
    produce(1, [(key(1), event("u", row(1, "first@x"), row(1, "stale@x"), lsn=20), now + 2000),
                (key(2), event("c", None, row(2, "again@x"), lsn=40), now + 4000),
                (key(3), event("u", row(3, "three@x"), row(3, "between@x"), lsn=60), now + 6000)])
    produce(0, [(key(3), event("c", None, row(3, "three@x"), lsn=50), now + 5000),
                (key(3), event("d", row(3, "between@x"), None, lsn=70), now + 7000), (key(3), None, now + 7000)])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert table_state(platform, spec) == {2: ("again@x", Decimal("1.50"))}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_9_anywhere_in_a_batch_neither_loses_nor_reapplies_a_change(platform, pipeline, point):
    spec = cdc_pipeline(pipeline)
    records, final, broken = change_stream(keys=30, changes=200, seed=11)
    send_by_key(platform, spec, records)
    crashed = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json", fault=point)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    resumed = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_applied_once(platform, spec, final, broken)


def test_an_avro_change_stream_with_a_derived_contract_lands_in_the_final_state(platform, make_spec, spark):
    from lakehouse.core.topics import ensure_topics

    spec = avro_cdc_spec(make_spec, source={"partitions": 1})
    ensure_topics([spec], platform)
    changes = [avro_change(1, "r", "a@x", 10), avro_change(2, "r", "b@x", 11), avro_change(1, "u", "a2@x", 12),
               avro_change(3, "c", "c@x", 13), avro_change(2, "d", None, 14), (avro_change(2, "d", None, 14)[0], None),
               avro_change(3, "u", "c2@x", 15)]
    send(platform, spec.source.topic, changes)
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert {r["id"]: r["email"] for r in rows(platform, spec, spec.target.table)} == {1: "a2@x", 3: "c2@x"}
    assert rows(platform, spec, spec.dead_letter_table) == []


def test_kill_9_while_decoding_or_writing_a_batch_neither_loses_nor_reapplies_an_avro_change(platform, make_spec,
                                                                                             spark):
    """An Avro change stream (snapshot, then creates, updates and deletes with their tombstones, each key on
    its partition) through a kill -9 while decoding, one after writing files, then the rest: the source's
    final state."""
    from lakehouse.core.topics import ensure_topics

    spec = avro_cdc_spec(make_spec, source={"partitions": 2}, trigger={"max_records_per_batch": 40})
    ensure_topics([spec], platform)
    rng, state, lsn = Random(5), {}, 100
    by_partition: dict[int, list] = {0: [], 1: []}

    def change(i: int, op: str, email: str | None) -> None:
        nonlocal lsn
        lsn += 1
        encoded_key, value = avro_change(i, op, email, lsn)
        by_partition[i % 2].append((encoded_key, value))
        if op == "d":
            by_partition[i % 2].append((encoded_key, None))  # the tombstone
            state.pop(i)
        else:
            state[i] = email

    for i in range(20):
        change(i, "r", f"user{i}@x")
    for n in range(180):
        i = rng.randrange(30)
        if i not in state:
            change(i, "c", f"new{i}-{n}@x")
        elif rng.random() < 0.3:
            change(i, "d", None)
        else:
            change(i, "u", f"user{i}-{n}@x")
    for p, records in by_partition.items():
        send(platform, spec.source.topic, records, partition=p)
    killed_at_every_point_then_resumed(platform, spec, points=FORMAT_KILL_POINTS)
    assert {r["id"]: r["email"] for r in rows(platform, spec, spec.target.table)} == state
    assert rows(platform, spec, spec.dead_letter_table) == []
    ends = log_ends(platform, spec.source.topic)
    for name in (spec.target.table, spec.dead_letter_table):
        assert offsets.decode_positions(summaries(platform, spec, name)[-1][SnapshotSummary.POSITIONS]) == ends
