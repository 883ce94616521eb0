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

A dry run (`align(dry_run=True)`, `guard(dry_run=True)`, `lakehouse retention --dry-run`) reads what the
real run reads and says what it would do: per table the rows the data-retention DELETE would remove
(counted with pyiceberg, no Spark session), or the retention.ms the guard would set. It deletes,
alters and records nothing.

The retention guard (`guard()`) acts on the lag now rather than on the lag seen so far. When the
oldest record not yet ingested (the record at the committed position of a partition) gets within
`retention.guard_threshold` (default half the declared retention) of the topic's retention horizon,
Kafka would delete it before the writer gets to it. The guard then raises the topic's
`retention.ms` (IncrementalAlterConfigs) so that a full declared retention lies ahead of that
record, never above `retention.max_retention`, and raises an alert (a `warn` event); once the
writer has caught up (the oldest record not yet ingested is within the lag SLO) it restores the
declared value: `source.retention_ms`, else the value the topic had before the guard first raised
it. Every change is a `retention_guard` event whose details carry the guard's state (declared
value, value set), so a guard that restarts knows what to restore. It alerts with a `failed` event
and raises RetentionAtRiskError when it cannot protect the records: no `max_retention` (it only
alerts), the cap reached, or the broker refusing the change (RetentionChangeRefusedError names the
missing permission, ALTER_CONFIGS on the topic). A retention someone else changed while it was
raised is left as it is.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from pyiceberg.exceptions import NoSuchTableError

from lakehouse.core import config, events, kafka_security, offsets, sparkenv, topics
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import (
    ConfigurationError,
    RetentionAtRiskError,
    RetentionChangeRefusedError,
    RetentionMisalignedError,
    TopicError,
)
from lakehouse.core.spec import PipelineSpec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest.plan import topic_state_for
from lakehouse.upkeep.maintenance import retrying, timestamp_literal

KIND_RETENTION = "retention"  # lakehouse.kind of data-retention delete commits
HOUR_MS = 3_600_000
MINUTE_MS = 60_000  # a retention the guard sets is a whole number of minutes
GUARD_KIND = "retention_guard"  # the guard's events on the ops timeline
# Kafka's answers to a client without the ACL it needs: the guard needs ALTER_CONFIGS on the topic
REFUSALS = {KafkaError.TOPIC_AUTHORIZATION_FAILED: "ALTER_CONFIGS on topic {topic}",
            KafkaError.CLUSTER_AUTHORIZATION_FAILED: "ALTER_CONFIGS on the cluster",
            KafkaError.POLICY_VIOLATION: None}  # a broker-side policy (alter.config.policy) said no


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
    deleted_rows: dict[str, int] = field(default_factory=dict)  # with dry_run: the rows a delete would remove
    dry_run: bool = False

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
            oldest = offsets.summary_properties(snap).get(SnapshotSummary.MIN_KAFKA_TIME)
            if not oldest:
                continue
            batches += 1
            worst = max(worst, snap.timestamp_ms / 1000 - datetime.fromisoformat(oldest).timestamp())
    return round(worst, 3), batches


def check(spec: PipelineSpec, platform: config.PlatformConfig | None = None) -> RetentionReport:
    """Compare the topic's retention.ms with what the pipeline needs (reads Kafka and the catalog only).

    Raises TopicError when the topic does not exist or the broker does not answer.
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
    column, delete_after_s = _data_retention(spec)
    cutoff = now - timedelta(seconds=delete_after_s)
    catalog = open_catalog(platform, spec.catalog)
    predicate = f"`{column}` < {timestamp_literal(cutoff)}"
    deleted: dict[str, int] = {}

    def delete(qualified: str, run_id: str) -> None:
        sparkenv.with_commit_properties(
            spark, {SnapshotSummary.KIND: KIND_RETENTION, SnapshotSummary.RETENTION_RUN: run_id},
            lambda: spark.sql(f"DELETE FROM {qualified} WHERE {predicate}").collect())

    for name in spec.target.tables:
        qualified = spec.qualified(name)
        try:
            catalog.load_table(name)
        except NoSuchTableError:
            continue
        run_id = uuid.uuid4().hex  # finds this delete's commit among the table's snapshots
        retrying(f"data-retention delete on {qualified}", partial(delete, qualified, run_id))
        commits = [s for s in catalog.load_table(name).snapshots()
                   if offsets.summary_properties(s).get(SnapshotSummary.RETENTION_RUN) == run_id]
        deleted[qualified] = sum(
            spark.sql(f"SELECT count(*) AS n FROM {qualified} VERSION AS OF {int(s.parent_snapshot_id)} "
                      f"WHERE {predicate}").collect()[0]["n"] for s in commits if s.parent_snapshot_id is not None)
    return deleted


def _data_retention(spec: PipelineSpec) -> tuple[str, float]:
    """(the event-time column, retention.delete_after in seconds) of a spec with data retention (the spec parser
    refuses retention.delete_after without a timestamp column to age rows by)."""
    column, delete_after_s = spec.event_time_field, spec.retention.delete_after_s
    if column is None or delete_after_s is None:
        raise ConfigurationError(f"pipeline {spec.name!r} has no data retention: it needs retention.delete_after "
                                 f"and a timestamp column in the contract")
    return column, delete_after_s


def expired_rows(spec: PipelineSpec, platform: config.PlatformConfig, now: datetime) -> dict[str, int]:
    """Per qualified data table, the rows of its main that `delete_expired` would delete now (event time before
    now minus `retention.delete_after`); read with pyiceberg, nothing is written."""
    from pyiceberg.expressions import LessThan, LessThanOrEqual
    from pyiceberg.types import DateType, TimestampType

    column, delete_after_s = _data_retention(spec)
    cutoff = (now - timedelta(seconds=delete_after_s)).astimezone(UTC)
    catalog = open_catalog(platform, spec.catalog)
    found: dict[str, int] = {}
    for name in spec.target.tables:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            continue
        kind = table.schema().find_field(column).field_type
        if isinstance(kind, DateType):  # Spark compares a date as its midnight: the cutoff's own day goes too
            midnight = cutoff.replace(hour=0, minute=0, second=0, microsecond=0) == cutoff
            row_filter = (LessThan if midnight else LessThanOrEqual)(term=column, value=cutoff.date().isoformat())
        elif isinstance(kind, TimestampType):  # without a zone: UTC wall time, as the session time zone is UTC
            row_filter = LessThan(term=column, value=cutoff.replace(tzinfo=None).isoformat())
        else:
            row_filter = LessThan(term=column, value=cutoff.isoformat())
        scan = table.scan(row_filter=row_filter, selected_fields=(column,))
        found[spec.qualified(name)] = scan.to_arrow().num_rows
    return found


def align(spec: PipelineSpec, platform: config.PlatformConfig | None = None, spark=None,
          now: datetime | None = None, dry_run: bool = False) -> RetentionReport:
    """Check the topic's retention, apply data retention where configured, record a `retention` event.

    Returns the report (status `failed` when the topic's retention is too short: call
    `raise_for_status()` to turn that into RetentionMisalignedError). The data-retention delete
    runs either way, since it does not depend on Kafka. Raises TopicError when the topic
    is missing or Kafka does not answer. With `dry_run`, `deleted_rows` holds the rows the delete would
    remove, and nothing is deleted or recorded.
    """
    platform = platform or config.load()
    now = now or datetime.now(UTC)
    report = check(spec, platform)
    report.dry_run = dry_run
    if dry_run:
        if spec.retention.delete_after_s is not None:
            report.delete_cutoff = (now - timedelta(seconds=spec.retention.delete_after_s)).isoformat()
            report.deleted_rows = expired_rows(spec, platform, now)
            report.message += ("; dry run: data retention would delete "
                               + (", ".join(f"{n} rows from {t}" for t, n in report.deleted_rows.items())
                                  or "nothing (no data table yet)")
                               + f" with {spec.event_time_field} before {report.delete_cutoff}")
        else:
            report.message += "; dry run: no retention.delete_after, so data retention would delete nothing"
        return report
    if spec.retention.delete_after_s is not None:
        spark = spark or sparkenv.session(platform, [spec.catalog], f"lakehouse-retention-{spec.name}")
        report.delete_cutoff = (now - timedelta(seconds=spec.retention.delete_after_s)).isoformat()
        report.deleted_rows = delete_expired(spark, spec, platform, now)
        report.message += (f"; data retention deleted {sum(report.deleted_rows.values())} rows with "
                           f"{spec.event_time_field} before {report.delete_cutoff}")
    events.record(events.Event(spec.name, "retention", report.status, report.message, report.metrics(),
                               report.to_json()), platform=platform, catalog=spec.catalog)
    return report


# ---------------------------------------------------------------------------- the retention guard

@dataclass(frozen=True)
class GuardState:
    """What the guard has done to a topic, as its newest `retention_guard` event recorded it."""

    raised: bool = False  # the guard's raise is in effect: restore `declared_ms` once the writer caught up
    declared_ms: int | None = None  # the retention to restore
    set_ms: int | None = None  # the retention.ms the guard set (a different one was set by someone else)

    @classmethod
    def of(cls, event: dict | None) -> GuardState:
        """The state an event's `details.guard_state` holds (the initial state without an event)."""
        state = (event or {}).get("details", {}).get("guard_state") or {}
        return cls(bool(state.get("raised")), state.get("declared_ms"), state.get("set_ms"))


@dataclass
class GuardReport:
    """One run of the retention guard on a pipeline's topic: what it saw, what it did and why."""

    pipeline: str
    topic: str
    retention_ms: int | None  # the topic's retention.ms when checked (-1 infinite, None not reported)
    declared_ms: int | None  # what the guard restores: source.retention_ms, else the value before its first raise
    threshold_ms: int | None  # how close to the horizon the oldest record not yet ingested may get
    max_retention_ms: int | None  # the cap (retention.max_retention); None: the guard only alerts
    oldest_age_ms: int | None  # age of the oldest record not yet ingested (0: caught up; None: unknown)
    partitions: dict[str, dict] = field(default_factory=dict)  # committed, end, age_ms per partition
    action: str = "none"  # none | raised | restored | released | refused | at-risk
    new_retention_ms: int | None = None  # what the guard set (raised, restored)
    status: str = "ok"  # ok | warn (raised, or cannot tell) | failed (records will age out)
    message: str = ""
    missing_permission: str | None = None
    state: GuardState = field(default_factory=GuardState)  # the guard's state after this run
    dry_run: bool = False  # only said what it would do: nothing altered, nothing recorded

    @property
    def recorded(self) -> bool:
        """Whether this run changes something or raises an alert, and so is a `retention_guard` event."""
        return self.action != "none"

    def metrics(self) -> dict[str, float | None]:
        return {"retention_ms": self.retention_ms, "new_retention_ms": self.new_retention_ms,
                "declared_ms": self.declared_ms, "oldest_age_ms": self.oldest_age_ms,
                "threshold_ms": self.threshold_ms, "max_retention_ms": self.max_retention_ms}

    def to_json(self) -> dict:
        out = asdict(self)
        out["guard_state"] = out.pop("state")
        return out

    def raise_for_status(self) -> None:
        """Raise RetentionChangeRefusedError (the broker said no) or RetentionAtRiskError when records not
        yet ingested will age out and the guard could not prevent it."""
        if self.action == "refused":
            raise RetentionChangeRefusedError(self.message)
        if self.status == "failed":
            raise RetentionAtRiskError(self.message)


def _duration(ms: int | None) -> str:
    if ms is None:
        return "unknown"
    return f"{ms} ms ({_hours(ms / 1000)})"


def oldest_unconsumed(spec: PipelineSpec, platform: config.PlatformConfig, now: datetime,
                      ) -> tuple[int | None, dict[str, dict]]:
    """(age in ms of the oldest record not yet ingested over the partitions, 0 when caught up and None
    when a partition's record could not be read; per partition: committed position, log end and age).

    The record not yet ingested on a partition is the one at the pipeline's committed position
    (offsets.committed_positions), or at the earliest offset Kafka holds when that is later.
    Raises SourceError when Kafka cannot be read.
    """
    catalog = open_catalog(platform, spec.catalog)
    progress = [offsets.read_progress(catalog, t, spec.name) for t in spec.positioned_tables]
    state = topic_state_for(platform.kafka(), spec.source.topic, progress, timeout=10.0)
    committed = offsets.committed_positions(progress, state.earliest)
    starts = {p: max(committed[p], ps.earliest) for p, ps in state.partitions.items()
              if ps.end > max(committed[p], ps.earliest)}
    stamps = topics.record_timestamps(platform.kafka(), spec.source.topic, starts)
    partitions: dict[str, dict] = {}
    for p, ps in sorted(state.partitions.items()):
        age = 0 if p not in starts else None if p not in stamps else max(0, int(now.timestamp() * 1000) - stamps[p])
        partitions[str(p)] = {"committed": committed[p], "end": ps.end, "age_ms": age}
    ages = [part["age_ms"] for part in partitions.values()]
    return (None if None in ages else max(ages, default=0)), partitions


def decide(spec: PipelineSpec, report: GuardReport, state: GuardState) -> GuardReport:
    """Fill in what the guard does (action, new_retention_ms, status, message, state) from what `report`
    saw and the guard's `state`; no I/O. The horizon is the topic's retention.ms: the oldest record not
    yet ingested is at risk when its age is within `threshold_ms` of it."""
    topic, current, age = report.topic, report.retention_ms, report.oldest_age_ms
    report.state = state
    if current is None:
        report.status = "warn"
        report.message = f"topic {topic!r}: the broker reports no retention.ms, so the guard cannot tell its horizon"
        return report
    if state.raised and current != state.set_ms:  # changed by someone else since the guard raised it: theirs now
        report.action, report.state = "released", GuardState()
        report.message = (f"topic {topic!r} keeps records {_duration(current)}, not the {_duration(state.set_ms)} "
                          f"the guard set: someone changed it since; the guard leaves it as it is and will not "
                          f"restore {_duration(state.declared_ms)}")
        return report
    if current == -1:
        report.message = f"topic {topic!r} keeps records forever (retention.ms -1): nothing to guard"
        return report
    if age is None:
        report.status = "warn"
        report.message = (f"topic {topic!r}: the timestamp of the oldest record not yet ingested could not be read "
                          f"({report.partitions}); the guard cannot tell how close it is to the horizon")
        return report
    declared, threshold = report.declared_ms, report.threshold_ms
    if declared is None or threshold is None:  # the guard's own event lost what it raised the retention from
        report.status = "warn"
        report.message = (f"topic {topic!r}: the retention to keep is unknown (no source.retention_ms, and the "
                          f"guard's last event does not say what it raised retention.ms from), so the guard cannot "
                          f"tell how close records are to the horizon; set source.retention_ms of {spec.name!r}")
        return report
    behind = (f"the oldest record not yet ingested is {_duration(age)} old and topic {topic!r} deletes records "
              f"after {_duration(current)}")
    if current - age <= threshold:
        cap = report.max_retention_ms
        wanted = math.ceil((age + declared) / MINUTE_MS) * MINUTE_MS  # a full declared retention ahead
        target = wanted if cap is None else min(cap, wanted)
        if cap is None or target <= current:
            report.action, report.status = "at-risk", "failed"
            why = ("retention.max_retention is not set, so the guard only alerts" if cap is None else
                   f"the guard may not raise it above retention.max_retention {_duration(cap)}")
            report.message = (f"{behind}: records will age out before they are ingested unless the writer catches "
                              f"up within {_duration(max(0, current - age))}; {why}. Restart or scale the ingest job "
                              f"of {spec.name!r}, or raise retention.ms by hand")
            return report
        report.action, report.status, report.new_retention_ms = "raised", "warn", target
        report.state = GuardState(True, report.declared_ms, target)
        report.message = (f"{behind}, within the guard threshold {_duration(report.threshold_ms)}: raised "
                          f"retention.ms to {_duration(target)} (cap {_duration(cap)}); it goes back to "
                          f"{_duration(report.declared_ms)} once the writer of {spec.name!r} has caught up")
        return report
    if state.raised:
        caught_up = min(spec.slo.lag_s * 1000, declared - threshold)
        if age <= caught_up:
            report.action, report.new_retention_ms, report.state = "restored", report.declared_ms, GuardState()
            report.message = (f"the writer of {spec.name!r} has caught up (oldest record not yet ingested "
                              f"{_duration(age)} old): restored retention.ms of topic {topic!r} from "
                              f"{_duration(current)} to {_duration(report.declared_ms)}")
        else:
            report.status = "warn"
            report.message = (f"{behind}: retention stays raised until the writer has caught up (to within "
                              f"{_duration(int(caught_up))}); then it goes back to {_duration(report.declared_ms)}")
        return report
    report.message = f"{behind}: more than the guard threshold {_duration(report.threshold_ms)} away"
    return report


def alter_retention(pipeline: str, topic: str, retention_ms: int, platform: config.PlatformConfig,
                    timeout: float = 10.0) -> None:
    """Set topic `topic`'s retention.ms to `retention_ms` with IncrementalAlterConfigs (other settings stay),
    for pipeline `pipeline`.

    Raises RetentionChangeRefusedError when the broker refuses (an authorization failure names the
    missing permission), TopicError when it fails otherwise or does not answer, and
    KafkaAuthError when it refuses the credentials.
    """
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(retention_ms), incremental_operation=AlterConfigOpType.SET)])
    conf, watch = kafka_security.watched(platform.kafka(logger=logging.getLogger("lakehouse.kafka")))
    admin = AdminClient(conf)  # kept referenced until the future is done: a collected client fails it
    try:
        kafka_security.wait_future(admin.incremental_alter_configs([resource], request_timeout=timeout)[resource],
                                   admin, watch, timeout)
    except KafkaException as exc:
        raise refusal(exc.args[0], topic, retention_ms, platform) from None


def refusal(err: KafkaError, topic: str, retention_ms: int,
            platform: config.PlatformConfig) -> RetentionChangeRefusedError | TopicError:
    """The error for the broker's answer `err` to setting `topic`'s retention.ms to `retention_ms`."""
    change = f"set retention.ms={retention_ms} on topic {topic!r}"
    if err.code() not in REFUSALS:
        return TopicError(f"could not {change} on {platform.bootstrap_servers}: {err.str()}")
    permission = REFUSALS[err.code()]
    if permission is None:
        return RetentionChangeRefusedError(f"the broker's alter-config policy refused to {change}: {err.str()}")
    permission = permission.format(topic=topic)
    return RetentionChangeRefusedError(
        f"the broker refused to {change} ({err.str()}): the client of {kafka_security.describe(platform.kafka())} "
        f"lacks the permission {permission}. Grant it, e.g. `kafka-acls --bootstrap-server "
        f"{platform.bootstrap_servers} --add --allow-principal User:<the pipeline's user> --operation "
        f"AlterConfigs --topic {topic}`, or change retention.ms by hand", permission)


def guard(spec: PipelineSpec, platform: config.PlatformConfig | None = None, now: datetime | None = None,
          actor: events.Actor | None = None, dry_run: bool = False) -> GuardReport:
    """Check how close the oldest record not yet ingested is to the topic's retention horizon; raise or
    restore the topic's retention.ms as `decide` says, and record a `retention_guard` event (naming
    `actor`, default this process's) when something changed or an alert is due.

    Returns the report; `raise_for_status()` turns a failed one into RetentionAtRiskError or
    RetentionChangeRefusedError. Raises TopicError when the topic is missing or Kafka does not
    answer, SourceError when Kafka cannot be read. With `dry_run` the report says what the guard would do
    (`action`, `new_retention_ms`) and the topic's config and the timeline are left as they are.
    """
    platform = platform or config.load()
    now = now or datetime.now(UTC)
    actor = actor or events.Actor.of_process()
    topic = spec.source.topic
    current = topics.describe_retention(topic, platform)
    newest = events.recent(spec.name, GUARD_KIND, limit=1, platform=platform, catalog=spec.catalog)
    state = GuardState.of(newest[0] if newest else None)
    declared = spec.source.retention_ms if (spec.source.retention_ms or 0) > 0 \
        else state.declared_ms if state.raised else current
    age, partitions = oldest_unconsumed(spec, platform, now)
    report = decide(spec, GuardReport(
        pipeline=spec.name, topic=topic, retention_ms=current, declared_ms=declared,
        threshold_ms=None if declared is None or declared < 0 else spec.retention.guard_threshold_ms(declared),
        max_retention_ms=spec.retention.max_retention_ms, oldest_age_ms=age, partitions=partitions), state)
    report.dry_run = dry_run
    if dry_run:
        if report.new_retention_ms is not None:
            report.message = (f"dry run: would set retention.ms of topic {topic!r} from {_duration(current)} to "
                              f"{_duration(report.new_retention_ms)} ({report.action}); {report.message}")
        else:
            report.message = f"dry run: would change no topic config; {report.message}"
        return report
    if report.new_retention_ms is not None:
        try:
            alter_retention(spec.name, topic, report.new_retention_ms, platform)
        except RetentionChangeRefusedError as exc:  # the topic keeps what it had, the guard its state
            report.message = f"{exc}. What the guard saw: {report.message}"
            report.action, report.status, report.state, report.new_retention_ms = "refused", "failed", state, None
            report.missing_permission = exc.missing_permission
    if report.recorded:
        events.record(events.Event(spec.name, GUARD_KIND, report.status, report.message, report.metrics(),
                                   report.to_json(), actor=actor), platform=platform, catalog=spec.catalog)
    return report
