"""The "Lakehouse pipelines" page inside the Airflow 3 UI: one card per pipeline, behind Airflow's login.

Airflow mounts `app` (FastAPI) under /lakehouse on its API server and shows the page
in its navigation (Browse > Lakehouse pipelines, embedded at /plugin/lakehouse). The plugin
(`LakehouseUIPlugin`) registers itself wherever the provider is installed, through the provider's
entry point `airflow.plugins`; the cards are those of the configured pipelines folder
(lakehouse_airflow.locations), read again at each rescan:

    GET /lakehouse/                 HTML: lag, freshness, last commit, quality, the last exactly-once
                                    verification, dead letters, the newest event of each kind (with
                                    who acted), the recent operator actions (who, when, through which
                                    DAG run, the parameters, the outcome), layout drift between spec and
                                    tables, a lag/freshness chart, the cost panel (per day), links to each
                                    pipeline's DAGs and the trace forms: one record by partition and
                                    offset, or every record of a Kafka key in a time window
    GET /lakehouse/api/pipelines    the same cards as JSON
    GET /lakehouse/trace?pipeline=P&partition=N&offset=O    HTML: where that record is (lakehouse.audit.trace)
    GET /lakehouse/trace?pipeline=P&key=K&since=T[&until=T]  HTML: every record of Kafka key K in that window
    GET /lakehouse/api/trace?...    the same as JSON (the rows of the tables holding the records included)

Access. Airflow 3 does not authenticate plugin FastAPI apps (a mounted app inherits none of the API
server's route dependencies), so every endpoint here does it itself with Airflow's own `get_user`
(airflow.api_fastapi.core_api.security, through `signed_in_user`): the JWT from an `Authorization:
Bearer` header (API clients: a token from POST /auth/token) or from the `_token` cookie the Airflow UI
sets at login (the page embedded in the UI, and its forms). No token answers 401 (the HTML pages say
where to sign in), a token the auth manager rejects 403. Then the auth manager decides what the user
sees (`batch_is_authorized_dag`, GET):

- a pipeline's card, and its traces, only when the user may read every DAG of the pipeline
  (<pipeline>_ingest, _maintenance, ...; `history.pipeline_dags`); a trace of another pipeline is 403
  naming them, and a user who may read no pipeline gets a page (or list) without cards, not an error;
- a spec file that does not load, or a pipelines folder that cannot be read, only when the user may
  read DAGs without naming one (the auth manager's answer for all DAGs: Admin and Viewer roles of the
  simple auth manager, the global DAG permission of FAB's). Such a file generates no DAGs, so there
  is no pipeline whose readers it belongs to, and the name it declares is whatever the file says:
  a file claiming another pipeline's name must not reach that pipeline's readers as if it were theirs.

What a browser receives. The cards carry aggregates, states, positions, counts, the SLOs and who
acted (`lakehouse.ops.history.public`): never a row value or a Kafka key (quality events' offending
values, verifications' problems, free-text event messages that quote them), never an action's host,
OS user or a parameter value that could hold data, never a filesystem path or URI (the spec file is
named by its file name), never an exception's text: an error is a short category of its type and a
stable id (`history.public_error`), and the API server's log has the full text under that id. The
trace endpoints answer a refused value with 400 and the reason, a trace the pipeline cannot answer
with 422 and the platform's explanation (locations scrubbed: an unknown pipeline or partition, Kafka
unreachable, a window holding more than PAGE_MAX_KEY_SCAN = 1,000,000 records in Kafka), anything
else with 500, a category and an id. The trace forms' values are checked before anything is read: a
pipeline name; a partition and an offset that are whole numbers from 0; or a key (1 to 65,536
characters) with `since` and optionally `until`, each an ISO-8601 time or a duration ago (`2h`),
`until` later than `since` (empty: now).

Off the request path. The API server runs sync handlers on one shared pool of 40 threads, which also
serves the Execution API that running tasks send their heartbeats to; an overview waits on Kafka
(10-15 s timeouts when it does not answer), the catalog and the ops timeline. So the page and
/api/pipelines are `async` and only read `lakehouse.ops.overview_cache` (one background thread
refreshes one pipeline at a time; a pipeline not read yet shows "loading", each card says when it was
read). Asking the auth manager what a user may see (it may query the metadata DB) and rendering the
answer run on PAGE_THREADS threads of the page's own, and traces, which read Kafka and the tables for as
long as they take, on TRACE_THREADS of their own: no number of page loads or traces takes a thread of
the shared pool, or blocks the event loop.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Annotated

import anyio
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from lakehouse.core.errors import LakehouseError, TraceError
from lakehouse.core.spec import IDENTIFIER, PipelineSpec, load_pipeline, parse_moment
from lakehouse.ingest.receipts import STAGES
from lakehouse.ops import history
from lakehouse.ops.cost import human_bytes
from lakehouse.ops.overview_cache import REFRESH_S, Card, OverviewCache
from lakehouse.ops.status import format_age
from lakehouse_airflow import locations

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.batch_apis import IsAuthorizedDagRequest

app = FastAPI(title="Lakehouse pipelines", description="Lag, freshness, commits, quality and dead letters")

# every card of the configured pipelines folder (read again at each rescan), refreshed in the background
CACHE = OverviewCache(locations.PIPELINES)
PAGE_THREADS = 4  # threads of the page's own: they ask the auth manager what a user may see and render it
TRACE_THREADS = 4  # traces under way at once, each on a thread of the traces' own
_page_threads = anyio.CapacityLimiter(PAGE_THREADS)
_trace_threads = anyio.CapacityLimiter(TRACE_THREADS)
STARTING = "the pipelines page is starting: the pipeline specs are being read; try again in a few seconds"


def _teams(dags: list[str]) -> dict[str, str | None]:
    """The team of each DAG in multi-team mode (the auth manager decides per team), else nothing."""
    from airflow.configuration import conf

    if not dags or not conf.getboolean("core", "multi_team", fallback=False):
        return {}
    from airflow.models.dag import DagModel

    return DagModel.get_dag_id_to_team_name_mapping(dags)


def _dags_refusal(pipeline: str, dags: tuple[str, ...], user: BaseUser, teams: dict[str, str | None]) -> str | None:
    """Why `user` may not read pipeline `pipeline` (None when they may): the auth manager must allow them
    to read (GET) every one of its DAGs."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    requests: list[IsAuthorizedDagRequest] = [{"method": "GET", "details": DagDetails(id=d, team_name=teams.get(d))}
                                              for d in dags]
    if dags and get_auth_manager().batch_is_authorized_dag(requests, user=user):
        return None
    return (f"user {user.get_name()!r} may not read the DAGs of pipeline {pipeline!r} ({', '.join(dags)}), "
            f"so not its tables' rows either")


def _refusal(spec: PipelineSpec, user: BaseUser) -> str | None:
    """Why `user` may not read the traces of `spec` (None when they may); see _dags_refusal."""
    dags = history.pipeline_dags(spec)
    return _dags_refusal(spec.name, dags, user, _teams(list(dags)))


def _readable(cards: list[Card], user: BaseUser) -> tuple[list[Card], bool]:
    """(the cards `user` may see, whether they may read every DAG): a pipeline's card when they may read all
    its DAGs, a broken file's only when they may read DAGs without naming one (see the module doc)."""
    from airflow.api_fastapi.app import get_auth_manager

    every = bool(get_auth_manager().is_authorized_dag(method="GET", user=user))
    teams = _teams([d for card in cards for d in card.dags])
    shown = [card for card in cards
             if (every if card.state == "broken" else _dags_refusal(card.pipeline, card.dags, user, teams) is None)]
    return shown, every


_bearer = HTTPBearer(auto_error=False)


async def signed_in_user(request: Request,
                         bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> BaseUser:
    """The caller as Airflow's own `get_user` finds it (a Bearer token, else the UI's `_token` cookie; 401 or
    403 otherwise). Airflow's security module is imported here, at the first request, not with the plugin:
    importing it costs 0.6 s, which every process that loads plugins (task runners too) would pay."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)


UserDep = Annotated[BaseUser, Depends(signed_in_user)]


def cards_json(user: BaseUser) -> tuple[int, dict | list]:
    """(HTTP status, body) of /api/pipelines: the cards `user` may see (lakehouse.ops.overview_cache.Card.to_json),
    from the cache only; 503 while the pipeline specs have not been read yet."""
    ready, cards, _ = CACHE.cards()
    if not ready:
        return 503, {"error": STARTING}
    shown, _ = _readable(cards, user)
    now = datetime.now(UTC)
    return 200, [card.to_json(now) for card in shown]


def cards_page(user: BaseUser) -> str:
    """The cards `user` may see as a page, from the cache only."""
    ready, cards, folder_error = CACHE.cards()
    shown, every = _readable(cards, user)
    return render_page(shown, datetime.now(UTC), ready, folder_error if every else None)


@app.get("/api/pipelines")
async def pipelines_json(user: UserDep) -> JSONResponse:
    """See cards_json; on a thread of the page's own (see the module doc)."""
    status, body = await anyio.to_thread.run_sync(cards_json, user, limiter=_page_threads)
    return JSONResponse(body, status_code=status, headers={"Retry-After": "5"} if status == 503 else None)


@app.get("/", response_class=HTMLResponse)
async def pipelines_page(user: UserDep) -> HTMLResponse:
    """See cards_page; on a thread of the page's own (see the module doc)."""
    return HTMLResponse(await anyio.to_thread.run_sync(cards_page, user, limiter=_page_threads))


PAGE_MAX_KEY_SCAN = 1_000_000  # Kafka records a key trace from the page reads at most (the CLI: MAX_KEY_SCAN)


def _number(text: str, name: str, maximum: int) -> int:
    """A form's whole number (ASCII digits); its range is trace_request's to check."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise ValueError(f"{name} must be a whole number from 0 to {maximum}, got {text[:40]!r}")
    return int(text)


def _trace(user: BaseUser, pipeline: str, partition: str | None, offset: str | None, key: str | None = None,
           since: str | None = None, until: str | None = None) -> tuple[int, dict]:
    """(HTTP status, body) of one record's trace (partition and offset) or one key's (key, since, until):
    200 and the trace, 400 for a refused value (the request as lakehouse.audit.trace.trace_request checks
    it, as `lakehouse trace` does), 403 when `user` may not read the pipeline's DAGs, 422 when the pipeline
    cannot answer (an unknown pipeline or partition, Kafka unreachable, a window too large; the platform's
    explanation, locations scrubbed), 500 for anything else, as a category and an error id."""
    from lakehouse.audit.trace import MAX_OFFSET, MAX_PARTITION, trace_key, trace_record, trace_request

    try:
        if not IDENTIFIER.fullmatch(pipeline):
            raise ValueError(f"{pipeline[:60]!r} is not a pipeline name")
        now = datetime.now(UTC)
        asked = trace_request(None if partition is None else _number(partition, "partition", MAX_PARTITION),
                              None if offset is None else _number(offset, "offset", MAX_OFFSET), key,
                              parse_moment(since, now) if since else None, parse_moment(until, now) if until else None,
                              now)

        def answer(spec: PipelineSpec) -> dict:
            if asked.partition is not None and asked.offset is not None:
                return trace_record(spec, asked.partition, asked.offset).to_json()
            assert asked.key is not None and asked.since is not None  # trace_request: else a key and its window
            return trace_key(spec, asked.key, asked.since, asked.until, max_scan=PAGE_MAX_KEY_SCAN).to_json()
    except (ValueError, TraceError) as exc:
        return 400, {"pipeline": pipeline[:128], "error": str(exc)}
    try:
        spec = load_pipeline(pipeline, locations.pipelines_dir())
        refused = _refusal(spec, user)
        if refused:
            return 403, {"pipeline": pipeline, "error": refused}
        return 200, answer(spec)
    except LakehouseError as exc:
        return 422, {"pipeline": pipeline, "error": history.scrub(exc, limit=2000)}
    except Exception as exc:  # noqa: BLE001 - a page answers with what failed, not a bare 500
        error = history.public_error(f"trace of pipeline {pipeline}", exc)
        return 500, {"pipeline": pipeline, "error": f"{error['category']} (error {error['id']}: the API server's "
                                                    f"log has the full text)", "error_id": error["id"]}


async def _traced(user: BaseUser, pipeline: str, *asked: str | None) -> tuple[int, dict]:
    """_trace on a thread of the traces' own pool (see the module doc)."""
    return await anyio.to_thread.run_sync(partial(_trace, user, pipeline, *asked), limiter=_trace_threads)


@app.get("/api/trace")
async def trace_json(user: UserDep, pipeline: str = "", partition: str | None = None, offset: str | None = None,
                     key: str | None = None, since: str | None = None, until: str | None = None) -> JSONResponse:
    """Where one record is (lakehouse.audit.trace.trace_record), or every record of a key in a window
    (trace_key), or {"error"} with 400/401/403/422/500."""
    status, body = await _traced(user, pipeline, partition, offset, key, since, until)
    return JSONResponse(body, status_code=status)


@app.get("/trace", response_class=HTMLResponse)
async def trace_page(user: UserDep, pipeline: str = "", partition: str | None = None, offset: str | None = None,
                     key: str | None = None, since: str | None = None, until: str | None = None) -> HTMLResponse:
    """The trace forms' answer as a page."""
    status, body = await _traced(user, pipeline, partition, offset, key, since, until)
    return HTMLResponse(_trace_page(body), status_code=status)


@app.exception_handler(HTTPException)
async def _refused(request: Request, exc: HTTPException):
    """A login refused (Airflow's get_user: 401 without a token, 403 for one the auth manager rejects): the
    pages say so and where to sign in, the JSON endpoints answer {"error"}; anything else as FastAPI does."""
    path = request.url.path
    if exc.status_code not in (401, 403):
        return await http_exception_handler(request, exc)
    if "/api/" in path:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)
    try:
        from airflow.api_fastapi.app import get_auth_manager

        login = get_auth_manager().get_url_login(next_url=str(request.url))
    except Exception:  # noqa: BLE001 - no auth manager to ask (outside the API server): the UI's root signs in
        login = "../"
    what = "trace records (their rows may hold personal data)" if path.endswith("/trace") else "see the pipelines"
    body = {"error": f"{exc.detail}: sign in to Airflow to {what}", "login": login,
            "title": "Trace" if path.endswith("/trace") else "Lakehouse pipelines"}
    return HTMLResponse(_trace_page(body), status_code=exc.status_code, headers=exc.headers)


# ---------------------------------------------------------------------------- rendering

def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _field(name: str, text: object, cls: str = "") -> str:
    return f'<span data-field="{_e(name)}" class="{cls}">{_e(text)}</span>'


def _chart(title: str, points: list[dict], key: str, limit: float | None, unit: str) -> str:
    """An inline SVG line chart of points[key] over time, with the SLO as a dashed line."""
    values = [(datetime.fromisoformat(p["at"]).timestamp(), p[key]) for p in points if p.get(key) is not None]
    width, height, pad = 360, 90, 4
    if len(values) < 2:
        return (f'<figure class="chart"><figcaption>{_e(title)}</figcaption>'
                f'<div class="nodata">{"one point so far" if values else "no points yet"}</div></figure>')
    t0, t1 = values[0][0], values[-1][0]
    top = max(max(v for _, v in values), limit or 0) or 1

    def xy(t: float, v: float) -> str:
        x = pad + (width - 2 * pad) * ((t - t0) / (t1 - t0) if t1 > t0 else 0)
        return f"{x:.1f},{height - pad - (height - 2 * pad) * v / top:.1f}"
    line = " ".join(xy(t, v) for t, v in values)
    slo = ""
    if limit is not None and limit <= top:
        y = height - pad - (height - 2 * pad) * limit / top
        slo = (f'<line x1="{pad}" x2="{width - pad}" y1="{y:.1f}" y2="{y:.1f}" class="slo">'
               f'<title>SLO {limit:g}{unit}</title></line>')
    latest = values[-1][1]
    return (f'<figure class="chart"><figcaption>{_e(title)}: latest {latest:g}{unit}, max {top:g}{unit}</figcaption>'
            f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{_e(title)}"><rect width="{width}" height="{height}" class="bg"/>{slo}'
            f'<polyline points="{line}" class="series"/></svg></figure>')


def _when(at: object) -> str:
    try:
        return datetime.fromisoformat(str(at)).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return str(at)


def _error(error: dict, name: str = "error") -> str:
    """An error as the page shows it: its category and its id (the API server's log has the full text)."""
    return (f'<span class="error" data-field="{_e(name)}">{_e(error["category"])}</span> '
            f'<span class="muted">(error <span data-field="{_e(name)}_id">{_e(error["id"])}</span>: the API '
            f"server's log has the full text)</span>")


def _numbers(metrics: dict, names: dict[str, str]) -> str:
    """`metrics` named in `names` (metric -> words after the number), in that order, as `12 rows, 3 ...`."""
    return ", ".join(f"{metrics[m]:g} {words}" for m, words in names.items() if m in metrics)


def _outcome(event: dict, names: dict[str, str], prefix: str) -> str:
    """An event's status, its numbers and when; a failed one's error id."""
    numbers = _numbers(event["metrics"], names) if names else ", ".join(
        f"{k} {v:g}" for k, v in list(event["metrics"].items())[:6])
    failed = f' {_error(event["error"], f"{prefix}_error")}' if event.get("error") else ""
    return (_field(prefix, event["status"], f"status-{_e(event['status'])}")
            + (f' <span class="muted" data-field="{prefix}_numbers">{_e(numbers)}</span>' if numbers else "")
            + failed + f' <span class="muted">({_e(_when(event["at"]))})</span>')


QUALITY_NUMBERS = {"rows": "rows audited", "failed_expectations": "failed expectations",
                   "unexpected_count": "unexpected values"}
VERIFY_NUMBERS = {"offsets": "offsets", "rows": "rows", "keys": "keys checked", "missing": "missing",
                  "duplicated": "duplicated", "foreign": "foreign", "gaps": "gaps"}


def _quality(event: dict | None) -> str:
    if event is None:
        return _field("quality", "none yet", "muted")
    return _outcome(event, QUALITY_NUMBERS, "quality")


def _verification(event: dict | None) -> str:
    """The newest `verify` event: status, its counts and when; what to run when none yet."""
    if event is None:
        return _field("verification", "none yet", "muted") + ' <span class="muted">(run the verify DAG or ' \
                                                              '`lakehouse verify --pipeline NAME`)</span>'
    known = set(VERIFY_NUMBERS) | {"seconds", "offsets_per_s"}
    problems = {k: f"{k}" for k, v in event["metrics"].items() if k not in known and v}
    return _outcome(event, {**VERIFY_NUMBERS, **problems}, "verification")


def _trace_form(name: str) -> str:
    """Two forms side by side: one record by partition and offset, every record of a key in a time window."""
    from lakehouse.audit.trace import MAX_KEY_CHARS, MAX_PARTITION

    pipeline = f'<input type="hidden" name="pipeline" value="{_e(name)}">'
    return (f'<form class="trace" action="trace" method="get" data-field="trace_form">{pipeline}'
            f'partition <input name="partition" type="number" min="0" max="{MAX_PARTITION}" required> '
            f'offset <input name="offset" type="number" min="0" required> <button type="submit">Trace</button></form>'
            f'<form class="trace" action="trace" method="get" data-field="trace_key_form">{pipeline}'
            f'key <input name="key" required maxlength="{MAX_KEY_CHARS}"> '
            f'since <input name="since" value="24h" required title="an ISO-8601 time or a duration ago (30m, 2h, 7d)"> '
            f'until <input name="until" placeholder="now" title="an ISO-8601 time or a duration ago; empty: now"> '
            f'<button type="submit">Trace key</button></form>')


def _record(body: dict) -> str:
    """One record's trace: the verdict and why, the rows holding it (a dead letter's reason) and the commits
    that added them, and Kafka's offsets when it was asked."""
    rows = []
    for s in body["sightings"]:
        commits = ", ".join(f'snapshot {_field("commit_snapshot", c["snapshot_id"])} ({_e(c["kind"])}) at {_e(c["at"])}'
                            for c in s["commits"]) or '<span class="muted">no commit of the pipeline holds it</span>'
        if s["role"] == "dead-letter":
            why = f'{s["row"].get("error_kind")}: {s["row"].get("error_detail")}'
            commits += f'<br>{_field("dead_letter_reason", why)}'
        rows.append(f'<tr><td>{_e(s["role"])}</td><td>{_e(s["table"])}</td><td>{commits}</td></tr>')
    kafka = body.get("kafka")
    return (f'<p><span data-field="verdict" class="verdict">{_e(body["verdict"])}</span>: '
            f'<span data-field="message">{_e(body["message"])}</span></p>'
            + (f'<table><tr><th>role</th><th>table</th><th>added by</th></tr>{"".join(rows)}</table>' if rows else "")
            + (f'<p class="muted" data-field="kafka">partition {_e(body["partition"])}: earliest '
               f'{_e(kafka["earliest"])}, committed {_e(kafka["committed"])}, log end {_e(kafka["end"])}, '
               f'lag {_e(kafka["lag"])}</p>' if kafka else ""))


def _trace_page(body: dict) -> str:
    """A trace's answer: one record's (see _record), a key's (each record found, with its coordinates), or
    the error (with where to sign in when the login was refused)."""
    if "error" in body:
        title = body.get("title", "Trace")
        content = f'<p class="error" data-field="error">{_e(body["error"])}</p>'
        if body.get("login"):
            content += f'<p><a data-field="login" href="{_e(body["login"])}" target="_top">Sign in to Airflow</a></p>'
    elif "records" in body:
        title = f'Trace key {body["key"][:80]!r}'
        found = "".join(f'<div class="record" data-record="{_e(r["partition"])}@{_e(r["offset"])}">'
                        f'<h2>{_e(r["topic"])}[{_e(r["partition"])}]@{_e(r["offset"])}</h2>{_record(r)}</div>'
                        for r in body["records"])
        content = (f'<p>{_field("records_found", len(body["records"]))} record(s) of key '
                   f'{_field("key", body["key"])} from {_e(body["since"])} to {_e(body["until"])} '
                   f'<span class="muted">({_field("scanned", body["scanned"])} Kafka records read, '
                   f'{body["seconds"]:.1f} s)</span></p>' + found)
    else:
        title = f'Trace {body["topic"]}[{body["partition"]}]@{body["offset"]}'
        content = _record(body)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title><style>{STYLE}</style></head>
<body><h1>{_e(title)} <small>{_e(body.get("pipeline", ""))}</small></h1>
<section class="card">{content}</section><p><a href="./">All pipelines</a></p></body></html>"""


def _timeline(timeline: dict) -> str:
    """The last batch with its stage seconds, throughput over the last minutes, the newest other events."""
    if "error" in timeline:
        return _error(timeline["error"], "timeline_error")
    last = timeline.get("last_batch")
    if last is None:  # a writer that never committed: its other events (a retention alert) still show
        rows = [_field("last_batch", "no batch events yet", "muted")]
    else:
        stages = ", ".join(f"{stage} {last[f'{stage}_s']:.2f}s" for stage in STAGES if f"{stage}_s" in last)
        recent = timeline["recent"]
        count = {k: f"{recent.get(k, 0):g}" for k in ("batches", "records_per_s", "dead_letters", "commit_retries")}
        rows = [f'last batch: {_field("last_batch", last["summary"])} <span class="muted">({_e(stages)})</span>',
                f'last {recent.get("window_s", 0) / 60:.0f} min: {_field("batches", count["batches"])} batches, '
                f'{_field("records_per_s", count["records_per_s"])} records/s, '
                f'{_field("recent_dead_letters", count["dead_letters"])} dead letters, '
                f'{_field("commit_retries", count["commit_retries"])} commit retries']
    for kind, event in timeline["latest"].items():
        by = f' by {_field(f"latest_{kind}_actor", event["actor"])}' if event.get("actor") else ""
        rows.append(f'{_e(kind)}: {_outcome(event, {}, f"latest_{kind}")}{by}')
    return "<br>".join(rows)


def _actions(timeline: dict) -> str:
    """The newest operator actions people took: when, what, who (and through which DAG run), the parameters
    (values the page may not show say `withheld`), the outcome."""
    if "error" in timeline:
        return '<span class="muted">the timeline cannot be read (see above)</span>'
    actions = timeline.get("actions") or []
    if not actions:
        return '<span class="muted">none in the last 7 days</span>'
    rows = []
    for action in actions:
        via = (f'Airflow run {action.get("dag_id")}/{action.get("run_id")}' if action.get("via") == "airflow"
               else "a command" if action.get("via") == "cli" else "unknown origin")
        parameters = ", ".join(f"{k}={v}" for k, v in action["parameters"].items()) or "no parameters"
        failed = f' {_error(action["error"], "action_error")}' if action.get("error") else ""
        rows.append(f'<li data-kind="{_e(action["kind"])}">{_e(_when(action["at"]))} {_e(action["kind"])} by '
                    f'{_field("action_actor", action["actor"] or "?")} <span class="muted">({_e(via)})</span>: '
                    f'{_field("action_status", action["status"], "status-" + _e(action["status"]))}{failed} '
                    f'<span class="muted" data-field="action_parameters">{_e(parameters)}</span></li>')
    return f'<ul class="actions">{"".join(rows)}</ul>'


def _layout(found: dict | None) -> str:
    """Drift between the spec and its tables: in sync, what the job applies at its next start or spec
    reload, or what it refuses (and stops on)."""
    if found is None:
        return _field("layout", "unknown", "muted")
    if found["in_sync"]:
        return _field("layout", "follows the spec", "ok")
    rows = [_field("layout", "refused" if found["refused"] else "drift", "bad" if found["refused"] else "")]
    rows += [f'<span class="error" data-field="layout_refused">{_e(why)}</span>' for why in found["refused"]]
    for drift in found["tables"]:
        changes = [c for c in drift["changes"] if c not in found["refused"]]
        if changes:
            rows.append(f'{_e(drift["table"])}: <span data-field="layout_changes">{_e("; ".join(changes))}</span> '
                        f'<span class="muted">(applied {_e(found["applies"])})</span>')
    return "<br>".join(rows)


def _cost(found: dict) -> str:
    """The cost panel: one row per day of what the pipeline used, priced when unit prices are set."""
    if "error" in found:
        return _error(found["error"], "cost_error")
    priced = found["priced"]
    head: tuple[str, ...] = ("day", "produced", "Kafka retains", "tables", "files", "PUT", "GET", "ingest s",
                             "maintenance s")
    head += (f'price {found["prices"]["currency"]}'.strip(),) if priced else ()
    rows = []
    for d in found["days"]:
        cells = [(d["day"] + (" (so far)" if d["partial"] else ""), "day"),
                 (human_bytes(d["produced_bytes"]), "produced_bytes"),
                 (human_bytes(d["kafka_retained_bytes"]), "kafka_retained_bytes"),
                 (human_bytes(d["table_bytes"]), "table_bytes"), (d["table_files"], "table_files"),
                 (d["put_requests"], "put_requests"), (d["get_requests"], "get_requests"),
                 (f'{d["ingest_seconds"]:.1f}', "ingest_seconds"),
                 (f'{d["maintenance_seconds"]:.1f}', "maintenance_seconds")]
        if priced:
            cells.append((f'{(d["price"] or {}).get("total", 0.0):.4f}', "price"))
        day = d["day"]
        rows.append("<tr>" + "".join(f'<td>{_field(f"cost_{day}_{name}", "-" if v is None else v)}</td>'
                                     for v, name in cells) + "</tr>")
    note = "" if priced else '<p class="muted">no unit prices set (LAKEHOUSE_PRICE_*): quantities only</p>'
    notes = "".join(f'<p class="muted" data-field="cost_note">{_e(n)}</p>' for n in found["notes"])
    return (f'<table class="cost"><tr>{"".join(f"<th>{_e(h)}</th>" for h in head)}</tr>{"".join(rows)}</table>'
            f"{note}{notes}")


def _read(card: Card, now: datetime) -> str:
    if card.read_at is None:
        return ""
    age = format_age(max(0.0, (now - card.read_at).total_seconds()))
    return f' <span class="muted read">read {_field("read_age", age)} ago</span>'


def render_card(card: Card, now: datetime) -> str:
    name = card.pipeline
    head = (f'<section class="card{" broken" if card.error else ""}" data-pipeline="{_e(name)}" '
            f'data-state="{_e(card.state)}">')
    if card.state == "loading":
        return (f'{head}<h2>{_e(name)}</h2><p>{_field("state", "loading", "muted")}<span class="muted">: the '
                f'first read of this pipeline is under way (one pipeline at a time, in the background); this '
                f'page reloads itself</span></p></section>')
    if card.state in ("broken", "error"):
        assert card.error is not None  # a card in either state holds its error (Card)
        if card.state == "broken":
            return (f'{head}<h2>{_e(name)} <small>{_field("file", card.file)}</small>{_read(card, now)}</h2>'
                    f'<p>{_error(card.error)}</p><p class="muted">`lakehouse pipelines` validates the specs and '
                    f'says why this file does not load</p></section>')
        return (f'{head}<h2>{_e(name)}{_read(card, now)}</h2><p>reading it failed: {_error(card.error)}</p>'
                f'</section>')
    entry = card.overview
    assert entry is not None  # a card in state "ok" holds its overview (Card)
    slo = entry["slo"]
    lag = entry["lag_records"]
    lag_text = "?" if lag is None else lag
    lag_cls = "" if lag is None else ("bad" if lag > slo["lag_records"] else "ok")
    fresh = entry["freshness_s"]
    fresh_cls = "" if fresh is None else ("bad" if fresh > slo["freshness_s"] else "ok")
    if entry["committed"]:
        commit = (_field("last_commit_at", _when(entry["last_commit_at"])) + " ("
                  + format_age(entry["seconds_since_commit"]) + " ago), snapshot "
                  + _field("snapshot_id", entry["snapshot_id"]))
        positions = ", ".join(f'p{p}: {_field(f"position_{p}", o)}' for p, o in entry["positions"].items())
    else:
        commit = _field("last_commit_at", "no commits yet", "muted")
        positions = '<span class="muted">-</span>'
    kafka = _error(entry["kafka_error"], "kafka_error") if entry["kafka_error"] else ""
    hist = entry["history"]
    charts = (_chart("freshness at commit", hist["points"], "freshness_s", slo["freshness_s"], " s")
              + (_chart("lag", hist["points"], "lag_records", slo["lag_records"], " records")
                 if hist["source"] == "events" else
                 _chart("committed offsets", hist["points"], "committed", None, "")))
    dags = " ".join(f'<a href="../dags/{_e(d)}" target="_top">{_e(d)}</a>' for d in entry["dags"])
    timeline = entry["timeline"] or {"latest": {}}
    tables = ", ".join(_e(t["table"]) for t in entry["tables"])
    commit_age = _field("commit_age", format_age(entry["seconds_since_commit"]))
    return f"""{head}
<h2>{_e(name)} <small>{_e(entry["topic"])} &rarr; {tables}</small>{_read(card, now)}</h2>
<table>
<tr><th>Kafka lag</th><td class="{lag_cls}">{_field("lag_records", lag_text)} records,
  {_field("lag_s", format_age(entry["lag_s"]))} behind
  (SLO {slo["lag_records"]} records / {format_age(slo["lag_s"])}) {kafka}</td></tr>
<tr><th>Freshness</th><td class="{fresh_cls}">newest event {_field("freshness", format_age(fresh))} old,
  last commit {commit_age} ago (SLO {format_age(slo["freshness_s"])})</td></tr>
<tr><th>Last commit</th><td>{commit}</td></tr>
<tr><th>Committed positions</th><td>{positions}</td></tr>
<tr><th>Rows</th><td>{_field("rows", entry["rows"])}</td></tr>
<tr><th>Dead letters</th><td>{_field("dead_letters", entry["dead_letters"])} rows</td></tr>
<tr><th>Last quality check</th><td>{_quality(entry["quality"])}</td></tr>
<tr><th>Exactly once</th><td>{_verification(timeline.get("latest", {}).get("verify"))}</td></tr>
<tr><th>Trace records</th><td>{_trace_form(name)}</td></tr>
<tr><th>Timeline</th><td class="timeline">{_timeline(timeline)}</td></tr>
<tr><th>Operator actions</th><td class="operator-actions">{_actions(timeline)}</td></tr>
<tr><th>Layout</th><td class="layout">{_layout(entry.get("layout"))}</td></tr>
<tr><th>DAGs</th><td class="dags">{dags}</td></tr>
</table>
<div class="charts" data-history-source="{_e(hist["source"])}">{charts}</div>
<details class="cost-panel" open><summary>Cost per day (UTC)</summary>{_cost(entry["cost"])}</details>
</section>"""


STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#1f2933;background:#f7f9fb}
h1{font-size:20px;margin:0 0 4px} .sub{color:#616e7c;margin:0 0 16px}
.card{background:#fff;border:1px solid #d9e2ec;border-radius:8px;padding:12px 16px;margin:0 0 16px}
.card h2{font-size:17px;margin:0 0 8px} .card h2 small{font-weight:normal;color:#616e7c;font-size:13px}
table{border-collapse:collapse;font-size:14px}
th{text-align:left;color:#52606d;font-weight:600;padding:3px 16px 3px 0;vertical-align:top}
td{padding:3px 0} .ok{color:#0b7a3b} .bad{color:#c0392b;font-weight:600} .muted{color:#7b8794}
.error{color:#c0392b;font-family:monospace;white-space:pre-wrap} .broken{border-color:#e5a19a}
.status-ok{color:#0b7a3b;font-weight:600} .status-failed{color:#c0392b;font-weight:600}
.status-warn{color:#b7791f;font-weight:600}
.dags a{margin-right:10px} .actions{margin:0;padding-left:18px}
.trace{display:inline-block;margin:0 18px 4px 0} .trace input{width:8em}
.record h2{font-size:15px;margin:10px 0 2px} .verdict{font-weight:600}
.charts{display:flex;gap:24px;flex-wrap:wrap;margin-top:8px}
.chart{margin:0} .chart figcaption{font-size:12px;color:#52606d} .bg{fill:#f0f4f8}
.series{fill:none;stroke:#2563eb;stroke-width:2} .slo{stroke:#c0392b;stroke-dasharray:4 3}
.cost-panel{margin-top:8px} .cost-panel summary{font-size:14px;color:#52606d;font-weight:600;cursor:pointer}
.cost th,.cost td{padding:2px 12px 2px 0;font-size:13px;text-align:right}
.cost th:first-child,.cost td:first-child{text-align:left}
.nodata{width:360px;height:90px;background:#f0f4f8;color:#7b8794;font-size:12px;display:flex;align-items:center;justify-content:center}
"""


def render_page(cards: list[Card], now: datetime, ready: bool = True, folder_error: dict | None = None) -> str:
    """The cards a user may see; while the specs have not been read yet, a note that reloads sooner."""
    if not ready:
        cards_html, reload = f'<p class="muted" data-field="starting">{_e(STARTING)}</p>', 3
    else:
        cards_html = "\n".join(render_card(c, now) for c in cards) or (
            '<p class="muted" data-field="no_pipelines">No pipeline to show: no spec declares one, or your '
            'Airflow user may not read the DAGs of any.</p>')
        reload = int(REFRESH_S)
    folder = (f'<p>the pipelines folder cannot be read: {_error(folder_error, "folder_error")}</p>'
              if folder_error else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Lakehouse pipelines</title>
<meta http-equiv="refresh" content="{reload}"><style>{STYLE}</style></head>
<body><h1>Lakehouse pipelines</h1>
<p class="sub">Shown at {_e(now.strftime("%Y-%m-%d %H:%M:%S UTC"))}: each card as read in the background (every
{REFRESH_S:.0f} s at most, one pipeline at a time; it says when); this page reloads every {reload} s.
<a href="api/pipelines">JSON</a></p>
{folder}{cards_html}
</body></html>"""


class LakehouseUIPlugin(AirflowPlugin):
    """Registers the page (FastAPI app under /lakehouse) and its entry in Airflow's navigation."""

    name = "lakehouse_ui"
    fastapi_apps = [{"app": app, "url_prefix": "/lakehouse", "name": "Lakehouse pipelines"}]
    external_views = [{"name": "Lakehouse pipelines", "href": "lakehouse/", "url_route": "lakehouse",
                       "destination": "nav", "category": "browse"}]
