"""Backfills requested from the Airflow UI: validate the request, plan it, say what would be written.

A backfill re-ingests a Kafka offset range (or the range a time window resolves to)
either in place (the pipeline's own tables, insert-if-absent: idempotent, never
moving the pipeline's positions) or into a candidate table. `parse_request` checks
the form's values alone; `plan` checks them against Kafka and the tables (partitions
exist, offsets still in Kafka, nothing past the pipeline's committed position) and
resolves times to offsets. The plan's `job_args()` are the replay job's arguments.

The plan travels from the DAG's `plan` task to its `backfill` task through XCom, which Airflow users
with XCom edit rights can change. So the job never runs what XCom says on trust: `confirm` re-plans
the run's own request (its params, fixed when it was triggered) when the job is about to start and
accepts only a plan that request yields: the same table, dry run flag and, for offsets, the same
ranges; for a time window, ranges inside the window as cut now (the cut only moves up as ingestion
commits). The job's arguments are rebuilt from the confirmed ranges.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from lakehouse.core import config, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.durations import parse_instant
from lakehouse.core.errors import BackfillError, PlanMismatchError, ReplayError
from lakehouse.core.spec import PipelineSpec, is_table_name
from lakehouse.ingest.plan import offsets_for_time, topic_state_for
from lakehouse.recovery.replay import parse_offset_ranges

MODES = ("offsets", "time")
TARGETS = ("in_place", "candidate")


_CHANGED = ("It was changed after the plan task made it (XCom can be edited). Nothing was written; trigger a new "
            "run, and find out who changed it")


@dataclass(frozen=True)
class BackfillRequest:
    mode: str
    target: str
    dry_run: bool
    ranges: dict[int, tuple[int, int]] | None = None  # mode offsets
    start_ms: int | None = None                       # mode time
    end_ms: int | None = None                         # mode time; None = up to the committed position
    candidate_table: str | None = None                # target candidate


def _time_ms(value: Any, name: str) -> int:
    """The form's ISO-8601 time `value` (UTC without an offset: core.durations.parse_instant) in ms."""
    try:
        return int(parse_instant(str(value).strip()).timestamp() * 1000)
    except ValueError as exc:
        raise BackfillError(f"{name}: {exc}") from None


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def parse_request(params: dict, live_tables: Collection[str] = frozenset()) -> BackfillRequest:
    """The request in `params` (the DAG's form), checked on its own; raises BackfillError.

    `live_tables` are tables some pipeline writes (or serves): a candidate table may not be one.
    """
    mode = params.get("mode", "offsets")
    if mode not in MODES:
        raise BackfillError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    target = params.get("target", "in_place")
    if target not in TARGETS:
        raise BackfillError(f"target: {target!r} is not one of {', '.join(TARGETS)}")
    dry_run = params.get("dry_run", True)
    if not isinstance(dry_run, bool):
        raise BackfillError(f"dry_run: must be true or false, got {dry_run!r}")
    request: dict[str, Any] = {"mode": mode, "target": target, "dry_run": dry_run}
    if mode == "offsets":
        if _blank(params.get("offsets")):
            raise BackfillError("offsets: required in mode offsets, e.g. 0:100-200,1:0-50")
        try:
            request["ranges"] = parse_offset_ranges(str(params["offsets"]))
        except ReplayError as exc:
            raise BackfillError(f"offsets: {exc}") from None
    else:
        if _blank(params.get("start_time")):
            raise BackfillError("start_time: required in mode time (ISO-8601)")
        request["start_ms"] = _time_ms(params["start_time"], "start_time")
        if not _blank(params.get("end_time")):
            request["end_ms"] = _time_ms(params["end_time"], "end_time")
            if request["end_ms"] <= request["start_ms"]:
                raise BackfillError(f"start_time {params['start_time']} is not before end_time {params['end_time']}")
    candidate = params.get("candidate_table")
    if target == "candidate":
        if _blank(candidate):
            raise BackfillError("candidate_table: required when target is candidate")
        if not is_table_name(candidate):
            raise BackfillError(f"candidate_table: {candidate!r} is not valid: use namespace.table in lower case, "
                                f"e.g. raw.orders_v2")
        if candidate in live_tables:
            raise BackfillError(f"candidate_table: {candidate} is a live table of a pipeline; choose a new table")
        request["candidate_table"] = candidate
    elif not _blank(candidate):
        raise BackfillError("candidate_table: only used when target is candidate")
    return BackfillRequest(**request)


def live_tables(specs: dict[str, PipelineSpec]) -> set[str]:
    """Every table or view a declared pipeline writes or serves, plus the ops timeline. (A table of a
    spec that does not load is still protected at run time: its owner property refuses the replay.)"""
    from lakehouse.core.events import EVENTS_TABLE

    names = {EVENTS_TABLE}
    for spec in specs.values():
        names.update(spec.owned_tables)
        names.update(spec.views)
    return names


@dataclass(frozen=True)
class BackfillPlan:
    pipeline: str
    target_table: str                       # qualified: where rows go (the live table for in_place)
    candidate_table: str | None
    ranges: dict[int, tuple[int, int]]      # partition -> [start, end)
    dry_run: bool
    notes: tuple[str, ...] = ()

    @property
    def records(self) -> int:
        return sum(end - start for start, end in self.ranges.values())

    @property
    def offsets(self) -> str:
        """The ranges as `PARTITION:START-END,...` (replay's --offsets)."""
        return ",".join(f"{p}:{s}-{e}" for p, (s, e) in sorted(self.ranges.items()))

    def job_args(self) -> list[str]:
        """Arguments of the replay job (after `--pipeline NAME`) that carry out this plan."""
        args = ["--offsets", self.offsets, "--backfill", "--json"]
        return args + (["--into-table", self.candidate_table] if self.candidate_table else [])

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "target_table": self.target_table,
                "candidate_table": self.candidate_table,
                "ranges": {str(p): list(r) for p, r in sorted(self.ranges.items())}, "offsets": self.offsets,
                "records": self.records, "dry_run": self.dry_run, "notes": list(self.notes),
                "job_args": self.job_args() if self.ranges else []}


def plan(spec: PipelineSpec, request: BackfillRequest, platform: config.PlatformConfig | None = None,
         ) -> BackfillPlan:
    """Check `request` against Kafka and the pipeline's tables and resolve it to offset ranges.

    Offset ranges must name existing partitions, start at offsets still in Kafka and end at
    or before the pipeline's committed position (later records are live ingestion's to
    write); time windows are cut at the committed position instead, with a note saying so.
    Raises BackfillError naming the partition and the bound, and PositionsLostError when a table holds
    rows but its positions cannot be found.
    """
    platform = platform or config.load()
    catalog = open_catalog(platform, spec.catalog)
    # fail closed as the replay that runs the plan does: without a table's positions no bound is known
    progress = [offsets.read_progress(catalog, t, spec.name).require_positions() for t in spec.positioned_tables]
    state = topic_state_for(platform.kafka(), spec.source.topic, progress)
    committed = offsets.committed_positions(progress, state.earliest)
    notes: list[str] = []
    if request.mode == "offsets":
        ranges = dict(request.ranges or {})
        for p, (start, end) in sorted(ranges.items()):
            if p not in state.partitions:
                raise BackfillError(f"offsets: topic {spec.source.topic!r} has no partition {p} "
                                    f"(partitions: {', '.join(map(str, sorted(state.partitions)))})")
            if start < state.partitions[p].earliest:
                raise BackfillError(f"offsets: partition {p}: offsets before {state.partitions[p].earliest} are no "
                                    f"longer in Kafka (asked from {start})")
            if end > committed[p]:
                raise BackfillError(f"offsets: partition {p}: range [{start}, {end}) goes past the pipeline's "
                                    f"committed position {committed[p]}; later records are the live ingestion's")
    else:
        if request.start_ms is None:
            raise BackfillError("start_time: required in mode time (ISO-8601)")
        ends = {p: ps.end for p, ps in state.partitions.items()}
        conf = platform.kafka()
        starts = offsets_for_time(conf, spec.source.topic, ends, request.start_ms, ends)
        stops = ends if request.end_ms is None else offsets_for_time(conf, spec.source.topic, ends, request.end_ms,
                                                                     ends)
        ranges = {}
        for p in sorted(ends):
            start = max(starts[p], state.partitions[p].earliest)
            end = min(stops[p], committed[p])
            if stops[p] > committed[p] and stops[p] > start:
                notes.append(f"partition {p}: cut at the committed position {committed[p]} "
                             f"(the window reaches {stops[p]}; later records are the live ingestion's)")
            if end > start:
                ranges[p] = (start, end)
        if not ranges:
            notes.append("no committed records in that time window")
    target = request.candidate_table or spec.target.table
    return BackfillPlan(pipeline=spec.name, target_table=spec.qualified(target),
                        candidate_table=request.candidate_table, ranges=ranges, dry_run=request.dry_run,
                        notes=tuple(notes))


def plan_from_json(planned: Any) -> BackfillPlan:
    """The BackfillPlan whose `to_json()` is exactly `planned`; PlanMismatchError for anything else (a
    missing plan, a field of the wrong type, job arguments or counts that do not follow from its ranges)."""
    if not isinstance(planned, dict):
        raise PlanMismatchError(f"no backfill plan: got {type(planned).__name__}. Nothing was written; trigger a "
                                f"new run")
    try:
        ranges: dict[int, tuple[int, int]] = {}
        for p, bounds in planned["ranges"].items():
            start, end = bounds
            if any(isinstance(b, bool) or not isinstance(b, int) for b in (start, end)):
                raise TypeError(f"partition {p}: bounds {bounds!r} are not offsets")
            if not 0 <= start < end:
                raise ValueError(f"partition {p}: need 0 <= START < END, got [{start}, {end})")
            ranges[int(p)] = (start, end)
        parsed = BackfillPlan(pipeline=planned["pipeline"], target_table=planned["target_table"],
                              candidate_table=planned["candidate_table"], ranges=ranges,
                              dry_run=planned["dry_run"], notes=tuple(planned["notes"]))
        rebuilt = parsed.to_json()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanMismatchError(f"not a backfill plan ({type(exc).__name__}: {exc}). {_CHANGED}") from None
    if rebuilt != planned:
        differing = sorted(k for k in set(planned) | set(rebuilt) if planned.get(k) != rebuilt.get(k))
        raise PlanMismatchError(f"the plan's {', '.join(differing)} do not follow from its ranges and tables. "
                                f"{_CHANGED}")
    return parsed


def confirm(spec: PipelineSpec, request: BackfillRequest, planned: Any,
            platform: config.PlatformConfig | None = None) -> BackfillPlan:
    """The plan `planned` (a `to_json()`, as the plan task pushed it), confirmed to be a plan of `request`
    now (`check_plan` against `plan(spec, request)`, which re-checks the request against Kafka and the
    tables), or PlanMismatchError naming what differs; BackfillError when the request cannot be served
    any more (records aged out of Kafka since, a candidate table became live)."""
    return check_plan(plan_from_json(planned), plan(spec, request, platform), request.mode)


def check_plan(given: BackfillPlan, now: BackfillPlan, mode: str) -> BackfillPlan:
    """`given` when it is a plan of the request that plans to `now` in `mode`, else PlanMismatchError
    naming each difference. Same pipeline, target and candidate table and dry run flag; in mode offsets
    the same ranges (the request's own); in mode time each range inside the window's range now (a window
    is cut at the committed position, which only moves up, so a plan made earlier holds the same or less)."""
    differences = [f"{name} {getattr(given, name)!r} instead of {getattr(now, name)!r}"
                   for name in ("pipeline", "target_table", "candidate_table", "dry_run")
                   if getattr(given, name) != getattr(now, name)]
    if mode == "offsets":
        if given.ranges != now.ranges:
            differences.append(f"offsets {given.offsets or 'none'} instead of {now.offsets or 'none'}")
    else:
        for p, (start, end) in sorted(given.ranges.items()):
            low, high = now.ranges.get(p, (0, 0))
            if not low <= start < end <= high:
                window = f"[{low}, {high})" if high else "committed records (there are none)"
                differences.append(f"partition {p}: [{start}, {end}) is not inside the window's {window}")
    if differences:
        raise PlanMismatchError(
            f"the plan to run is not what this run's request plans: {'; '.join(differences)}. {_CHANGED}")
    return given
