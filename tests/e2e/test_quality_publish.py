"""Write-audit-publish: new rows reach readers only after the expectation suite passes and the
freshness/lag SLOs hold; a failing batch stays on `main`, named down to its Kafka offsets. The DAG's
`verify` task verifies together the snapshots it audited, so that the gate can require that."""

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml
from airflow.sdk.exceptions import AirflowSensorTimeout
from confluent_kafka import Producer
from e2e import pipeline, rows, run_cli, send, table, task_states, xcom  # noqa: F401 (fixture)

from lakehouse.core import errors, events
from lakehouse.core.spec import load_spec
from lakehouse.ingest.job import IngestJob
from lakehouse.recovery.replay import Replay
from lakehouse.wap import publish, quality
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def order(i: int, **changes) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": f"c-{i % 7}", "amount": 10.0 + i, "currency": "EUR",
              "status": "created", "event_time": datetime.now(timezone.utc).isoformat()}
    record.update(changes)
    return record["order_id"].encode(), json.dumps(record).encode()


def head(platform, spec, name=None) -> int | None:
    return publish.published_head(table(platform, spec, name or spec.target.table), spec.publish.branch)


def main_snapshot(platform, spec) -> int:
    return table(platform, spec, spec.target.table).current_snapshot().snapshot_id


def asset_events(name: str) -> list:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id) \
            .filter(AssetModel.name == name).all()


def test_a_good_batch_is_published_to_readers_through_the_view(platform, pipeline, make_spec, run_dag, spark):
    spec = pipeline(partitions=2, slo={"freshness": "1h"})
    produce.produce(spec, 200, seed=1)
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert done.returncode == 0, done.stderr[-3000:]
    audited = main_snapshot(platform, spec)
    assert head(platform, spec) is None, "nothing is published before the first audit"

    run = run_dag(f"{spec.name}_publish", make_spec.directory)

    assert str(run.state) == "success", task_states(run)
    assert head(platform, spec) == audited, "readers' branch points at exactly the audited snapshot"
    checked = events.recent(spec.name, kind="quality", platform=platform)[0]
    assert checked["status"] == "ok" and checked["metrics"]["rows"] == 200
    assert checked["details"]["snapshots"] == {spec.target.table: audited}
    assert Path(checked["details"]["docs"]).is_file()
    assert events.recent(spec.name, kind="publish", platform=platform)[0]["status"] == "ok"
    view = spec.qualified(spec.publish.view)
    assert spark.sql(f"SELECT count(*) FROM {view}").collect()[0][0] == 200
    assert len(asset_events(spec.qualified(spec.target.table))) == 1
    assert xcom(run, "publish", "return_value") == [
        {"table": spec.target.table, "snapshot_id": audited, "previous_snapshot_id": None, "view": spec.publish.view}]


def test_a_failing_expectation_blocks_publication_and_names_the_offending_offsets(platform, pipeline, make_spec,
                                                                                   run_dag, spark):
    spec = pipeline(partitions=1, slo={"freshness": "1h"})
    job = IngestJob(spec, platform, spark)
    send(platform, spec.source.topic, [order(i) for i in range(20)], partition=0)
    job.run_once()
    good = quality.audit(spec, platform)
    published = good.snapshots[spec.target.table]
    # while the audit ran, ingestion went on: offsets 20..29 are good orders, offsets 30..32 break
    # expectations the contract cannot see
    future = (datetime.now(timezone.utc) + timedelta(hours=2)).isoformat()
    send(platform, spec.source.topic, [order(i) for i in range(20, 30)]
         + [order(30, currency="ZZZ"), order(31, event_time=future), order(32, currency="ZZZ", event_time=future)],
         partition=0)
    job.run_once()
    publish.publish(spec, good.snapshots, platform)
    assert head(platform, spec) == published != main_snapshot(platform, spec), "exactly the audited snapshot"

    run = run_dag(f"{spec.name}_publish", make_spec.directory)

    states = task_states(run)
    assert str(run.state) == "failed" and states["quality"] == "failed", states
    assert states["publish"] == "upstream_failed", states
    assert head(platform, spec) == published, "readers still see the last good snapshot"
    assert len(rows(platform, spec, spec.target.table)) == 33, "main (the audit branch) keeps every row"
    view = spark.sql(f"SELECT count(*) FROM {spec.qualified(spec.publish.view)}").collect()[0][0]
    assert view == 20
    result = events.recent(spec.name, kind="quality", platform=platform)[0]
    assert result["status"] == "failed"
    assert result["metrics"]["rows"] == 13, "only rows added since the published snapshot are audited"
    assert result["metrics"]["failed_expectations"] == 2
    offending = {(o["partition"], o["offset"], o["column"]) for o in result["details"]["offending_offsets"]}
    assert offending == {(0, 30, "currency"), (0, 32, "currency"), (0, 31, "event_time"), (0, 32, "event_time")}
    assert all(o["topic"] == spec.source.topic for o in result["details"]["offending_offsets"])
    docs = Path(result["details"]["docs"])
    assert docs.is_file() and "<html" in docs.read_text().lower()
    assert f"{spec.source.topic}[0]@30" in result["message"]
    pushed = xcom(run, "quality", "result")
    assert pushed["success"] is False and pushed["rows"] == 13
    assert pushed["offending_offsets"] == result["details"]["offending_offsets"]
    # once a newer snapshot is published, the older one can never be published over it
    publish.publish(spec, {spec.target.table: main_snapshot(platform, spec)}, platform, record_event=False)
    with pytest.raises(errors.NotADescendantError):
        publish.publish(spec, {spec.target.table: published}, platform, record_event=False)


def test_dead_letters_replayed_below_the_published_positions_are_audited_before_they_are_published(
        platform, pipeline, spark):
    spec = pipeline(partitions=1)
    # offset 3 is dead-lettered: "eur" breaks the contract's ^[A-Z]{3}$
    send(platform, spec.source.topic, [order(i) for i in range(3)] + [order(3, currency="eur")]
         + [order(i) for i in range(4, 8)], partition=0)
    IngestJob(spec, platform, spark).run_once()
    first = quality.audit(spec, platform, record_event=False)
    assert first.success and first.rows == 7
    publish.publish(spec, first.snapshots, platform, spark_factory=lambda: spark, record_event=False)
    # the contract is relaxed and the dead letter replayed; the suite only knows upper-case currencies
    raw = yaml.safe_load(Path(spec.path).read_text())
    next(f for f in raw["contract"]["fields"] if f["name"] == "currency")["pattern"] = "^[A-Za-z]{3}$"
    Path(spec.path).write_text(yaml.safe_dump(raw))
    relaxed = load_spec(spec.path)
    assert Replay(IngestJob(relaxed, platform, spark)).dead_letters().dead_letters_resolved == 1

    result = quality.audit(relaxed, platform, record_event=False)

    assert not result.success and result.rows == 1, "only the replayed row is new since the publication"
    assert result.tables[spec.target.table].offsets == {0: (3, 3)}
    assert [(o["partition"], o["offset"], o["column"]) for o in result.offending_offsets] == [(0, 3, "currency")]
    assert head(platform, spec) == first.snapshots[spec.target.table]


def test_an_upsert_audit_validates_only_the_live_version_of_keys_changed_since_publication(platform, pipeline,
                                                                                           spark):
    spec = pipeline(mode="upsert", table_key=["order_id"], partition_by=[], partitions=1)
    job = IngestJob(spec, platform, spark)
    send(platform, spec.source.topic, [order(1), order(2), order(3)], partition=0)
    job.run_once()
    publish.publish(spec, quality.audit(spec, platform, record_event=False).snapshots, platform,
                    spark_factory=lambda: spark, record_event=False)
    send(platform, spec.source.topic, [order(1, status="paid")], partition=0)  # offset 3
    job.run_once()
    send(platform, spec.source.topic, [order(1, status="shipped"), order(4)], partition=0)  # offsets 4, 5
    job.run_once()

    result = quality.audit(spec, platform, record_event=False)

    # the "paid" version was added after the publication and deleted (by position) since: not audited,
    # else the key would not be unique
    assert result.success, result.summary()
    assert result.rows == 2 and result.tables[spec.target.table].offsets == {0: (4, 5)}


def test_upsert_suites_get_key_uniqueness_from_the_spec(platform, pipeline, spark):
    spec = pipeline(mode="upsert", table_key=["order_id"], partition_by=[], partitions=1)
    suite = quality.load_suite(spec)
    assert {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "order_id"},
            "meta": {"generated_from": "target.key"}} in suite["expectations"]
    send(platform, spec.source.topic, [order(1), order(2), order(1, status="paid")], partition=0)
    IngestJob(spec, platform, spark).run_once()
    assert quality.audit(spec, platform, record_event=False).success
    # a buggy writer appends a second row for ord-1 (same coordinates as the live one)
    data = table(platform, spec, spec.target.table)
    live = data.scan().to_arrow().filter(pc.field("order_id") == "ord-1")
    data.append(live)

    result = quality.audit(spec, platform, record_event=False)

    assert not result.success
    unique = next(e for e in result.expectations if e["expectation"] == "expect_column_values_to_be_unique")
    assert not unique["success"] and unique["unexpected_count"] == 2
    assert {(o["partition"], o["offset"]) for o in result.offending_offsets} == {(0, 2)}


def test_a_fanout_pipeline_audits_and_publishes_every_table_with_its_own_view(platform, pipeline, spark):
    spec = pipeline(partitions=1, fanout={"field": "currency",
                                                   "routes": {"USD": "raw.orders_{suffix}_usd"}})
    default, usd = spec.target.tables
    send(platform, spec.source.topic, [order(i, currency=("EUR", "USD")[i % 2]) for i in range(11)], partition=0)
    IngestJob(spec, platform, spark).run_once()

    audited = quality.audit(spec, platform, record_event=False)
    assert audited.success
    assert {t: a.rows for t, a in audited.tables.items()} == {default: 6, usd: 5}
    done = publish.publish(spec, audited.snapshots, platform, record_event=False)

    assert {p.table: p.view for p in done} == {default: spec.publish.view, usd: f"serve.{usd.split('.')[1]}"}
    for name in (default, usd):
        assert head(platform, spec, name) == audited.snapshots[name]
    counts = {p.view: spark.sql(f"SELECT count(*) FROM {spec.qualified(p.view)}").collect()[0][0] for p in done}
    assert counts == {spec.publish.view: 6, f"serve.{usd.split('.')[1]}": 5}


@pytest.mark.parametrize("text, why", [
    (None, "cannot read"),
    ("{not json", "is not valid JSON"),
    ('{"expectations": {"type": "x"}}', "'expectations' list"),
    ('{"expectations": [{"type": "expect_column_values_to_be_sorted_alphabetically", "kwargs": {}}]}',
     "not a valid expectation suite"),
    ('{"expectations": [{"type": "expect_column_values_to_be_between", "kwargs": {"colum": "amount"}}]}',
     "not a valid expectation suite"),
])
def test_a_missing_or_broken_suite_stops_with_the_file_and_the_reason(make_spec, tmp_path, text, why):
    spec = make_spec()
    if text is not None:
        (tmp_path / "orders.json").write_text(text)
    with pytest.raises(errors.QualityConfigError, match=why) as failed:
        quality.load_suite(spec, tmp_path)
    assert str(tmp_path / "orders.json") in str(failed.value)


def run_trigger(spec, kind: str, limits: dict, within: float = 1.0) -> dict:
    from lakehouse_airflow.triggers import SloTrigger

    trigger = SloTrigger(kind=kind, pipeline=spec.name, limits=limits, deadline=time.time() + within,
                         poll_interval=0.5, pipelines_dir=str(Path(spec.path).parent))
    classpath, kwargs = trigger.serialize()
    assert classpath == "lakehouse_airflow.triggers.SloTrigger"
    revived = SloTrigger(**json.loads(json.dumps(kwargs)))  # what the triggerer does

    return asyncio.run(first_event(revived))


async def first_event(trigger) -> dict:
    async for event in trigger.run():
        return event.payload


def test_the_lag_gate_holds_back_until_the_backlog_is_ingested(platform, pipeline, spark, monkeypatch):
    spec = pipeline(partitions=1)
    job = IngestJob(spec, platform, spark)
    send(platform, spec.source.topic, [order(i) for i in range(5)], partition=0)
    job.run_once()
    # a backlog of 30 records, the oldest produced 2 minutes ago
    producer = Producer(platform.kafka())
    old = int(time.time() * 1000) - 120_000
    for i in range(5, 35):
        key, value = order(i)
        producer.produce(spec.source.topic, key=key, value=value, partition=0, timestamp=old + i)
    producer.flush(30)

    by_records = run_trigger(spec, "lag", {"lag_records": 10, "lag_s": 3600})
    by_age = run_trigger(spec, "lag", {"lag_records": 1000, "lag_s": 60})

    assert by_records["status"] == "breached"
    assert "lag is 30 records, 20 records over the 10 records limit" in by_records["check"]["message"]
    assert by_age["status"] == "breached"
    assert by_age["check"]["measured"]["lag_s"] >= 110
    assert "age of the oldest unconsumed record" in by_age["check"]["message"]
    with pytest.raises(AirflowSensorTimeout, match="lag is 30 records, 20 records over the 10 records limit"):
        run_lag_sensor(spec, monkeypatch)
    job.run_once()
    caught_up = run_trigger(spec, "lag", {"lag_records": 10, "lag_s": 60})
    assert caught_up["status"] == "ok", caught_up
    assert caught_up["check"]["measured"] == {"lag_records": 0, "lag_s": 0.0}
    assert run_lag_sensor(spec, monkeypatch)["ok"] is True


def run_lag_sensor(spec, monkeypatch) -> dict:
    """A deferrable LagSensor (10 records) driven as Airflow drives it: execute() either returns or
    defers; the trigger (revived from its serialized form) runs; execute_complete() gets its event."""
    from airflow.sdk.exceptions import TaskDeferred

    from lakehouse_airflow.sensors import LagSensor

    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(Path(spec.path).parent))
    sensor = LagSensor(task_id="lag", pipeline=spec.name, max_records=10, poke_interval=0.5, timeout=1)
    try:
        return sensor.execute({})
    except TaskDeferred as deferred:
        classpath, kwargs = deferred.trigger.serialize()
        assert classpath == "lakehouse_airflow.triggers.SloTrigger"
        event = asyncio.run(first_event(type(deferred.trigger)(**json.loads(json.dumps(kwargs)))))
        return getattr(sensor, deferred.method_name)({}, event)


def test_the_freshness_gate_in_poke_mode_fails_saying_which_slo_was_missed(pipeline, monkeypatch):
    from lakehouse_airflow.sensors import FreshnessSensor

    spec = pipeline(slo={"freshness": "30s"})  # nothing ingested yet: no event time, no commit
    monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(Path(spec.path).parent))
    sensor = FreshnessSensor(task_id="freshness", pipeline=spec.name, deferrable=False, poke_interval=0.2,
                             timeout=0.5)
    with pytest.raises(AirflowSensorTimeout) as failed:
        sensor.execute({})
    assert str(failed.value) == (f"{spec.name}: freshness SLO missed: age of the newest committed event is unknown "
                                 f"(limit 30s); age of the last commit is unknown (limit 30s)")


def test_the_view_shows_columns_the_table_gained_once_they_are_published(platform, pipeline, spark):
    spec = pipeline(partitions=1)
    send(platform, spec.source.topic, [order(i) for i in range(5)])
    IngestJob(spec, platform, spark).run_once()
    publish.publish(spec, quality.audit(spec, platform, record_event=False).snapshots, platform,
                    spark_factory=lambda: spark, record_event=False)
    view = spec.qualified(spec.publish.view)
    assert "channel" not in spark.table(view).columns

    raw = yaml.safe_load(Path(spec.path).read_text())
    raw["contract"]["fields"].append({"name": "channel", "type": "string"})
    Path(spec.path).write_text(yaml.safe_dump(raw))
    evolved = load_spec(spec.path)
    send(platform, spec.source.topic, [order(i, channel="app") for i in range(5, 8)])
    IngestJob(evolved, platform, spark).run_once()
    publish.publish(evolved, quality.audit(evolved, platform, record_event=False).snapshots, platform,
                    spark_factory=lambda: spark, record_event=False)

    channels = [r.channel for r in spark.table(view).collect()]
    assert channels.count("app") == 3 and channels.count(None) == 5


def test_the_publish_dags_verify_task_verifies_in_full_snapshots_verified_only_beside_others(
        platform, pipeline, make_spec, run_dag, spark):
    """Exactly once holds across a fan-out pipeline's tables, and the gate wants one verification of exactly
    the snapshots it publishes (tests/unit/ops/test_operator_authority.py). Here each table's head was verified
    beside an older snapshot of the other, and both such verifications passed, though an offset the default
    table holds was copied into the route table: an incremental run finds nothing new, so the DAG's `verify`
    task verifies the two heads together in full, finds the copy, and nothing is published."""
    from pyiceberg.expressions import And, EqualTo

    from lakehouse.audit import verify

    spec = pipeline(partitions=1, partition_by=[], fanout={"field": "currency",
                                                           "routes": {"USD": "raw.orders_{suffix}_usd"}})
    default, usd = spec.target.tables
    job, quiet = IngestJob(spec, platform, spark), (lambda line: None)

    def heads_now() -> dict[str, int]:
        return {name: table(platform, spec, name).current_snapshot().snapshot_id for name in (default, usd)}

    def ingest(batch: range) -> None:
        send(platform, spec.source.topic, [order(i, currency=("EUR", "USD")[i % 2]) for i in batch], partition=0)
        job.run_once()

    ingest(range(0, 10))
    assert verify.verify(spec, platform, progress=quiet).ok
    first = heads_now()
    ingest(range(10, 20))
    # offset 12 (EUR: the default table's) copied into the USD table by a careless hand
    copied = table(platform, spec, default).scan(row_filter=And(EqualTo("_kafka.partition", 0),
                                                                EqualTo("_kafka.offset", 12))).to_arrow()
    assert copied.num_rows == 1
    table(platform, spec, usd).append(copied)
    heads = heads_now()
    mixed = [verify.verify(spec, platform, upto={default: heads[default], usd: first[usd]}, progress=quiet),
             verify.verify(spec, platform, upto={default: first[default], usd: heads[usd]}, progress=quiet)]
    assert all(v.status == "ok" for v in mixed), [v.summary() for v in mixed]

    run = run_dag(f"{spec.name}_publish", make_spec.directory)
    states = task_states(run)
    assert (states["quality"], states["verify"], states["publish"]) == ("success", "failed", "upstream_failed")
    together = events.recent(spec.name, kind="verify", platform=platform)[0]
    assert (together["status"], together["details"]["mode"]) == ("failed", "full")
    assert {t: together["details"]["snapshots"][t] for t in heads} == heads
    assert {(p["kind"], p["partition"], p["offset"]) for p in together["details"]["problems"]} == \
        {("duplicated", 0, 12)}
    assert (head(platform, spec, default), head(platform, spec, usd)) == (None, None)  # readers see nothing
