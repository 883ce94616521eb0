"""What the pipelines page shows: live status plus lag and freshness over time, per pipeline.

`overview(spec)` joins `status.pipeline_status` (offsets, lag in records and seconds,
freshness, last commit, dead-letter rows, and what the ops timeline says) with
`history`.

`history(spec, batches)` is the pipeline's recent past. When ingestion records `batch` events
on the ops timeline (metrics `lag_records`, `freshness_s`), those are the points;
otherwise each ingest commit of the data table is a point, from its snapshot summary:
the commit time, the committed position (`lakehouse.positions`) and the freshness at
commit (commit time minus `lakehouse.max-event-time`). Lag in records at a past
commit is not recorded in summaries, so that series is only present with events.
"""

from __future__ import annotations

from datetime import datetime, timezone

from lakehouse.core import config, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import SHARED_DAG_IDS, PipelineSpec, dag_id
from lakehouse.ops import cost
from lakehouse.ops.status import pipeline_status

HISTORY_POINTS = 60
COST_DAYS = 7  # the page's cost panel: the last week, today included
COST_SAMPLE_RECORDS = 200  # records read per day to size them (the CLI reads more)


def _seconds(later: datetime, earlier: datetime) -> float:
    return round((later - earlier).total_seconds(), 1)


def history(spec: PipelineSpec, batches: list[dict] | None, platform: config.PlatformConfig | None = None,
            limit: int = HISTORY_POINTS) -> dict:
    """{source: "events" | "snapshots" | "none", points: [...] oldest first, at most `limit`}.

    `batches` are the batch points `status.timeline` read from the ops timeline (None when
    it could not be read). Each point has `at` (ISO time) and `freshness_s`; `lag_records`
    comes from batch events, `committed` (sum of next offsets) and `snapshot_id` from snapshots.
    """
    platform = platform or config.load()
    if batches:
        return {"source": "events", "points": batches[-limit:]}
    catalog = open_catalog(platform, spec.catalog)
    if not catalog.table_exists(spec.target.table):
        return {"source": "none", "points": []}
    points = []
    for snap in offsets.ingest_commits(catalog.load_table(spec.target.table), spec.name):
        props = offsets.summary_properties(snap)
        at = datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=timezone.utc)
        event_time = props.get(offsets.K_MAX_EVENT_TIME)
        points.append({
            "at": at.isoformat(),
            "snapshot_id": snap.snapshot_id,
            "committed": sum(offsets.decode_positions(props[offsets.K_POSITIONS]).values()),
            "freshness_s": _seconds(at, datetime.fromisoformat(event_time)) if event_time else None,
        })
    return {"source": "snapshots" if points else "none", "points": points[-limit:]}


def dag_ids(spec: PipelineSpec) -> list[str]:
    """The DAGs generated for this pipeline, then the ones shared by all pipelines."""
    return [dag_id(spec.name, kind) for kind in spec.dag_kinds] + list(SHARED_DAG_IDS)


def overview(spec: PipelineSpec, platform: config.PlatformConfig | None = None,
             now: datetime | None = None) -> dict:
    """`pipeline_status` plus `snapshot_id`, `positions`, `committed`, `quality`, `history`, `dags`, `slo`
    and `cost`.

    `committed` is False while no data table holds an ingest commit of the pipeline.
    `quality` is the newest `quality` event of the ops timeline, or None.
    `cost` is `lakehouse.ops.cost.daily_cost` over COST_DAYS days (as JSON), or {"error": why}.
    """
    platform = platform or config.load()
    now = now or datetime.now(timezone.utc)
    status = pipeline_status(spec, platform, now=now)
    primary = next(t for t in status["tables"] if t["table"] == spec.qualified(spec.target.table))
    kafka = status["kafka"] or {}
    timeline = status["timeline"]
    quality = timeline.get("latest", {}).get("quality")
    return {
        **status,
        "committed": any(t["recovery_snapshot_id"] for t in status["tables"] if t["role"] == "data"),
        "snapshot_id": primary["recovery_snapshot_id"],
        "positions": primary["positions"],
        "lag_s": status.get("lag_s"),  # absent when Kafka did not answer
        "kafka_error": kafka.get("error"),
        "quality": quality,
        "history": history(spec, timeline.get("batches"), platform),
        "dags": dag_ids(spec),
        "slo": {"freshness_s": spec.slo.freshness_s, "lag_records": spec.slo.lag_records, "lag_s": spec.slo.lag_s},
        "cost": _cost(spec, platform, now),
    }


def _cost(spec: PipelineSpec, platform: config.PlatformConfig, now: datetime) -> dict:
    """The cost panel's figures, or {"error": why} (a bad LAKEHOUSE_PRICE_* included): the rest of the
    card does not depend on them."""
    try:
        return cost.daily_cost(spec, COST_DAYS, platform, now=now, sample_records=COST_SAMPLE_RECORDS).to_json()
    except Exception as exc:  # noqa: BLE001 - one panel must not blank the card
        return {"error": f"{type(exc).__name__}: {exc}"}
