"""The benchmark's arithmetic, free of Kafka, Spark and files so it can be checked by unit tests.

- `median`, `percentile` (censored observations count as +inf, never dropped);
- `Snapshot` / `visible_at`: when each record became visible, from snapshot offset ranges;
- `freshness_by_phase`: freshness percentiles per produce phase, and whether the pipeline kept up;
- `steady_rate`, `stage_breakdown`: ingest rates and per-stage seconds from `batch` event metrics;
- `evaluate_targets`: the issue's targets against the measured numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

# Batch-event metric keys that are not stages of a batch (they are ages or totals); keys ending in
# `_task_s` are seconds summed over parallel Spark tasks, which overlap and do not add up to wall time.
# not stages: `launch_s` and `tail_s` are parts of the write stage's wall time (Spark before and after the tasks)
NON_STAGE_KEYS = frozenset({"seconds", "freshness_s", "commit_age_s", "launch_s", "tail_s"})
TASK_SUFFIX = "_task_s"
# Stages in pipeline order, the finer split first; keys not listed here are appended in name order.
STAGE_ORDER = ("plan_s", "read_s", "decode_s", "read_decode_s", "write_s", "commit_s", "write_commit_s",
               "group_commit_s")
OTHER_STAGE = "other_s"


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    kept = sorted(float(v) for v in values if v is not None)
    if not kept:
        return None
    mid = len(kept) // 2
    return kept[mid] if len(kept) % 2 else (kept[mid - 1] + kept[mid]) / 2


def percentile(values: Sequence[float], q: float, censored: int = 0) -> float | None:
    """The q-th percentile (0..100, nearest rank) of `values` plus `censored` observations known only
    to exceed every measured value; None when the rank falls among the censored (the true value is
    then above the largest measurement) or there is nothing at all."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    total = len(values) + censored
    if total == 0:
        return None
    rank = max(1, math.ceil(q / 100 * total))  # nearest-rank: the smallest value with >= q% at or below it
    if rank > len(values):
        return None
    return float(np.partition(np.asarray(values, dtype=float), rank - 1)[rank - 1])


# ---------------------------------------------------------------------------------------------- freshness

@dataclass(frozen=True)
class Snapshot:
    """One ingest commit: when it became visible and the offsets `[start, end)` per partition it holds."""

    timestamp_ms: int
    ranges: Mapping[int, tuple[int, int]]


def visible_at(snapshots: Iterable[Snapshot], partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per record (partition, offset), the timestamp (ms) of the snapshot whose range holds it; NaN for
    a record no snapshot holds.

    Raises ValueError when two snapshots claim the same offset: an ingest commit only holds offsets
    past the table's position, so overlapping ranges mean the snapshots are not one table's ingest
    commits.
    """
    partitions = np.asarray(partitions, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    out = np.full(len(offsets), np.nan)
    by_partition: dict[int, list[tuple[int, int, int]]] = {}
    for snap in snapshots:
        for p, (start, end) in snap.ranges.items():
            if end > start:
                by_partition.setdefault(int(p), []).append((int(start), int(end), int(snap.timestamp_ms)))
    for p, spans in by_partition.items():
        spans.sort()
        starts = np.array([s[0] for s in spans], dtype=np.int64)
        ends = np.array([s[1] for s in spans], dtype=np.int64)
        if len(spans) > 1 and (starts[1:] < ends[:-1]).any():
            first = int(np.argmax(starts[1:] < ends[:-1]))
            raise ValueError(f"partition {p}: snapshot ranges {spans[first][:2]} and {spans[first + 1][:2]} "
                             f"overlap; pass one table's ingest snapshots only")
        stamps = np.array([s[2] for s in spans], dtype=float)
        mask = partitions == p
        wanted = offsets[mask]
        index = np.searchsorted(starts, wanted, side="right") - 1
        safe = np.clip(index, 0, None)
        hit = (index >= 0) & (wanted < ends[safe])
        out[np.flatnonzero(mask)[hit]] = stamps[safe][hit]
    return out


@dataclass(frozen=True)
class Phase:
    """A stretch of the paced producer: `rate` msg/s asked, records stamped in [start_ms, end_ms)."""

    rate: int
    start_ms: int
    end_ms: int
    produced: int

    @property
    def achieved_rate(self) -> float:
        seconds = (self.end_ms - self.start_ms) / 1000
        return self.produced / seconds if seconds > 0 else 0.0


@dataclass
class PhaseFreshness:
    """Freshness of one phase's records (seconds from produce to visible) and whether the pipeline kept up."""

    rate: int
    achieved_rate: float
    produced: int
    visible: int
    censored: int  # produced but not visible by the end of the drain: counted, never dropped
    p50: float | None
    p95: float | None
    p99: float | None
    max_visible: float | None
    early_lag: int  # peak records produced but not yet visible, first third of the phase
    late_lag: int   # the same, last third of the phase
    kept_up: bool
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def lag(kafka_ts_ms: np.ndarray, visible_ms: np.ndarray, at_ms: np.ndarray) -> np.ndarray:
    """Records produced at or before each time in `at_ms` but not visible by then (NaN visibility: never)."""
    produced = np.sort(np.asarray(kafka_ts_ms, dtype=float))
    seen = np.sort(np.nan_to_num(np.asarray(visible_ms, dtype=float), nan=np.inf))
    at = np.asarray(at_ms, dtype=float)
    return np.searchsorted(produced, at, side="right") - np.searchsorted(seen, at, side="right")


@dataclass(frozen=True)
class BatchTiming:
    """One committed batch of a continuous job: when it committed, how long it took, how many records."""

    end_ms: float
    seconds: float
    records: int

    @property
    def planned_ms(self) -> float:
        """When the batch was planned (it took `seconds` from plan to commit)."""
        return self.end_ms - self.seconds * 1000


def freshness_by_phase(phases: Sequence[Phase], kafka_ts_ms: np.ndarray, visible_ms: np.ndarray,
                       deadline_ms: int, batches: Sequence[BatchTiming] = (), trigger_s: float = 0.0,
                       max_batch_records: int | None = None) -> list[PhaseFreshness]:
    """Freshness percentiles per phase; records not visible by `deadline_ms` are censored.

    A phase kept up when (a) none of its records was censored, (b) no batch planned during the phase
    was full (`max_batch_records`: the backlog had outgrown the batch budget), and (c) the backlog
    stayed within what one batch in flight, one trigger wait and one more batch explain: the peak lag
    (records produced, not yet visible) of the phase's last third is at most
    1.25 x rate x (max(trigger, B) + B) + one second of the rate, B being the longest batch planned
    during the phase.
    """
    kafka_ts_ms = np.asarray(kafka_ts_ms, dtype=float)
    visible_ms = np.asarray(visible_ms, dtype=float)
    seen = ~np.isnan(visible_ms) & (visible_ms <= deadline_ms)
    by_deadline = np.where(seen, visible_ms, np.nan)
    out = []
    for phase in phases:
        in_phase = (kafka_ts_ms >= phase.start_ms) & (kafka_ts_ms < phase.end_ms)
        ok = in_phase & seen
        fresh = (visible_ms[ok] - kafka_ts_ms[ok]) / 1000.0
        # the producer's count is the truth for how many records the phase sent
        censored = max(0, phase.produced - int(ok.sum()))
        third = (phase.end_ms - phase.start_ms) / 3
        grid = np.arange(phase.start_ms, phase.end_ms, 100.0)
        lags = lag(kafka_ts_ms, by_deadline, grid)
        early = int(lags[grid < phase.start_ms + third].max(initial=0))
        late = int(lags[grid >= phase.end_ms - third].max(initial=0))
        during = [b for b in batches if phase.start_ms <= b.planned_ms < phase.end_ms]
        longest = max((b.seconds for b in during), default=trigger_s)
        bound = 1.25 * phase.rate * (max(trigger_s, longest) + longest) + phase.rate
        capped = [b for b in during if max_batch_records and b.records >= max_batch_records]
        if censored:
            kept_up, why = False, f"{censored:,} records not visible by the end of the drain"
        elif capped:
            kept_up, why = False, (f"{len(capped)} batch(es) planned during the phase were full "
                                   f"({max_batch_records:,} records): the backlog outgrew a batch")
        elif late > bound:
            kept_up, why = False, (f"the backlog reached {late:,} records, more than one batch in flight plus one "
                                   f"trigger and one batch explain ({bound:,.0f})")
        else:
            kept_up, why = True, ""
        out.append(PhaseFreshness(
            rate=phase.rate, achieved_rate=round(phase.achieved_rate, 1), produced=phase.produced,
            visible=int(ok.sum()), censored=censored,
            p50=percentile(fresh, 50, censored), p95=percentile(fresh, 95, censored),
            p99=percentile(fresh, 99, censored),
            max_visible=float(fresh.max()) if len(fresh) else None,
            early_lag=early, late_lag=late, kept_up=kept_up, why=why))
    return out


@dataclass(frozen=True)
class BatchCost:
    """A batch's seconds as a fixed cost plus records at a marginal rate, fitted by least squares."""

    fixed_s: float
    records_per_s: float
    batches: int

    def seconds(self, records: float) -> float:
        return self.fixed_s + records / self.records_per_s

    def steady_batch(self, rate: float, trigger_s: float,
                     max_records: int | None = None) -> tuple[float, float, float] | None:
        """(records per batch, seconds per cycle, seconds per batch) once a continuous job settles at
        `rate` msg/s with `trigger_s`; None when it never settles: the rate is at or above the marginal
        rate, or the batch it would need is larger than `max_records` (the backlog then grows forever).

        Each cycle takes max(trigger, batch seconds) and its batch holds what arrived during the
        previous cycle: n = rate x max(trigger, fixed + n / marginal). A record then waits at worst one
        cycle for the next batch to be planned and one batch for it to commit.
        """
        if rate >= self.records_per_s:
            return None
        n = rate * self.fixed_s / (1 - rate / self.records_per_s)  # batches longer than the trigger
        if self.seconds(n) < trigger_s:  # the trigger paces the job: a cycle is one trigger interval
            n = rate * trigger_s
            cycle = trigger_s
        else:
            cycle = self.seconds(n)
        if max_records is not None and n > max_records:
            return None
        return n, cycle, self.seconds(n)

    def capped_rate(self, max_records: int) -> float:
        """Records per second a job drains with full batches of `max_records` back to back."""
        return max_records / self.seconds(max_records)


def fit_batch_cost(batches: Sequence[BatchTiming]) -> BatchCost | None:
    """Least-squares fit of seconds = fixed + records / marginal over the batches; None when the batches
    do not span at least two sizes or the fit is not physical (negative cost or rate)."""
    sizes = np.array([b.records for b in batches], dtype=float)
    seconds = np.array([b.seconds for b in batches], dtype=float)
    if len(batches) < 3 or np.ptp(sizes) <= 0:
        return None
    slope, intercept = np.polyfit(sizes, seconds, 1)
    if slope <= 0 or intercept < 0:
        return None
    return BatchCost(fixed_s=float(intercept), records_per_s=float(1 / slope), batches=len(batches))


# ---------------------------------------------------------------------------------------------- ingest rates

@dataclass
class IngestRate:
    """A `--once` run's rates: steady state from the batch events, end to end from wall time."""

    records: int
    batches: int
    wall_s: float
    steady_records: int
    steady_s: float
    cold_records: int
    cold_s: float

    @property
    def steady_rate(self) -> float | None:
        return self.steady_records / self.steady_s if self.steady_s > 0 else None

    @property
    def cold_rate(self) -> float | None:
        return self.cold_records / self.cold_s if self.cold_s > 0 else None

    @property
    def wall_rate(self) -> float | None:
        return self.records / self.wall_s if self.wall_s > 0 else None


def ingest_rate(batches: Sequence[Mapping[str, float]], wall_s: float) -> IngestRate:
    """Rates of one `--once` run from its batch metrics, oldest first.

    The first batch is the cold one (JIT, first Iceberg load, Python workers starting); the steady
    state sums records and seconds over the others. With a single batch, that batch is all there is.
    """
    records = int(sum(b.get("records", 0) for b in batches))
    if not batches:
        return IngestRate(records, 0, wall_s, 0, 0.0, 0, 0.0)
    cold = batches[0]
    steady = batches[1:] or batches
    return IngestRate(
        records=records, batches=len(batches), wall_s=wall_s,
        steady_records=int(sum(b.get("records", 0) for b in steady)),
        steady_s=float(sum(b.get("seconds", 0.0) for b in steady)),
        cold_records=int(cold.get("records", 0)), cold_s=float(cold.get("seconds", 0.0)))


def stage_breakdown(batches: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Seconds per stage summed over `batches`, in pipeline order, whatever stage keys the events carry;
    `other_s` is the part of the batches' `seconds` no stage accounts for (never negative)."""
    totals: dict[str, float] = {}
    for metrics in batches:
        for key, value in metrics.items():
            if key.endswith("_s") and not key.endswith(TASK_SUFFIX) and key not in NON_STAGE_KEYS \
                    and value is not None:
                totals[key] = totals.get(key, 0.0) + float(value)
    # a coarse stage and its finer split must not both count: keep the finer one when present
    for coarse, fine in (("read_decode_s", ("read_s", "decode_s")), ("write_commit_s", ("write_s", "commit_s"))):
        if coarse in totals and all(f in totals for f in fine):
            del totals[coarse]
    ordered = {k: totals[k] for k in STAGE_ORDER if k in totals}
    ordered.update({k: totals[k] for k in sorted(totals) if k not in ordered})
    seconds = float(sum(m.get("seconds", 0.0) for m in batches))
    ordered[OTHER_STAGE] = max(0.0, seconds - sum(ordered.values()))
    return ordered


def task_seconds(batches: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Seconds summed over parallel tasks per stage (`read_task_s` -> `read`), summed over `batches`."""
    totals: dict[str, float] = {}
    for metrics in batches:
        for key, value in metrics.items():
            if key.endswith(TASK_SUFFIX) and value is not None:
                stage = key[: -len(TASK_SUFFIX)]
                totals[stage] = totals.get(stage, 0.0) + float(value)
    return totals


def dominant_stage(breakdown: Mapping[str, float]) -> tuple[str, float] | None:
    """(stage, share of the total 0..1) of the stage that took the most time; None when nothing was timed."""
    total = sum(breakdown.values())
    if total <= 0:
        return None
    stage = max(breakdown, key=lambda k: breakdown[k])
    return stage, breakdown[stage] / total


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


# ---------------------------------------------------------------------------------------------- targets

@dataclass
class Target:
    name: str
    goal: str
    measured: str
    passed: bool | None  # None: not measured in this run
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# the names of the targets, as the report's table and the explanations key them
T_CEILING = "steady JSON ingest vs parallel consume ceiling"
T_S3 = "a 10-record batch on the S3 warehouse"
T_WIDE = "a batch of 1,000 partitions x 20 records"
T_AUDIT = "the audit's worker memory, 10M-row window"
T_AVRO = "Avro end to end vs JSON"
T_CDC = "a change stream (20 % updates, 5 % deletes) vs appends"
T_CDC_READ = "reads of the change table vs after compaction"
T_PROTOBUF = "Protobuf end to end vs JSON"
T_VS_CONNECT = "records per CPU second vs the Kafka Connect sink"
T_VS_SSS = "records per CPU second vs Structured Streaming"
T_BASELINE = "speed-up over the hand-written baseline"
T_FIXED = "fixed cost per batch"
T_SMALL = "a 10-record batch commits"
T_FRESH_50K = "freshness p95 at 50k msg/s, 1 s trigger"
T_FRESH_10K = "freshness p95 at 10k msg/s, 1 s trigger"
T_SCALING = "speed-up from local[1] to local[2]"
T_MEMORY = "memory bounded by the batch size, not the backlog"


@dataclass
class TargetInputs:
    """The measured numbers the issue's targets are checked against (None: not measured)."""

    pipeline_rate: float | None          # sustained records/s (best partition count, steady state)
    consume_ceiling: float | None        # records/s of the raw consumer on the same topic
    baseline_rate: float | None = None   # records/s of the faster hand-written baseline
    batch_fixed_s: float | None = None   # fitted fixed cost of a batch (continuous jobs)
    small_batch_s: float | None = None   # median seconds of a 10-record batch
    small_batch_max_s: float | None = None
    # freshness p95 in seconds per (rate, trigger); a key present with None: censored records
    freshness_p95: dict[tuple[int, float], float | None] = field(default_factory=dict)
    one_core_rate: float | None = None   # steady records/s under local[1] ...
    two_core_rate: float | None = None   # ... and local[2], same topic
    memory_small_mb: float | None = None  # peak RSS of the ingest tree, backlog 1x the batch size
    memory_large_mb: float | None = None  # peak RSS, backlog several times the batch size
    memory_growth_limit: float = 0.25
    wide_batch_s: float | None = None     # median seconds of a batch of 1,000 partitions x 20 records
    # peak RSS (MB) of the audit's own process (the Airflow worker's task) per (path, rows of the window)
    audit_worker_mb: dict[tuple[str, int], float] = field(default_factory=dict)
    s3_batch_s: float | None = None       # median seconds of a 10-record batch on the S3 warehouse
    s3_requests_per_batch: float | None = None
    # steady records/s of `lakehouse ingest --once` per wire format, JSON's from the pipeline section (same topic
    # layout, same cores)
    format_rates: dict[str, float | None] = field(default_factory=dict)
    # per envelope format (json, avro): the change stream's steady records/s, and full-scan seconds of its
    # table before and after maintenance
    cdc_rates: dict[str, float | None] = field(default_factory=dict)
    cdc_scans: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # steady records per CPU second (every process, the broker included) per system: pipeline, connect, sss
    records_per_cpu_s: dict[str, float | None] = field(default_factory=dict)
    # freshness p95 in seconds per (system, rate, trigger) of the peers' runs (None: censored records)
    peer_p95: dict[tuple[str, int, float], float | None] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)  # target name -> explanation when it fails


def _freshness_target(t: TargetInputs, name: str, rate: int, trigger_s: float, limit_s: float) -> Target:
    goal = f"<= {limit_s:g} s"
    if (rate, trigger_s) not in t.freshness_p95:
        return Target(name, goal, "not measured", None)
    p95 = t.freshness_p95[(rate, trigger_s)]
    return Target(name, goal, "above the drain bound (records censored)" if p95 is None else f"{p95:.2f} s",
                  False if p95 is None else p95 <= limit_s)


def _peer_target(t: TargetInputs, name: str, system: str, label: str, factor: float) -> Target:
    """This pipeline's steady records per CPU second >= `factor` x the peer's, and its freshness p95 no worse
    than the peer's at every (rate, trigger) both ran (a censored p95 is worse than any measured one)."""
    goal = f">= {factor:g}x, freshness p95 no worse at the same trigger"
    speedup = ratio(t.records_per_cpu_s.get("pipeline"), t.records_per_cpu_s.get(system))
    if speedup is None:
        return Target(name, goal, "not measured", None)
    worse = []
    compared = 0
    for (peer, rate, trigger), theirs in sorted(t.peer_p95.items()):
        if peer != system or (rate, trigger) not in t.freshness_p95:
            continue
        compared += 1
        ours = t.freshness_p95[(rate, trigger)]
        if ours is None and theirs is None:
            continue
        if ours is None or (theirs is not None and ours > theirs):
            worse.append(f"{rate // 1000}k/s at {trigger:g} s: {'censored' if ours is None else f'{ours:.2f} s'} "
                         f"vs {'censored' if theirs is None else f'{theirs:.2f} s'}")
    measured = (f"{speedup:.2f}x ({t.records_per_cpu_s['pipeline']:,.0f} vs {t.records_per_cpu_s[system]:,.0f} "
                f"records per CPU s); freshness " + (f"worse at {'; '.join(worse)}" if worse else
                                                     f"no worse in {compared} comparisons" if compared else
                                                     "not compared"))
    return Target(name, goal, measured, speedup >= factor and not worse)


def _audit_target(t: TargetInputs) -> Target:
    """The audit's worker memory is bounded by a constant: on the Spark path the largest window's peak is at
    most +25 % of the smallest's; the pandas path's growth is reported beside it."""
    goal = "bounded by a constant (largest window <= +25 % of the smallest on the Spark path)"
    spark = sorted((rows, mb) for (path, rows), mb in t.audit_worker_mb.items() if path == "spark")
    if len(spark) < 2 or spark[0][0] == spark[-1][0]:
        return Target(T_AUDIT, goal, "not measured", None)
    (small, small_mb), (large, large_mb) = spark[0], spark[-1]
    pandas = sorted((rows, mb) for (path, rows), mb in t.audit_worker_mb.items() if path == "pandas")
    measured = f"Spark: {large_mb:,.0f} MB at {large:,} rows, {small_mb:,.0f} MB at {small:,}"
    if pandas:
        measured += "; pandas: " + ", ".join(f"{mb:,.0f} MB at {rows:,}" for rows, mb in pandas)
    return Target(T_AUDIT, goal, measured, large_mb <= small_mb * 1.25)


def evaluate_targets(t: TargetInputs) -> list[Target]:
    """The issue's targets, each with its goal, the measured value and pass/fail (None: not measured)."""
    out = []
    share = ratio(t.pipeline_rate, t.consume_ceiling)
    out.append(Target(T_CEILING, ">= 80 % of the ceiling",
                      "not measured" if share is None else
                      f"{share * 100:.1f} % ({t.pipeline_rate:,.0f} of {t.consume_ceiling:,.0f} records/s)",
                      None if share is None else share >= 0.8))
    out.append(Target(T_WIDE, "<= 1 s", "not measured" if t.wide_batch_s is None else f"{t.wide_batch_s:.2f} s median",
                      None if t.wide_batch_s is None else t.wide_batch_s <= 1.0))
    out.append(_audit_target(t))
    out.append(Target(T_S3, "<= 0.5 s (the fixed cost), object-store requests per batch reported",
                      "not measured" if t.s3_batch_s is None else
                      f"{t.s3_batch_s:.2f} s median, {t.s3_requests_per_batch or 0:,.1f} requests per batch",
                      None if t.s3_batch_s is None else t.s3_batch_s <= 0.5))
    json_rate = t.format_rates.get("json")
    for fmt, name in (("avro", T_AVRO), ("protobuf", T_PROTOBUF)):
        share = ratio(t.format_rates.get(fmt), json_rate)
        out.append(Target(name,
                          ">= 80 % of JSON's steady records/s",
                          "not measured" if share is None else
                          f"{share * 100:.1f} % ({t.format_rates[fmt]:,.0f} vs {json_rate:,.0f} records/s)",
                          None if share is None else share >= 0.8))
    shares = {fmt: ratio(rate, t.format_rates.get(fmt)) for fmt, rate in sorted(t.cdc_rates.items())}
    shares = {fmt: share for fmt, share in shares.items() if share is not None}
    out.append(Target(T_CDC, ">= 50 % of the append rate of the same format",
                      "; ".join(f"{fmt} {share * 100:.1f} % ({t.cdc_rates[fmt]:,.0f} vs {t.format_rates[fmt]:,.0f} "
                                f"records/s)" for fmt, share in shares.items()) or "not measured",
                      min(shares.values()) >= 0.5 if shares else None))
    slower = {fmt: ratio(before, after) for fmt, (before, after) in sorted(t.cdc_scans.items())}
    slower = {fmt: x for fmt, x in slower.items() if x is not None}
    out.append(Target(T_CDC_READ, "<= 1.5x the scan time after compaction",
                      "; ".join(f"{fmt} {x:.2f}x ({t.cdc_scans[fmt][0]:.3f} s vs {t.cdc_scans[fmt][1]:.3f} s)"
                                for fmt, x in slower.items()) or "not measured",
                      max(slower.values()) <= 1.5 if slower else None))
    out.append(_peer_target(t, T_VS_CONNECT, "connect", "the Kafka Connect sink", 2.0))
    out.append(_peer_target(t, T_VS_SSS, "sss", "Structured Streaming", 1.5))
    speedup = ratio(t.pipeline_rate, t.baseline_rate)
    out.append(Target(T_BASELINE, ">= 2x",
                      "not measured" if speedup is None else
                      f"{speedup:.2f}x ({t.pipeline_rate:,.0f} vs {t.baseline_rate:,.0f} records/s)",
                      None if speedup is None else speedup >= 2.0))
    out.append(Target(T_FIXED, "<= 0.5 s (fitted)",
                      "not measured" if t.batch_fixed_s is None else f"{t.batch_fixed_s:.2f} s",
                      None if t.batch_fixed_s is None else t.batch_fixed_s <= 0.5))
    out.append(Target(T_SMALL, "< 1 s",
                      "not measured" if t.small_batch_s is None else
                      f"{t.small_batch_s:.2f} s median" + (f", {t.small_batch_max_s:.2f} s max"
                                                           if t.small_batch_max_s is not None else ""),
                      None if t.small_batch_s is None else t.small_batch_s < 1.0))
    out.append(_freshness_target(t, T_FRESH_50K, 50_000, 1.0, 5.0))
    out.append(_freshness_target(t, T_FRESH_10K, 10_000, 1.0, 3.0))
    scaling = ratio(t.two_core_rate, t.one_core_rate)
    out.append(Target(T_SCALING, ">= 1.6x",
                      "not measured" if scaling is None else
                      f"{scaling:.2f}x ({t.one_core_rate:,.0f} -> {t.two_core_rate:,.0f} records/s)",
                      None if scaling is None else scaling >= 1.6))
    growth = ratio(t.memory_large_mb, t.memory_small_mb)
    out.append(Target(T_MEMORY,
                      f"peak RSS with a 3x backlog <= +{t.memory_growth_limit * 100:.0f} % of a 1x backlog",
                      "not measured" if growth is None else
                      f"{t.memory_small_mb:,.0f} MB -> {t.memory_large_mb:,.0f} MB ({(growth - 1) * 100:+.1f} %)",
                      None if growth is None else growth <= 1.0 + t.memory_growth_limit))
    for target in out:
        target.why = t.extra.get(target.name, "")
    return out
