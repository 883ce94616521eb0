"""Recovery points and lag per pipeline: what the tables hold versus what Kafka has.

Reads only the catalog (pyiceberg) and Kafka metadata, so it is cheap enough for
a CLI, a sensor or a UI page.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from lakehouse import config, offsets
from lakehouse.kafka_source import SourceError, topic_state_for
from lakehouse.spec import PipelineSpec


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def pipeline_status(spec: PipelineSpec, platform: config.PlatformConfig | None = None,
                    now: datetime | None = None) -> dict:
    """Per pipeline: committed vs log-end offsets, lag, last commit, newest event time, counts, snapshots."""
    platform = platform or config.load()
    now = now or datetime.now(timezone.utc)
    catalog = offsets.open_catalog(platform, spec.catalog)
    tables = []
    progress = {}
    for name in (*spec.target.tables, spec.dead_letter_table):
        tp = offsets.read_progress(catalog, name, spec.name)
        progress[name] = tp
        tables.append({
            "table": spec.qualified(name),
            "role": "dead-letter" if name == spec.dead_letter_table else "data",
            "exists": tp.exists,
            "rows": tp.total_records,
            "snapshots": tp.snapshot_count,
            "current_snapshot_id": tp.current_snapshot_id,
            "recovery_snapshot_id": tp.snapshot_id,
            "positions": {str(p): o for p, o in sorted(tp.positions.items())},
            "last_commit_at": _iso(tp.committed_at),
            "max_event_time": _iso(tp.max_event_time),
        })
    data = [progress[t] for t in spec.target.tables]
    status: dict = {
        "pipeline": spec.name,
        "topic": spec.source.topic,
        "mode": spec.target.mode,
        "tables": tables,
        "rows": sum(tp.total_records for tp in data),
        "dead_letters": progress[spec.dead_letter_table].total_records,
        "kafka": None,
        "lag_records": None,
        "lag_s": None,
    }
    commits = [tp.committed_at for tp in data if tp.committed_at]
    events = [tp.max_event_time for tp in data if tp.max_event_time]
    status["last_commit_at"] = _iso(max(commits)) if commits else None
    status["newest_event_time"] = _iso(max(events)) if events else None
    status["seconds_since_commit"] = round((now - max(commits)).total_seconds(), 1) if commits else None
    status["freshness_s"] = round((now - max(events)).total_seconds(), 1) if events else None
    try:
        state = topic_state_for(platform.kafka(), spec.source.topic, progress.values(), timeout=10.0)
    except SourceError as exc:
        status["kafka"] = {"error": str(exc)}
        return status
    partitions = []
    for p, ps in sorted(state.partitions.items()):
        committed = min((progress[t].positions.get(p, ps.earliest) for t in spec.target.tables), default=0)
        partitions.append({"partition": p, "earliest": ps.earliest, "end": ps.end, "committed": committed,
                           "lag": max(0, ps.end - committed)})
    oldest = _record_timestamps(platform.kafka(), spec.source.topic,
                                {p["partition"]: max(p["committed"], p["earliest"]) for p in partitions if p["lag"]})
    for p in partitions:
        ts = oldest.get(p["partition"])
        p["lag_s"] = 0.0 if not p["lag"] else None if ts is None else round(max(0.0, now.timestamp() - ts / 1000), 1)
    status["kafka"] = {"topic_id": state.topic_id, "partitions": partitions}
    status["lag_records"] = sum(p["lag"] for p in partitions)
    # lag in seconds: age of the oldest record not yet in the tables (0 when caught up)
    ages = [p["lag_s"] for p in partitions]
    status["lag_s"] = None if None in ages else max(ages, default=0.0)
    return status


def _record_timestamps(kafka_conf: dict, topic: str, starts: dict[int, int], timeout: float = 10.0) -> dict[int, int]:
    """Kafka timestamp (ms) of the record at `starts[p]` per partition; partitions that return none
    within `timeout` seconds are left out."""
    if not starts:
        return {}
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_conf, "group.id": "lakehouse-status", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    found: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + timeout
        pending = set(starts)
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(pending), timeout=0.5):
                p = msg.partition()
                if p not in pending:
                    continue
                if msg.error() is None:
                    found[p] = msg.timestamp()[1]
                pending.discard(p)  # a record or end-of-partition: either way done with p
    finally:
        consumer.close()
    return found


def format_age(seconds: float | None) -> str:
    """A duration for people: 52s, 14m, 3.5h; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render(statuses: list[dict]) -> str:
    """A readable table of pipeline statuses, then one line per partition."""
    header = ("PIPELINE", "MODE", "ROWS", "DEAD", "LAG", "LAST COMMIT", "FRESHNESS", "SNAPSHOTS")
    rows = []
    for s in statuses:
        data = [t for t in s["tables"] if t["role"] == "data"]
        rows.append((s["pipeline"], s["mode"], str(s["rows"]), str(s["dead_letters"]),
                     "?" if s["lag_records"] is None else str(s["lag_records"]),
                     format_age(s["seconds_since_commit"]) + (" ago" if s["seconds_since_commit"] is not None else ""),
                     format_age(s["freshness_s"]), str(sum(t["snapshots"] for t in data))))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    for s in statuses:
        lines.append("")
        lines.append(f"{s['pipeline']}: topic {s['topic']} -> "
                     + ", ".join(t["table"] for t in s["tables"]))
        kafka = s["kafka"] or {}
        if "error" in kafka:
            lines.append(f"  kafka: {kafka['error']}")
        for p in kafka.get("partitions", []):
            lines.append(f"  partition {p['partition']}: committed {p['committed']} / end {p['end']} "
                         f"(earliest {p['earliest']}, lag {p['lag']})")
        for t in s["tables"]:
            if not t["exists"]:
                lines.append(f"  {t['table']}: not created yet")
            else:
                lines.append(f"  {t['table']}: {t['rows']} rows, {t['snapshots']} snapshots, recovery point "
                             f"snapshot {t['recovery_snapshot_id']} at {t['last_commit_at'] or '-'}")
    return "\n".join(lines)
