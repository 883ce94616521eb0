"""Recovery points and lag per pipeline: what the tables hold versus what Kafka has, and what the
ops timeline says happened.

Positions, recovery snapshots and commit ages come from the tables' snapshot summaries
(they are the truth resume and the promotion gates rely on); lag comes from Kafka's
log ends now. Everything else is read from the ops timeline (`ops.pipeline_events`),
not recomputed: the last batch's counts and stage times, throughput over the last
minutes, and the newest quality, publish, maintenance, retention, restart and gap
events. Reads only the catalog (pyiceberg) and Kafka metadata, so it is cheap enough
for a CLI, a sensor or a UI page.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from lakehouse.core import config, console, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import SourceError
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.receipts import STAGES

# The timeline (pyarrow), Kafka (confluent_kafka) and the tables' layout (the decoders' schemas) are imported
# where they are read: formatting a status, a UI page or /metrics loads none of them.


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


TIMELINE_WINDOW = timedelta(days=7)  # how far back `timeline` looks for each kind's newest event
RATE_WINDOW_S = 300.0                 # throughput is over the batches of the last five minutes
TIMELINE_BATCHES = 60                 # batch points kept for charts


def timeline(spec: PipelineSpec, platform: config.PlatformConfig, now: datetime) -> dict:
    """What the ops timeline says about `spec`'s pipeline, from one scan of `ops.pipeline_events`:

    `last_batch` (its time, numbers and stage seconds), `recent` (batches, records, records/s,
    dead letters and commit retries over the last RATE_WINDOW_S), `latest` (per event kind
    other than batch: time, status, message, actor), `actions` (the newest operator actions,
    newest first: time, kind, status, actor and where it acted from, parameters, message) and
    `batches` (up to TIMELINE_BATCHES points, oldest first, with lag and freshness at commit).
    `error` instead when the timeline cannot be read: the rest of the status does not depend on it.
    """
    from lakehouse.core import events

    try:
        found = events.digest(spec.name, now - TIMELINE_WINDOW, TIMELINE_BATCHES, platform, spec.catalog)
    except Exception as exc:  # noqa: BLE001 - the timeline is for people; the tables still answer
        return {"error": f"{type(exc).__name__}: {exc}"}
    batches = found["batches"]
    window = [b for b in batches if (now - b["ts"]).total_seconds() <= RATE_WINDOW_S]
    records = sum(b["metrics"].get("records", 0.0) for b in window)
    last = batches[0] if batches else None
    return {
        "last_batch": None if last is None else {
            "at": last["ts"].isoformat(), "message": last["message"], **last["metrics"],
            "batch_id": last["details"].get("batch_id")},
        "recent": {
            "window_s": RATE_WINDOW_S, "batches": len(window), "records": int(records),
            "records_per_s": round(records / RATE_WINDOW_S, 1),
            "dead_letters": int(sum(b["metrics"].get("dead_letters", 0.0) for b in window)),
            "commit_retries": int(sum(b["metrics"].get("commit_retries", 0.0) for b in window)),
        },
        "latest": {kind: {"at": e["ts"].isoformat(), "status": e["status"], "message": e["message"],
                          "metrics": e["metrics"], "details": e["details"], "actor": e["actor"]}
                   for kind, e in found["latest"].items() if kind != "batch"},
        "actions": [{"at": e["ts"].isoformat(), "kind": e["kind"], "status": e["status"], "actor": e["actor"],
                     "origin": e["details"].get("actor") or {}, "parameters": e["details"].get("parameters") or {},
                     "message": e["message"]} for e in found["actions"]],
        "batches": [{"at": b["ts"].isoformat(), "lag_records": b["metrics"].get("lag_records"),
                     "freshness_s": b["metrics"].get("freshness_s")} for b in reversed(batches)],
    }


def layout(spec: PipelineSpec, catalog) -> dict:
    """Drift between the spec's layout and its existing data tables (lakehouse.ingest.tables.layout_drift):
    `tables` (one drift each: what differs), `refused` (what the ingest job cannot apply and stops on,
    a renamed default table included), `in_sync`, and `applies`: when the job applies the rest."""
    from lakehouse.ingest import tables as table_layout

    drifts = []
    for name in spec.target.tables:
        try:
            drifts.append(table_layout.layout_drift(spec, name, catalog.load_table(name).metadata))
        except NoSuchTableError:
            continue
    refused = [why for d in drifts for why in d.refused]
    renamed = table_layout.recorded_default_table(catalog, spec)[2]
    if renamed:
        refused.append(renamed)
    return {"in_sync": not refused and all(d.in_sync for d in drifts), "refused": refused,
            "tables": [d.to_json() for d in drifts],
            "applies": "when the ingest job next starts or reloads the edited spec (between batches)"}


def pipeline_status(spec: PipelineSpec, platform: config.PlatformConfig | None = None,
                    now: datetime | None = None, with_timeline: bool = True) -> dict:
    """Per pipeline: committed vs log-end offsets, lag, last commit, newest event time, counts,
    snapshots, `timeline` (see `timeline`) and `layout` (drift between spec and tables, see `layout`);
    both None with `with_timeline=False`, for callers that poll only lag and freshness, such as the
    SLO trigger, and skip their reads)."""
    from lakehouse.core import topics
    from lakehouse.ingest.plan import topic_state_for

    platform = platform or config.load()
    now = now or datetime.now(UTC)
    catalog = open_catalog(platform, spec.catalog)
    tables = []
    progress = {}
    for name in spec.positioned_tables:
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
            "lost": tp.lost,  # why the positions cannot be found although the table holds rows
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
        "timeline": timeline(spec, platform, now) if with_timeline else None,
        "layout": layout(spec, catalog) if with_timeline else None,
    }
    # librdkafka's lines go to the `lakehouse.kafka` logger (shown by `lakehouse --verbose`), not to stderr
    kafka_conf = platform.kafka(logger=logging.getLogger("lakehouse.kafka"))
    commits = [tp.committed_at for tp in data if tp.committed_at]
    events = [tp.max_event_time for tp in data if tp.max_event_time]
    status["last_commit_at"] = _iso(max(commits)) if commits else None
    status["newest_event_time"] = _iso(max(events)) if events else None
    status["seconds_since_commit"] = round((now - max(commits)).total_seconds(), 1) if commits else None
    status["freshness_s"] = round((now - max(events)).total_seconds(), 1) if events else None
    try:
        state = topic_state_for(kafka_conf, spec.source.topic, progress.values(), timeout=10.0)
    except SourceError as exc:
        status["kafka"] = {"error": str(exc), "error_type": type(exc).__name__}
        return status
    partitions: list[dict[str, Any]] = []
    committed = offsets.committed_positions(progress.values(), state.earliest)
    for p, ps in sorted(state.partitions.items()):
        partitions.append({"partition": p, "earliest": ps.earliest, "end": ps.end, "committed": committed[p],
                           "lag": max(0, ps.end - committed[p])})
    oldest = topics.record_timestamps(kafka_conf, spec.source.topic,
                                {p["partition"]: max(p["committed"], p["earliest"]) for p in partitions if p["lag"]})
    for entry in partitions:
        ts = oldest.get(entry["partition"])
        entry["lag_s"] = 0.0 if not entry["lag"] else None if ts is None \
            else round(max(0.0, now.timestamp() - ts / 1000), 1)
    status["kafka"] = {"topic_id": state.topic_id, "partitions": partitions}
    status["lag_records"] = sum(p["lag"] for p in partitions)
    # lag in seconds: age of the oldest record not yet in the tables (0 when caught up)
    ages = [p["lag_s"] for p in partitions]
    status["lag_s"] = None if None in ages else max(ages, default=0.0)
    return status


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
    """The plain form of `report`."""
    return console.text(report(statuses))


def report(statuses: list[dict]) -> list[console.Block]:
    """A table of pipeline statuses, then per pipeline a line per partition, table, layout difference and
    timeline figure."""
    header = ("PIPELINE", "MODE", "ROWS", "DEAD", "LAG", "LAST COMMIT", "FRESHNESS", "SNAPSHOTS")
    rows = []
    for s in statuses:
        data = [t for t in s["tables"] if t["role"] == "data"]
        rows.append((s["pipeline"], s["mode"], str(s["rows"]), str(s["dead_letters"]),
                     "?" if s["lag_records"] is None else str(s["lag_records"]),
                     format_age(s["seconds_since_commit"]) + (" ago" if s["seconds_since_commit"] is not None else ""),
                     format_age(s["freshness_s"]), str(sum(t["snapshots"] for t in data))))
    lines: list[console.Block] = [console.Table.of(header, rows)]
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
            elif t.get("lost"):
                lines.append(f"  {t['table']}: POSITIONS LOST: {t['lost']}")
            else:
                lines.append(f"  {t['table']}: {t['rows']} rows, {t['snapshots']} snapshots, recovery point "
                             f"snapshot {t['recovery_snapshot_id']} at {t['last_commit_at'] or '-'}")
        lines.extend(_layout_lines(s.get("layout")))
        lines.extend(_timeline_lines(s.get("timeline") or {}))
    return lines


def _layout_lines(found: dict | None) -> list[str]:
    """The layout part of `render`: in sync, or each difference and whether the job applies it."""
    if found is None:
        return []
    if found["in_sync"]:
        return ["  layout: the tables follow the spec"]
    lines = [f"  LAYOUT REFUSED (the ingest job stops until this is resolved): {why}" for why in found["refused"]]
    for drift in found["tables"]:
        changes = [c for c in drift["changes"] if c not in found["refused"]]
        if changes:
            lines.append(f"  layout drift of {drift['table']}, applied {found['applies']}: " + "; ".join(changes))
    return lines


def batch_summary(batches: list[dict], seconds: float) -> str:
    """One line over `batches` (batch events, any order) committed within the last `seconds`: counts,
    throughput, lag at the last commit, freshness at commit and mean seconds per stage."""
    if not batches:
        return f"no batches committed in the last {format_age(seconds)}"
    total = {key: sum(b["metrics"].get(key, 0.0) for b in batches)
             for key in ("records", "dead_letters", "commit_retries")}
    last = max(batches, key=lambda b: b["ts"])["metrics"]
    fresh = sorted(b["metrics"]["freshness_s"] for b in batches if "freshness_s" in b["metrics"])
    stages = ", ".join(f"{stage} {sum(b['metrics'].get(f'{stage}_s', 0.0) for b in batches) / len(batches):.2f}s"
                       for stage in STAGES)
    return (f"{len(batches)} batches in the last {format_age(seconds)}: {total['records']:.0f} records "
            f"({total['records'] / seconds:.0f}/s), {total['dead_letters']:.0f} dead letters, "
            f"{total['commit_retries']:.0f} commit retries; lag at the last commit "
            f"{last.get('lag_records', 0):.0f} records"
            + (f"; freshness at commit median {fresh[len(fresh) // 2]:.1f}s, max {fresh[-1]:.1f}s" if fresh else "")
            + f"; mean per batch: {stages}")


def _timeline_lines(tl: dict) -> list[str]:
    """The timeline part of `render`: last batch with its stages, recent throughput, newest events."""
    if "error" in tl:
        return [f"  timeline: cannot be read ({tl['error']})"]
    lines = []
    last = tl.get("last_batch")
    if last:
        stages = ", ".join(f"{stage} {last[f'{stage}_s']:.2f}s" for stage in STAGES if f"{stage}_s" in last)
        lines.append(f"  last batch {last['at']}: {last['message']} ({stages}); lag at commit "
                     f"{last.get('lag_records', 0):.0f} records")
        recent = tl["recent"]
        lines.append(f"  last {recent['window_s'] / 60:.0f} min: {recent['batches']} batches, {recent['records']} "
                     f"records ({recent['records_per_s']:g}/s), {recent['dead_letters']} dead letters, "
                     f"{recent['commit_retries']} commit retries")
    for kind, event in sorted(tl.get("latest", {}).items()):
        by = f" by {event['actor']}" if event.get("actor") else ""
        lines.append(f"  latest {kind}: {event['status']} at {event['at']}{by}: {event['message']}")
    return lines
