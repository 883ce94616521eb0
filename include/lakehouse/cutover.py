"""Candidate cutover and rollback: move readers from a live pipeline's table to a candidate's.

Readers query the live pipeline's view (`publish.view`, e.g. `serve.orders`), which
selects from the published branch of the live table. A candidate pipeline (a spec with
`candidate_for: <live>`: new partitioning, a new contract, a rebuilt table) ingests
the same topic beside it. Cutting over replaces the view's query with the candidate
table's published branch, only when

1. the candidate's lag and freshness are at least as good as the live pipeline's
   (within a tolerance of one candidate trigger interval for freshness), and
2. over the overlap window (the offsets both pipelines have committed) the candidate
   accounts for every source offset exactly once (data or dead-letter table), like the
   live one, and its rows pass the candidate's quality suite.

Each cutover records the view's previous query in a `cutover` event; `rollback()`
restores the query of the newest cutover not yet rolled back and records a `rollback`
event. Both act on the catalog atomically (one view replacement).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lakehouse import config, events, offsets, quality, status as status_module
from lakehouse.publish import current_view_query, replace_view, view_query
from lakehouse.spec import PipelineSpec


class CutoverError(ValueError):
    """The cutover or rollback was refused; the message says which check failed and by how much."""


@dataclass
class Comparison:
    """What a cutover decision is based on; `reasons` lists every failed check."""
    live: str
    candidate: str
    live_lag_records: int | None
    candidate_lag_records: int | None
    live_freshness_s: float | None
    candidate_freshness_s: float | None
    overlap: dict[int, tuple[int, int]] = field(default_factory=dict)
    overlap_offsets: int = 0
    candidate_offsets_in_overlap: int = 0
    candidate_duplicates: int = 0
    quality: dict | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def as_dict(self) -> dict:
        out = asdict(self)
        out["overlap"] = {str(p): list(r) for p, r in self.overlap.items()}
        out["ok"] = self.ok
        return out


def view_name(spec: PipelineSpec) -> str:
    if not spec.publish.view:
        raise CutoverError(f"pipeline {spec.name!r} declares no readers' view (publish.view); nothing to cut over")
    return spec.qualified(spec.publish.view)


def _committed_ranges(spark, spec: PipelineSpec) -> dict[int, tuple[int, int]]:
    """Per partition, [first offset held, committed position) over the pipeline's tables."""
    catalog = offsets.open_catalog(config.load(), spec.catalog)
    positions = offsets.read_progress(catalog, spec.target.table, spec.name).positions
    starts: dict[int, int] = {}
    for name in (*spec.target.tables, spec.dead_letter_table):
        for row in spark.sql(f"SELECT _kafka.partition AS p, min(_kafka.offset) AS o FROM {spec.qualified(name)} "
                             f"GROUP BY _kafka.partition").collect():
            starts[row.p] = min(row.o, starts.get(row.p, row.o))
    return {p: (starts.get(p, end), end) for p, end in positions.items()}


def _offsets_held(spark, spec: PipelineSpec, overlap: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(distinct source offsets of `overlap` held across the pipeline's tables, duplicated ones)."""
    if not overlap:
        return 0, 0
    where = " OR ".join(f"(_kafka.partition = {p} AND _kafka.offset >= {lo} AND _kafka.offset < {hi})"
                        for p, (lo, hi) in overlap.items())
    union = " UNION ALL ".join(
        f"SELECT _kafka.partition AS p, _kafka.offset AS o FROM {spec.qualified(name)} WHERE {where}"
        for name in (*spec.target.tables, spec.dead_letter_table))
    row = spark.sql(f"SELECT count(*) AS n, count(DISTINCT p, o) AS d FROM ({union})").collect()[0]
    return row.d, row.n - row.d


def compare(spark, live: PipelineSpec, candidate: PipelineSpec, platform: config.PlatformConfig | None = None,
            freshness_tolerance_s: float | None = None) -> Comparison:
    """Every check a cutover needs, without changing anything; `reasons` lists the failed ones.

    Raises CutoverError when `candidate` is not a candidate of `live` at all.
    """
    if candidate.candidate_for != live.name:
        raise CutoverError(f"{candidate.name!r} is not a candidate for {live.name!r} "
                           f"(its spec says candidate_for: {candidate.candidate_for!r})")
    if candidate.source.topic != live.source.topic:
        raise CutoverError(f"{candidate.name!r} reads topic {candidate.source.topic!r}, "
                           f"{live.name!r} reads {live.source.topic!r}: no common offsets to compare")
    platform = platform or config.load()
    tolerance = candidate.trigger.interval_s if freshness_tolerance_s is None else freshness_tolerance_s
    ls, cs = (status_module.pipeline_status(s, platform, with_timeline=False) for s in (live, candidate))
    cmp = Comparison(live.name, candidate.name, ls["lag_records"], cs["lag_records"],
                     ls["seconds_since_commit"], cs["seconds_since_commit"])
    if cs["lag_records"] is None or not cs["last_commit_at"]:
        cmp.reasons.append(f"candidate {candidate.name!r} has no committed position yet")
        return cmp
    if ls["lag_records"] is not None and cs["lag_records"] > ls["lag_records"]:
        cmp.reasons.append(f"candidate lag {cs['lag_records']} records > live lag {ls['lag_records']}")
    if ls["seconds_since_commit"] is not None and cs["seconds_since_commit"] > ls["seconds_since_commit"] + tolerance:
        cmp.reasons.append(f"candidate last commit {cs['seconds_since_commit']}s ago, live "
                           f"{ls['seconds_since_commit']}s ago (tolerance {tolerance:g}s)")
    live_ranges, cand_ranges = _committed_ranges(spark, live), _committed_ranges(spark, candidate)
    cmp.overlap = {p: (max(lo, cand_ranges[p][0]), min(hi, cand_ranges[p][1]))
                   for p, (lo, hi) in live_ranges.items()
                   if p in cand_ranges and max(lo, cand_ranges[p][0]) < min(hi, cand_ranges[p][1])}
    cmp.overlap_offsets = sum(hi - lo for lo, hi in cmp.overlap.values())
    if not cmp.overlap_offsets:
        cmp.reasons.append("no overlap window: the candidate and the live pipeline share no committed offsets")
        return cmp
    held, cmp.candidate_duplicates = _offsets_held(spark, candidate, cmp.overlap)
    cmp.candidate_offsets_in_overlap = held
    if held != cmp.overlap_offsets or cmp.candidate_duplicates:
        cmp.reasons.append(f"candidate holds {held} of {cmp.overlap_offsets} offsets of the overlap window "
                           f"({cmp.candidate_duplicates} duplicated)")
    audit = quality.audit(candidate, platform, window=cmp.overlap, record_event=False)
    cmp.quality = {"success": audit.success, "summary": audit.summary(), "rows": audit.rows, "docs": audit.docs,
                   "offending_offsets": audit.offending_offsets}
    if not audit.success:
        cmp.reasons.append(f"candidate quality suite failed over the overlap window: {audit.summary()}")
    return cmp


def cutover(spark, live: PipelineSpec, candidate: PipelineSpec, platform: config.PlatformConfig | None = None,
            freshness_tolerance_s: float | None = None) -> dict:
    """Point `live`'s readers' view at `candidate`'s published branch if every check passes.

    Returns the recorded event details (comparison, previous and new query). Raises
    CutoverError naming the failed checks (and records a failed `cutover` event).
    """
    platform = platform or config.load()
    view = view_name(live)
    cmp = compare(spark, live, candidate, platform, freshness_tolerance_s)
    previous = current_view_query(spark, view)
    details = {"view": view, "candidate": candidate.name, "previous_query": previous,
               "comparison": cmp.as_dict()}
    if not cmp.ok:
        events.record(events.Event(live.name, "cutover", "failed", "; ".join(cmp.reasons), details=details),
                      platform=platform)
        raise CutoverError(f"cutover of {view} to {candidate.name!r} refused: " + "; ".join(cmp.reasons))
    target = offsets.open_catalog(platform, candidate.catalog).load_table(candidate.target.table)
    if target.refs().get(candidate.publish.branch) is None:
        raise CutoverError(f"candidate table {candidate.qualified(candidate.target.table)} has no "
                           f"{candidate.publish.branch!r} branch yet: publish it (its quality gate) first")
    details["query"] = view_query(candidate)
    replace_view(spark, view, details["query"])
    events.record(events.Event(live.name, "cutover", "ok", f"{view} now reads {candidate.name}",
                               metrics={"overlap_offsets": cmp.overlap_offsets}, details=details),
                  platform=platform)
    return details


def rollback(spark, live: PipelineSpec, platform: config.PlatformConfig | None = None) -> dict:
    """Restore the readers' view to its query before the newest cutover not yet rolled back.

    Raises CutoverError when there is nothing to roll back.
    """
    platform = platform or config.load()
    view = view_name(live)
    history = [e for e in reversed(events.recent(live.name, limit=1000, platform=platform))
               if e["kind"] in ("cutover", "rollback") and e["status"] == "ok"]
    stack: list[dict] = []
    for event in history:  # oldest first: a rollback undoes the newest open cutover
        if event["kind"] == "cutover":
            stack.append(event)
        elif stack:
            stack.pop()
    if not stack:
        raise CutoverError(f"nothing to roll back: {view} has no cutover that is still in effect")
    last = stack[-1]["details"]
    previous = last.get("previous_query") or view_query(live)
    current = current_view_query(spark, view)
    replace_view(spark, view, previous)
    details = {"view": view, "rolled_back_candidate": last.get("candidate"), "previous_query": current,
               "query": previous}
    events.record(events.Event(live.name, "rollback", "ok", f"{view} reads {previous!r} again", details=details),
                  platform=platform)
    return details
