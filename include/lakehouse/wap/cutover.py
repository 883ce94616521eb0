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

The view only ever reads a `Source`: the published branch of a table of the live
pipeline or of one of its candidates (`known_sources`, from the specs). A cutover
refuses a view that reads anything else (created or replaced by hand: it is not managed
by the pipeline). Each cutover records what the view read before and after as typed
sources (`previous_source`, `source`) in a `cutover` event, next to the query texts
for people to read. `rollback()` takes the newest cutover not yet rolled back, checks
that its sources are known ones and that the view still reads what the cutover set, and
rebuilds the query from the specs (`publish.view_query`): SQL text from the timeline is
never executed, so whoever can append an event cannot choose what readers read. Both act on
the catalog atomically (one view replacement). Each cutover and rollback, refused ones included,
is one audited event (`cutover` or `rollback`, `failed` when refused) in the live pipeline's
catalog, naming who asked (the actor), with which parameters, and the outcome.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from lakehouse.core import config, events, offsets
from lakehouse.core import spec as spec_module
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import CutoverError
from lakehouse.core.spec import PipelineSpec
from lakehouse.ops import status as status_module
from lakehouse.wap import quality
from lakehouse.wap.publish import current_view_query, replace_view, view_name, view_query

SOURCE_FIELDS = ("pipeline", "table", "branch")
HISTORY_LIMIT = 1000  # cutover (and rollback) events read back to find the one to roll back


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


@dataclass(frozen=True)
class Source:
    """What a readers' view reads: `table` of pipeline `pipeline` at its published branch `branch`."""
    pipeline: str
    table: str
    branch: str

    @classmethod
    def of(cls, spec: PipelineSpec, table: str | None = None) -> Source:
        """The published branch of `table` (default: the main table) of `spec`."""
        return cls(spec.name, table or spec.target.table, spec.publish.branch)


def cutover_view(spec: PipelineSpec) -> str:
    """The view a cutover of `spec` switches and a rollback restores: the readers' view of its main table
    (publish.view_name), qualified (catalog.namespace.name). Raises CutoverError when it declares none."""
    view = view_name(spec, spec.target.table)
    if not view:
        raise CutoverError(f"pipeline {spec.name!r} declares no readers' view (publish.view); nothing to cut over")
    return spec.qualified(view)


def known_sources(live: PipelineSpec) -> dict[Source, PipelineSpec]:
    """Every source `live`'s view may read, with the spec that owns it: each table of `live` and of
    every candidate for it that `spec.load_all` finds in `live`'s spec folder."""
    specs = spec_module.load_all(Path(live.path).parent)
    owners = [live, *(s for s in specs.values() if s.candidate_for == live.name)]
    return {Source.of(spec, table): spec for spec in owners for table in spec.target.tables}


def catalogs(live: PipelineSpec) -> list[str]:
    """The catalogs a Spark session needs to cut `live`'s view over or roll it back (its own and its candidates')."""
    return sorted({spec.catalog for spec in known_sources(live).values()})


def _view_source(spark, view: str, live: PipelineSpec, known: dict[Source, PipelineSpec]) -> tuple[Source, str]:
    """(The source `view` reads now, its query text). Raises CutoverError when the view does not exist
    or reads anything but a known source: then it is not managed by `live`."""
    query = current_view_query(spark, view)
    if query is None:
        raise CutoverError(f"{view} does not exist yet: publish {live.name!r} first (its first publication "
                           f"creates the view), then cut over")
    for source, spec in known.items():
        if query == view_query(spec, source.table):
            return source, query
    raise CutoverError(f"{view} reads {query!r}, which is not the published branch of {live.name!r} or of a "
                       f"candidate for it: the view is not managed by this pipeline. If readers should read "
                       f"{live.name!r}, restore it with CREATE OR REPLACE VIEW {view} AS {view_query(live)} "
                       f"and cut over again")


def _committed_ranges(spark, spec: PipelineSpec, platform: config.PlatformConfig) -> dict[int, tuple[int, int]]:
    """Per partition, [first offset held, committed position) over the pipeline's tables."""
    catalog = open_catalog(platform, spec.catalog)
    positions = offsets.committed_positions([offsets.read_progress(catalog, t, spec.name)
                                             for t in spec.positioned_tables])
    starts: dict[int, int] = {}
    for name in spec.positioned_tables:
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
        for name in spec.positioned_tables)
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
    live_ranges, cand_ranges = _committed_ranges(spark, live, platform), _committed_ranges(spark, candidate, platform)
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
            freshness_tolerance_s: float | None = None, actor: events.Actor | None = None) -> dict:
    """Point `live`'s readers' view at `candidate`'s published branch if every check passes.

    Returns the recorded event details: the view, what it read before and reads now (typed
    sources and query texts) and the comparison. Raises CutoverError when `candidate` is not
    declared as a candidate for `live`, when the view does not read a known source (it is not
    managed by `live`), when the candidate has no published branch, or naming the failed
    checks. Either way one `cutover` event records `actor` (default: this process's), the
    candidate and tolerance asked for, and the outcome (events.audited).
    """
    platform = platform or config.load()
    parameters = {"candidate": candidate.name, "freshness_tolerance_s": freshness_tolerance_s}
    with events.audited(live.name, "cutover", actor or events.Actor.of_process(), parameters, platform,
                        live.catalog) as audit:
        view = cutover_view(live)
        known = known_sources(live)
        source = Source.of(candidate)
        if source not in known:
            raise CutoverError(f"{candidate.name!r} is not a candidate for {live.name!r} declared in "
                               f"{Path(live.path).parent} (its spec says candidate_for: "
                               f"{candidate.candidate_for!r}); put its spec there so a rollback can verify it")
        previous, previous_query = _view_source(spark, view, live, known)
        cmp = compare(spark, live, candidate, platform, freshness_tolerance_s)
        audit.details.update(view=view, candidate=candidate.name, previous_source=asdict(previous),
                             previous_query=previous_query, comparison=cmp.as_dict())
        if not cmp.ok:
            raise CutoverError(f"cutover of {view} to {candidate.name!r} refused: " + "; ".join(cmp.reasons))
        target = open_catalog(platform, candidate.catalog).load_table(candidate.target.table)
        if target.refs().get(candidate.publish.branch) is None:
            raise CutoverError(f"candidate table {candidate.qualified(candidate.target.table)} has no "
                               f"{candidate.publish.branch!r} branch yet: publish it (its quality gate) first")
        audit.details.update(source=asdict(source), query=view_query(candidate))
        replace_view(spark, view, audit.details["query"])
        audit.message = f"{view} now reads {candidate.name}"
        audit.metrics = {"overlap_offsets": cmp.overlap_offsets}
    return audit.details


def _open_cutover(live: PipelineSpec, view: str, platform: config.PlatformConfig) -> dict:
    """The newest `ok` cutover event of `live` that no later `ok` rollback undid.

    Raises CutoverError when there is none.
    """
    history = sorted((e for kind in ("cutover", "rollback")
                      for e in events.recent(live.name, kind=kind, limit=HISTORY_LIMIT, platform=platform,
                                             catalog=live.catalog)
                      if e["status"] == "ok"), key=lambda e: e["ts"])
    stack: list[dict] = []
    for event in history:  # oldest first: a rollback undoes the newest open cutover
        if event["kind"] == "cutover":
            stack.append(event)
        elif stack:
            stack.pop()
    if not stack:
        raise CutoverError(f"nothing to roll back: {view} has no cutover that is still in effect")
    return stack[-1]


def _recorded_source(event: dict, key: str, known: dict[Source, PipelineSpec]) -> Source:
    """The typed source `key` ("previous_source" or "source") of cutover `event`.

    Raises CutoverError when it is missing or malformed, or is not a known source.
    """
    value = event["details"].get(key)
    if not (isinstance(value, dict) and set(value) == set(SOURCE_FIELDS)
            and all(isinstance(value[f], str) for f in SOURCE_FIELDS)):
        raise CutoverError(f"cutover event {event['event_id']} ({event['ts']}) has no valid {key!r} (expected "
                           f"{{pipeline, table, branch}}, found {value!r})")
    source = Source(**value)
    if source not in known:
        raise CutoverError(f"cutover event {event['event_id']} ({event['ts']}) names {key} {value!r}, which is "
                           f"not the published branch of a table of {event['pipeline']!r} or of a candidate for it")
    return source


def _rollback_details(spark, live: PipelineSpec, view: str, event: dict) -> dict:
    """The details of a rollback of cutover `event`: the source it set and its query now (`previous_*`),
    the source it replaced and the query built for it from the specs (`source`, `query`), once the
    event checks out: it is for `view`, its typed sources are known ones, and the view still reads
    what it set.

    Raises CutoverError naming what does not check out.
    """
    recorded = event["details"]
    if not isinstance(recorded, dict) or recorded.get("view") != view:
        raise CutoverError(f"cutover event {event['event_id']} ({event['ts']}) is not one for view {view} "
                           f"(its details: {recorded!r})")
    known = known_sources(live)
    restore = _recorded_source(event, "previous_source", known)
    rolled_back = _recorded_source(event, "source", known)
    current = current_view_query(spark, view)
    if current != view_query(known[rolled_back], rolled_back.table):
        raise CutoverError(f"{view} reads {current!r}, not {rolled_back.pipeline!r} as cutover event "
                           f"{event['event_id']} ({event['ts']}) left it: the view changed since")
    return {"view": view, "rolled_back_candidate": rolled_back.pipeline, "cutover_event": event["event_id"],
            "previous_source": asdict(rolled_back), "previous_query": current,
            "source": asdict(restore), "query": view_query(known[restore], restore.table)}


def rollback(spark, live: PipelineSpec, platform: config.PlatformConfig | None = None,
             actor: events.Actor | None = None) -> dict:
    """Point the readers' view back at what it read before the newest cutover not yet rolled back.

    The query is built from the specs for the cutover event's typed `previous_source`, never taken
    from the event. Returns the recorded event details. Raises CutoverError when there is nothing
    to roll back, or, changing nothing, when the cutover event does not check out
    (`_rollback_details`: forged, malformed, or the view changed since). Either way one `rollback`
    event records `actor` (default: this process's) and the outcome (events.audited).
    """
    platform = platform or config.load()
    with events.audited(live.name, "rollback", actor or events.Actor.of_process(), {}, platform,
                        live.catalog) as audit:
        view = cutover_view(live)
        event = _open_cutover(live, view, platform)
        audit.details.update(view=view, cutover_event=event["event_id"])
        try:
            details = _rollback_details(spark, live, view, event)
        except CutoverError as exc:
            raise CutoverError(f"rollback of {view} refused: {exc}. Nothing was changed; check the cutover and "
                               f"rollback events of {live.name!r} in {live.catalog}.{events.EVENTS_TABLE}") from None
        replace_view(spark, view, details["query"])
        audit.details = details
        audit.message = f"{view} reads {details['source']['pipeline']} again"
    return details
