"""What a pipeline does with its records: dead letters, upsert, fan-out, schema evolution, source checks.

These run the ingest job in the test process (one Spark session for the module)
against the real embedded broker and catalog.
"""

import json
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from polling import wait_until
from tests.unit.ingest.test_poison_records import KEYS_AND_VALUES, MAX_KAFKA_TIMESTAMP_MS

from e2e import (  # noqa: F401 (fixture)
    assert_exactly_once,
    pipeline,
    rows,
    run_cli,
    send,
    summaries,
    table,
)
from lakehouse.core import offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import OffsetGapError, TopicRecreatedError
from lakehouse.core.offsets import OffsetRange, TableProgress
from lakehouse.core.spec import load_spec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest.job import IngestJob
from lakehouse.ingest.plan import PartitionState, TopicState, plan_batch, split_for_tasks, topic_state
from lakehouse.ingest.rejects import ERROR_KINDS
from lakehouse_dev import produce, producer_settings

pytestmark = pytest.mark.slow


def order(i: int, **changes) -> dict:
    record = {"order_id": f"ord-{i}", "customer_id": f"c-{i % 7}", "amount": 10.0 + i, "currency": "EUR",
              "status": "created", "event_time": "2026-11-20T12:00:00+00:00"}
    record.update(changes)
    return record


def encode(record: dict) -> tuple[bytes, bytes]:
    return record["order_id"].encode(), json.dumps(record).encode()


def test_every_kind_of_bad_record_lands_in_the_dead_letter_table_with_its_reason(platform, pipeline, spark):
    spec = pipeline()
    # a producer with its clock in microseconds gets through
    producer_settings.accept_any_timestamp(spec.source.topic, platform)
    report = produce.produce(spec, 600, bad_ratio=0.5, seed=11)
    IngestJob(spec, platform, spark).run_once()
    assert assert_exactly_once(platform, spec) == 600

    dead = rows(platform, spec, spec.dead_letter_table)
    by_kind: dict[str, list] = {}
    for row in dead:
        by_kind.setdefault(row["error_kind"], []).append(row)
    assert {k: len(v) for k, v in by_kind.items()} == report.bad_by_kind
    for kind in ("malformed_json", "not_utf8", "not_an_object", "missing_required", "wrong_type", "bad_enum",
                 "out_of_range", "pattern_mismatch", "bad_timestamp", "oversize", "null_value", "null_key",
                 "bad_string", "timestamp_out_of_range", "bad_kafka_timestamp"):
        assert kind in by_kind, f"the producer should have made {kind} records"
        assert all(r["error_detail"] and r["pipeline"] == spec.name for r in by_kind[kind])
    assert all(r["value"] is None for r in by_kind["null_value"])
    assert all(r["_kafka"]["timestamp"] is None for r in by_kind["bad_kafka_timestamp"])
    assert all(r["key"] is None for r in by_kind["null_key"])
    for r in by_kind["not_utf8"]:
        with pytest.raises(UnicodeDecodeError):
            r["value"].decode("utf-8")
    assert all(len(r["value"]) > spec.source.max_value_bytes for r in by_kind["oversize"])
    assert all(r["headers"] for r in dead if r["error_kind"] != "null_value"), "headers are kept"
    assert all(r["_kafka"]["topic"] == spec.source.topic for r in dead)


def test_upsert_keeps_the_latest_record_per_key_within_and_across_batches(platform, pipeline, spark):
    spec = pipeline(mode="upsert", table_key=["order_id"], partition_by=[])
    job = IngestJob(spec, platform, spark)
    send(platform, spec.source.topic, [encode(order(1, status="created")), encode(order(2, status="created")),
                                       encode(order(1, status="paid")), encode(order(3, status="created"))],
         partition=0)
    job.run_once()
    send(platform, spec.source.topic, [encode(order(1, status="shipped")), (b"ord-2", None),
                                       encode(order(3, status="cancelled")), encode(order(3, status="refunded"))],
         partition=0)
    job.run_once()
    current = {r["order_id"]: r["status"] for r in rows(platform, spec, spec.target.table)}
    assert current == {"ord-1": "shipped", "ord-3": "refunded"}, "ord-2 was deleted by its tombstone"
    positions = offsets.read_progress(open_catalog(platform, spec.catalog), spec.target.table,
                                      spec.name).positions
    assert positions[0] == 8


def test_fanout_routes_each_record_to_one_table_by_field(platform, pipeline, spark):
    spec = pipeline(fanout={"field": "currency", "routes": {"EUR": "raw.orders_{suffix}_eur",
                                                      "USD": "raw.orders_{suffix}_usd"}})
    records = [encode(order(i, currency=("EUR", "USD", "GBP")[i % 3])) for i in range(90)]
    send(platform, spec.source.topic, records)
    IngestJob(spec, platform, spark).run_once()
    assert assert_exactly_once(platform, spec) == 90
    default, eur, usd = spec.target.tables
    assert {r["currency"] for r in rows(platform, spec, eur)} == {"EUR"}
    assert {r["currency"] for r in rows(platform, spec, usd)} == {"USD"}
    assert {r["currency"] for r in rows(platform, spec, default)} == {"GBP"}
    assert len(rows(platform, spec, eur)) == 30


def with_route(spec, value: str):
    """The spec file of `spec` with one more fan-out route, `value` -> a table of its own; the reloaded spec."""
    raw = yaml.safe_load(Path(spec.path).read_text())
    routes = raw["target"]["fanout"]["routes"]
    routes[value] = f"{raw['target']['table']}_{value.lower()}"
    Path(spec.path).write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_spec(spec.path)


CURRENCIES = ("EUR", "USD", "GBP", "CHF")


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(steps=["produce", "ingest", "route"])
@given(steps=st.lists(st.sampled_from(["produce", "ingest", "route"]), min_size=2, max_size=6))
def test_a_route_added_to_a_running_fanout_pipeline_keeps_every_offset_once(platform, pipeline, spark, steps):
    """Whenever routes are added between batches, every offset is in exactly one table: a new route's table
    joins at the committed position (records before it stay where they were routed), then takes its records."""
    spec = pipeline(fanout={"field": "currency", "routes": {"EUR": "raw.orders_{suffix}_eur"}}, partitions=2)
    sent, added = 0, []
    for step in [*steps, "produce", "ingest"]:
        if step == "produce":
            send(platform, spec.source.topic, [encode(order(sent + i, currency=CURRENCIES[(sent + i) % 4]))
                                               for i in range(12)])
            sent += 12
        elif step == "ingest":
            IngestJob(spec, platform, spark).run_once()
        elif len(added) < 2:
            added.append(("USD", "GBP")[len(added)])
            spec = with_route(spec, added[-1])
    assert assert_exactly_once(platform, spec) == sent
    routes = spec.target.fanout.routes
    for value, name in routes.items():
        assert {r["currency"] for r in rows(platform, spec, name)} <= {value}
    # before its route existed, a currency's records went to the default table
    assert {r["currency"] for r in rows(platform, spec, spec.target.table)} <= \
        (set(CURRENCIES) - set(routes)) | set(added)


def test_a_route_added_while_a_batch_is_half_committed_is_refused_until_it_is_finished(platform, pipeline):
    """A kill between a batch's commits leaves the tables at different positions: where the new table's records
    start is then ambiguous, so the job refuses (exit 3, no commit) and says what to run first."""
    import signal

    from e2e import lakehouse

    spec = pipeline(fanout={"field": "currency", "routes": {"EUR": "raw.orders_{suffix}_eur"}}, partitions=1)
    before = Path(spec.path).read_text()
    send(platform, spec.source.topic, [encode(order(i, currency=CURRENCIES[i % 4])) for i in range(20)])
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    send(platform, spec.source.topic, [encode(order(i, currency=CURRENCIES[i % 4])) for i in range(20, 40)])
    crashed = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", fault="after_table_commit")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    routed = with_route(spec, "USD")
    after = Path(spec.path).read_text()
    refused = run_cli(routed, "ingest", "--pipeline", spec.name, "--once")
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "cut short between its commits" in refused.stderr and "--once" in refused.stderr
    assert not table(platform, routed, routed.target.fanout.routes["USD"]).snapshots()
    Path(spec.path).write_text(before)  # as the message says: finish the batch with the spec as it was
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    Path(spec.path).write_text(after)
    assert run_cli(routed, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    assert assert_exactly_once(platform, routed) == 40


def test_a_new_optional_field_is_added_without_rewriting_data(platform, pipeline, spark):
    spec = pipeline()
    send(platform, spec.source.topic, [encode(order(i)) for i in range(30)])
    IngestJob(spec, platform, spark).run_once()
    before = {f.file.file_path for f in table(platform, spec, spec.target.table).scan().plan_files()}

    raw = yaml.safe_load(Path(spec.path).read_text())
    raw["contract"]["fields"].append({"name": "channel", "type": "string", "enum": ["web", "app"]})
    Path(spec.path).write_text(yaml.safe_dump(raw))
    evolved = load_spec(spec.path)
    send(platform, spec.source.topic, [encode(order(i, channel="app")) for i in range(30, 60)])
    IngestJob(evolved, platform, spark).run_once()

    t = table(platform, spec, spec.target.table)
    assert "channel" in t.schema().column_names
    after = {f.file.file_path for f in t.scan().plan_files()}
    assert before <= after, "old data files are kept as they are"
    channels = [r["channel"] for r in rows(platform, spec, spec.target.table)]
    assert channels.count(None) == 30 and channels.count("app") == 30


def test_an_incompatible_change_stops_the_pipeline_with_an_explanation(platform, pipeline, spark):
    spec = pipeline()
    send(platform, spec.source.topic, [encode(order(1))])
    IngestJob(spec, platform, spark).run_once()
    raw = yaml.safe_load(Path(spec.path).read_text())
    raw["contract"]["fields"][2]["type"] = "long"  # amount: double -> long narrows
    Path(spec.path).write_text(yaml.safe_dump(raw))
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert run.returncode == 2
    assert "'amount' is double in the table but long in the contract" in run.stderr


def test_a_misconfigured_pipeline_stops_instead_of_dead_lettering(platform, make_spec):
    spec = make_spec(source={"topic": "no-such-topic-anywhere"})
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert run.returncode == 3, run.stderr[:1500]
    assert "topic 'no-such-topic-anywhere' does not exist" in run.stderr


def test_a_recreated_topic_stops_the_pipeline(platform, pipeline, spark):
    from confluent_kafka.admin import AdminClient, NewTopic

    spec = pipeline()
    send(platform, spec.source.topic, [encode(order(i)) for i in range(50)])
    IngestJob(spec, platform, spark).run_once()
    admin = AdminClient(platform.kafka())
    admin.delete_topics([spec.source.topic])[spec.source.topic].result()
    refusals: list[Exception] = []

    def recreated() -> bool:
        try:
            admin.create_topics([NewTopic(spec.source.topic, 3, 1)])[spec.source.topic].result()
            return True
        except Exception as exc:  # noqa: BLE001 - deletion is asynchronous: the old topic may still exist
            refusals.append(exc)
            return False

    wait_until(recreated, 30, lambda: f"topic {spec.source.topic} to be created again after its deletion "
                                      f"(last refusal: {refusals[-1] if refusals else None})", interval=0.2)
    send(platform, spec.source.topic, [encode(order(i)) for i in range(5)])
    run = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert run.returncode == 3, run.stderr
    assert "recreated" in run.stderr


def state(earliest: int, end: int, topic_id="id-1") -> TopicState:
    return TopicState("t", topic_id, {0: PartitionState(0, earliest, end)})


def progress(position: int, topic_id="id-1") -> list[TableProgress]:
    return [TableProgress("raw.t", True, positions={0: position}, topic_id=topic_id)]


def test_offsets_that_aged_out_before_ingestion_are_a_gap_never_skipped_silently(make_spec):
    # the watermarks Kafka reports after retention deleted [100, 250) (end to end: test_trace's gap)
    spec = make_spec()
    with pytest.raises(OffsetGapError, match=r"offsets \[100, 250\) aged out .* --accept-gap"):
        plan_batch(spec, state(250, 400), progress(100), 1000)
    plan = plan_batch(spec, state(250, 400), progress(100), 1000, accept_gap=True)
    assert plan.gaps == {0: (100, 250)}
    assert plan.range_map() == {0: (250, 400)}


def test_offsets_going_backwards_or_a_new_topic_id_mean_the_topic_was_recreated(make_spec):
    spec = make_spec()
    with pytest.raises(TopicRecreatedError, match="offsets went backwards"):
        plan_batch(spec, state(0, 10), progress(500), 1000)
    with pytest.raises(TopicRecreatedError, match="was deleted and recreated"):
        plan_batch(spec, state(0, 900, topic_id="id-2"), progress(500), 1000)


def test_batches_are_bounded_and_shared_fairly_across_partitions(make_spec):
    spec = make_spec()
    wide = TopicState("t", None, {p: PartitionState(p, 0, end) for p, end in enumerate([1000, 10, 1000])})
    plan = plan_batch(spec, wide, [], 500)
    assert plan.record_count == 500
    assert plan.range_map() == {0: (0, 245), 1: (0, 10), 2: (0, 245)}


def test_large_partition_ranges_are_cut_so_every_task_slot_reads():
    three = [OffsetRange("t", p, 0, 60_000) for p in range(3)]
    pieces = split_for_tasks(three, tasks=4)
    assert len(pieces) == 6  # three 60k partitions on four slots: two pieces each, not three tasks
    for p in range(3):
        mine = [(r.start, r.end) for r in pieces if r.partition == p]
        assert mine == [(0, 30_000), (30_000, 60_000)]  # contiguous, exactly the partition's range
    many = [OffsetRange("t", p, 100, 5_000) for p in range(12)]
    assert split_for_tasks(many, tasks=4) == many  # enough partitions: nothing to cut
    assert split_for_tasks([OffsetRange("t", 0, 7, 7)], tasks=4) == [OffsetRange("t", 0, 7, 7)]


def test_a_stopped_producer_sees_all_its_records_land(platform, pipeline, spark):
    spec = pipeline(partitions=1)
    # one produce batch, the last thing the producer does: the log end is the high watermark after it
    send(platform, spec.source.topic, [encode(order(i)) for i in range(100)], partition=0,
         **{"linger.ms": 200, "batch.num.messages": 1000})
    state_ = topic_state(platform.kafka(), spec.source.topic)
    assert state_.partitions[0].end == 100
    IngestJob(spec, platform, spark).run_once()
    assert len(rows(platform, spec, spec.target.table)) == 100
    assert summaries(platform, spec, spec.target.table)[-1][SnapshotSummary.POSITIONS] == '{"0":100}'


def test_a_record_that_crashes_the_reader_is_dead_lettered_and_the_batch_commits(platform, pipeline, spark,
                                                                                 monkeypatch):
    # the reader raises on the record half way through each range, on every attempt (LAKEHOUSE_FAULT)
    spec = pipeline(partitions=1, partition_by=[])
    send(platform, spec.source.topic, [encode(order(i)) for i in range(40)], partition=0)
    monkeypatch.setenv("LAKEHOUSE_FAULT", "record_crash")
    job = IngestJob(spec, platform, spark)
    [receipt] = job.run_once()
    assert assert_exactly_once(platform, spec) == 40
    dead = rows(platform, spec, spec.dead_letter_table)
    assert [(r["error_kind"], r["_kafka"]["offset"]) for r in dead] == [("reader_failure", 20)]
    assert "injected reader crash" in dead[0]["error_detail"] and dead[0]["value"] == encode(order(20))[1]
    assert receipt.dead_letters == 1 and job.poisoned.keys() == {(0, 20)}


# Kafka timestamps a producer can send: none (the producer's clock), any representable one, and the edges
# and far future past the representable range (librdkafka refuses negative ones)
SENDABLE_TIMESTAMPS = st.one_of(
    st.none(), st.integers(1, MAX_KAFKA_TIMESTAMP_MS),
    st.sampled_from([1, MAX_KAFKA_TIMESTAMP_MS, MAX_KAFKA_TIMESTAMP_MS + 1, 2**62, 2**63 - 1]))
HOSTILE_FIELDS = [{"name": "id", "type": "string", "required": True, "max_length": 40},
                  {"name": "label", "type": "string"}, {"name": "code", "type": "string", "pattern": "^[A-Z]{3}$"},
                  {"name": "size", "type": "string", "enum": ["S", "M", "L"]}, {"name": "small", "type": "int"},
                  {"name": "big", "type": "long"}, {"name": "ratio", "type": "double"},
                  {"name": "flag", "type": "boolean"}, {"name": "at", "type": "timestamp"},
                  {"name": "day", "type": "date"}]


@settings(max_examples=3, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(records=st.lists(st.tuples(SENDABLE_TIMESTAMPS, KEYS_AND_VALUES, st.integers(0, 2)), min_size=20, max_size=60))
def test_hostile_records_land_exactly_once_in_the_table_or_the_dead_letter_table(platform, make_spec, spark,
                                                                                  records):
    """Arbitrary bytes, arbitrary JSON and the edges of every contract type and of the Kafka timestamp,
    through the real broker, Spark and catalog: every offset lands once, as a row or a dead letter."""
    from lakehouse.core.topics import ensure_topics

    spec = make_spec(fields=HOSTILE_FIELDS, key={"field": "id", "required": False}, partition_by=[],
                     fanout={"field": "size", "routes": {"S": "raw.orders_{suffix}_small"}},
                     source={"max_value_bytes": 20_000})
    ensure_topics([spec], platform)
    producer_settings.accept_any_timestamp(spec.source.topic, platform)  # the far-future timestamps too
    producer = Producer(platform.kafka(**{"linger.ms": 5}))
    for ts_ms, (key, value), partition in records:
        producer.produce(spec.source.topic, key=key, value=value, partition=partition,
                         **({} if ts_ms is None else {"timestamp": ts_ms}))
    assert producer.flush(30) == 0
    IngestJob(spec, platform, spark).run_once()
    assert assert_exactly_once(platform, spec) == len(records)
    dead = rows(platform, spec, spec.dead_letter_table)
    assert all(r["error_kind"] in ERROR_KINDS and r["error_kind"] != "reader_failure" for r in dead), \
        {r["error_kind"]: r["error_detail"] for r in dead}
