"""`--dry-run` on the commands that change state says what the real run would do and changes nothing:
`topics` (the topics it would create, the existing ones it leaves as they are), `retention` (per table the
rows the data-retention DELETE would remove; with `--guard` the retention.ms it would set) and `replay` (the
offset ranges, their records and the tables it would write). Each dry run is checked against the real run
that follows it: the real run does exactly what the dry run said.

On the embedded Apache Kafka; the CLI runs in-process (e2e.run_cli) with the session's Spark session.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.exceptions import NoSuchTableError

from e2e import pipeline, rows, run_cli, send, table, xcom  # noqa: F401 (fixture)
from lakehouse.core import events, topics
from lakehouse.ingest.job import IngestJob
from lakehouse.upkeep import retention

pytestmark = pytest.mark.slow
HOUR_MS, MINUTE_MS, WEEK_MS = 3_600_000, 60_000, 7 * 86_400_000


def order(i: int, event_time: datetime) -> tuple[bytes, bytes]:
    record = {"order_id": f"ord-{i}", "customer_id": "c-1", "amount": float(i), "currency": "EUR",
              "status": "created", "event_time": event_time.isoformat()}
    return record["order_id"].encode(), json.dumps(record).encode()


def full_hour_past(age_ms: int) -> int:
    """The retention.ms the guard sets for a declared hour: a full hour past the oldest record, whole minutes."""
    return math.ceil((age_ms + HOUR_MS) / MINUTE_MS) * MINUTE_MS


def snapshot_ids(platform, spec) -> dict[str, list[int]]:
    return {name: sorted(s.snapshot_id for s in table(platform, spec, name).snapshots())
            for name in spec.positioned_tables}


def test_topics_dry_run_lists_what_it_would_create_and_what_it_leaves_and_creates_nothing(platform, make_spec):
    spec = make_spec(partitions=3, retention_ms=WEEK_MS)
    topic = spec.source.topic

    dry = run_cli(spec, "topics", "--pipeline", spec.name, "--dry-run")

    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"would create topic {topic} (3 partitions, replication factor 1, retention.ms {WEEK_MS})"]
    assert topic not in topics.topic_partitions(platform)
    as_json = json.loads(run_cli(spec, "topics", "--pipeline", spec.name, "--dry-run", "--json").stdout)
    assert as_json == {"create": [{"topic": topic, "partitions": 3, "replication_factor": 1,
                                   "config": {"retention.ms": str(WEEK_MS)}}],
                       "mismatches": [], "unchanged": [], "created": [], "dry_run": True}
    assert topic not in topics.topic_partitions(platform)

    real = run_cli(spec, "topics", "--pipeline", spec.name)  # what the dry run said, no more
    assert (real.returncode, real.stdout) == (0, f"created topic {topic}\n"), real.stderr
    assert topics.topic_partitions(platform)[topic] == 3
    assert topics.describe_retention(topic, platform) == WEEK_MS

    again = run_cli(spec, "topics", "--pipeline", spec.name, "--dry-run")
    assert again.stdout == "dry run: every topic exists; nothing would be created\n"
    wider = make_spec(partitions=5, source={"topic": topic})
    left = run_cli(wider, "topics", "--pipeline", wider.name, "--dry-run")
    assert left.returncode == 0, left.stderr
    [line] = left.stdout.splitlines()[:1]
    assert line.startswith(f"would leave as it is: topic {topic!r} has 3 partition(s) but pipeline "
                           f"{wider.name!r} declares 5")
    assert topics.topic_partitions(platform)[topic] == 3


def test_retention_and_replay_dry_runs_name_the_rows_ranges_and_tables_and_write_nothing(platform, pipeline, spark):
    spec = pipeline(retention={"delete_after": "30d"}, retention_ms=WEEK_MS, partitions=1)
    now = datetime.now(timezone.utc)
    old = [order(i, now - timedelta(days=40 + i)) for i in range(7)]
    young = [order(100 + i, now - timedelta(days=i)) for i in range(5)]
    send(platform, spec.source.topic, old + young + [(b"broken", b"{not json")], partition=0)
    IngestJob(spec, platform, spark=spark).run_once()
    data, dead = spec.qualified(spec.target.table), spec.qualified(spec.dead_letter_table)
    before = snapshot_ids(platform, spec)
    assert len(rows(platform, spec, spec.target.table)) == 12

    # retention: the rows the delete would remove, per table; nothing deleted, nothing recorded
    dry = run_cli(spec, "retention", "--pipeline", spec.name, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True and report["deleted_rows"] == {data: 7}
    assert f"dry run: data retention would delete 7 rows from {data}" in report["message"]
    assert events.recent(spec.name, "retention", platform=platform) == []

    # replay: offsets, a time range, another table, dead letters
    shown = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:2-9", "--dry-run", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"pipeline": spec.name, "kind": "replay", "dry_run": True,
                                        "ranges": {"0": [2, 9]}, "records": 7, "tables": [data, dead],
                                        "creates_table": False, "inserted_by_table": None,
                                        "dead_letters_resolved": None, "dead_letters_added": None, "seconds": None}
    human = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:2-9", "--dry-run")
    assert human.stdout == f"dry run: would replay 7 records (p0:[2,9)) into {data}, {dead}; nothing written\n"
    window = run_cli(spec, "replay", "--pipeline", spec.name, "--dry-run", "--json",
                     "--from-time", (now - timedelta(hours=1)).isoformat())
    assert json.loads(window.stdout)["ranges"] == {"0": [0, 13]}, window.stderr
    candidate = f"raw.{spec.name}_candidate"
    into = json.loads(run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:0-13", "--dry-run", "--json",
                              "--into-table", candidate).stdout)
    assert (into["tables"], into["creates_table"], into["records"]) == ([spec.qualified(candidate)], True, 13)
    with pytest.raises(NoSuchTableError):
        table(platform, spec, candidate)
    letters = json.loads(run_cli(spec, "replay", "--pipeline", spec.name, "--dead-letters", "--dry-run",
                                 "--json").stdout)
    assert (letters["kind"], letters["records"], letters["tables"]) == ("dead-letter-replay", 1, [data, dead])
    # what the replay would refuse, the dry run refuses with the same words
    past = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:5-20", "--dry-run")
    assert past.returncode == 2
    assert "range [5, 20) goes past the pipeline's committed position 13" in past.stderr

    assert snapshot_ids(platform, spec) == before
    assert events.recent(spec.name, "replay", platform=platform) == []

    # the real run deletes exactly what the dry run counted
    real = run_cli(spec, "retention", "--pipeline", spec.name, "--dry-run=false", "--json")
    assert real.returncode == 0, real.stderr
    assert json.loads(real.stdout)["deleted_rows"] == {data: 7}
    assert sorted(r["order_id"] for r in rows(platform, spec, spec.target.table)) == [f"ord-{100 + i}" for i in range(5)]


def test_the_guard_dry_run_names_the_retention_it_would_set_and_leaves_the_topic_and_timeline(
        platform, make_spec, run_dag):
    spec = make_spec(partitions=1, retention_ms=None, retention={"max_retention": "3h"}, slo={"lag_seconds": "5m"})
    topic = spec.source.topic
    admin = AdminClient(platform.kafka())  # referenced until the future is done: a collected client fails it
    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": str(HOUR_MS)})])[topic].result(15)
    producer = Producer(platform.kafka())  # a stalled writer: records 40 minutes old, past half the hour
    stamp = int((datetime.now(timezone.utc) - timedelta(minutes=40)).timestamp() * 1000)
    for i in range(3):
        producer.produce(topic, key=f"k{i}".encode(), value=order(i, datetime.now(timezone.utc))[1], timestamp=stamp)
    assert producer.flush(30) == 0

    run = run_dag("retention_guard", make_spec.directory, conf={"dry_run": True})  # the DAG's `dry_run` Param
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {f"guard_{spec.name}": "success"}
    previewed = xcom(run, f"guard_{spec.name}")
    assert (previewed["dry_run"], previewed["action"]) == (True, "raised")
    assert previewed["new_retention_ms"] == full_hour_past(previewed["oldest_age_ms"])
    assert topics.describe_retention(topic, platform) == HOUR_MS

    dry = run_cli(spec, "retention", "--pipeline", spec.name, "--guard", "--dry-run", "--json")

    assert dry.returncode == 0, dry.stderr
    said = json.loads(dry.stdout)
    assert (said["dry_run"], said["action"]) == (True, "raised")
    assert said["new_retention_ms"] == full_hour_past(said["oldest_age_ms"]) >= 101 * MINUTE_MS
    assert said["message"].startswith(f"dry run: would set retention.ms of topic {topic!r} from 3600000 ms (1.0h) "
                                      f"to {said['new_retention_ms']} ms (")
    assert topics.describe_retention(topic, platform) == HOUR_MS
    assert events.recent(spec.name, retention.GUARD_KIND, platform=platform, catalog=spec.catalog) == []

    real = json.loads(run_cli(spec, "retention", "--pipeline", spec.name, "--guard", "--json").stdout)
    assert (real["dry_run"], real["action"]) == (False, "raised")
    assert real["new_retention_ms"] == full_hour_past(real["oldest_age_ms"])  # the dry run's rule, a moment later
    assert topics.describe_retention(topic, platform) == real["new_retention_ms"]
