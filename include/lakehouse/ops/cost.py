"""What a pipeline costs, per UTC day, from measured figures; priced only when unit prices are set.

`daily_cost(spec)` returns one `DayCost` per day of the window (the newest is today, partial):

- produced      records the topic received that day: per partition, the offsets at the day's
                start and end by Kafka timestamp (ListOffsets by time); bytes = records x the mean
                size (key + value + headers) of a sample read from the start of the day, at most
                SAMPLE_RECORDS records (exact when the day has no more);
- Kafka retains the bytes Kafka must keep at that day's rate under the declared retention:
                produced bytes x retention in days x replication factor (the spec's
                `source.retention_ms`, else the topic's `retention.ms`);
- table         bytes and files of the pipeline's tables at the end of the day: the totals in the
                summary of each table's `main` snapshot current then (`total-files-size`,
                `total-data-files` + `total-delete-files`);
- requests      per table commit of the day (every snapshot, ingestion, maintenance and staged
                upserts alike, from its summary): the files it added, the manifests it wrote
                (`manifests-created` when the writer records it, else one for its data files, one
                for its delete files and one per removed file: the manifest that held it is written
                again), a manifest list and a metadata file (PUTs); reading the table's metadata file
                and the parent's manifest list (GETs: an upper bound, since a running ingest job keeps
                the metadata files it wrote, lakehouse.core.fileio), plus every data file compaction read
                (maintenance events). Each event committed to the ops timeline is one more commit
                (a file, a manifest, a manifest list, a metadata file). Days older than a table's
                retained history (expired snapshots) are counted from the batch events instead;
- compute       seconds the ingest batches took (batch events: wall time, and task seconds) and the
                seconds maintenance took per table (maintenance events).

Prices come from the environment (never from a spec), each optional: `PRICE_VARIABLES`, read by
lakehouse.core.config and checked here. A day's
price is the sum of the items whose price is set; storage is priced per GiB-month (a month is
30 days) on the day's end-of-day bytes. docs/sizing.md explains the model and what it leaves out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaError, TopicPartition
from pyiceberg.exceptions import NoSuchTableError

from lakehouse.core import config, console, events, offsets, topics
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import ConfigurationError, SourceError
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.plan import kafka_consumer, offsets_for_time, topic_state

DAY_MS = 86_400_000
GIB = 1024 ** 3
MONTH_DAYS = 30
MAX_DAYS = 90
SAMPLE_RECORDS = 1000  # records read per day to measure the mean record size
SAMPLE_PARTITIONS = 32  # partitions read per day (those with the most records that day)
SAMPLE_TIMEOUT_S = 10.0
# environment variable (config.PRICE_ENVIRONMENT) -> UnitPrices field; each a number >= 0, in PRICE_CURRENCY
PRICE_VARIABLES = dict(zip(config.PRICE_ENVIRONMENT[:5], ("object_store_gb_month", "kafka_gb_month", "put_per_1000",
                                                         "get_per_1000", "compute_hour"), strict=True))
PRICE_CURRENCY = config.PRICE_ENVIRONMENT[5]


@dataclass(frozen=True)
class UnitPrices:
    """Unit prices of the resources a pipeline uses; None where not configured."""

    object_store_gb_month: float | None = None  # per GiB stored for a month (tables)
    kafka_gb_month: float | None = None  # per GiB a broker stores for a month (all replicas)
    put_per_1000: float | None = None  # per 1,000 object-store writes
    get_per_1000: float | None = None  # per 1,000 object-store reads
    compute_hour: float | None = None  # per hour a job's executors work
    currency: str = ""

    @classmethod
    def from_settings(cls, environ: Mapping[str, str]) -> UnitPrices:
        """The prices the PRICE_VARIABLES of `environ` set (a platform's `prices`: what the environment
        gave). Raises ConfigurationError naming a variable whose value is not a finite number >= 0."""
        found: dict[str, float] = {}
        for variable, name in PRICE_VARIABLES.items():
            raw = (environ.get(variable) or "").strip()
            if not raw:
                continue
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{variable}={raw[:40]!r} is not a price: use a number of at least 0, "
                                         f"e.g. {variable}=0.023")
            found[name] = value
        currency = (environ.get(PRICE_CURRENCY) or "").strip()
        if currency and (len(currency) > 8 or not currency.isascii() or not currency.isalpha()):
            raise ConfigurationError(f"{PRICE_CURRENCY}={currency[:40]!r} is not a currency: use a code like EUR")
        return cls(**found, currency=currency)

    @property
    def configured(self) -> bool:
        return any(getattr(self, name) is not None for name in PRICE_VARIABLES.values())


@dataclass
class DayCost:
    """What one pipeline used on one UTC day. None: not measurable (see the report's notes)."""

    day: str  # ISO date
    partial: bool = False  # today: the day is not over
    produced_records: int | None = None
    produced_bytes: int | None = None
    sampled_records: int = 0  # records read to measure their size
    kafka_complete: bool = True  # False when Kafka no longer holds the start of the day (retention)
    kafka_retained_bytes: int | None = None
    table_bytes: int | None = None
    table_files: int | None = None
    commits: int = 0  # table commits (snapshots) of the pipeline's tables
    timeline_commits: int = 0  # events the pipeline committed to the ops timeline
    files_written: int = 0
    bytes_written: int = 0
    manifests_written: int = 0
    put_requests: int = 0
    get_requests: int = 0
    requests_source: str = "snapshots"  # snapshots | events (history expired) | mixed
    batches: int = 0
    ingest_seconds: float = 0.0  # wall seconds of the batches
    ingest_task_seconds: float = 0.0  # seconds the Spark tasks worked, summed over tasks
    maintenance_seconds: float = 0.0
    price: dict[str, float] | None = None  # item -> price, and "total"; None when no price is set

    @property
    def compute_seconds(self) -> float:
        return self.ingest_seconds + self.maintenance_seconds


@dataclass
class CostReport:
    pipeline: str
    topic: str
    retention_ms: int | None  # declared (spec) or, if not, the topic's; -1 unlimited
    retention_source: str  # spec | topic | unknown
    replication_factor: int
    prices: UnitPrices
    days: list[DayCost] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, float]:
        """Sums over the window (storage figures are per day, so they are averaged instead)."""
        summed = ("produced_records", "produced_bytes", "commits", "timeline_commits", "files_written",
                  "bytes_written", "manifests_written", "put_requests", "get_requests", "batches",
                  "ingest_seconds", "ingest_task_seconds", "maintenance_seconds")
        out: dict[str, float] = {k: sum(getattr(d, k) or 0 for d in self.days) for k in summed}
        for k in ("kafka_retained_bytes", "table_bytes"):
            known = [getattr(d, k) for d in self.days if getattr(d, k) is not None]
            out[f"mean_{k}"] = sum(known) / len(known) if known else 0.0
        if self.prices.configured:
            out["price"] = round(sum((d.price or {}).get("total", 0.0) for d in self.days), 6)
        return out

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "topic": self.topic, "retention_ms": self.retention_ms,
                "retention_source": self.retention_source, "replication_factor": self.replication_factor,
                "prices": asdict(self.prices), "priced": self.prices.configured,
                "days": [{**asdict(d), "compute_seconds": d.compute_seconds} for d in self.days],
                "totals": self.totals(), "notes": self.notes}


# ---------------------------------------------------------------------------- Kafka

def _day_starts(days: int, now: datetime) -> list[int]:
    """Epoch ms of the start of each of the last `days` UTC days, oldest first, then `now`."""
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    starts = [int((today - timedelta(days=days - 1 - i)).timestamp() * 1000) for i in range(days)]
    return [*starts, int(now.timestamp() * 1000)]


def record_bytes(msg) -> int:
    """A record's payload bytes as produced: key + value + header names and values."""
    headers = msg.headers() or []
    return len(msg.key() or b"") + len(msg.value() or b"") + sum(len(k.encode()) + len(v or b"") for k, v in headers)


def _sample(kafka_conf: dict, topic: str, ranges: dict[int, tuple[int, int]], quota: int,
            timeout: float = SAMPLE_TIMEOUT_S) -> tuple[int, int]:
    """(records read, their bytes) from the start of each partition's [start, end) range, at most `quota`
    records over the SAMPLE_PARTITIONS partitions with the most records; what arrives within `timeout`."""
    chosen = sorted(ranges, key=lambda p: ranges[p][1] - ranges[p][0], reverse=True)[:SAMPLE_PARTITIONS]
    chosen = [p for p in chosen if ranges[p][1] > ranges[p][0]]
    if not chosen:
        return 0, 0
    share = max(1, math.ceil(quota / len(chosen)))
    stops = {p: min(ranges[p][1], ranges[p][0] + share) for p in chosen}
    consumer = kafka_consumer(kafka_conf, "lakehouse-cost", **{"enable.partition.eof": True, "fetch.wait.max.ms": 10})
    read = size = 0
    try:
        consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in chosen])
        pending, deadline = set(chosen), time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                p, err, offset = msg.partition(), msg.error(), msg.offset()
                if p is None or p not in pending:
                    continue
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(p)
                    continue
                if offset is None:  # a record without an error has one
                    continue
                if offset >= stops[p]:
                    pending.discard(p)
                    continue
                read, size = read + 1, size + record_bytes(msg)
                if offset + 1 >= stops[p]:
                    pending.discard(p)
    finally:
        consumer.close()
    return read, size


def _produced(spec: PipelineSpec, platform: config.PlatformConfig, bounds: list[int], days: list[DayCost],
              notes: list[str], progress: Callable[[str], None], sample_records: int) -> None:
    """Fill each day's produced records and bytes from Kafka; a broker that does not answer leaves them
    None with a note."""
    conf = platform.kafka()
    topic = spec.source.topic
    try:
        progress(f"reading {topic}'s log ends")
        state = topic_state(conf, topic)
        ends = {p: ps.end for p, ps in state.partitions.items()}
        progress(f"finding {topic}'s offsets at {len(bounds) - 1} day boundaries")
        at = [offsets_for_time(conf, topic, ends, ms, ends) for ms in bounds[:-1]] + [ends]
    except SourceError as exc:
        notes.append(f"Kafka did not answer, so nothing produced is counted: {exc}")
        return
    earliest = state.earliest
    for i, day in enumerate(days):
        ranges = {p: (at[i][p], max(at[i][p], at[i + 1][p])) for p in ends}
        day.produced_records = sum(end - start for start, end in ranges.values())
        day.kafka_complete = not any(earliest[p] > 0 and ranges[p][0] <= earliest[p] for p in ends)
        if not day.produced_records:
            day.produced_bytes = 0
            continue
        progress(f"sampling up to {sample_records} records of {day.day} for their size")
        read, size = _sample(conf, topic, ranges, sample_records)
        day.sampled_records = read
        if read:
            day.produced_bytes = round(size / read * day.produced_records)
    if not all(d.kafka_complete for d in days):
        notes.append("Kafka no longer holds the start of some days (retention): their produced figures are low")


def declared_retention(spec: PipelineSpec, platform: config.PlatformConfig) -> tuple[int | None, str]:
    """(retention.ms, where it comes from): the spec's `source.retention_ms`, else what the broker reports
    for the topic, else (None, "unknown")."""
    if spec.source.retention_ms is not None:
        return spec.source.retention_ms, "spec"
    try:
        found = topics.describe_retention(spec.source.topic, platform)
    except Exception:  # noqa: BLE001 - a broker that does not answer: the retention stays unknown
        found = None
    return (found, "topic") if found is not None else (None, "unknown")


# ---------------------------------------------------------------------------- tables

def _history_start_ms(metadata) -> int | None:
    """Epoch ms from which every commit of the table is still in its metadata (older snapshots were
    expired), or None when the whole history is there."""
    present = {s.snapshot_id for s in metadata.snapshots}
    cut = [s.timestamp_ms for s in metadata.snapshots
           if s.parent_snapshot_id is not None and s.parent_snapshot_id not in present]
    return max(cut) if cut else None


def _at_day_end(metadata, end_ms: int) -> tuple[int, int] | None:
    """(bytes, files) of `main` as of `end_ms` from its snapshot summary's totals; (0, 0) before the
    first commit; None when the snapshot current then has expired."""
    last = None
    for snap in offsets.main_ancestry(metadata):  # newest first
        last = snap
        if snap.timestamp_ms < end_ms:
            props = offsets.summary_properties(snap)
            return (int(props.get("total-files-size", 0)),
                    int(props.get("total-data-files", 0)) + int(props.get("total-delete-files", 0)))
    if last is None or last.parent_snapshot_id is None:
        return 0, 0
    return None


def commit_requests(summary: Mapping[str, str]) -> dict[str, int]:
    """What one table commit wrote and read on the object store, from its snapshot summary: `files`
    (data and delete files added), `bytes`, `manifests` (see the module's docstring), `put` (files +
    manifests + manifest list + metadata file) and `get` (the table's metadata file and the parent's
    manifest list)."""
    data, deletes = int(summary.get("added-data-files", 0)), int(summary.get("added-delete-files", 0))
    files = data + deletes
    removed = sum(int(summary.get(k, 0)) for k in ("deleted-data-files", "removed-delete-files"))
    if "manifests-created" in summary:  # Iceberg's Java writers record it for manifest rewrites
        manifests = int(summary["manifests-created"])
    else:  # one manifest for added data files, one for delete files, and each manifest that held a
        # removed file is written again with it marked deleted (at most one per file: an upper bound)
        manifests = (1 if data else 0) + (1 if deletes else 0) + removed
    return {"files": files, "bytes": int(summary.get("added-files-size", 0)), "manifests": manifests,
            "put": files + manifests + 2, "get": 2}


def _tables(spec: PipelineSpec, platform: config.PlatformConfig, bounds: list[int], days: list[DayCost],
            events_by_day: dict[str, dict], notes: list[str]) -> None:
    """Fill each day's table storage and table requests from the tables' metadata; days older than a
    table's retained history take that table's commits from the batch events."""
    catalog = open_catalog(platform, spec.catalog)
    loaded = {}
    for name in spec.owned_tables:
        try:
            loaded[name] = catalog.load_table(name).metadata
        except NoSuchTableError:
            continue
    for day in days:
        day.table_bytes, day.table_files = 0, 0
    expired = set()
    for name, metadata in loaded.items():
        start_ms = _history_start_ms(metadata)
        for i, day in enumerate(days):
            end = _at_day_end(metadata, bounds[i + 1])
            if end is None or day.table_bytes is None or day.table_files is None:
                day.table_bytes = day.table_files = None
            else:
                day.table_bytes += end[0]
                day.table_files += end[1]
            if start_ms is not None and bounds[i] < start_ms:
                expired.add((day.day, name))
        for snap in metadata.snapshots:
            at = _day_index(bounds, snap.timestamp_ms)
            if at is None or (days[at].day, name) in expired:
                continue
            counted = commit_requests(offsets.summary_properties(snap))
            day = days[at]
            day.commits += 1
            day.files_written += counted["files"]
            day.bytes_written += counted["bytes"]
            day.manifests_written += counted["manifests"]
            day.put_requests += counted["put"]
            day.get_requests += counted["get"]
    positioned = [t for t in spec.positioned_tables if t in loaded]
    for day in days:
        gone = [name for name in loaded if (day.day, name) in expired]
        if not gone:
            continue
        # the batch events stand in for expired commits: one commit per positioned table per batch
        found = events_by_day.get(day.day, {})
        share = len([t for t in gone if t in positioned]) / max(1, len(positioned))
        commits = round(found.get("batches", 0) * len(positioned) * share)
        files = round(found.get("files_added", 0) * share)
        manifests = round(found.get("batches_with_files", 0) * share)
        day.commits += commits
        day.files_written += files
        day.bytes_written += round(found.get("bytes_added", 0) * share)
        day.manifests_written += manifests
        day.put_requests += files + manifests + 2 * commits
        day.get_requests += 2 * commits
        day.requests_source = "events" if len(gone) == len(loaded) else "mixed"
    if expired:
        notes.append("some days are older than the tables' retained snapshots: their commits are counted from "
                     "the batch events (requests_source)")
    if any(d.table_bytes is None for d in days):
        notes.append("table storage of days whose snapshots expired is unknown")


def _day_index(bounds: list[int], ts_ms: int) -> int | None:
    for i in range(len(bounds) - 1):
        if bounds[i] <= ts_ms < bounds[i + 1]:
            return i
    return None


# ---------------------------------------------------------------------------- the ops timeline

def _timeline(spec: PipelineSpec, platform: config.PlatformConfig, bounds: list[int], days: list[DayCost],
              notes: list[str]) -> dict[str, dict]:
    """Fill each day's compute seconds, batch count, timeline commits and compaction reads from the
    pipeline's events; returns per day the batch figures (`_tables` falls back on them)."""
    since = datetime.fromtimestamp(bounds[0] / 1000, tz=UTC)
    try:
        found = events.recent(spec.name, since=since, limit=10 ** 7, platform=platform, catalog=spec.catalog)
    except Exception as exc:  # noqa: BLE001 - the timeline is for people; the tables and Kafka still answer
        notes.append(f"the ops timeline cannot be read, so compute seconds are missing: {type(exc).__name__}: {exc}")
        return {}
    by_day: dict[str, dict] = {}
    for event in found:
        i = _day_index(bounds, int(event["ts"].timestamp() * 1000))
        if i is None:
            continue
        day, metrics = days[i], event["metrics"]
        day.timeline_commits += 1
        if event["kind"] == "batch":
            day.batches += 1
            day.ingest_seconds += metrics.get("seconds") or 0.0
            day.ingest_task_seconds += metrics.get("busy_task_s") or 0.0
            figures = by_day.setdefault(day.day, {"batches": 0, "files_added": 0, "bytes_added": 0,
                                                  "batches_with_files": 0})
            figures["batches"] += 1
            figures["files_added"] += metrics.get("files_added") or 0
            figures["bytes_added"] += metrics.get("bytes_added") or 0
            figures["batches_with_files"] += 1 if metrics.get("files_added") else 0
        elif event["kind"] == "maintenance":
            day.maintenance_seconds += metrics.get("seconds") or 0.0
            day.get_requests += int(metrics.get("rewritten_data_files") or 0)  # compaction reads each file
    for day in days:
        day.put_requests += 4 * day.timeline_commits  # a file, a manifest, a manifest list, a metadata file
        day.get_requests += 2 * day.timeline_commits
        day.ingest_seconds = round(day.ingest_seconds, 3)
        day.ingest_task_seconds = round(day.ingest_task_seconds, 3)
        day.maintenance_seconds = round(day.maintenance_seconds, 3)
    return by_day


# ---------------------------------------------------------------------------- prices and the report

def price_day(day: DayCost, prices: UnitPrices) -> dict[str, float] | None:
    """The day's price per item whose unit price is set, and their `total`; None when none is set."""
    if not prices.configured:
        return None
    items: dict[str, float] = {}
    if prices.object_store_gb_month is not None and day.table_bytes is not None:
        items["object_store"] = day.table_bytes / GIB * prices.object_store_gb_month / MONTH_DAYS
    if prices.kafka_gb_month is not None and day.kafka_retained_bytes is not None:
        items["kafka"] = day.kafka_retained_bytes / GIB * prices.kafka_gb_month / MONTH_DAYS
    if prices.put_per_1000 is not None:
        items["put_requests"] = day.put_requests / 1000 * prices.put_per_1000
    if prices.get_per_1000 is not None:
        items["get_requests"] = day.get_requests / 1000 * prices.get_per_1000
    if prices.compute_hour is not None:
        items["compute"] = day.compute_seconds / 3600 * prices.compute_hour
    items = {k: round(v, 6) for k, v in items.items()}
    items["total"] = round(sum(items.values()), 6)
    return items


def daily_cost(spec: PipelineSpec, days: int = 7, platform: config.PlatformConfig | None = None,
               prices: UnitPrices | None = None, now: datetime | None = None,
               progress: Callable[[str], None] | None = None, sample_records: int = SAMPLE_RECORDS) -> CostReport:
    """`spec`'s pipeline's use of Kafka, the object store and compute over the last `days` UTC days (1 to
    MAX_DAYS, today last), priced with `prices` (default: the platform's, UnitPrices.from_settings).
    `progress` is told what is being read (Kafka sampling may take seconds); `sample_records` bounds the
    records read per day to measure their size. Raises ConfigurationError for
    a bad `days` or price; a broker or timeline that does not answer leaves its figures out, with a note."""
    if not 1 <= days <= MAX_DAYS:
        raise ConfigurationError(f"days={days}: use 1 to {MAX_DAYS}")
    platform = platform or config.load()
    prices = prices if prices is not None else UnitPrices.from_settings(platform.prices)
    now = now or datetime.now(UTC)
    progress = progress or (lambda _message: None)
    bounds = _day_starts(days, now)
    retention_ms, source = declared_retention(spec, platform)
    report = CostReport(spec.name, spec.source.topic, retention_ms, source, spec.source.replication_factor, prices)
    report.days = [DayCost(day=datetime.fromtimestamp(bounds[i] / 1000, tz=UTC).date().isoformat(),
                           partial=i == days - 1) for i in range(days)]
    progress("reading the ops timeline")
    by_day = _timeline(spec, platform, bounds, report.days, report.notes)
    progress("reading the tables' snapshots")
    _tables(spec, platform, bounds, report.days, by_day, report.notes)
    _produced(spec, platform, bounds, report.days, report.notes, progress, sample_records)
    for day in report.days:
        if day.produced_bytes is not None and retention_ms is not None and retention_ms >= 0:
            day.kafka_retained_bytes = round(
                day.produced_bytes * retention_ms / DAY_MS * spec.source.replication_factor)
        day.price = price_day(day, prices)
    if retention_ms == -1:
        report.notes.append("retention is unlimited: Kafka keeps every byte produced (x replication), so its "
                            "storage grows by each day's produced bytes")
    elif retention_ms is None:
        report.notes.append("neither the spec (source.retention_ms) nor the broker states the topic's retention: "
                            "Kafka storage is not estimated")
    if any(d.sampled_records and d.produced_records and d.sampled_records < d.produced_records for d in report.days):
        report.notes.append(f"produced bytes are estimated from a sample of up to {sample_records} records per day")
    return report


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def render(report: CostReport) -> str:
    """The plain form of `blocks`."""
    return console.text(blocks(report))


def blocks(report: CostReport) -> list[console.Block]:
    """The report for people: one row per day, then totals and notes."""
    retention = ("unlimited" if report.retention_ms == -1 else "unknown" if report.retention_ms is None
                 else f"{report.retention_ms / DAY_MS:g} d ({report.retention_source})")
    lines: list[console.Block] = [f"{report.pipeline}: topic {report.topic}, retention {retention}, replication "
             f"{report.replication_factor}; per UTC day, today so far last"]
    header = ["DAY", "PRODUCED", "RECORDS", "KAFKA RETAINS", "TABLES", "FILES", "COMMITS", "PUT", "GET",
              "INGEST S", "MAINT S"]
    if report.prices.configured:
        header.append(f"PRICE {report.prices.currency}".strip())
    rows = []
    for d in report.days:
        row = [d.day + ("*" if d.partial else ""), human_bytes(d.produced_bytes),
               "-" if d.produced_records is None else str(d.produced_records), human_bytes(d.kafka_retained_bytes),
               human_bytes(d.table_bytes), "-" if d.table_files is None else str(d.table_files),
               str(d.commits + d.timeline_commits), str(d.put_requests), str(d.get_requests),
               f"{d.ingest_seconds:.1f}", f"{d.maintenance_seconds:.1f}"]
        if report.prices.configured:
            row.append(f"{(d.price or {}).get('total', 0.0):.4f}")
        rows.append(row)
    lines.append(console.Table.of(header, rows))
    totals = report.totals()
    lines.append(f"window: {human_bytes(totals['produced_bytes'])} produced, {totals['put_requests']:.0f} PUT and "
                 f"{totals['get_requests']:.0f} GET requests, {totals['ingest_seconds']:.1f} s ingesting, "
                 f"{totals['maintenance_seconds']:.1f} s maintaining"
                 + (f", price {totals['price']:.4f} {report.prices.currency}".rstrip() if "price" in totals else
                    "; no unit prices set (LAKEHOUSE_PRICE_*): quantities only"))
    lines += [f"note: {n}" for n in report.notes]
    return lines
