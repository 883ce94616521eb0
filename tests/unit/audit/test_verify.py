"""`lakehouse verify` proves a range exactly once.

Unit layer: the interval arithmetic of source coordinates (property-based), the checks of one piece
of a window (foreign, duplicated and missing offsets), each key's newest record and the upsert
invariant, and the command's arguments.

End-to-end (slow), on the real broker, Spark and catalog: the tables are damaged on purpose, as a
careless hand or a broken writer would (a row deleted, a row duplicated, a dead letter removed, a file
of rows from another range added), and each must be found with its coordinates, incrementally after a
passing verification, with exit 3 and a failed `verify` event. Upsert tables keep the newest record
per key: a stale row and a key that vanished without a tombstone are found. The publish DAG verifies
the audited snapshots and refuses to publish what no passing verification covers.

The unit half; the end-to-end half is tests/e2e/test_verify_e2e.py.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from e2e import pipeline, run_cli, send, table, task_states  # noqa: F401 (pipeline: a fixture)
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.expressions import And, EqualTo

from lakehouse import cli
from lakehouse.audit import keys as verify_keys
from lakehouse.audit import verify_model
from lakehouse.audit.checks import PartitionFacts, check_rows
from lakehouse.audit.coordinates import KAFKA_RECORDS
from lakehouse.audit.intervals import Coverage, Intervals
from lakehouse.audit.keys import check_keys, newest_per_key
from lakehouse.core import config, errors

# ---------------------------------------------------------------------------- unit layer: the arithmetic

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=8)


def members(iv: Intervals) -> set[int]:
    return {o for s, e in iv for o in range(s, e)}


def model(pairs) -> set[int]:
    return {o for s, e in pairs for o in range(s, e)}


@given(spans, spans)
def test_intervals_behave_as_the_sets_of_offsets_they_hold(a, b):
    x, y = Intervals.of(a), Intervals.of(b)
    assert members(x) == model(a) and x.count == len(model(a))
    assert members(x.union(y)) == model(a) | model(b)
    assert members(x.intersection(y)) == model(a) & model(b)
    assert members(x.difference(y)) == model(a) - model(b)
    assert members(x.clip(10, 40)) == {o for o in model(a) if 10 <= o < 40}
    probe = np.arange(-2, 64, dtype=np.int64)
    assert x.contains_many(probe).tolist() == [o in model(a) for o in probe.tolist()]
    assert all((o in x) == (o in model(a)) for o in probe.tolist())
    # normal form: sorted, disjoint, never touching, so equal sets are equal values
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(x.spans, x.spans[1:]))
    assert Intervals.of([(o, o + 1) for o in model(a)]) == x


@given(st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2 ** 63 - 2)), max_size=50))
def test_intervals_from_offsets_hold_exactly_those_offsets(offsets_):
    iv = Intervals.from_offsets(np.array(offsets_, dtype=np.int64))
    assert iv == Intervals.of([(o, o + 1) for o in offsets_]) and iv.count == len(set(offsets_))


@given(st.dictionaries(st.integers(0, 5), spans, max_size=4), st.dictionaries(st.integers(0, 5), spans, max_size=4))
def test_coverage_is_per_partition_arithmetic_and_survives_json(a, b):
    x, y = Coverage.of(a), Coverage.of(b)
    for p in range(6):
        assert members(x.union(y).get(p)) == model(a.get(p, [])) | model(b.get(p, []))
        assert members(x.difference(y).get(p)) == model(a.get(p, [])) - model(b.get(p, []))
        assert members(x.intersection(y).get(p)) == model(a.get(p, [])) & model(b.get(p, []))
    assert Coverage.from_json(json.loads(json.dumps(x.to_json()))) == x
    assert x.count == sum(len(model(v)) for v in a.values())


# ---------------------------------------------------------------------------- unit layer: one piece's checks

TOPIC = "orders"


def facts(**changes) -> PartitionFacts:
    base = dict(topic=TOPIC, partition=0, in_topic=True, earliest=0, committed=100,
                positions={"raw.t": 100, "raw.t_dlq": 100}, gaps=Intervals(), floors={})
    return PartitionFacts(**{**base, **changes})


def rows(*items: tuple[str, str | None, int]) -> pa.Table:
    tables, topics, offsets_ = zip(*items) if items else ((), (), ())
    return pa.table({"table": pa.array(tables, pa.string()), "topic": pa.array(topics, pa.string()),
                     "offset": pa.array(offsets_, pa.int64())})


def kafka(*offsets_: int) -> pa.Table:
    n = len(offsets_)
    return pa.table([pa.array([0] * n, pa.int32()), pa.array(offsets_, pa.int64()), pa.array([0] * n, pa.int64()),
                     pa.array([None] * n, pa.string()), pa.array([False] * n)], schema=KAFKA_RECORDS)


def test_a_piece_finds_missing_duplicated_and_foreign_offsets_with_their_reasons():
    f = facts(gaps=Intervals.of([(40, 45)]), floors={"raw.t": 2}, positions={"raw.t": 100, "raw.t_dlq": 90})
    held = rows(("raw.t", TOPIC, 2), ("raw.t", TOPIC, 3), ("raw.t_dlq", TOPIC, 3),  # 3 held twice
                ("raw.t", TOPIC, 6),                                                  # 4, 5 missing
                ("raw.t", "elsewhere", 7),                                            # another topic
                ("raw.t", TOPIC, 1),                                                  # below the table's first
                ("raw.t", TOPIC, 41),                                                 # in a recorded gap
                ("raw.t", TOPIC, 8),                                                  # Kafka has no record at 8
                ("raw.t_dlq", TOPIC, 95),                                             # past the DLQ's position
                ("raw.t", TOPIC, 120))                                                # past everything
    found = check_rows(f, held, kafka(2, 3, 4, 5, 6, 7), Intervals.of([(2, 9)]), count_missing=True)
    assert found.counts == {"missing": 3, "duplicated": 1, "foreign": 6, "stale": 0}
    assert found.missing == Coverage.of({0: [(4, 6), (7, 8)]})  # 7 is held only by another topic's row
    why = {(p.offset, p.tables): p.detail for p in found.problems if p.kind == "foreign"}
    assert "another topic" in why[(7, ("raw.t",))]
    assert "below 2, the first offset raw.t ingested" in why[(1, ("raw.t",))]
    assert "recorded gap" in why[(41, ("raw.t",))]
    assert "Kafka holds no record" in why[(8, ("raw.t",))]
    assert "raw.t_dlq's committed position 90" in why[(95, ("raw.t_dlq",))]
    assert "committed position 100" in why[(120, ("raw.t",))]
    (dup,) = [p for p in found.problems if p.kind == "duplicated"]
    assert (dup.offset, sorted(dup.tables)) == (3, ["raw.t", "raw.t_dlq"])
    assert found.offsets == 6 and found.rows == 10


def test_rows_below_the_earliest_offset_are_checked_for_duplicates_only_and_upserts_miss_nothing_per_offset():
    held = rows(("raw.t", TOPIC, 1), ("raw.t", TOPIC, 1))  # offset 0 aged out of Kafka: not missing, 1 twice
    found = check_rows(facts(earliest=5), held, kafka(5), Intervals.of([(5, 6)]), count_missing=True)
    assert (found.counts["duplicated"], found.counts["missing"]) == (1, 1)  # 5: Kafka holds it, nobody does
    assert check_rows(facts(), rows(), kafka(5, 6), Intervals.of([(5, 7)]), count_missing=False).ok


@settings(max_examples=200)
@given(st.lists(st.integers(0, 30), max_size=40), st.sets(st.integers(0, 30)))
def test_missing_and_duplicated_follow_from_counting(held, delivered):
    found = check_rows(facts(), rows(*[("raw.t", TOPIC, o) for o in held]), kafka(*sorted(delivered)),
                       Intervals.of([(0, 31)]), count_missing=True)
    stray = {o for o in held if o not in delivered}  # inside the span but not a record Kafka has
    counted = [o for o in held if o in delivered]
    assert found.counts["foreign"] == sum(1 for o in held if o in stray)
    assert found.counts["duplicated"] == sum(1 for o in set(counted) if counted.count(o) > 1)
    assert members(found.missing.get(0)) == delivered - set(counted)


# ---------------------------------------------------------------------------- unit layer: upsert keys


def records(*items: tuple[str, int, int, int, bool]) -> pa.Table:
    """(key, partition, offset, timestamp ms, tombstone) as KAFKA_RECORDS rows."""
    key, part, off, ts, dead = zip(*items)
    return pa.table([pa.array(part, pa.int32()), pa.array(off, pa.int64()), pa.array(ts, pa.int64()),
                     pa.array(key, pa.string()), pa.array(dead)], schema=KAFKA_RECORDS)


def key_rows(*items: tuple[str, int, int, int]) -> pa.Table:
    key, part, off, ts = zip(*items) if items else ((), (), (), ())
    return pa.table({"key": pa.array(key, pa.string()), "partition": pa.array(part, pa.int32()),
                     "offset": pa.array(off, pa.int64()), "timestamp_ms": pa.array(ts, pa.int64())})


def test_the_newest_record_of_a_key_is_the_highest_offset_in_a_partition_and_the_latest_time_across():
    newest = newest_per_key(records(("a", 0, 1, 500, False), ("a", 0, 3, 100, False), ("a", 1, 9, 300, True),
                                    ("b", 2, 4, 7, False), ("b", 1, 5, 7, False)))
    assert newest.to_pylist() == [
        {"key": "a", "partition": 1, "offset": 9, "timestamp_ms": 300, "tombstone": True,  # 300 > offset 3's 100
         "position": None, "source_ts": None},
        {"key": "b", "partition": 2, "offset": 4, "timestamp_ms": 7, "tombstone": False,  # a tie: higher partition
         "position": None, "source_ts": None}]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.integers(0, 50), st.integers(0, 9),
                          st.booleans()), min_size=1, max_size=30, unique_by=lambda r: (r[1], r[2])))
def test_the_newest_record_is_the_latest_of_each_partitions_last(items):
    """As the ingest job's `latest_per_key` ranks a key's records: the last of each partition first, then the
    latest Kafka timestamp across partitions, the higher partition on a tie."""
    last: dict[tuple[str, int], tuple] = {}
    for key, p, o, ts, dead in items:
        if (key, p) not in last or o > last[(key, p)][2]:
            last[(key, p)] = (key, p, o, ts, dead)
    expected = {}
    for key, p, o, ts, dead in last.values():
        if key not in expected or (ts, p) > (expected[key][3], expected[key][1]):
            expected[key] = (key, p, o, ts, dead)
    found = newest_per_key(records(*items)).to_pylist()
    assert [tuple(r.values())[:5] for r in found] == [expected[k] for k in sorted(expected)]


def test_each_keys_row_is_its_newest_record_and_a_tombstone_leaves_no_older_row():
    newest = newest_per_key(records(("ok", 0, 5, 1, False), ("later", 0, 6, 1, False), ("stale", 0, 7, 1, False),
                                    ("lost", 0, 8, 1, False), ("gone", 0, 9, 1, True), ("back", 0, 10, 1, True),
                                    ("deleted_later", 0, 11, 1, False), ("no_ledger", 0, 12, 1, True)))
    held = key_rows(("ok", 0, 5, 1), ("later", 0, 60, 1), ("stale", 0, 3, 1), ("back", 0, 2, 1))
    ledger = key_rows(("gone", 0, 9, 1), ("back", 0, 10, 1), ("deleted_later", 0, 70, 1))
    found, checked = check_keys(TOPIC, "raw.t", "raw.t__tombstones", newest, held, ledger)
    assert checked == 8
    assert {(p.kind, p.key, p.offset) for p in found.problems} == {
        ("stale", "stale", 7), ("missing", "lost", 8), ("stale", "back", 10), ("missing", "no_ledger", 12)}
    assert found.problems[0].tables == ("raw.t",)


# ---------------------------------------------------------------------------- unit layer: table keys of records

KEY_FORMATS = ["string", "json", "avro", "protobuf", "json_schema"]


def table_key_texts(spec, rows: list[dict]) -> list[str]:
    """The key text of table rows holding `rows` (contract values as the reader checks them), as `_key_rows`
    reads a table: each key column in its Arrow type, through `key_text`."""
    from lakehouse.ingest.layout import arrow_type

    return verify_keys.key_text([pa.array([r[k] for r in rows], arrow_type(spec.contract.field(k)))
                            for k in spec.target.key]).to_pylist()


@pytest.mark.parametrize("key_format", KEY_FORMATS)
def test_a_records_table_key_is_derived_as_ingestion_derives_it_for_every_key_format(make_spec, key_format):
    """An upsert table keyed by the Kafka key: the key of each valid record, decoded as the reader decodes it
    (text, or the key field of a JSON, Avro, Protobuf or JSON Schema record key), is the text of the key
    column of the row ingestion writes for it; a key that does not decode gives none."""
    from lakehouse.ingest.validator import RecordValidator
    from lakehouse_dev.synthesis import synthesize
    from tests.unit.devstack.test_synthesis_formats import in_format

    spec = in_format(make_spec, "json", key_format=None if key_format == "string" else key_format,
                     mode="upsert", table_key=["payment_id"])
    assert spec.tombstones_delete
    keys, validator = verify_keys.TableKeys(spec), RecordValidator(spec)
    records = list(synthesize(spec, 300, bad_ratio=0.3, seed=11))
    valid = [r for r in records if r.kind is None]
    expected = table_key_texts(spec, [validator.check(validator.check_key(r.key), r.value) for r in valid])
    assert [verify_keys.key_text([pa.array([keys.identify(r.key, r.value).values[0]])]).to_pylist()[0]
            for r in valid] == expected
    assert all(keys.identify(r.key, r.value) is None for r in records if r.kind in ("bad_key", "null_key"))


@pytest.mark.parametrize("value_format, connect_schemas", [("json", False), ("json", True), ("avro", False)])
def test_a_change_events_table_key_is_its_primary_key_and_deletes_are_told_apart(make_spec, monkeypatch,
                                                                               value_format, connect_schemas):
    """Debezium keys with and without their Connect schema, and Avro keys: each valid change event's table
    key is the text of the primary key in the row it writes (or deletes); op d and tombstones delete."""
    from lakehouse.ingest.validator import RecordValidator
    from lakehouse_dev.synthesis import synthesize
    from tests.unit.devstack.test_change_streams import applied, cdc_spec

    if value_format == "avro":
        monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", f"mock://verify-{os.getpid()}-{connect_schemas}")
    platform = config.load(fresh=True)
    spec = cdc_spec(make_spec, value_format)
    records = list(synthesize(spec, 400, bad_ratio=0.1, seed=5, platform=platform, connect_schemas=connect_schemas))
    validator = RecordValidator(spec, registry=platform.schema_registry())
    keys = verify_keys.TableKeys(spec, platform.schema_registry())
    for r in records:
        if r.kind is not None:
            continue
        _, values, op = validator.check_change(r.key, r.value)
        found = keys.identify(r.key, r.value, with_text=True)
        assert found.values == values[:1] and found.delete == (op == "delete")
        assert found.text == validator.check_key(r.key) and found.cdc["position"] == values[-1]["position"]
        assert verify_keys.key_text([pa.array([found.values[0]], pa.int64())]).to_pylist() == [str(values[0])]
    rows, deleted = applied(spec, records, validator)
    assert rows and deleted  # the stream holds creates, updates and deletes


def test_a_composite_key_is_one_text_of_its_columns():
    assert verify_keys.key_text([pa.array(["eu", None]), pa.array([7, 8])]).to_pylist() == ["(eu, 7)", None]


def cdc_records(*items: tuple[str, int, int, int, bool, int | None]) -> pa.Table:
    """(key, partition, offset, timestamp ms, delete, source position) as NEWEST rows."""
    key, part, off, ts, dead, position = zip(*items)
    return pa.table([pa.array(key, pa.string()), pa.array(part, pa.int32()), pa.array(off, pa.int64()),
                     pa.array(ts, pa.int64()), pa.array(dead), pa.array(position, pa.decimal128(38, 0)),
                     pa.nulls(len(key), pa.int64())], schema=verify_keys.NEWEST)


def test_a_change_streams_newest_change_is_the_latest_in_the_source_log_across_partitions():
    """Kafka timestamps say partition 1's update is newer; the source log says partition 0's delete is: the
    MERGE (NEWER_CDC) and the check follow the source."""
    newest = newest_per_key(cdc_records(("k", 0, 4, 100, True, 900), ("k", 1, 2, 500, False, 800),
                                        ("j", 0, 5, 100, False, None), ("j", 1, 3, 200, False, None)))
    assert [(r["key"], r["partition"], r["offset"]) for r in newest.to_pylist()] == [("j", 1, 3), ("k", 0, 4)]
    revived = key_rows(("k", 1, 2, 500))  # the older update's row left in place: a deleted key revived
    revived = revived.append_column("position", pa.array([800], pa.decimal128(38, 0)))
    ledger = key_rows(("k", 0, 4, 100))
    found, _ = check_keys(TOPIC, "raw.t", "raw.t__tombstones", newest.filter(pc.equal(newest["key"], "k")), revived,
                          ledger, by_source=True)
    assert [(p.kind, p.key, p.offset) for p in found.problems] == [("stale", "k", 4)]
    by_kafka_time, _ = check_keys(TOPIC, "raw.t", "raw.t__tombstones", newest.filter(pc.equal(newest["key"], "k")),
                                  revived, ledger)
    assert by_kafka_time.ok  # without the source order the row would look newer than the delete


def test_a_change_streams_tombstone_is_as_new_as_the_delete_before_it_in_its_partition():
    """Partition 0 holds key k's delete (position 900) and then its tombstone (no change event, no position);
    partition 1 an update from before the delete (800), read in the same batch: the tombstone is the newest
    change, as the ingest job's latest_per_key orders it, so the key stays deleted."""
    newest = newest_per_key(cdc_records(("k", 0, 4, 100, True, 900), ("k", 0, 5, 100, True, None),
                                        ("k", 1, 2, 500, False, 800), ("j", 1, 7, 50, True, None),
                                        ("j", 0, 1, 10, False, 10)))
    assert [(r["key"], r["partition"], r["offset"]) for r in newest.to_pylist()] == [("j", 0, 1), ("k", 0, 5)]


# ---------------------------------------------------------------------------- unit layer: the command


@pytest.mark.parametrize("argv, message", [
    (["verify", "--pipeline", "orders", "--since", "0s"], "argument --since: '0s' is not in the past"),
    (["verify", "--pipeline", "orders", "--since", "soon"], "argument --since: 'soon' is neither an ISO-8601 time"),
    (["verify", "--pipeline", "orders", "--snapshots", "12..x"], "argument --snapshots: '12..x' is not a snapshot"),
    (["verify", "--pipeline", "orders", "--snapshots", "1..2", "--since", "1h"], "not allowed with argument"),
    (["verify", "--pipeline", "orders", "--engine", "gpu"], "argument --engine: invalid choice"),
    (["trace", "--pipeline", "orders", "--partition", "0"], "give a partition and an offset, or a key and since"),
    (["trace", "--pipeline", "orders", "--partition", "-1", "--offset", "3"], "argument --partition: '-1'"),
    (["trace", "--pipeline", "orders", "--key", "", "--since", "1h"], "key must be a Kafka key of 1 to 65536"),
    (["trace", "--pipeline", "orders", "--key", "k", "--since", "2999-01-01T00:00:00Z"], "must be later than since"),
    (["trace", "--pipeline", "orders", "--partition", "0", "--offset", "1e9"], "argument --offset: '1e9' is not"),
    (["trace", "--pipeline", "orders", "--key", "k"], "since is required with a key"),
    (["trace", "--pipeline", "orders", "--key", "k", "--since", "yesterday"], "argument --since: 'yesterday' is"),
    (["trace", "--pipeline", "orders", "--key", "k", "--partition", "0", "--since", "1h"],
     "not at a partition and offset"),
    (["trace", "--pipeline", "orders", "--partition", "0", "--offset", "1", "--since", "1h"],
     "since and until go with a key"),
    (["trace", "--pipeline", "orders", "--key", "k", "--since", "2026-11-21T10:00:00Z",
      "--until", "2026-11-21T09:00:00Z"], "must be later than since (2026-11-21T10:00:00+00:00)"),
])
def test_verify_and_trace_refuse_bad_arguments_before_doing_anything(argv, message, own_home, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not any(own_home.iterdir())  # no catalog, no state: nothing was created


def test_the_verify_dag_runs_on_the_specs_schedule(make_spec):
    from lakehouse.core.spec import SpecError

    assert make_spec().verify.schedule == "@hourly" and "verify" in make_spec().dag_kinds
    assert make_spec(verify={"schedule": "*/20 * * * *"}).verify.schedule == "*/20 * * * *"
    with pytest.raises(SpecError, match=r"verify.schedule: 'nightly' is not a schedule"):
        make_spec(verify={"schedule": "nightly"})
    with pytest.raises(SpecError, match=r"verify.when: unknown field"):
        make_spec(verify={"when": "@daily"})


def test_a_snapshot_range_is_two_ids():
    assert verify_model.parse_snapshot_range("12..-3") == (12, -3)
    with pytest.raises(errors.VerifyError, match="FROM..TO"):
        verify_model.parse_snapshot_range("12...13")


# ---------------------------------------------------------------------------- end to end


def order(partition: int, i: int, **changes) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{partition}-{i}", "customer_id": f"c-{i % 7}", "amount": 10.0 + i,
              "currency": "EUR", "status": "created", "event_time": datetime.now(timezone.utc).isoformat()}
    record.update(changes)
    return record["order_id"].encode(), json.dumps(record).encode()


def at(partition: int, offset: int):
    return And(EqualTo("_kafka.partition", partition), EqualTo("_kafka.offset", offset))


def delete(spark, spec, name: str, where: str) -> None:
    """DELETE FROM a table of the pipeline with Spark SQL, as an operator's query would."""
    spark.sql(f"DELETE FROM {spec.qualified(name)} WHERE {where}")


def ingest(spec) -> None:
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once", "--json")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def orders(platform, pipeline):
    """An append pipeline, ingested: partition 0 holds 30 records whose offsets 5, 15 and 25 are dead
    letters (not JSON), partition 1 holds 20 good records."""
    spec = pipeline(partitions=2)
    send(platform, spec.source.topic, [(b"bad", b"{not json") if i % 10 == 5 else order(0, i) for i in range(30)],
         partition=0)
    send(platform, spec.source.topic, [order(1, i) for i in range(20)], partition=1)
    ingest(spec)
    return spec


@pytest.mark.parametrize("key_format", KEY_FORMATS)
def test_a_tombstone_deletes_the_row_of_its_keys_field_whatever_the_key_format(make_spec, key_format):
    """A tombstone's row (what the MERGE deletes by, and the ledger keeps) holds the key field's value as the
    rows of that key hold it: for a record key the field of the record, not the record's JSON text."""
    from lakehouse.ingest.reader import BatchBuilder
    from lakehouse.ingest.validator import RecordValidator
    from lakehouse_dev.synthesis import synthesize
    from tests.unit.devstack.test_synthesis_formats import in_format

    spec = in_format(make_spec, "json", key_format=None if key_format == "string" else key_format,
                     mode="upsert", table_key=["payment_id"])
    validator = RecordValidator(spec)
    valid = next(r for r in synthesize(spec, 20, seed=3) if r.kind is None)
    builder = BatchBuilder(spec, validator, ingested_at_us=0)
    builder.add(spec.source.topic, 0, 7, None, valid.key, valid.value, [])
    builder.add(spec.source.topic, 0, 8, None, valid.key, None, [])  # its tombstone
    row, tombstone = builder.flush().to_pylist()
    assert (row["_op"], tombstone["_op"]) == ("upsert", "delete")
    assert tombstone["payment_id"] == row["payment_id"] == json.loads(valid.value)["payment_id"]
    assert tombstone["_kafka"]["key"] == row["_kafka"]["key"]  # `_kafka.key`: the key as ingestion shows it
