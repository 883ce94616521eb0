"""Retention alignment: Kafka must hold records as long as the pipeline may still need them.

A record must stay in Kafka from when it is produced until it is committed (the lag), through
the longest writer or catalog outage the platform promises to survive
(`retention.outage_budget`), and for as long as it may be replayed
(`retention.replay_window`). So the topic needs

    retention.ms >= worst observed lag + outage budget + replay window      (-1, infinite, is fine)

The worst observed lag is measured from the table, not guessed: every ingest commit records
the oldest Kafka timestamp its batch read (`lakehouse.min-kafka-time`), and commit time minus
that is how long the oldest record of the batch waited in Kafka. The maximum over the
pipeline's retained snapshots (data and dead-letter tables) is the worst lag over the replay
window, because maintenance keeps exactly that window of snapshots. Replays and backfills are
not counted: they are what the replay window pays for.

Snapshot expiry uses the same replay window (`maintenance.run`), so time travel reaches as far
back as Kafka replay. Where `retention.delete_after` is set, rows whose event time
(`spec.event_time_field`) is older than now minus it are deleted from each data table's `main`.
`align()` records one `retention` event per pipeline on the ops timeline.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone

from pyiceberg.exceptions import NoSuchTableError

from lakehouse.core import config, events, offsets, sparkenv, topics
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import SourceError
from lakehouse.core.spec import PipelineSpec
from lakehouse.upkeep.maintenance import retrying, timestamp_literal

KIND_RETENTION = "retention"  # lakehouse.kind of data-retention delete commits
HOUR_MS = 3_600_000


class RetentionMisalignedError(SourceError):
    """The topic's retention.ms cannot cover lag + outage budget + replay window; the message says by how
    much and which setting fixes it."""


@dataclass
class RetentionReport:
    pipeline: str
    topic: str
    retention_ms: int | None  # as the broker reports it; -1 infinite, None not reported
    required_ms: int
    worst_lag_s: float
    observed_batches: int
    outage_budget_s: float
    replay_window_s: float
    snapshot_expiry_window_s: float  # what maintenance expires snapshots after (= replay window)
    status: str  # ok | warn (retention not reported) | failed (too short)
    message: str
    suggestion: str | None = None
    delete_cutoff: str | None = None
    deleted_rows: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, float | None]:
        return {"retention_ms": None if self.retention_ms is None else float(self.retention_ms),
                "required_ms": float(self.required_ms), "worst_lag_s": self.worst_lag_s,
                "observed_batches": float(self.observed_batches),
                "snapshot_expiry_window_s": self.snapshot_expiry_window_s,
                "deleted_rows": float(sum(self.deleted_rows.values()))}

    def to_json(self) -> dict:
        return asdict(self)

    def raise_for_status(self) -> None:
        """Raise RetentionMisalignedError when the topic's retention is too short."""
        if self.status == "failed":
            raise RetentionMisalignedError(self.message)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h"


def observed_lag(spec: PipelineSpec, platform: config.PlatformConfig) -> tuple[float, int]:
    """(worst lag in seconds, number of ingest commits measured) over the retained snapshots of the
    pipeline's tables: commit time minus the oldest Kafka timestamp the batch read."""
    catalog = open_catalog(platform, spec.catalog)
    worst, batches = 0.0, 0
    for name in spec.positioned_tables:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            continue
        for snap in offsets.ingest_commits(table, spec.name):
            oldest = offsets.summary_properties(snap).get(offsets.K_MIN_KAFKA_TIME)
            if not oldest:
                continue
            batches += 1
            worst = max(worst, snap.timestamp_ms / 1000 - datetime.fromisoformat(oldest).timestamp())
    return round(worst, 3), batches


def check(spec: PipelineSpec, platform: config.PlatformConfig | None = None) -> RetentionReport:
    """Compare the topic's retention.ms with what the pipeline needs (reads Kafka and the catalog only).

    Raises topics.TopicError when the topic does not exist or the broker does not answer.
    """
    platform = platform or config.load()
    topic = spec.source.topic
    actual = topics.describe_retention(topic, platform)
    lag, batches = observed_lag(spec, platform)
    window = spec.retention.replay_window_s
    required = math.ceil((lag + spec.retention.outage_budget_s + window) * 1000)
    needs = (f"pipeline {spec.name!r} needs {required} ms ({_hours(required / 1000)}): worst observed lag "
             f"{lag:g}s over {batches} ingest commits + outage budget {_hours(spec.retention.outage_budget_s)} "
             f"+ replay window {_hours(window)}")
    report = RetentionReport(pipeline=spec.name, topic=topic, retention_ms=actual, required_ms=required,
                             worst_lag_s=lag, observed_batches=batches,
                             outage_budget_s=spec.retention.outage_budget_s, replay_window_s=window,
                             snapshot_expiry_window_s=window, status="ok", message="")
    expiry = f"snapshot expiry keeps {_hours(window)} of time travel, the same window as Kafka replay"
    if actual is None:
        report.status = "warn"
        report.message = (f"topic {topic!r}: the broker reports no retention.ms, so it cannot be checked; "
                          f"{needs}; {expiry}")
    elif actual == -1 or actual >= required:
        shown = "infinite (-1)" if actual == -1 else f"{actual} ms ({_hours(actual / 1000)})"
        report.message = f"topic {topic!r} keeps records {shown}; {needs}; {expiry}"
    else:
        suggested = math.ceil(required / HOUR_MS) * HOUR_MS  # whole hours are easier to read in configs
        report.status = "failed"
        report.suggestion = (f"kafka-configs --bootstrap-server {platform.bootstrap_servers} --alter "
                             f"--entity-type topics --entity-name {topic} --add-config retention.ms={suggested}")
        report.message = (f"topic {topic!r} keeps records for retention.ms={actual} ({_hours(actual / 1000)}) but "
                          f"{needs}: records would age out of Kafka before they are ingested after an outage or "
                          f"before they can be replayed. Raise it with `{report.suggestion}` and set "
                          f"source.retention_ms: {suggested} in {spec.path}; {expiry}")
    return report


def delete_expired(spark, spec: PipelineSpec, platform: config.PlatformConfig, now: datetime) -> dict[str, int]:
    """Delete rows older than `retention.delete_after` (by event time) from each data table's main.

    Returns the number of rows deleted per qualified table: the rows matching the cutoff in the
    snapshot each delete was applied to. Raises MaintenanceError when the delete keeps conflicting.
    """
    column = spec.event_time_field
    cutoff = now - timedelta(seconds=spec.retention.delete_after_s)
    catalog = open_catalog(platform, spec.catalog)
    predicate = f"`{column}` < {timestamp_literal(cutoff)}"
    deleted: dict[str, int] = {}
    for name in spec.target.tables:
        qualified = spec.qualified(name)
        try:
            catalog.load_table(name)
        except NoSuchTableError:
            continue
        run_id = uuid.uuid4().hex  # finds this delete's commit among the table's snapshots
        retrying(f"data-retention delete on {qualified}", lambda: sparkenv.with_commit_properties(
            spark, {offsets.K_KIND: KIND_RETENTION, offsets.PREFIX + "retention-run": run_id},
            lambda: spark.sql(f"DELETE FROM {qualified} WHERE {predicate}").collect()))
        commits = [s for s in catalog.load_table(name).snapshots()
                   if offsets.summary_properties(s).get(offsets.PREFIX + "retention-run") == run_id]
        deleted[qualified] = sum(
            spark.sql(f"SELECT count(*) AS n FROM {qualified} VERSION AS OF {int(s.parent_snapshot_id)} "
                      f"WHERE {predicate}").collect()[0]["n"] for s in commits)
    return deleted


def align(spec: PipelineSpec, platform: config.PlatformConfig | None = None, spark=None,
          now: datetime | None = None) -> RetentionReport:
    """Check the topic's retention, apply data retention where configured, record a `retention` event.

    Returns the report (status `failed` when the topic's retention is too short: call
    `raise_for_status()` to turn that into RetentionMisalignedError). The data-retention delete
    runs either way, since it does not depend on Kafka. Raises topics.TopicError when the topic
    is missing or Kafka does not answer.
    """
    platform = platform or config.load()
    now = now or datetime.now(timezone.utc)
    report = check(spec, platform)
    if spec.retention.delete_after_s is not None:
        spark = spark or sparkenv.session(platform, [spec.catalog], f"lakehouse-retention-{spec.name}")
        report.delete_cutoff = (now - timedelta(seconds=spec.retention.delete_after_s)).isoformat()
        report.deleted_rows = delete_expired(spark, spec, platform, now)
        report.message += (f"; data retention deleted {sum(report.deleted_rows.values())} rows with "
                           f"{spec.event_time_field} before {report.delete_cutoff}")
    events.record(events.Event(spec.name, "retention", report.status, report.message, report.metrics(),
                               report.to_json()), platform=platform, catalog=spec.catalog)
    return report
