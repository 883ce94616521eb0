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

`public(overview)` is what a browser may receive of an overview: aggregates, states, positions,
counts and who acted, built field by field from an allow-list, never copied wholesale. The ops
timeline holds more than that: a quality event's offending rows (`offending_offsets[].value`), a
verification's problems (Kafka keys), free-text messages that quote keys, values, Data Docs paths or
exceptions, the host and OS user an action ran from, and the parameters people typed. None of that
leaves `public`: an event is its kind, status, time, actor and numeric metrics; an action's
parameters keep their values only for known parameter names whose value has that parameter's own
form (an offset range, a time, a table or pipeline name, an enumerated choice, a number or a flag: a
card number is not an offset range), the rest say `withheld`;
the text that is left (layout drift, why positions are lost) has locations scrubbed (`scrub`). An
error is a short category of its type and a stable id (`public_error`); its full text goes to the
server's log, once per id, so an operator can find it there.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from datetime import UTC, datetime
from typing import Any, overload

from lakehouse.core import config, errors, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import IDENTIFIER, SHARED_DAG_IDS, TABLE_NAME, PipelineSpec, dag_id
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ops import cost
from lakehouse.ops.status import pipeline_status

log = logging.getLogger("lakehouse.ops.history")

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
        at = datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=UTC)
        event_time = props.get(SnapshotSummary.MAX_EVENT_TIME)
        points.append({
            "at": at.isoformat(),
            "snapshot_id": snap.snapshot_id,
            "committed": sum(offsets.decode_positions(props[SnapshotSummary.POSITIONS]).values()),
            "freshness_s": _seconds(at, datetime.fromisoformat(event_time)) if event_time else None,
        })
    return {"source": "snapshots" if points else "none", "points": points[-limit:]}


def pipeline_dags(spec: PipelineSpec) -> tuple[str, ...]:
    """The DAGs generated for this pipeline alone: a user must be allowed to read every one of them
    to see the pipeline on the page or trace its records."""
    return tuple(dag_id(spec.name, kind) for kind in spec.dag_kinds)


def dag_ids(spec: PipelineSpec) -> list[str]:
    """The DAGs generated for this pipeline, then the ones shared by all pipelines."""
    return [*pipeline_dags(spec), *SHARED_DAG_IDS]


def overview(spec: PipelineSpec, platform: config.PlatformConfig | None = None,
             now: datetime | None = None) -> dict:
    """`pipeline_status` plus `snapshot_id`, `positions`, `committed`, `quality`, `history`, `dags`, `slo`
    and `cost`.

    `committed` is False while no data table holds an ingest commit of the pipeline.
    `quality` is the newest `quality` event of the ops timeline, or None.
    `cost` is `lakehouse.ops.cost.daily_cost` over COST_DAYS days (as JSON), or {"error": why}.
    """
    platform = platform or config.load()
    now = now or datetime.now(UTC)
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


# ---------------------------------------------------------------------------- what a browser may receive

WITHHELD = "withheld"  # an action parameter's value the page does not show
MAX_TEXT = 500  # characters kept of a scrubbed text
MAX_METRICS = 40  # numeric metrics kept per event
MAX_PARAMETERS = 30  # parameters kept per action
_REMEMBERED_IDS = 10_000  # error ids logged once each; past this many the memory starts over

# A location: a URI (s3://bucket/key, file:///home/x), an absolute or home-relative path, a drive path.
# A location ends before trailing punctuation, so the sentence around it stays whole.
_LOCATION = re.compile(r"""(?:[A-Za-z][A-Za-z0-9+.-]*://|(?<![\w.:/~-])~?/|\b[A-Za-z]:\\)"""
                       r"""[^\s'"<>]*[^\s'"<>.,;:!?)\]}]""")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")  # a metric or parameter name, an event kind
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # an identifier, a table or pipeline name, a DAG id
_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,249}")  # an Airflow run id (manual__2024-01-01T00:00:00+00:00)
_RANGE = r"\s*\d{1,10}\s*:\s*\d{1,19}\s*-\s*\d{1,19}\s*"
_OFFSETS = re.compile(rf"{_RANGE}(?:,{_RANGE}){{0,63}}")  # PARTITION:START-END[,...], as the backfill DAG takes them
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_CHOICE = re.compile(r"[a-z][a-z_]{0,31}")  # a value of an enumerated parameter (mode, target, action)


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


def _amount(value: Any) -> bool:
    return _number(value) is not None


def _form(pattern: re.Pattern):
    return lambda value: isinstance(value, str) and pattern.fullmatch(value) is not None


def _error_kind(value: Any) -> bool:
    from lakehouse.ingest.rejects import ERROR_KINDS

    return value in ERROR_KINDS


def _snapshots(value: Any) -> bool:
    """{table: snapshot id}, as retention and maintenance record what they kept."""
    return (isinstance(value, dict) and len(value) <= 20
            and all(isinstance(k, str) and TABLE_NAME.fullmatch(k) and _amount(v) for k, v in value.items()))


# Parameters of operator actions (lakehouse.cli, the backfill, cutover and publish DAGs, maintenance) whose
# values the page shows, each when its value has the one form that parameter takes (an offset range, a time,
# a table or pipeline name, an enumerated choice, a number, a flag): a form that cannot carry a row's value
# or a Kafka key. Any other parameter's value, or a value of another form, is WITHHELD.
SHOWN_PARAMETERS = {
    "offsets": _form(_OFFSETS), "from_time": _form(_TIME), "to_time": _form(_TIME), "start_time": _form(_TIME),
    "end_time": _form(_TIME), "mode": _form(_CHOICE), "target": _form(_CHOICE), "action": _form(_CHOICE),
    "dry_run": _flag, "dead_letters": _flag, "forced": _flag, "force": _flag, "error_kind": _error_kind,
    "into_table": _form(TABLE_NAME), "candidate_table": _form(TABLE_NAME), "candidate": _form(IDENTIFIER),
    "freshness_tolerance_s": _amount, "run_id": _form(_RUN_ID), "snapshots": _snapshots,
}
# Cost notes that end with the text of the error that cut a figure short (lakehouse.ops.cost).
_COST_NOTES_WITH_ERRORS = ("Kafka did not answer, so nothing produced is counted",
                           "the ops timeline cannot be read, so compute seconds are missing")
_EXCEPTION_TEXT = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|Traceback|\{code=")

# What the page says of an error: the category of the nearest class of its type's MRO listed here.
ERROR_CATEGORIES: dict[type, str] = {
    errors.TopicMissingError: "the topic does not exist",
    errors.TopicRecreatedError: "the topic was deleted and recreated (its offsets went backwards)",
    errors.OffsetGapError: "records aged out of Kafka before they were ingested",
    errors.SchemaRegistryUnavailableError: "the schema registry did not answer",
    errors.BrokerUnavailableError: "Kafka did not answer in time",
    errors.SourceError: "Kafka cannot serve what the page asked",
    errors.CatalogUnavailableError: "the catalog did not answer",
    errors.CatalogAccessError: "the catalog refused the platform's credentials",
    errors.ObjectStoreUnavailableError: "the object store did not answer",
    errors.ObjectStoreAccessError: "the object store refused the platform's credentials",
    errors.TableStateError: "a table is not in a state the pipeline can continue from",
    errors.SpecError: "the spec file does not load",
    errors.ConfigurationError: "a setting is invalid",
    errors.RetryableError: "a transient outage",
    errors.LakehouseError: "the platform could not read it",
}

_logged: set[str] = set()
_logged_lock = threading.Lock()


def scrub(text: object, limit: int = MAX_TEXT) -> str:
    """`text` with every location (URI, filesystem path) replaced by `<location>`, at most `limit` characters."""
    cleaned = _LOCATION.sub("<location>", str(text))
    return cleaned if len(cleaned) <= limit else cleaned[:limit - 1] + "\u2026"


def _error_type(name: str) -> type | None:
    """The LakehouseError subclass called `name` among those loaded, else None."""
    pending: list[type] = [errors.LakehouseError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def error_category(kind: type | str | None) -> str:
    """A short category for an error of type `kind` (the class or its name): ERROR_CATEGORIES of the nearest
    class of its MRO, else "an unexpected error (TypeName)". Never anything of the error's text."""
    cls = kind if isinstance(kind, type) else _error_type(kind) if kind else None
    for base in cls.__mro__ if cls else ():
        if base in ERROR_CATEGORIES:
            return ERROR_CATEGORIES[base]
    name = kind.__name__ if isinstance(kind, type) else kind
    if name and re.fullmatch(r"[A-Za-z_]\w{0,80}", name):
        return f"an unexpected error ({name})"
    return "an unexpected error"


def public_error(where: str, error: BaseException | str, kind: type | str | None = None,
                 category: str | None = None) -> dict:
    """{"category", "id"}: what a browser may learn of `error`, met while reading `where` (e.g. "pipeline
    orders: Kafka"). `error` is the exception, or its text with its type's name in `kind` or as a
    "TypeName: " prefix (as the status and cost reads record theirs); `category` replaces the type's.

    The id is stable (a hash of where, type and text): the same error keeps its id across refreshes,
    and the server's log has its full text under that id, logged the first time it is met.
    """
    if isinstance(error, BaseException):
        kind, text = type(error), str(error)
    else:
        text = str(error)
        prefixed = None if kind else re.match(r"([A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit)): (.*)", text, re.S)
        if prefixed:
            kind, text = prefixed.group(1).rsplit(".", 1)[-1], prefixed.group(2)
    name = kind.__name__ if isinstance(kind, type) else (kind or "")
    digest = hashlib.sha256(f"{where}\0{name}\0{text}".encode("utf-8", "replace")).hexdigest()[:12]
    category = category or error_category(kind)
    with _logged_lock:
        first = digest not in _logged
        if first:
            if len(_logged) >= _REMEMBERED_IDS:
                _logged.clear()
            _logged.add(digest)
    if first:
        log.warning("pipelines page: %s: %s [error %s]: %s%s", where, category, digest,
                    f"{name}: " if name else "", text)
    return {"category": category, "id": digest}


def _number(value: Any) -> int | float | None:
    """`value` when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None


def _metrics(found: Any, limit: int = MAX_METRICS) -> dict[str, float]:
    """The finite numbers of `found` under plain names, at most `limit`, by name."""
    if not isinstance(found, dict):
        return {}
    kept = {k: _number(v) for k, v in found.items() if isinstance(k, str) and _NAME.fullmatch(k)}
    return dict(sorted((k, v) for k, v in kept.items() if v is not None)[:limit])


def _safe(value: Any, form: re.Pattern) -> str | None:
    return value if isinstance(value, str) and form.fullmatch(value) else None


def _actor(value: Any) -> str | None:
    """Who acted (an Airflow user, the scheduler, an OS user), when it reads as a name."""
    return value if isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable() else None


def _status(value: Any) -> str:
    return value if value in ("ok", "warn", "failed", "skipped") else "unknown"


def parameters_of(found: Any) -> dict[str, Any]:
    """An action's parameters: each name, with its value when SHOWN_PARAMETERS names it and the value has
    that parameter's form (None: not given), else WITHHELD."""
    if not isinstance(found, dict):
        return {}
    names = sorted(k for k in found if isinstance(k, str) and _NAME.fullmatch(k))[:MAX_PARAMETERS]
    return {k: found[k] if found[k] is None or (k in SHOWN_PARAMETERS and SHOWN_PARAMETERS[k](found[k]))
            else WITHHELD for k in names}


@overload
def _event(pipeline: str, kind: str, event: dict) -> dict: ...
@overload
def _event(pipeline: str, kind: str, event: None) -> None: ...
@overload
def _event(pipeline: str, kind: str, event: dict | None) -> dict | None: ...


def _event(pipeline: str, kind: str, event: dict | None) -> dict | None:
    """An ops timeline event as the page shows it: time, kind, status, actor and numeric metrics; a failed
    event's message (it may quote rows, keys, paths or an exception) only as an error id."""
    if event is None:
        return None
    out = {"at": str(event.get("at")), "kind": kind, "status": _status(event.get("status")),
           "actor": _actor(event.get("actor")), "metrics": _metrics(event.get("metrics"))}
    if out["status"] == "failed":
        out["error"] = public_error(f"pipeline {pipeline}: {kind} event at {out['at']}", event.get("message") or "",
                                    category=f"the {kind} failed")
    return out


def action_of(pipeline: str, action: dict) -> dict:
    """An operator action: who, when, what, through which DAG run or a command, the parameters (see
    parameters_of) and the outcome; never the host or OS user it ran from."""
    origin = action.get("origin")
    if not isinstance(origin, dict):
        origin = {}
    via = origin.get("via") if origin.get("via") in ("airflow", "cli") else None
    kind = _safe(action.get("kind"), _NAME) or "action"
    out = {**_event(pipeline, kind, action), "via": via,
           "dag_id": _safe(origin.get("dag_id"), _WORD) if via == "airflow" else None,
           "run_id": _safe(origin.get("run_id"), _RUN_ID) if via == "airflow" else None,
           "parameters": parameters_of(action.get("parameters"))}
    out.pop("metrics")
    return out


def _timeline(pipeline: str, found: dict | None) -> dict | None:
    if found is None:
        return None
    if "error" in found:
        return {"error": public_error(f"pipeline {pipeline}: the ops timeline", found["error"])}
    last = found.get("last_batch")
    if last is not None:
        numbers = _metrics({k: v for k, v in last.items() if k not in ("at", "message", "batch_id")})
        last = {"at": str(last.get("at")), **numbers,
                "summary": f"{numbers.get('records', 0):.0f} records: {numbers.get('rows', 0):.0f} rows, "
                           f"{numbers.get('dead_letters', 0):.0f} dead letters in {numbers.get('seconds', 0):.1f}s"}
    return {
        "last_batch": last,
        "recent": _metrics(found.get("recent")),
        "latest": {kind: _event(pipeline, kind, event) for kind, event in sorted((found.get("latest") or {}).items())
                   if isinstance(kind, str) and _NAME.fullmatch(kind)},
        "actions": [action_of(pipeline, a) for a in found.get("actions") or []],
        "batches": [{"at": str(b.get("at")), "lag_records": _number(b.get("lag_records")),
                     "freshness_s": _number(b.get("freshness_s"))} for b in found.get("batches") or []],
    }


def _layout(found: dict | None) -> dict | None:
    if found is None:
        return None
    return {"in_sync": bool(found["in_sync"]), "refused": [scrub(why) for why in found["refused"]],
            "tables": [{"table": d["table"], "in_sync": d.get("in_sync"), "changes": [scrub(c) for c in d["changes"]]}
                       for d in found["tables"]],
            "applies": found["applies"]}


def _note(pipeline: str, note: str) -> str:
    """A cost note without the error text some end with (its id instead), locations scrubbed."""
    for head in _COST_NOTES_WITH_ERRORS:
        if note.startswith(head + ": "):
            return f"{head} (error {public_error(f'pipeline {pipeline}: cost', note[len(head) + 2:])['id']})"
    if _EXCEPTION_TEXT.search(note) and ": " in note:
        head, _, rest = note.partition(": ")
        return f"{scrub(head)} (error {public_error(f'pipeline {pipeline}: cost', rest)['id']})"
    return scrub(note)


_DAY_FIELDS = ("day", "partial", "produced_records", "produced_bytes", "sampled_records", "kafka_complete",
               "kafka_retained_bytes", "table_bytes", "table_files", "commits", "timeline_commits", "files_written",
               "bytes_written", "manifests_written", "put_requests", "get_requests", "requests_source", "batches",
               "ingest_seconds", "ingest_task_seconds", "maintenance_seconds", "compute_seconds", "price")


def _public_cost(pipeline: str, found: dict) -> dict:
    if "error" in found:
        return {"error": public_error(f"pipeline {pipeline}: cost", found["error"])}
    return {"priced": bool(found["priced"]), "prices": found["prices"], "retention_ms": found["retention_ms"],
            "retention_source": found["retention_source"], "replication_factor": found["replication_factor"],
            "days": [{k: d.get(k) for k in _DAY_FIELDS} for d in found["days"]],
            "totals": _metrics(found["totals"], limit=100), "notes": [_note(pipeline, n) for n in found["notes"]]}


def public(found: dict) -> dict:
    """What a browser may receive of `overview(spec)` (see the module doc): aggregates, states, positions,
    counts, the SLOs, the DAGs and who acted, field by field; errors as {"category", "id"}."""
    name = found["pipeline"]
    kafka = found.get("kafka") or {}
    kafka_error = (public_error(f"pipeline {name}: Kafka", kafka["error"], kafka.get("error_type"))
                   if "error" in kafka else None)
    tables = [{"table": t["table"], "role": t["role"], "exists": bool(t["exists"]), "rows": t["rows"],
               "snapshots": t["snapshots"], "current_snapshot_id": t["current_snapshot_id"],
               "recovery_snapshot_id": t["recovery_snapshot_id"], "positions": dict(t["positions"]),
               "last_commit_at": t["last_commit_at"], "max_event_time": t["max_event_time"],
               "lost": scrub(t["lost"]) if t.get("lost") else None} for t in found["tables"]]
    partitions = [{k: _number(p.get(k)) for k in ("partition", "earliest", "end", "committed", "lag", "lag_s")}
                  for p in kafka.get("partitions", [])]
    hist = found["history"]
    return {
        "pipeline": name, "topic": found["topic"], "mode": found["mode"], "committed": bool(found["committed"]),
        **{k: _number(found.get(k)) for k in ("rows", "dead_letters", "lag_records", "lag_s", "freshness_s",
                                              "seconds_since_commit", "snapshot_id")},
        "last_commit_at": found.get("last_commit_at"), "newest_event_time": found.get("newest_event_time"),
        "positions": {str(p): _number(o) for p, o in found["positions"].items()},
        "tables": tables,
        "kafka": None if not kafka else {"error": kafka_error} if kafka_error else
        {"topic_id": str(kafka.get("topic_id")), "partitions": partitions},
        "kafka_error": kafka_error,
        "quality": _event(name, "quality", found.get("quality")),
        "timeline": _timeline(name, found.get("timeline")),
        "layout": _layout(found.get("layout")),
        "history": {"source": hist["source"],
                    "points": [{k: p[k] for k in ("at", "snapshot_id", "committed", "freshness_s", "lag_records")
                                if k in p} for p in hist["points"]]},
        "dags": list(found["dags"]), "slo": dict(found["slo"]),
        "cost": _public_cost(name, found["cost"]),
    }
