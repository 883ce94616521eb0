"""The benchmark's Markdown report and PNG plots, rendered from the results dict (results.json).

`render(results)` returns the Markdown text and never needs Kafka or Spark, so the report
of a stored results.json can be rendered again (`python -m bench.report results.json`).
`plot(results, directory)` draws the PNGs with matplotlib's headless backend and returns
their file names.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from bench import stats

STAGE_LABELS = {
    "plan_s": "plan", "read_s": "read (Kafka)", "decode_s": "decode + validate", "read_decode_s": "read + decode",
    "write_s": "write files", "commit_s": "catalog commit", "write_commit_s": "write + commit",
    "group_commit_s": "group commit", "other_s": "other (events, Spark overhead)",
}


# ---------------------------------------------------------------------------------------------- formatting

def num(value: float | None, digits: int = 0) -> str:
    """A number with thousands separators, '–' for a missing one."""
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def secs(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; cells are rendered with str()."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def stage_label(key: str) -> str:
    return STAGE_LABELS.get(key, key.removesuffix("_s").replace("_", " "))


# ---------------------------------------------------------------------------------------------- derived numbers

def headline(results: Mapping[str, Any]) -> dict[str, float | None]:
    """The numbers the ratios and targets use: best sustained pipeline rate (and its partition count),
    the consume ceiling of the same topic, the faster baseline."""
    pipeline = results.get("pipeline") or {}
    best_key, best = None, None
    for key, entry in pipeline.items():
        rate = entry.get("median_steady_records_per_s")
        if rate is not None and (best is None or rate > best):
            best_key, best = key, rate
    ceilings = results.get("ceilings") or {}
    consume = (ceilings.get("consume") or {}).get(best_key or "", {})
    parallel = (ceilings.get("parallel_consume") or {}).get(best_key or "", {})
    baselines = [b.get("median_records_per_s") for b in (results.get("baseline") or {}).values()]
    baselines = [b for b in baselines if b is not None]
    # the ceiling: as many readers as task slots (the pipeline's steady rate excludes its start-up, so the
    # single consumer's is taken after its first fetch, when there is no parallel one)
    return {"pipeline_key": best_key, "pipeline_rate": best,
            "consume_ceiling": parallel.get("median_after_first_records_per_s") or parallel.get("median_records_per_s")
            or consume.get("median_after_first_records_per_s") or consume.get("median_records_per_s"),
            "baseline_rate": max(baselines) if baselines else None}


def freshness_at(results: Mapping[str, Any], rate: int, trigger_s: float) -> dict | None:
    for run in results.get("freshness") or []:
        if abs(run.get("trigger_s", -1) - trigger_s) < 1e-9:
            for phase in run.get("phases", []):
                if phase.get("rate") == rate:
                    return phase
    return None


def target_inputs(results: Mapping[str, Any]) -> stats.TargetInputs:
    """The targets' inputs from the results, with the explanations the 'why' section needs."""
    h = headline(results)
    memory = results.get("memory") or {}
    freshness = results.get("freshness") or []
    costs = [r["batch_cost"] for r in freshness if r.get("batch_cost")]
    small = results.get("small_batches") or {}
    inputs = stats.TargetInputs(
        pipeline_rate=h["pipeline_rate"], consume_ceiling=h["consume_ceiling"], baseline_rate=h["baseline_rate"],
        batch_fixed_s=stats.median(c["fixed_s"] for c in costs) if costs else None,
        small_batch_s=small.get("median_s"), small_batch_max_s=small.get("max_s"),
        freshness_p95={(phase.get("rate"), float(run.get("trigger_s", 0))): phase.get("p95")
                       for run in freshness for phase in run.get("phases", [])},
        one_core_rate=((results.get("scaling") or {}).get("local[1]") or {}).get("median_steady_records_per_s"),
        two_core_rate=((results.get("pipeline") or {}).get("p3") or {}).get("median_steady_records_per_s"),
        memory_small_mb=(memory.get("small") or {}).get("peak_mb"),
        memory_large_mb=(memory.get("large") or {}).get("peak_mb"),
        wide_batch_s=(results.get("partitions") or {}).get("median_s"),
        audit_worker_mb={(run.get("path"), run.get("rows")): (run.get("peak_by_role_mb") or {}).get("driver")
                         for run in (results.get("audit") or {}).get("runs", [])
                         if (run.get("peak_by_role_mb") or {}).get("driver") is not None},
        s3_batch_s=(results.get("s3") or {}).get("median_s"),
        s3_requests_per_batch=((results.get("s3") or {}).get("requests_per_batch") or {}).get("all"),
        format_rates={"json": ((results.get("pipeline") or {}).get("p3") or {}).get("median_steady_records_per_s"),
                      **{fmt: entry.get("median_steady_records_per_s")
                         for fmt, entry in (results.get("formats") or {}).items()}},
        cdc_rates={fmt: entry.get("steady_records_per_s") for fmt, entry in (results.get("cdc") or {}).items()
                   if isinstance(entry, dict)},
        cdc_scans={fmt: ((entry.get("maintenance") or {}).get("scan_median_before"),
                         (entry.get("maintenance") or {}).get("scan_median_after"))
                   for fmt, entry in (results.get("cdc") or {}).items() if isinstance(entry, dict)
                   and entry.get("maintenance")},
        records_per_cpu_s={system: entry.get("steady_records_per_cpu_s") or entry.get("records_per_cpu_s")
                           for system, entry in ((results.get("peers") or {}).get("backlog") or {}).items()},
        peer_p95={(run["system"], phase.get("rate"), float(run.get("trigger_s", 0))): phase.get("p95")
                  for run in (results.get("peers") or {}).get("freshness") or [] for phase in run.get("phases", [])})
    inputs.extra = explanations(results, h)
    return inputs


def explanations(results: Mapping[str, Any], h: Mapping[str, Any]) -> dict[str, str]:
    """Per target, the measurements that explain its outcome: which stage dominates, what the ceiling is."""
    out: dict[str, str] = {}
    ceilings = results.get("ceilings") or {}
    decode = (ceilings.get("decode") or {}).get("median_records_per_s")
    write = (ceilings.get("write") or {}).get("median_records_per_s")
    cores = (results.get("config") or {}).get("cores") or 1
    key = h.get("pipeline_key")
    entry = (results.get("pipeline") or {}).get(key or "", {})
    stages = entry.get("stages_s") or {}
    dominant = stats.dominant_stage(stages)
    parts = []
    if dominant:
        parts.append(f"in the steady batches of the {key} run, **{stage_label(dominant[0])}** takes "
                     f"{dominant[1] * 100:.0f} % of the batch time ({_stage_summary(stages)})")
    tasks = entry.get("task_s") or {}
    task_wall = sum(stages.get(k, 0.0) for k in ("read_s", "decode_s", "read_decode_s"))
    task_total = (tasks.get("read") or 0.0) + (tasks.get("decode") or 0.0)
    if task_wall > 0 and task_total > 0:
        overhead = max(0.0, 1 - task_total / cores / task_wall)
        parts.append(f"the read and decode stages took {secs(task_wall)} of wall time while their Spark tasks ran "
                     f"{secs(task_total)} summed over tasks ({pct(tasks.get('decode', 0) / task_total)} of it "
                     f"decoding), so at least {pct(overhead)} of those stages is Spark work around the tasks "
                     f"(job scheduling, Python worker hand-off) or cores the tasks did not get (the broker and "
                     f"the driver share them)")
    batches = entry.get("stage_batches") or 0
    write_commit = sum(stages.get(k, 0.0) for k in ("write_s", "commit_s", "write_commit_s"))
    if batches and write_commit and write:
        per_batch = entry.get("stage_records", 0) / batches
        parts.append(f"writing and committing took {secs(write_commit / batches)} per batch of {num(per_batch)} "
                     f"records, where pyarrow alone writes them as Parquet in {secs(per_batch / write)} "
                     f"({num(write)} rows/s)")
    costs = [r["batch_cost"] for r in results.get("freshness") or [] if r.get("batch_cost")]
    if costs:
        fixed = stats.median(c["fixed_s"] for c in costs)
        marginal = stats.median(c["records_per_s"] for c in costs)
        parts.append(f"the continuous jobs' batches fit {secs(fixed)} of fixed cost per batch plus one second per "
                     f"{num(marginal)} records, so even an unbounded batch tops out near {num(marginal)} records/s "
                     f"({pct(stats.ratio(marginal, h.get('consume_ceiling')))} of the consume ceiling)")
    if decode:
        cap = decode * cores
        share = stats.ratio(cap, h.get("consume_ceiling"))
        verdict = ("so Python decoding alone keeps the pipeline below the 80 % target" if share is not None
                   and share < 0.8 else "so per-record Python decoding alone does not explain the gap")
        parts.append(f"the pipeline's own decoder (RecordValidator + BatchBuilder, pure Python) runs at "
                     f"{num(decode)} records/s on one core, {num(cap)} records/s on {cores} cores at best "
                     f"({pct(share)} of the consume ceiling), {verdict}")
    bound, ceiling = _machine_bound(entry, cores), h.get("consume_ceiling")
    if bound and ceiling:
        total, machine = bound
        text = (f"the {key} run spent {total:.2f} CPU seconds per 100k records ({_cpu_split(entry)}), so with "
                f"all {cores} cores busy it tops out near {num(machine)} records/s ({pct(machine / ceiling)} of the "
                f"consume ceiling); 80 % of the ceiling leaves {cores / (0.8 * ceiling) * 100_000:.2f} CPU seconds "
                f"per 100k records for everything")
        reading = _ceiling_cpu_per_100k(results, key)
        if reading:
            text += (f", of which the ceiling's readers and the broker alone spent {sum(reading.values()):.2f} "
                     f"({', '.join(f'{role} {seconds:.2f} s' for role, seconds in reading.items())})")
        parts.append(text)
    out[stats.T_CEILING] = "; ".join(parts)

    run = next((r for r in results.get("freshness") or [] if abs(r.get("trigger_s", -1) - 1.0) < 1e-9), None)
    for name, rate in ((stats.T_FRESH_50K, 50_000), (stats.T_FRESH_10K, 10_000)):
        phase = freshness_at(results, rate, 1.0)
        if run is None or phase is None:
            continue
        text = (f"at {num(rate)} msg/s the 1 s-trigger job {'kept up' if phase.get('kept_up') else 'did not keep up'}"
                f"{' (' + phase['why'] + ')' if phase.get('why') else ''}; a record waits for the next trigger "
                f"(up to 1 s) and then for one whole batch, whose median took {secs(run.get('median_batch_s'))}")
        cost = run.get("batch_cost")
        if cost:
            text += "; " + cost_sentence(cost, rate, 1.0, run.get("max_records_per_batch"))
        dominant = stats.dominant_stage(run.get("stages_s") or {})
        if dominant:
            text += f"; over that job's batches, {stage_label(dominant[0])} took {dominant[1] * 100:.0f} % of the time"
        if phase.get("censored"):
            text += f"; {num(phase['censored'])} records were not visible by the end of the drain"
        out[name] = text

    small = results.get("small_batches") or {}
    if small.get("stages_s"):
        out[stats.T_SMALL] = (f"over {small.get('batches')} batches of {small.get('records_per_batch')} records, "
                              f"{_stage_summary(small['stages_s'])}")
        out[stats.T_FIXED] = out[stats.T_SMALL]

    scaling = (results.get("scaling") or {}).get("local[1]") or {}
    two = (results.get("pipeline") or {}).get("p3") or {}
    busy_one, busy_two, bound = _cores_busy(scaling), _cores_busy(two), _machine_bound(two, cores)
    if busy_one and busy_two and bound:
        total, machine = bound
        room = stats.ratio(machine, scaling.get("median_steady_records_per_s")) or 0.0
        out[stats.T_SCALING] = (
            f"local[1] is one task slot, not one core: at its steady rate it kept {busy_one:.2f} of the {cores} "
            f"cores busy (CPU seconds per 100k records: {_cpu_split(scaling)}; python_workers includes "
            f"librdkafka's fetch threads, which run beside the task's decoding), and local[2] kept {busy_two:.2f} "
            f"busy ({_cpu_split(two)}). At {total:.2f} CPU seconds per 100k records the whole machine tops out "
            f"near {num(machine)} records/s, {room:.2f}x the one-slot rate: the second slot can only add the "
            f"cores the first one leaves idle")

    baseline = h.get("baseline_rate")
    if baseline:
        out[stats.T_BASELINE] = (
            f"the faster baseline ingests {num(baseline)} records/s against the pipeline's "
            f"{num(h.get('pipeline_rate'))}; "
            f"the baseline is one process with no JVM: json.loads, no contract validation, no dead letters, no "
            f"offsets in its commits, one pyiceberg commit per N records; the pipeline's tasks decode, validate "
            f"and write in parallel, and each batch pays one Spark job and two fenced commits (data and "
            f"dead-letter table) that carry the offsets of its exactly-once contract")

    memory = results.get("memory") or {}
    small, large = memory.get("small") or {}, memory.get("large") or {}
    if small and large:
        grew = {role: (large.get("peak_by_role_mb", {}).get(role, 0) - mb)
                for role, mb in (small.get("peak_by_role_mb") or {}).items()}
        role = max(grew, key=lambda r: grew[r]) if grew else None
        if role is not None:
            out[stats.T_MEMORY] = (
                f"peaks by process: 1x {_roles(small)}; 3x {_roles(large)}; the largest change is the "
                f"{role} ({grew[role]:+,.0f} MB). The JVM heap grows lazily up to its maximum whatever the "
                f"data, so RSS after more batches can be higher without holding more records")
    return out


def _cpu_per_100k(summary: Mapping[str, Any]) -> dict[str, float]:
    """CPU seconds per role per 100k records of a pipeline summary's median run: in its steady batches when
    measured, else over the whole run (JVM start included). {} when not measured."""
    runs = summary.get("runs") or []
    if not runs:
        return {}
    run = sorted(runs, key=lambda r: r.get("steady_records_per_s") or 0)[(len(runs) - 1) // 2]
    memory = run.get("memory") or {}
    if memory.get("steady_cpu_by_role_s") and memory.get("steady_records"):
        cpu, records = memory["steady_cpu_by_role_s"], memory["steady_records"]
    else:
        cpu, records = memory.get("cpu_by_role_s") or {}, run.get("records") or 0
    if not cpu or not records:
        return {}
    return {role: seconds * 100_000 / records for role, seconds in cpu.items() if seconds}


def _machine_bound(summary: Mapping[str, Any], cores: int) -> tuple[float, float] | None:
    """(CPU seconds per 100k records of a pipeline summary's run, the records/s every core busy at that cost
    would give): every process of the run shares the cores, the broker's and the JVM's included. None when
    the CPU was not measured."""
    total = sum(_cpu_per_100k(summary).values())
    return (total, cores / total * 100_000) if total else None


def _ceiling_cpu_per_100k(results: Mapping[str, Any], key: str | None) -> dict[str, float]:
    """CPU seconds per role per 100k records of the parallel consume ceiling of topic `key`, over all its runs:
    its readers (librdkafka's threads included) and the broker. {} when not measured."""
    parallel = ((results.get("ceilings") or {}).get("parallel_consume") or {}).get(key or "") or {}
    runs = [r for r in parallel.get("runs") or [] if r.get("cpu_by_role_s") and r.get("records")]
    records = sum(r["records"] for r in runs)
    return {role: sum(r["cpu_by_role_s"].get(role, 0.0) for r in runs) * 100_000 / records
            for role in ("readers", "broker") if any(role in r["cpu_by_role_s"] for r in runs)}


def _cpu_split(summary: Mapping[str, Any]) -> str:
    """'driver 0.1 s, jvm 0.2 s, ...': CPU seconds per 100k records by role (see _cpu_per_100k)."""
    return ", ".join(f"{role} {seconds:.1f} s" for role, seconds in _cpu_per_100k(summary).items())


def _cores_busy(summary: Mapping[str, Any]) -> float | None:
    """Cores the run kept busy at its steady rate: CPU seconds per record x records per second."""
    cpu, rate = _cpu_per_100k(summary), summary.get("median_steady_records_per_s")
    return sum(cpu.values()) / 100_000 * rate if cpu and rate else None


def cost_sentence(cost: Mapping[str, float], rate: int, trigger_s: float, max_records: int | None = None) -> str:
    """What the fitted batch cost predicts for a continuous job at `rate` msg/s with `trigger_s`."""
    model = stats.BatchCost(**cost)
    head = (f"fitted over {model.batches} batches, a batch costs {secs(model.fixed_s)} plus one second per "
            f"{num(model.records_per_s)} records")
    return f"{head}, so {_steady_only(cost, rate, trigger_s, max_records, detail=True)}"


def _steady_only(cost: Mapping[str, float], rate: int, trigger_s: float, max_records: int | None = None,
                 detail: bool = False) -> str:
    model = stats.BatchCost(**cost)
    steady = model.steady_batch(rate, trigger_s, max_records)
    if steady is None:
        if max_records and rate < model.records_per_s:
            return (f"at {num(rate)} msg/s the backlog grows without bound: full batches of {num(max_records)} "
                    f"records drain only {num(model.capped_rate(max_records))} records/s")
        return f"at {num(rate)} msg/s the backlog grows without bound (above the marginal rate)"
    records, cycle, batch = steady
    if detail:
        return (f"at {num(rate)} msg/s with a {trigger_s:g} s trigger it settles at batches of about "
                f"{num(records)} records every {secs(cycle)}: a record waits up to one cycle for its batch to be "
                f"planned and one batch ({secs(batch)}) for it to commit, about {secs(cycle + batch)} at worst")
    return (f"at {num(rate)} msg/s, batches of about {num(records)} records every {secs(cycle)}, "
            f"about {secs(cycle + batch)} at worst")


def _stage_summary(stages: Mapping[str, float]) -> str:
    total = sum(stages.values()) or 1.0
    return ", ".join(f"{stage_label(k)} {v / total * 100:.0f} %" for k, v in stages.items() if v > 0)


def _roles(memory: Mapping[str, Any]) -> str:
    return ", ".join(f"{role} {mb:,.0f} MB" for role, mb in (memory.get("peak_by_role_mb") or {}).items() if mb)


# ---------------------------------------------------------------------------------------------- Markdown

BUDGET_S = 20 * 60  # the whole unattended run, peers included, on 2 cores


def _time_spent(results: Mapping[str, Any]) -> list[str]:
    """Each section's wall seconds, longest first, against the run's budget."""
    spent = results.get("section_seconds") or {}
    if not spent:
        return []
    total = results.get("wall_s") or sum(spent.values())
    rows = [(name, secs(seconds), pct(seconds / total if total else None))
            for name, seconds in sorted(spent.items(), key=lambda item: -item[1])]
    verdict = "within" if total <= BUDGET_S else "over"
    return ["## Where the run's time went", "", table(["section", "wall time", "share"], rows), "",
            f"The run took {secs(total)}, {verdict} its budget of {secs(BUDGET_S)}.", ""]


def render(results: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    """The whole report as Markdown."""
    cfg = results.get("config") or {}
    h = headline(results)
    targets = stats.evaluate_targets(target_inputs(results))
    out = [
        "# Benchmark: Kafka -> Iceberg ingest against the machine's ceilings",
        "",
        f"Run {results.get('started_at', '?')}, {num(results.get('wall_s'))} s wall time, "
        f"command `{cfg.get('command', 'make bench')}`. All numbers below come from this run, on the same "
        f"{num(cfg.get('records'))} synthetic orders ({pct(cfg.get('bad_ratio'))} broken on purpose); "
        f"repeated measurements are medians of {cfg.get('repeats', '?')} runs ({cfg.get('pipeline_repeats', '?')} per "
        f"topic for the `lakehouse ingest --once` runs).",
        "",
    ]
    if results.get("errors"):
        out += ["**Sections that failed (their numbers are missing below):**", ""]
        out += [f"- `{section}`: {message}" for section, message in results["errors"].items()]
        out.append("")

    out += ["## Machine", "", table(["", ""], (results.get("machine") or {}).items()), "",
            "Noise: the machine may be shared (compare the load averages at start and end with the core "
            "count), and every process of a measurement (broker, Spark driver and workers, producer) runs on "
            "the same cores, so the numbers move with the load; medians damp that, they do not remove it.", ""]

    out += ["## Targets", "", table(["target", "goal", "measured", "result"],
                                    ((t.name, t.goal, t.measured, _verdict(t.passed)) for t in targets)), ""]
    failing = [t for t in targets if t.passed is False and t.why]
    if failing:
        out += ["### Why", ""]
        out += [f"- **{t.name}**: {t.why}." for t in failing]
        out.append("")

    out += _time_spent(results)
    out += ["## Throughput", "", _throughput_table(results), ""]
    out += ["Ratios: " + "; ".join(_ratios(results, h)) + ".", ""]
    out += ["Steady state sums records and seconds of every batch but the first (cold: JVM warm-up, first "
            "table load, Python workers starting); wall time is the whole `lakehouse ingest --once` process, "
            "JVM start included. MB/s counts Kafka value bytes.", ""]
    out += _pipeline_runs(results)
    out += _stages(results)
    out += _scaling(results)
    out += _small_batches(results)
    out += _cdc(results)
    out += _audit(results)
    out += _wide(results)
    out += _s3(results)
    out += _memory(results)
    out += _freshness(results)
    out += _peers(results)
    out += _baseline(results)
    out += _maintenance(results)
    out += _proof(results)
    out += _data(results)
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(out).rstrip() + "\n"


def _scaling(results: Mapping[str, Any]) -> list[str]:
    one = (results.get("scaling") or {}).get("local[1]") or {}
    two = (results.get("pipeline") or {}).get("p3") or {}
    if not one or not two:
        return []
    rows = [(label, num(entry.get("median_steady_records_per_s")), _cpu_split(entry) or "–")
            for label, entry in (("local[1]", one), ("local[2]", two))]
    return ["## Scaling: one core and two", "",
            "The same `--once` run over the 3-partition topic with one Spark task slot and with two; CPU "
            "seconds per 100k records by process role (the broker too) in the steady batches (from the end of "
            "the first batch to the end of the last):", "",
            table(["master", "steady records/s", "CPU s per 100k records"], rows), ""]


def _small_batches(results: Mapping[str, Any]) -> list[str]:
    small = results.get("small_batches") or {}
    if not small:
        return []
    return ["## Small batches", "",
            f"A warm continuous job fed {small.get('records_per_batch')} records at a time: "
            f"{small.get('batches')} batches, median {secs(small.get('median_s'))}, p95 {secs(small.get('p95_s'))}, "
            f"max {secs(small.get('max_s'))}; stages: {_stage_summary(small.get('stages_s') or {}) or '–'}.", ""]


def _verdict(passed: bool | None) -> str:
    return "not measured" if passed is None else ("**pass**" if passed else "**FAIL**")


def _throughput_table(results: Mapping[str, Any]) -> str:
    rows = []
    ceilings = results.get("ceilings") or {}
    for key, entry in (ceilings.get("consume") or {}).items():
        rows.append((f"raw consume ceiling ({key}), end to end", "confluent-kafka, one consumer, `assign`, "
                     "consumer creation to last record", num(entry.get("median_records_per_s")),
                     num(entry.get("median_mb_per_s"), 1)))
        if entry.get("median_after_first_records_per_s"):
            rows.append((f"raw consume ceiling ({key}), after first fetch",
                         f"same runs, without the first {secs(entry.get('median_first_record_s'))} (connect, "
                         f"offset lookup, first fetch)",
                         num(entry.get("median_after_first_records_per_s")),
                         num(entry.get("median_after_first_mb_per_s"), 1)))
    parallel = ceilings.get("parallel_consume") or {}
    for key, entry in parallel.items():
        if key == "processes":
            continue
        rows.append((f"parallel consume ceiling ({key}), after first fetch",
                     f"{parallel.get('processes')} consumer processes (one per task slot) over disjoint partitions, "
                     f"started together, from the first records to the last; the targets use this one",
                     num(entry.get("median_after_first_records_per_s") or entry.get("median_records_per_s")),
                     num(entry.get("median_after_first_mb_per_s") or entry.get("median_mb_per_s"), 1)))
    write = ceilings.get("write") or {}
    if write:
        rows.append(("raw write ceiling", "pyarrow Parquet (zstd) of the decoded rows",
                     num(write.get("median_records_per_s")), num(write.get("median_mb_per_s"), 1)))
    decode = ceilings.get("decode") or {}
    if decode:
        rows.append(("pipeline decoder, one core", f"RecordValidator + BatchBuilder on {num(decode.get('sample'))} "
                     f"records", num(decode.get("median_records_per_s")), num(decode.get("median_mb_per_s"), 1)))
    for fmt, run in (ceilings.get("decode_by_format") or {}).items():
        if fmt == "json":  # the row above is JSON's
            continue
        if fmt.startswith("debezium_"):  # change events of the same rows, keyed by a record
            name, how = f"Debezium {fmt[9:]}", f"the same {num(run.get('sample'))} records as creates in " \
                                                f"Debezium {fmt[9:]} change events (mode cdc)"
        else:
            name, how = fmt, f"the same {num(run.get('sample'))} records as {fmt} values (Confluent wire format)"
        rows.append((f"pipeline decoder, one core, {name}", how, num(run.get("median_records_per_s")),
                     num(run.get("median_mb_per_s"), 1)))
    for key, entry in (results.get("pipeline") or {}).items():
        rows.append((f"pipeline {key}, steady", "`lakehouse ingest --once`, batches 2..n",
                     num(entry.get("median_steady_records_per_s")), num(entry.get("median_steady_mb_per_s"), 1)))
        rows.append((f"pipeline {key}, end to end", "same runs, process wall time incl. JVM start",
                     num(entry.get("median_wall_records_per_s")), num(entry.get("median_wall_mb_per_s"), 1)))
    for fmt, entry in (results.get("formats") or {}).items():
        rows.append((f"pipeline p3 in {fmt}, steady", f"`lakehouse ingest --once`, the same records as {fmt} values "
                     f"(Confluent framing, {num(entry.get('value_bytes_per_record'))} bytes each), batches 2..n; "
                     f"{num(entry.get('median_steady_records_per_cpu_s'))} records per CPU s",
                     num(entry.get("median_steady_records_per_s")), num(entry.get("median_steady_mb_per_s"), 1)))
    for every, entry in (results.get("baseline") or {}).items():
        rows.append((f"hand-written baseline, N={num(int(every))}", "confluent-kafka + json + pyiceberg append",
                     num(entry.get("median_records_per_s")), num(entry.get("median_mb_per_s"), 1)))
    return table(["measurement", "how", "records/s", "MB/s"], rows)


def _ratios(results: Mapping[str, Any], h: Mapping[str, Any]) -> list[str]:
    ceilings = results.get("ceilings") or {}
    key = h.get("pipeline_key") or "?"
    rate = h.get("pipeline_rate")
    write = (ceilings.get("write") or {}).get("median_records_per_s")
    decode = (ceilings.get("decode") or {}).get("median_records_per_s")
    return [f"pipeline ({key}, steady) / consume ceiling = {pct(stats.ratio(rate, h.get('consume_ceiling')))}",
            f"pipeline / write ceiling = {pct(stats.ratio(rate, write))}",
            f"pipeline / one-core decoder = {times(stats.ratio(rate, decode))}",
            f"pipeline / faster baseline = {times(stats.ratio(rate, h.get('baseline_rate')))}"]


def _pipeline_runs(results: Mapping[str, Any]) -> list[str]:
    rows = []
    for key, entry in (results.get("pipeline") or {}).items():
        for run in entry.get("runs", []):
            cold = run.get("cold_batch") or {}
            rows.append((key, run["pipeline"], num(run["records"]), run["batches"], secs(run["wall_s"]),
                         num(run.get("steady_records_per_s")), num(run.get("wall_records_per_s")),
                         f"{num(cold.get('records'))} in {secs(cold.get('seconds'))}",
                         num((run.get("memory") or {}).get("peak_mb"))))
    if not rows:
        return []
    return ["### Every pipeline run", "",
            table(["topic", "pipeline", "records", "batches", "wall", "steady rec/s", "end-to-end rec/s",
                   "cold batch", "peak RSS MB"], rows), ""]


def _stages(results: Mapping[str, Any]) -> list[str]:
    rows = []
    for key, entry in (results.get("pipeline") or {}).items():
        stages = entry.get("stages_s") or {}
        if stages:
            rows.append((f"`--once` {key} (steady batches, median run)", _stage_summary(stages),
                         secs(sum(stages.values()))))
    for run in results.get("freshness") or []:
        stages = run.get("stages_s") or {}
        if stages:
            rows.append((f"continuous, trigger {run['trigger_s']:g} s (all batches)", _stage_summary(stages),
                         secs(sum(stages.values()))))
    if not rows:
        return []
    return ["## Where a batch spends its time", "",
            "From the per-stage seconds the `batch` events carry (`lakehouse.core.events`, kind `batch`).", "",
            table(["run", "share of batch time per stage", "batch seconds summed"], rows), ""]


def _cdc(results: Mapping[str, Any]) -> list[str]:
    found = results.get("cdc") or {}
    runs = {fmt: e for fmt, e in found.items() if isinstance(e, dict)}
    if not runs:
        return []
    batch = (results.get("config") or {}).get("batch_size")
    rows = []
    for fmt, e in runs.items():
        m = e.get("maintenance") or {}
        receipt = m.get("receipt") or {}
        ops = e.get("by_op") or {}
        rows.append((fmt, num(e.get("records")), ", ".join(f"{op} {num(n)}" for op, n in sorted(ops.items())),
                     num(e.get("steady_records_per_s")), num(e.get("wall_records_per_s")),
                     f"{num(e.get('rows'))} ({'= the source' if e.get('table_matches_source') else '**not the source**'})",
                     f"{num(m.get('files_before'))} -> {num(m.get('files_after'))}",
                     f"{num(receipt.get('delete_files_before'))} -> {num(receipt.get('delete_files_after'))}",
                     f"{secs(m.get('scan_median_before'))} -> {secs(m.get('scan_median_after'))}"))
    return ["## Change streams (mode cdc)", "",
            f"Debezium change events of one source table (a snapshot, then {pct(found.get('updates'))} updates and "
            f"{pct(found.get('deletes'))} deletes, each delete followed by its tombstone, the rest creates), keyed by "
            f"product_id, through `lakehouse ingest --once` in batches of {num(batch)} records (the append runs' "
            f"size) into a merge-on-read table (updates and deletes become delete files, no data file is rewritten "
            f"per batch); then `lakehouse maintain` folds the delete files back (on the JSON envelopes' table: the "
            f"Avro one holds the same rows from the same batches). The table is compared with the source's final "
            f"rows key by key.", "",
            table(["envelope", "records", "ops", "rec/s steady", "rec/s end to end", "rows", "data files",
                   "delete files", "full scan before -> after maintenance"], rows), ""]


def _audit(results: Mapping[str, Any]) -> list[str]:
    found = results.get("audit") or {}
    if not found.get("runs"):
        return []
    rows = [(num(r.get("rows")), r.get("path"), secs(r.get("seconds")), num((r.get("peak_by_role_mb") or {}).get("driver")),
             num(r.get("peak_rss_mb")), "yes" if r.get("success") else "no") for r in found["runs"]]
    build = found.get("build") or {}
    return ["## The publish gate's audit at scale", "",
            f"The Great Expectations suite of the publish gate over a table of {num(build.get('rows'))} orders, "
            f"each audit in its own process as the publish DAG's `quality` task runs it on an Airflow worker, the "
            f"process tree's memory sampled: the whole table on Spark (a window of at least "
            f"`publish.spark_audit_rows` runs on Great Expectations' Spark datasource, read through the catalog; "
            f"only aggregates and at most 100 failing rows per expectation reach the worker), and smaller windows "
            f"on both paths. *Worker*: the audit's own process; *tree*: with Spark's JVM.", "",
            table(["window rows", "path", "seconds", "worker peak MB", "tree peak MB", "passed"], rows), ""]


def _wide(results: Mapping[str, Any]) -> list[str]:
    found = results.get("partitions") or {}
    if not found:
        return []
    return ["## 1,000 partitions", "",
            f"A continuous job (1 s trigger) over a topic of {num(found.get('partitions'))} partitions, each batch "
            f"{num(found.get('per_partition'))} records from every partition ({num(found.get('records_per_batch'))} "
            f"records in {num(found.get('partitions'))} short ranges): median {secs(found.get('median_s'))}, max "
            f"{secs(found.get('max_s'))} over {found.get('batches')} batches after the warm-up one "
            f"({_stage_summary(found.get('stages_s') or {})}). `python -m bench.partitions` breaks such a batch "
            f"down further (topic metadata, offset summaries, metadata.json growth).", ""]


def _s3(results: Mapping[str, Any]) -> list[str]:
    found = results.get("s3") or {}
    if not found:
        return []
    per_batch = found.get("requests_per_batch") or {}
    operations = found.get("requests_per_batch_by_operation") or {}
    return ["## On the S3 warehouse", "",
            f"The {found.get('records_per_batch')}-record batches again, on a second scratch stack whose warehouse "
            f"is the stack's S3 server (`lakehouse stack up --object-store`, `{found.get('warehouse') or 's3://'}`): "
            f"median {secs(found.get('median_s'))}, p95 {secs(found.get('p95_s'))}, max {secs(found.get('max_s'))} "
            f"over {found.get('batches')} batches ({_stage_summary(found.get('stages_s') or {})}). Requests per batch, "
            f"from the server's own counts after the warm-up batch: {num(per_batch.get('all'), 1)} in all, "
            f"{num(per_batch.get('put'), 1)} billed as PUT/LIST, {num(per_batch.get('get'), 1)} as GET/HEAD, "
            f"{num(per_batch.get('free'), 1)} free.", "",
            table(["operation", "requests per batch"], ((op, num(n, 1)) for op, n in operations.items())), ""]


def _memory(results: Mapping[str, Any]) -> list[str]:
    memory = results.get("memory") or {}
    small, large = memory.get("small") or {}, memory.get("large") or {}
    if not (small or large):
        return []
    rows = [(f"{label} ({num(m.get('backlog'))} records)", num(m.get("peak_mb")), _roles(m))
            for label, m in (("1x batch size", small), ("3x batch size", large)) if m]
    return ["## Memory against the backlog", "",
            f"`max_records_per_batch` = {num(memory.get('batch_size'))}. Peak RSS of the `lakehouse ingest --once` "
            f"process tree (driver Python, JVM, Spark's Python workers), sampled every 0.2 s with psutil. RSS "
            f"counts pages shared by forked workers once per worker.", "",
            table(["backlog", "peak RSS MB", "peak per process (MB)"], rows), ""]


def _freshness(results: Mapping[str, Any]) -> list[str]:
    runs = results.get("freshness") or []
    if not runs:
        return []
    rows = []
    for run in runs:
        for p in run.get("phases", []):
            steps = f" (files every {run['write_interval_s']:g} s)" if run.get("write_interval_s") else ""
            rows.append((f"{p['rate']:,}", f"{run['trigger_s']:g} s{steps}", num(p.get("achieved_rate")), num(p["produced"]),
                         num(p["censored"]), secs(p.get("p50")), secs(p.get("p95")), secs(p.get("p99")),
                         f"{num(p.get('early_lag'))} / {num(p.get('late_lag'))}",
                         "yes" if p.get("kept_up") else f"no ({p.get('why')})"))
    cfg = results.get("config") or {}
    lines = ["## Freshness: produce -> visible in the table", "",
             f"One continuous `lakehouse ingest` job per trigger (a trigger longer than the write interval shown reads "
             f"and writes files every write interval and commits them once per trigger: `trigger.write_interval`); "
             f"a paced producer runs {cfg.get('phase_s', '?')} s "
             f"per rate, the fastest last, then the job drains for at most {cfg.get('drain_s', '?')} s. Each record's "
             f"freshness is the timestamp of the snapshot whose `lakehouse.offsets` range holds it minus its Kafka "
             f"CreateTime (stamped at produce), read back from the table's `_kafka` column — exact, not polled. "
             f"Records not visible by the end of the drain are counted as censored; a percentile that falls "
             f"among them shows '–' (it is above the drain bound). A phase kept up when nothing was censored, no "
             f"batch planned during it was full (`max_records_per_batch`), and the peak lag (records produced, "
             f"not yet visible) of its last third stayed within 1.25 x rate x (max(trigger, B) + B) plus one "
             f"second of its rate, B being the phase's longest batch: one batch in flight, one trigger wait and "
             f"one more batch. Each job's `max_records_per_batch` is twice what one trigger brings at the highest "
             f"rate (at least the orders spec's 200,000), so a phase measures the job, not its cap.", "",
             table(["rate msg/s", "trigger", "achieved msg/s", "produced", "censored", "p50", "p95", "p99",
                    "peak lag first / last third", "kept up"], rows), ""]
    for run in runs:
        line = (f"- trigger {run['trigger_s']:g} s: {run.get('batches')} batches, median batch "
                f"{secs(run.get('median_batch_s'))}, largest batch {num(run.get('largest_batch_records'))} records, "
                f"drain {'complete' if run.get('drained') else 'cut off'} after {secs(run.get('drain_s'))}.")
        if run.get("batch_cost"):
            line += " Batch cost model (least squares over the batches after the warm-up one): " + "; ".join(
                cost_sentence(run["batch_cost"], p["rate"], run["trigger_s"], run.get("max_records_per_batch"))
                if i == 0 else
                _steady_only(run["batch_cost"], p["rate"], run["trigger_s"], run.get("max_records_per_batch"))
                for i, p in enumerate(run.get("phases", []))) + "."
        lines.append(line)
    lines.append("")
    return lines


PEER_ORDER = ("pipeline", "connect", "sss", "baseline")


def _peer_cpu(entry: Mapping[str, Any]) -> str:
    by_role = entry.get("steady_cpu_by_role_s") or entry.get("cpu_by_role_s") or {}
    total = sum(by_role.values()) or 1.0
    return ", ".join(f"{role} {v / total * 100:.0f} %" for role, v in sorted(by_role.items(), key=lambda kv: -kv[1])
                     if v / total >= 0.01)


def _peers(results: Mapping[str, Any]) -> list[str]:
    found = results.get("peers") or {}
    backlog = found.get("backlog") or {}
    if not backlog:
        return []
    rows = []
    for system in PEER_ORDER:
        e = backlog.get(system)
        if not e:
            continue
        rows.append((e["label"], num(e.get("wall_records_per_s")), num(e.get("steady_records_per_s")),
                     num(e.get("steady_mb_per_s"), 1), num(e.get("steady_cpu_s_per_100k"), 1),
                     num(e.get("steady_records_per_cpu_s")), num(e.get("cpu_s_per_100k"), 1), _peer_cpu(e),
                     num(e.get("peak_mb")), num(e.get("files")), num(e.get("commits"))))
    lines = ["## Beside the peers", "",
             f"The same {num(found.get('records'))} clean orders in `{found.get('topic')}` (3 partitions), the same "
             f"Apache Kafka and the same catalog, one system after another: the Apache Iceberg Kafka Connect sink "
             f"in a Kafka Connect standalone worker (commit interval 1 s), Spark Structured Streaming with Spark's "
             f"Kafka source and Iceberg's streaming writer (availableNow, one micro-batch per "
             f"`max_records_per_batch`), the hand-written loop (a commit every `max_records_per_batch` records) "
             f"and `lakehouse ingest --once`. *From start*: process start to every row visible. *Steady*: the "
             f"records of every commit after the first over the time between the first and the last commit, and "
             f"the CPU seconds every process (broker included) spent in that time. Broken records are kept out of "
             f"this topic because one stops the Connect sink (see below).", "",
             table(["system", "rec/s from start", "rec/s steady", "MB/s steady", "CPU s per 100k, steady",
                    "records per CPU s, steady", "CPU s per 100k, whole run", "where the CPU went (steady)",
                    "peak MB", "files", "commits"], rows), ""]
    fresh = found.get("freshness") or []
    ours = results.get("freshness") or []
    if fresh or ours:
        rows = []
        for run in ours:
            for p in run.get("phases", []):
                if p["rate"] in {ph["rate"] for r in fresh for ph in r.get("phases", [])} or not fresh:
                    rows.append(("this pipeline", f"{run['trigger_s']:g} s", f"{p['rate']:,}", secs(p.get("p50")),
                                 secs(p.get("p95")), num(p.get("censored")), "yes" if p.get("kept_up") else "no",
                                 num(run.get("files_per_hour"))))
        for run in fresh:
            for p in run.get("phases", []):
                rows.append((run["label"], f"{run['trigger_s']:g} s", f"{p['rate']:,}", secs(p.get("p50")),
                             secs(p.get("p95")), num(p.get("censored")), "yes" if p.get("kept_up") else "no",
                             num(run.get("files_per_hour"))))
        lines += ["### Freshness beside the peers", "",
                  "Each peer runs continuously with the trigger (the Connect sink: its commit interval and the "
                  "worker's offset flush interval) while the paced producer runs each rate; a record's freshness "
                  "is the commit time of the snapshot that added its data file minus its Kafka timestamp. Files "
                  "per hour: data files the run wrote (before any maintenance), per hour of the run.", "",
                  table(["system", "trigger", "rate msg/s", "p50", "p95", "censored", "kept up", "files per hour"],
                        rows), ""]
    kill = found.get("kill") or {}
    if kill:
        session = ((kill.get("connect") or {}).get("settings") or {}).get("session_timeout_ms")
        rows = []
        for system in PEER_ORDER:
            k = kill.get(system)
            if not k:
                continue
            verdict = "–" if k.get("exactly_once") is None else ("yes" if k["exactly_once"] else "**no**")
            rows.append((backlog.get(system, {}).get("label", system), num(k.get("killed_after_rows")),
                         num(k.get("rows")), num(k.get("duplicates")), num(k.get("missing")), verdict,
                         secs(k.get("resumed_s")), k.get("note") or k.get("resume_error") or ""))
        lines += ["### Exactly once after kill -9", "",
                  "Each system over the same backlog into a fresh table, its whole process group killed with "
                  "SIGKILL once its first commit is visible, then started again with the same state (connector "
                  "name and offsets, checkpoint, pipeline). Duplicates and losses are counted per (partition, "
                  "offset) from the rows' coordinates. A peer that duplicates or loses is a finding. Resumed in: "
                  "from the second start until every row was in" + (
                      f" (the group session timeout of the Connect worker's sink consumers and of the Iceberg "
                      f"committers' control-topic consumers set to {num(session / 1000, 0)} s for this run: with "
                      f"Kafka's default of 45 s, the worker started again waits that long for its partitions)."
                      if session else "."), "",
                  table(["system", "killed after rows", "rows", "duplicates", "missing", "exactly once",
                         "resumed in", "note"], rows), ""]
    broken = found.get("broken") or {}
    if broken:
        lines += ["### Broken records", "",
                  f"The topic of the pipeline section, {num(broken.get('records'))} records of which "
                  f"{num(broken.get('broken'))} are broken on purpose (the same defects as everywhere: bad JSON, "
                  f"wrong types, impossible timestamps, oversized values, missing fields).", ""]
        connect = broken.get("connect") or {}
        if connect:
            lines.append(f"- **Kafka Connect sink**: {num(connect.get('rows'))} rows landed, "
                         f"{num(connect.get('dead_letter_topic_records'))} records in the dead-letter topic; "
                         + (f"the task stopped and does not recover without a restart: `{connect['stopped']}`"
                            if connect.get("stopped") else "the task kept running") + ".")
        sss = broken.get("sss") or {}
        if sss:
            lines.append(f"- **Structured Streaming**: {num(sss.get('rows'))} rows landed, of which "
                         f"{num(sss.get('rows_all_null'))} are all-null rows (`from_json` turns a record it cannot "
                         f"parse into nulls, silently) and {num(sss.get('rows_null_event_time'))} have no event "
                         f"time; nothing is set aside" + (f"; the query failed: `{sss['stopped']}`"
                                                         if sss.get("stopped") else "") + ".")
        baseline = broken.get("baseline") or {}
        if baseline:
            lines.append(f"- **hand-written**: {num(baseline.get('rows'))} rows; {num(baseline.get('skipped'))} "
                         f"records skipped without a trace.")
        pipeline = broken.get("pipeline") or {}
        if pipeline:
            lines.append(f"- **this pipeline**: {num(pipeline.get('rows'))} rows; {num(pipeline.get('dead_letters'))} "
                         f"records in the dead-letter table, each with its reason and coordinates.")
        lines.append("")
    return lines


def _baseline(results: Mapping[str, Any]) -> list[str]:
    baseline = results.get("baseline") or {}
    if not baseline:
        return []
    rows = []
    for every, entry in baseline.items():
        for run in entry.get("runs", []):
            rows.append((num(int(every)), num(run["consumed"]), num(run["appended"]), num(run["skipped"]),
                         run["commits"], secs(run["seconds"]), num(run["records_per_s"])))
    return ["## Hand-written baseline", "",
            "confluent-kafka `assign` loop, `json.loads`, undecodable records skipped, a pyarrow table with the "
            "same columns (coordinates included) appended with pyiceberg every N records to a table partitioned "
            "by day(event_time) in the same catalog. It validates less than the pipeline (no contract rules, no "
            "dead letters) and keeps no offsets in its commits.", "",
            table(["N", "consumed", "appended", "skipped", "commits", "seconds", "records/s"], rows), ""]


def _maintenance(results: Mapping[str, Any]) -> list[str]:
    m = results.get("maintenance") or {}
    if not m:
        return []
    receipt = m.get("receipt") or {}
    return ["## Maintenance effect", "",
            f"`lakehouse maintain --pipeline {m.get('pipeline')}` on {m.get('table')}, the table the 1 s-trigger "
            f"freshness run left; full scans with pyiceberg `scan().to_arrow()`.", "",
            table(["", "before", "after"], [
                ("data files", num(m.get("files_before")), num(m.get("files_after"))),
                ("rows", num(m.get("rows_before")), num(m.get("rows_after"))),
                ("full scan (median)", secs(m.get("scan_median_before")), secs(m.get("scan_median_after"))),
            ]), "",
            f"Maintenance took {secs(m.get('maintain_wall_s'))} (process wall time incl. JVM start); receipt: "
            f"{receipt.get('status')}, rewrote {num(receipt.get('rewritten_data_files'))} files into "
            f"{num(receipt.get('added_data_files'))}, content unchanged: {receipt.get('content_unchanged')}.", ""] \
        + ([f"`lakehouse maintain` exited with {m.get('maintain_exit_code')}; the table was measured after it "
            f"anyway. Its error:", "", "```", str(m.get("maintain_error")).strip(), "```", ""]
           if m.get("maintain_error") else [])


def _proof(results: Mapping[str, Any]) -> list[str]:
    p = results.get("proof") or {}
    if not p:
        return []
    built, trace, ver = p.get("trace_table") or {}, p.get("trace") or {}, p.get("verify") or {}
    spark = ver.get("spark") or {}
    return ["## Proving the contract: trace and verify", "",
            f"`lakehouse trace` on {built.get('table')}: {num(built.get('rows'))} rows in {num(built.get('files'))} "
            f"data files and {num(built.get('commits'))} ingest commits over {built.get('partitions')} partitions "
            f"(built with pyiceberg appends in {secs(built.get('build_s'))}). Each lookup is a fresh call: the "
            f"table loaded from the catalog, its files pruned by their `_kafka` bounds.", "",
            table(["", ""], [
                ("trace latency, median", secs(trace.get("median_s"))),
                ("trace latency, p95", secs(trace.get("p95_s"))),
                ("trace latency, max", secs(trace.get("max_s"))),
                ("data files read per lookup (median)",
                 f"{num(trace.get('files_planned_median'))} of {num(trace.get('files_total'))}"),
            ]), "",
            f"`lakehouse verify --full` over {ver.get('pipeline')} ({num(ver.get('offsets'))} offsets Kafka holds, "
            f"every row of its data and dead-letter tables):", "",
            table(["engine", "offsets/s", "seconds"], [
                ("in process (median)", num(ver.get("local_median_offsets_per_s")), secs(ver.get("local_median_s"))),
                ("Spark job (one run, session start included)", num(spark.get("offsets_per_s")),
                 secs(spark.get("seconds"))),
            ]), ""]


def _data(results: Mapping[str, Any]) -> list[str]:
    data = results.get("data") or {}
    if not data:
        return []
    cfg = results.get("config") or {}
    rows = [("records", num(data.get("records"))), ("broken on purpose", num(data.get("bad"))),
            ("value bytes", num(data.get("value_bytes"))), ("mean value bytes", num(data.get("mean_value_bytes"), 1)),
            ("generated in", secs(data.get("generate_s")))]
    rows += [(f"loaded into {topic}", f"{num(d.get('sent'))} in {secs(d.get('seconds'))}")
             for topic, d in (data.get("topics") or {}).items()]
    rows += [(f"setting: {k}", ", ".join(map(str, v)) if isinstance(v, list) else v)
             for k, v in cfg.items() if k not in ("command",)]
    return ["## Data and settings", "", table(["", ""], rows), ""]


# ---------------------------------------------------------------------------------------------- plots

def plot(results: Mapping[str, Any], directory: Path) -> list[str]:
    """Draw the PNG plots into `directory`; returns the file names written (plots without data are skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, draw in (("throughput.png", _plot_throughput), ("freshness.png", _plot_freshness),
                       ("stages.png", _plot_stages), ("memory.png", _plot_memory),
                       ("maintenance.png", _plot_maintenance), ("peers.png", _plot_peers),
                       ("peers_freshness.png", _plot_peer_freshness)):
        fig = draw(plt, results)
        if fig is None:
            continue
        fig.tight_layout()
        fig.savefig(directory / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def _plot_throughput(plt, results):
    labels, values, colors = [], [], []
    ceilings = results.get("ceilings") or {}
    for key, entry in (ceilings.get("consume") or {}).items():
        labels.append(f"consume ceiling {key} (after 1st fetch)")
        values.append(entry.get("median_after_first_records_per_s") or entry.get("median_records_per_s"))
        colors.append("#7f7f7f")
    for key, entry in (ceilings.get("parallel_consume") or {}).items():
        if key != "processes":
            labels.append(f"parallel consume ceiling {key}")
            values.append(entry.get("median_after_first_records_per_s") or entry.get("median_records_per_s"))
            colors.append("#4d4d4d")
    for name, label in (("write", "write ceiling (pyarrow)"), ("decode", "decoder, 1 core")):
        entry = ceilings.get(name) or {}
        if entry:
            labels.append(label), values.append(entry.get("median_records_per_s")), colors.append("#bcbcbc")
    for key, entry in (results.get("pipeline") or {}).items():
        labels.append(f"pipeline {key} steady"), values.append(entry.get("median_steady_records_per_s"))
        colors.append("#1f77b4")
        labels.append(f"pipeline {key} end-to-end"), values.append(entry.get("median_wall_records_per_s"))
        colors.append("#9ecae1")
    for every, entry in (results.get("baseline") or {}).items():
        labels.append(f"baseline N={int(every):,}"), values.append(entry.get("median_records_per_s"))
        colors.append("#ff7f0e")
    kept = [(l, v, c) for l, v, c in zip(labels, values, colors) if v]
    if not kept:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(kept) + 1.5))
    ax.barh([k[0] for k in kept], [k[1] for k in kept], color=[k[2] for k in kept])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("records/s (log scale)")
    ax.set_title("Throughput: ceilings, pipeline, baseline (medians)")
    for i, (_, v, _) in enumerate(kept):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    return fig


def _plot_freshness(plt, results):
    runs = results.get("freshness") or []
    groups = [(f"{p['rate'] // 1000}k/s, {run['trigger_s']:g}s", p) for run in runs for p in run.get("phases", [])]
    if not groups:
        return None
    import numpy as np

    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = np.arange(len(groups))
    top = max([p.get(q) or 0 for _, p in groups for q in ("p50", "p95", "p99")] + [5.0])
    censored_label = "censored: above the drain bound"
    for i, (q, color) in enumerate((("p50", "#9ecae1"), ("p95", "#3182bd"), ("p99", "#08519c"))):
        vals = [p.get(q) for _, p in groups]
        xs = x + (i - 1) * 0.27
        ax.bar(xs, [v if v is not None else 0 for v in vals], 0.27, label=q, color=color)
        # a censored percentile is only known to exceed the drain bound: an empty hatched bar, labelled
        censored = [(xi, top * 1.05) for xi, v in zip(xs, vals) if v is None]
        if censored:
            ax.bar([c[0] for c in censored], [c[1] for c in censored], 0.27, fill=False, hatch="//",
                   edgecolor=color, label=censored_label)
            censored_label = None  # one legend entry for all hatched bars
            for xi, height in censored:
                ax.text(xi, height, ">", ha="center", va="bottom", fontsize=8)
    ax.axhline(5, color="red", linestyle="--", linewidth=1, label="target p95 <= 5 s (50k/s, 1 s)")
    ax.axhline(3, color="orange", linestyle="--", linewidth=1, label="target p95 <= 3 s (10k/s, 1 s)")
    ax.set_xticks(x, [g[0] for g in groups], rotation=30, ha="right")
    ax.set_ylabel("seconds from produce to visible")
    ax.set_title("Freshness per produce rate and trigger")
    ax.legend(fontsize=8)
    return fig


def _plot_peers(plt, results):
    backlog = (results.get("peers") or {}).get("backlog") or {}
    systems = [backlog[s] for s in PEER_ORDER if s in backlog]
    if not systems:
        return None
    colors = {"this pipeline": "#1f77b4", "Kafka Connect sink": "#d62728", "Structured Streaming": "#2ca02c",
              "hand-written": "#ff7f0e"}
    labels = [e["label"] for e in systems]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * len(systems) + 2.2))
    for ax, key, title in ((left, "steady_records_per_s", "records/s, steady (between first and last commit)"),
                           (right, "steady_cpu_s_per_100k", "CPU seconds per 100,000 records, steady")):
        values = [e.get(key) or 0 for e in systems]
        ax.barh(labels, values, color=[colors.get(label, "#7f7f7f") for label in labels])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:,.0f}" if v >= 10 else f" {v:.1f}", va="center", fontsize=8)
    right.tick_params(labelleft=False)
    fig.suptitle("Beside the peers: the same records, broker and catalog")
    return fig


def _plot_peer_freshness(plt, results):
    peers = results.get("peers") or {}
    runs = [("this pipeline", r) for r in results.get("freshness") or []]
    runs += [(r["label"], r) for r in peers.get("freshness") or []]
    rates = sorted({p["rate"] for _, r in runs if r in (peers.get("freshness") or []) for p in r.get("phases", [])})
    if not rates:
        return None
    import numpy as np

    groups = sorted({(p["rate"], r["trigger_s"]) for _, r in runs for p in r.get("phases", []) if p["rate"] in rates})
    systems = list(dict.fromkeys(label for label, _ in runs))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = np.arange(len(groups))
    width = 0.8 / max(1, len(systems))
    top = 1.0
    for i, system in enumerate(systems):
        p95 = {(p["rate"], r["trigger_s"]): p.get("p95") for label, r in runs if label == system
               for p in r.get("phases", [])}
        values = [p95.get(g) for g in groups]
        top = max([top] + [v for v in values if v])
        xs = x + (i - (len(systems) - 1) / 2) * width
        ax.bar(xs, [v or 0 for v in values], width, label=system)
        for xi, v, g in zip(xs, values, groups):
            if g in p95 and v is None:  # censored: above the drain bound
                ax.text(xi, 0, "censored", rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{rate // 1000}k/s, {trigger:g} s trigger" for rate, trigger in groups], rotation=20, ha="right")
    ax.set_ylabel("p95 seconds from produce to visible")
    ax.set_title("Freshness p95 per system, rate and trigger")
    ax.legend(fontsize=8)
    return fig


def _plot_stages(plt, results):
    runs = []
    for key, entry in (results.get("pipeline") or {}).items():
        stages, records = entry.get("stages_s") or {}, entry.get("stage_records")
        if stages and records:
            runs.append((f"--once {key}", stages, records))
    for run in results.get("freshness") or []:
        stages = run.get("stages_s") or {}
        records = sum(p.get("visible", 0) for p in run.get("phases", []))
        if stages and records:
            runs.append((f"continuous {run['trigger_s']:g}s", stages, records))
    if not runs:
        return None
    keys = list(dict.fromkeys(k for _, s, _ in runs for k in s))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottoms = [0.0] * len(runs)
    cmap = plt.get_cmap("tab10")
    for i, key in enumerate(keys):
        vals = [s.get(key, 0.0) / r * 100_000 for _, s, r in runs]
        ax.bar([r[0] for r in runs], vals, bottom=bottoms, label=stage_label(key), color=cmap(i % 10))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_ylabel("seconds per 100k records")
    ax.set_title("Where batch time goes (from the batch events)")
    ax.legend(fontsize=8)
    return fig


def _plot_memory(plt, results):
    memory = results.get("memory") or {}
    series = [(label, memory.get(key) or {}) for key, label in (("small", "1x batch size"), ("large", "3x batch size"))]
    series = [(l, m) for l, m in series if m.get("timeline")]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, m in series:
        t, mb = zip(*m["timeline"])
        ax.plot(t, mb, label=f"backlog {label} ({m.get('backlog', 0):,} records), peak {m.get('peak_mb', 0):,.0f} MB")
    ax.set_xlabel("seconds since `lakehouse ingest --once` started")
    ax.set_ylabel("RSS of the process tree (MB)")
    ax.set_title("Memory against the backlog")
    ax.legend(fontsize=8)
    return fig


def _plot_maintenance(plt, results):
    m = results.get("maintenance") or {}
    if m.get("files_before") is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.bar(["before", "after"], [m.get("files_before") or 0, m.get("files_after") or 0], color=["#bcbcbc", "#1f77b4"])
    left.set_title("data files")
    right.bar(["before", "after"], [m.get("scan_median_before") or 0, m.get("scan_median_after") or 0],
              color=["#bcbcbc", "#1f77b4"])
    right.set_title("full scan seconds (median)")
    fig.suptitle(f"Maintenance of {m.get('table')}")
    return fig


def main(argv: list[str] | None = None) -> int:
    """Render report.md (and plots) again from a results.json: `python -m bench.report reports/bench/results.json`."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m bench.report RESULTS_JSON", file=sys.stderr)
        return 2
    path = Path(args[0])
    results = json.loads(path.read_text())
    written = plot(results, path.parent)
    (path.parent / "report.md").write_text(render(results, written))
    print(path.parent / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
