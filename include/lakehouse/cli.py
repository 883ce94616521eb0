# PYTHON_ARGCOMPLETE_OK  (argcomplete: `eval "$(register-python-argcomplete lakehouse)"` completes this CLI)
"""`lakehouse`: the platform's command line.

    lakehouse pipelines [--json]                 validate and list the pipeline specs (exit 2: a file is broken)
    lakehouse check [--pipeline NAME] [--json]   validate the specs and reach every configured part: Kafka, each
                                                 catalog, its object store (s3://), the schema registry
    lakehouse topics [--pipeline NAME]           create the pipelines' source topics (--dry-run: say which)
    lakehouse ingest --pipeline NAME --once      Kafka -> Iceberg, exactly once
    lakehouse replay --pipeline NAME ...         re-ingest offsets, a time range or dead letters (--dry-run: the
                                                 ranges, records and tables it would write)
    lakehouse status [--pipeline NAME] [--json]  lag, recovery points, row and dead-letter counts
    lakehouse maintain --pipeline NAME           compact, expire snapshots, remove orphans (receipt per table)
    lakehouse retention --pipeline NAME          check topic retention against lag + outage + replay window
    lakehouse retention --pipeline NAME --guard  extend retention.ms while the writer is behind, restore it after
                                                 (--dry-run: the rows data retention would delete per table, or
                                                 the retention.ms the guard would set; nothing changes)
    lakehouse schemas --pipeline NAME [--pull]   writer schemas (folder, registry) and whether the contract takes each
    lakehouse trace --pipeline NAME --partition N --offset O   where one record is (or --key K --since T)
    lakehouse verify --pipeline NAME             prove every offset exactly once across the tables (exit 3: not)
    lakehouse cost --pipeline NAME [--days N]    per day: bytes produced and retained by Kafka, table bytes and
                                                 files, object-store requests, compute seconds (priced when
                                                 LAKEHOUSE_PRICE_* are set)
    lakehouse --version                          the installed distribution's version

The development stack (`devstack/`, installed by `make setup`) adds `lakehouse stack`, `lakehouse
airflow` and `lakehouse produce` (lakehouse_dev.cli). docs/cli.md describes every command, its options,
its `--json` shape and shell completion.

Exit codes (lakehouse.core.errors.EXIT_CODES, each error's `exit_code`): 0 ok; 1 failure; 2 a bad
spec, setting or argument; 3 the source or a table needs attention (offset gap, topic recreated,
topic missing, retention too short, positions lost, records about to age out that the retention
guard could not protect; Kafka unreachable or refusing a topic operation); 4 fenced (another ingest
job of the pipeline took over its tables); 130 interrupted (Ctrl-C); 141 the reader of standard
output went away (`lakehouse pipelines --json | head -1`: the command stops quietly, as Unix tools
killed by SIGPIPE do). `lakehouse check` exits with the code of its first failed part. `lakehouse
stack status` exits 1 when the broker does not run, `lakehouse airflow status` when no Airflow
component runs.

`--json` prints one shape per command, whatever the other options: an object, or a list of objects for
`status`, `schemas` and `check` (`ingest` prints one object per batch, a line each); docs/cli.md
lists each shape's keys. Errors go to stderr as text in either mode.

Every duration option takes what a spec takes (`500ms`, `5s`, `2m`, `1h`, `7d`: lakehouse.core.spec
parse_duration) and every point in time ISO-8601 (UTC without an offset) or a duration ago (`2h`:
parse_moment), through the argument types of lakehouse.core.cli_types.

`topics`, `replay`, `status`, `retention` and `trace` first ask Kafka for metadata (a few seconds at
most): with nothing answering they exit 3 with one line naming the bootstrap servers and the setting to
check (LAKEHOUSE_BOOTSTRAP_SERVERS), before anything is opened or created. A catalog that does not answer
exits 1 with one line naming the catalog, its URI and the setting it came from (LAKEHOUSE_CATALOG_URI or
the pyiceberg configuration). librdkafka's own log lines (connection attempts, retries) are shown only
with --verbose.

Replays, backfills and maintenance runs are audited on the ops timeline: their events name the OS user
the command runs as (or the Airflow user whose DAG run started it), the arguments and the outcome.

Every argument is checked while parsing, before a command creates anything (a Spark
session, a table, a topic, a stack): a bad one exits 2 naming it. A broken spec file
stops only its own pipeline: `--pipeline NAME` works while a sibling file is broken, and
`pipelines`, `topics` and `status` without `--pipeline` act on the valid specs, print each
broken file's error on stderr and exit 2 (`check` reports each broken file as a failed part).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, entry_points, version

from lakehouse.core import cli_types, config, console, errors
from lakehouse.core.errors import SpecError
from lakehouse.core.spec import (
    DURATION_CAPS_S,
    FORMAT_SCHEMA_TYPES,
    PipelineSpec,
    load_pipeline,
    load_schema_source,
    load_specs,
)

EXIT_FAILURE, EXIT_CONFIG, EXIT_SOURCE = errors.EXIT_FAILURE, errors.EXIT_CONFIG, errors.EXIT_SOURCE
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = errors.EXIT_INTERRUPTED, errors.EXIT_BROKEN_PIPE  # Ctrl-C, a closed pipe
DISTRIBUTION = "lakehouse"  # pyproject.toml [project] name: what `--version` reports


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_pipelines(args) -> int:
    """Lists the valid specs; every mistake of each broken file goes to stderr, one line each with its
    file, line and field (in the JSON under "errors", a file's mistakes as its "problems"). Returns
    EXIT_CONFIG when any file is broken. With --schema, prints the JSON Schema of a spec file instead."""
    if args.schema:
        from lakehouse.core.spec_schema import spec_json_schema

        print_json(spec_json_schema())
        return 0
    found = load_specs()
    if args.json:
        print_json({
            "pipelines": [{"name": s.name, "topic": s.source.topic, "tables": list(s.target.tables),
                           "dead_letter_table": s.dead_letter_table, "mode": s.target.mode, "path": s.path}
                          for s in found.specs.values()],
            "errors": [{"path": e.path, "pipeline": found.declared[path], "line": e.line, "field": e.field,
                        "why": e.why, "message": str(e),
                        "problems": [{"line": p.line, "field": p.field, "why": p.why} for p in e.problems]}
                       for path, e in found.errors.items()],
        })
    else:
        console.show([console.Table.of(
            ("PIPELINE", "TOPIC", "TABLES", "MODE", "DEAD LETTERS"),
            [(s.name, s.source.topic, ", ".join(s.qualified(t) for t in s.target.tables), s.target.mode,
              s.qualified(s.dead_letter_table)) for s in found.specs.values()])] if found.specs else [])
        _report_broken(found.errors)
    return EXIT_CONFIG if found.errors else 0


def _report_broken(errors: dict[str, SpecError]) -> None:
    """Print every mistake of each broken spec file on stderr, one line each (`error: FILE:LINE: FIELD: WHY`)."""
    for error in errors.values():
        for problem in error.problems:
            print(f"error: {problem}", file=sys.stderr)


def _specs(name: str | None) -> tuple[list[PipelineSpec], bool]:
    """The named pipeline, or every valid one with the broken files reported on stderr; and whether
    any file was broken."""
    if name:
        return [load_pipeline(name)], False
    found = load_specs()
    _report_broken(found.errors)
    return list(found.specs.values()), bool(found.errors)


def cmd_topics(args) -> int:
    """Creates the missing source topics, or with --dry-run says which it would create (partitions,
    replication, retention.ms) and which existing ones disagree with their spec; nothing is ever altered.
    JSON (either way): the plan (`create`, `mismatches`, `unchanged`), `created` (names) and `dry_run`."""
    from lakehouse.core import topics

    specs, broken = _specs(args.pipeline)
    topics.require_broker()
    plan = topics.plan_topics(specs)
    if args.dry_run:
        if args.json:
            print_json({**plan.to_json(), "created": [], "dry_run": True})
        else:
            for c in plan.create:
                retention = c["config"].get("retention.ms")
                print(f"would create topic {c['topic']} ({c['partitions']} partitions, replication factor "
                      f"{c['replication_factor']}" + (f", retention.ms {retention}" if retention else "") + ")")
            for message in plan.mismatches:
                print(f"would leave as it is: {message}")
            if not plan.create:
                print("dry run: every topic exists; nothing would be created")
        return EXIT_CONFIG if broken else 0
    created = topics.ensure_topics(specs)
    if args.json:
        print_json({**plan.to_json(), "created": created, "dry_run": False})
        return EXIT_CONFIG if broken else 0
    for topic in created:
        print(f"created topic {topic}")
    if not created:
        print("all topics exist")
    return EXIT_CONFIG if broken else 0


def cmd_ingest(args) -> int:
    """One ingest process per pipeline (a second one would write the same offsets twice): the job
    holds the pipeline's lock, or runs under its supervisor's."""
    from lakehouse.ingest.job import IngestJob
    from lakehouse.ops.supervision import JobLock

    spec = load_pipeline(args.pipeline)
    with JobLock.unless_supervised(config.load(), spec.name):
        return _ingest(IngestJob(spec, accept_gap=args.accept_gap), args)


def _ingest(job, args) -> int:
    from lakehouse.ingest.receipts import receipt_line

    metrics = None
    if args.metrics_port and not args.once:
        from lakehouse.ops.metrics import IngestMetrics

        metrics = IngestMetrics(job.spec.name)
        metrics.serve(args.metrics_port)

    def show(receipt) -> None:
        if metrics is not None:
            metrics.observe(receipt)
        if args.json:
            print(receipt_line(receipt), flush=True)
        else:
            ranges = " ".join(f"p{p}:[{s},{e})" for p, (s, e) in sorted(receipt.ranges.items()))
            print(f"batch {receipt.batch_id[:8]}: {receipt.records} records -> "
                  + ", ".join(f"{t} +{n}" for t, n in receipt.rows_by_table.items())
                  + f", dead letters +{receipt.dead_letters} ({ranges}) in {receipt.seconds:.1f}s"
                  + (f", {receipt.commit_retries} commit retries" if receipt.commit_retries else ""), flush=True)

    if args.once:
        receipts = job.run_once(on_batch=show)
        if not receipts and not args.json:
            print("nothing to ingest: every table is at the end of the log")
    else:
        job.run_continuous(args.trigger_interval, on_batch=show, max_batches=args.max_batches)
        if not args.json:
            print("stopped after finishing the batch in flight")
    return 0


def _replay_parameters(args) -> dict:
    """What a replay was asked to do, as its audited event records it (options given only)."""
    def iso(ms: int | None) -> str | None:
        return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()

    asked = {"offsets": None if args.offsets is None
             else ",".join(f"{p}:{s}-{e}" for p, (s, e) in args.offsets.items()),
             "from_time": iso(args.from_time), "to_time": iso(args.to_time), "dead_letters": args.dead_letters,
             "error_kind": args.error_kind, "into_table": args.into_table}
    return {name: value for name, value in asked.items() if value not in (None, False)}


REPLAY_JSON = ("pipeline", "kind", "dry_run", "ranges", "records", "tables", "creates_table", "inserted_by_table",
               "dead_letters_resolved", "dead_letters_added", "seconds")


def _replay_json(found: dict, dry_run: bool) -> dict:
    """A replay's or its dry run's JSON in the one shape of `replay --json` (REPLAY_JSON): what only the other
    kind of run can tell is null (a dry run inserted nothing yet; a run does not say whether it created
    --into-table's table)."""
    return {key: found.get(key) for key in REPLAY_JSON} | {"dry_run": dry_run}


def cmd_replay(args) -> int:
    """A replay (a backfill with --backfill): one audited `replay` or `backfill` event, whatever the outcome.
    With --dry-run: the offset ranges it would read (a time range resolved), their record count (or the dead
    letters it would decode again) and the tables it would write; no Spark session, no table, no event."""
    from lakehouse.core import events, topics

    spec = load_pipeline(args.pipeline)
    platform = config.load()
    topics.require_broker(platform)
    if args.dry_run:
        from lakehouse.recovery.replay import preview

        found = preview(spec, platform, ranges=args.offsets, from_ms=args.from_time, to_ms=args.to_time,
                        dead_letters=args.dead_letters, error_kind=args.error_kind, into_table=args.into_table)
        if args.json:
            print_json(_replay_json(found.to_json(), dry_run=True))
        else:
            print(found.render())
        return 0
    from lakehouse.ingest.job import IngestJob
    from lakehouse.recovery.replay import Replay

    # what the run writes, as its dry run names it: --into-table's table, else the pipeline's and its dead letters'
    tables = ([spec.qualified(args.into_table)] if args.into_table
              else [spec.qualified(t) for t in (*spec.target.tables, spec.dead_letter_table)])
    creates_table = None if args.into_table else False  # whether --into-table's table was new: not said by a run
    with events.audited(spec.name, "backfill" if args.backfill else "replay", events.Actor.of_process(),
                        _replay_parameters(args), platform, spec.catalog) as audit:
        replay = Replay(IngestJob(spec, platform))
        ranges = args.offsets
        if args.dead_letters:
            receipt = replay.dead_letters(args.error_kind)
        else:
            if ranges is None:
                ranges = replay.resolve_time_range(args.from_time, args.to_time)
            if not ranges:
                audit.status, audit.message = "skipped", "no records in that time range"
                if args.json:
                    print_json(_replay_json({"pipeline": spec.name, "kind": "replay", "ranges": {}, "records": 0,
                                              "tables": tables, "creates_table": creates_table, "inserted_by_table": {},
                                              "dead_letters_resolved": 0,
                                              "dead_letters_added": 0, "seconds": 0.0}, dry_run=False))
                else:
                    print(audit.message)
                return 0
            receipt = replay.into_table(ranges, args.into_table) if args.into_table else replay.offsets(ranges)
        target = args.into_table or ", ".join(spec.target.tables)
        inserted = sum(receipt.inserted_by_table.values())
        audit.message = f"{receipt.kind} of {receipt.records} records into {target}: {inserted} rows inserted"
        audit.metrics = {"records": receipt.records, "inserted": inserted,
                         "dead_letters_added": receipt.dead_letters_added, "seconds": receipt.seconds}
        audit.details = {**receipt.to_json(), "target": target}
    if args.json:
        print_json(_replay_json({**receipt.to_json(), "tables": tables, "creates_table": creates_table},
                                 dry_run=False))
    else:
        print(f"{receipt.kind}: {receipt.records} records; inserted "
              + ", ".join(f"{t} +{n}" for t, n in receipt.inserted_by_table.items())
              + f"; dead letters resolved {receipt.dead_letters_resolved}, added {receipt.dead_letters_added} "
                f"in {receipt.seconds:.1f}s")
    return 0


def cmd_status(args) -> int:
    """Each pipeline's status; Kafka must answer first (a catalog is opened only then, so a status with the
    broker down creates none). JSON: a list of per-pipeline objects, with --pipeline too (one item)."""
    from lakehouse.core import topics
    from lakehouse.ops.status import pipeline_status, report

    specs, broken = _specs(args.pipeline)
    topics.require_broker()
    statuses = [pipeline_status(s) for s in specs]
    if args.json:
        print_json(statuses)
    else:
        console.show(report(statuses))
    return EXIT_CONFIG if broken else 0


def cmd_maintain(args) -> int:
    """One maintenance run over the pipeline's tables, a receipt per table; exit 1 when a table's maintenance
    failed (or, with --dry-run, would fail: an orphan removal that would be refused). A dry run lists the data
    files compaction would rewrite, the snapshots expiry would name and the orphan files removal would delete,
    and rewrites, expires and deletes nothing (its receipts are recorded as `maintenance` events)."""
    from lakehouse.upkeep import maintenance, maintenance_receipts

    receipt = maintenance.run(load_pipeline(args.pipeline), run_id=args.run_id, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(receipt.to_json(), separators=(",", ":"), default=str), flush=True)
    else:
        print(maintenance_receipts.render(receipt), flush=True)
    return 0 if receipt.ok else EXIT_FAILURE


def _dry_run(text: str) -> bool:
    """`--dry-run=true|false` (what a DAG's `dry_run` Param renders to)."""
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


def cmd_retention(args) -> int:
    """The alignment check (and data retention), or with --guard one run of the retention guard; exit 3
    when the topic's retention is too short, or when records will age out and the guard could not help
    (with --dry-run: would). A dry run deletes no row, changes no topic config and records no event: it
    says per table how many rows the delete would remove, or which retention.ms the guard would set."""
    from lakehouse.core import topics
    from lakehouse.upkeep import retention

    spec = load_pipeline(args.pipeline)
    topics.require_broker()
    report = (retention.guard(spec, dry_run=args.dry_run) if args.guard
              else retention.align(spec, dry_run=args.dry_run))
    if args.json:
        print(json.dumps(_retention_json(report, "guard" if args.guard else "align"), separators=(",", ":"),
                         default=str), flush=True)
    else:
        print(f"{report.status:<8} {report.message}")
    if args.guard and report.status == "failed":
        print(f"error: {report.message}", file=sys.stderr)
    return EXIT_SOURCE if report.status == "failed" else 0


def _retention_json(report, mode: str) -> dict:
    """The alignment report or the guard's in the one shape of `retention --json`: `mode` (align | guard) and
    the keys of both reports, those of the other mode null."""
    from lakehouse.upkeep import retention

    shown = report.to_json()
    keys = _json_keys(retention.RetentionReport) + ["guard_state" if k == "state" else k
                                                    for k in _json_keys(retention.GuardReport)]
    return {"mode": mode} | {key: shown.get(key) for key in dict.fromkeys(keys)}


def _json_keys(cls) -> list[str]:
    from dataclasses import fields

    return [f.name for f in fields(cls)]


def _require_wire_formats(name: str, source) -> None:
    if not any(f in FORMAT_SCHEMA_TYPES for f in (source.value_format, source.key_format)):
        raise errors.ConfigurationError(f"pipeline {name!r} reads {source.value_format} values and "
                                        f"{source.key_format} keys, which carry no writer schema")


def cmd_schemas(args) -> int:
    """Lists the pipeline's writer schemas and what the contract makes of each; with --pull, first writes the
    registry subjects' versions the schema folder lacks into it. Returns EXIT_CONFIG when one is
    incompatible or cannot be translated."""
    from lakehouse.ingest.schema_reports import describe_schemas, pull_schemas

    registry = config.load().schema_registry()
    if args.pull:
        # the source section alone: a contract derived from an empty folder does not load until this fills it
        pulling = load_schema_source(args.pipeline)
        _require_wire_formats(pulling.name, pulling.source)
        if registry is None:
            raise errors.ConfigurationError("--pull needs the schema registry: set LAKEHOUSE_SCHEMA_REGISTRY_URL")
        for schema_id, schema_type, path in pull_schemas(pulling, registry):
            print(f"pulled   {schema_id} ({schema_type}) -> {path}", file=sys.stderr)
    spec = load_pipeline(args.pipeline)  # with --pull: the contract as the folder now derives it
    _require_wire_formats(spec.name, spec.source)
    found = describe_schemas(spec, registry)
    if args.json:
        print_json([report.__dict__ for report in found])
    else:
        console.show([console.Table.of(("ID", "TYPE", "WHERE", "VERDICT", "WHY"),
                                       [(str(r.schema_id), r.schema_type, r.where, r.verdict, r.why) for r in found])])
    return EXIT_CONFIG if any(r.verdict in ("incompatible", "untranslatable") for r in found) else 0


def cmd_trace(args) -> int:
    """One record's (or one key's records') whereabouts; exits 3 when a record is missing, duplicated or
    foreign."""
    from lakehouse.audit import trace
    from lakehouse.core import topics

    spec = load_pipeline(args.pipeline)
    topics.require_broker()
    found: trace.KeyTrace | trace.RecordTrace
    if args.key is not None:
        with console.progress() as say:
            found = trace.trace_key(spec, args.key, args.since, args.until, progress=None if args.json else say)
        shown = found.to_json() | {"partition": None, "offset": None}
    else:
        found = trace.trace_record(spec, args.partition, args.offset)
        record = found.to_json()
        shown = {"pipeline": spec.name, "key": None, "partition": args.partition, "offset": args.offset, "since": None,
                 "until": None, "scanned": None, "records": [record], "seconds": record["seconds"]}
    if args.json:  # one shape for a record and a key: the records found, each as trace_record reports it
        print_json({key: shown[key] for key in ("pipeline", "key", "partition", "offset", "since", "until", "scanned",
                                                  "records", "seconds")})
    else:
        print(found.render())
    return found.exit_code


def cmd_verify(args) -> int:
    """Verification of a range exactly once; exits 3 when anything is missing, duplicated, foreign or stale."""
    from lakehouse.audit import verify

    with console.progress() as say:
        result = verify.verify(load_pipeline(args.pipeline), since_s=args.since, snapshots=args.snapshots,
                               full=args.full, engine=args.engine, progress=say)
    if args.json:
        print_json(result.to_json())
    else:
        print(result.summary())
        for problem in result.findings.problems:
            print(f"  {problem}")
    return 0 if result.ok else EXIT_SOURCE


def cmd_cost(args) -> int:
    """The pipeline's daily use and price (lakehouse.ops.cost); what it reads is told on stderr."""
    from lakehouse.ops import cost

    platform = config.load()
    prices = cost.UnitPrices.from_settings(platform.prices)  # a bad price stops before anything is read
    with console.progress(suffix=" ...") as say:
        report = cost.daily_cost(load_pipeline(args.pipeline), days=args.days, platform=platform, prices=prices,
                                 progress=say)
    if args.json:
        print_json(report.to_json())
    else:
        console.show(cost.blocks(report))
    return 0


def cmd_check(args) -> int:
    """Validates the specs (or --pipeline's) and asks every configured part the cheapest question that proves
    it works (lakehouse.ops.check); a line (JSON: an object) per part. Exits 0 only when every part passed,
    else with the exit code of the first that failed."""
    from lakehouse.ops import check

    found = check.check(args.pipeline, timeout=args.timeout)
    if args.json:
        print_json([part.to_json() for part in found])
    else:
        for part in found:
            print(part.render(), flush=True)
        failed = [part for part in found if not part.ok]
        print(f"{len(found) - len(failed)} of {len(found)} parts ok" + (f"; {len(failed)} did not pass" if failed
                                                                        else ""))
    return next((part.exit_code or EXIT_FAILURE for part in found if not part.ok), 0)


# --- argument types: each returns the parsed value or raises ArgumentTypeError (argparse: exit 2) ----------
# The kinds every command shares are lakehouse.core.cli_types'; the ones below are this CLI's own options.

_trigger_interval = cli_types.duration(positive=True, maximum=DURATION_CAPS_S["trigger.interval"])
_check_timeout = cli_types.duration(positive=True, maximum=60.0)


def _days(text: str) -> int:
    from lakehouse.ops.cost import MAX_DAYS

    return cli_types.integer(text, 1, MAX_DAYS)


def _offsets(text: str) -> dict[int, tuple[int, int]]:
    """Per-partition offset ranges, as lakehouse.recovery.replay.parse_offset_ranges reads them."""
    from lakehouse.recovery.replay import parse_offset_ranges

    try:
        return parse_offset_ranges(text)
    except errors.ReplayError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _error_kind(text: str) -> str:
    from lakehouse.ingest.rejects import ERROR_KINDS

    if text not in ERROR_KINDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not an error kind (one of {', '.join(ERROR_KINDS)})")
    return text


def _partition(text: str) -> int:
    from lakehouse.audit.trace import MAX_PARTITION

    return cli_types.integer(text, 0, MAX_PARTITION)


def _offset(text: str) -> int:
    from lakehouse.audit.trace import MAX_OFFSET

    return cli_types.integer(text, 0, MAX_OFFSET)


def _snapshot_range(text: str) -> tuple[int, int]:
    from lakehouse.audit.verify_model import parse_snapshot_range

    try:
        return parse_snapshot_range(text)
    except errors.VerifyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def complete_pipelines(prefix: str = "", **_) -> list[str]:
    """Shell completion of --pipeline (argcomplete): the pipelines of the configured specs folder
    (LAKEHOUSE_PIPELINES_DIR), the ones a broken file declares too, that start with `prefix`."""
    try:
        found = load_specs()
    except Exception:  # noqa: BLE001 - completion offers what it can and never prints a traceback into a shell
        return []
    return sorted(name for name in {*found.specs, *found.declared.values()} if name.startswith(prefix))


def _check_together(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks that span arguments (and LAKEHOUSE_METRICS_PORT); a failure exits 2 with the message."""
    def fail(message: str) -> None:
        parser.exit(EXIT_CONFIG, f"{parser.prog} {args.command}: error: {message}\n")

    if args.command == "replay":
        if args.to_time is not None and args.from_time is None:
            fail("argument --to-time: needs --from-time")
        if args.from_time is not None and args.to_time is not None and args.from_time >= args.to_time:
            fail("argument --to-time: must be later than --from-time")
        if args.into_table and args.dead_letters:
            fail("argument --into-table: replays offsets or a time range, not --dead-letters")
        if args.error_kind and not args.dead_letters:
            fail("argument --error-kind: only applies with --dead-letters")
    if args.command == "trace":
        from lakehouse.audit.trace import trace_request

        try:  # the rule the Airflow UI's trace page applies too, in its words
            trace_request(args.partition, args.offset, args.key, args.since, args.until)
        except errors.TraceError as exc:
            fail(str(exc))
    if args.command == "ingest" and args.metrics_port is None and os.environ.get("LAKEHOUSE_METRICS_PORT"):
        try:
            args.metrics_port = cli_types.port(os.environ["LAKEHOUSE_METRICS_PORT"])
        except argparse.ArgumentTypeError as exc:
            fail(f"LAKEHOUSE_METRICS_PORT: {exc}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line, every value checked; exits 2 naming the first bad argument. Under shell
    completion (argcomplete's environment set) it prints the completions and exits instead."""
    parser = build_parser()
    try:
        import argcomplete
    except ImportError:  # completion is a convenience: the CLI works without it
        pass
    else:
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    _check_together(parser, args)
    return args


def installed_version() -> str:
    """The version of the installed `lakehouse` distribution (pyproject.toml), as pip reports it."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (the lakehouse distribution is not installed: pip install -e . or make setup)"


# Help of the options several commands share
PIPELINE_HELP = "the pipeline, by the `name` its spec declares (in LAKEHOUSE_PIPELINES_DIR)"
PIPELINE_FILTER_HELP = "only this pipeline (default: every valid spec of LAKEHOUSE_PIPELINES_DIR)"
INSTANT = "ISO-8601 (UTC without an offset, e.g. 2026-11-21T10:00:00Z) or a duration ago (30m, 2h, 7d)"


def _json_help(shape: str) -> str:
    return f"print {shape} as JSON instead of text (docs/cli.md lists its keys)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakehouse", description=__doc__.split("\n\n")[0],
                                     epilog="docs/cli.md: every command, its options, exit codes and JSON shapes; "
                                            'completion: eval "$(register-python-argcomplete lakehouse)"',
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress details (and librdkafka's own lines); show tracebacks of unexpected errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}",
                        help="print the installed lakehouse version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pipelines", help="validate and list pipeline specs")
    p.add_argument("--json", action="store_true", help=_json_help("{pipelines: [...], errors: [...]}"))
    p.add_argument("--schema", action="store_true",
                   help="print the JSON Schema of a spec file (for editors; docs/spec.schema.json) and exit")
    p.set_defaults(fn=cmd_pipelines)

    p = sub.add_parser("check", help="validate the specs and reach every configured part (Kafka, catalogs, object "
                                     "store, schema registry), one line each")
    p.add_argument("--pipeline", type=cli_types.pipeline_name,
                   help="only this pipeline's spec and the parts it uses (default: every spec file)")
    p.add_argument("--timeout", type=_check_timeout, default=5.0, metavar="DURATION",
                   help="how long each part may take to answer, e.g. 500ms, 10s (default 5s, at most 1m)")
    p.add_argument("--json", action="store_true", help=_json_help("a list of one object per part"))
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("topics", help="create the source topics of the pipelines")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, help=PIPELINE_FILTER_HELP)
    p.add_argument("--dry-run", action="store_true",
                   help="only say which topics would be created (and which existing ones differ from their spec)")
    p.add_argument("--json", action="store_true", help=_json_help("the plan and the topics created"))
    p.set_defaults(fn=cmd_topics)

    p = sub.add_parser("ingest", help="ingest a pipeline's topic into its tables")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="catch up to the end of every partition and exit")
    mode.add_argument("--trigger-interval", type=_trigger_interval, metavar="DURATION",
                      help="continuous mode: one batch per interval, above 0 and at most 1d (default: the spec's "
                           "trigger.interval)")
    p.add_argument("--max-batches", type=cli_types.at_least(1), metavar="N",
                   help="continuous mode: stop after this many batches")
    p.add_argument("--accept-gap", action="store_true",
                   help="continue past records that aged out of Kafka, recording the gap in the table")
    p.add_argument("--json", action="store_true", help="print one JSON receipt per batch, a line each")
    p.add_argument("--metrics-port", type=cli_types.port, metavar="PORT",
                   help="continuous mode: serve Prometheus /metrics on 127.0.0.1:PORT (env LAKEHOUSE_METRICS_PORT)")
    p.set_defaults(fn=cmd_ingest)

    p = sub.add_parser("replay", help="re-ingest offsets, a time range, or dead letters (idempotent)")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--offsets", type=_offsets, metavar="P:START-END[,...]",
                      help="per partition, end exclusive, e.g. 0:100-200,1:0-50")
    what.add_argument("--from-time", type=cli_types.instant_ms, metavar="TIME",
                      help=f"start of a time range of Kafka timestamps: {INSTANT}")
    what.add_argument("--dead-letters", action="store_true", help="decode dead letters again with the contract")
    p.add_argument("--to-time", type=cli_types.instant_ms, metavar="TIME",
                   help="with --from-time: end of the time range, as --from-time (default: now)")
    p.add_argument("--error-kind", type=_error_kind, help="with --dead-letters: only this error kind")
    p.add_argument("--into-table", type=cli_types.table_name, metavar="NAMESPACE.TABLE",
                   help="write the range's valid records into this table instead of the pipeline's tables "
                        "(created from the contract if missing)")
    p.add_argument("--backfill", action="store_true",
                   help="record the run as a `backfill` event on the ops timeline (default: a `replay` event)")
    p.add_argument("--dry-run", nargs="?", const=True, default=False, type=_dry_run, metavar="true|false",
                   help="only say which offset ranges (how many records) it would read and which tables it would "
                        "write; write nothing, record nothing")
    p.add_argument("--json", action="store_true", help=_json_help("the receipt (or the dry run's plan)"))
    p.set_defaults(fn=cmd_replay)

    p = sub.add_parser("status", help="lag, recovery points and counts per pipeline")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, help=PIPELINE_FILTER_HELP)
    p.add_argument("--json", action="store_true", help=_json_help("a list of one object per pipeline"))
    p.set_defaults(fn=cmd_status)

    p = sub.add_parser("maintain", help="compact, rewrite manifests, expire snapshots and remove orphan files")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    p.add_argument("--run-id", help="tag for this run's `maintenance` events (default: random)")
    p.add_argument("--dry-run", nargs="?", const=True, default=False, type=_dry_run, metavar="true|false",
                   help="only list what a run would do (files compaction would rewrite, snapshots it would expire, "
                        "orphan files it would delete); rewrite, expire and delete nothing")
    p.add_argument("--json", action="store_true", help="print the receipt as one JSON line")
    p.set_defaults(fn=cmd_maintain)

    p = sub.add_parser("retention", help="check Kafka retention covers lag, outages and the replay window; "
                                         "apply data retention")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    p.add_argument("--guard", action="store_true",
                   help="instead: run the retention guard once (extend the topic's retention.ms while the writer "
                        "is behind, restore it once caught up)")
    p.add_argument("--dry-run", nargs="?", const=True, default=False, type=_dry_run, metavar="true|false",
                   help="only say what it would do: the rows data retention would delete per table, or with "
                        "--guard the retention.ms it would set; delete, alter and record nothing")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line (one shape with or without "
                                                       "--guard, see docs/cli.md)")
    p.set_defaults(fn=cmd_retention)

    p = sub.add_parser("schemas", help="list a pipeline's writer schemas (folder and registry) and whether the "
                                       "contract takes each")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    p.add_argument("--pull", action="store_true",
                   help="first write the registry subjects' versions the pipeline's schema folder lacks into it")
    p.add_argument("--json", action="store_true", help=_json_help("a list of one object per writer schema"))
    p.set_defaults(fn=cmd_schemas)

    p = sub.add_parser("trace", help="where one record is: a row, a dead letter, not yet ingested, a gap, ...")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    p.add_argument("--partition", type=_partition, metavar="N", help="the record's partition")
    p.add_argument("--offset", type=_offset, metavar="O", help="the record's offset")
    p.add_argument("--key", help="trace every record of this Kafka key in a time window instead")
    p.add_argument("--since", type=cli_types.instant, metavar="TIME",
                   help=f"with --key: start of the window, {INSTANT}")
    p.add_argument("--until", type=cli_types.instant, metavar="TIME",
                   help="with --key: end of the window, as --since (default: now)")
    p.add_argument("--json", action="store_true", help=_json_help("the records found (one with --partition/--offset)"))
    p.set_defaults(fn=cmd_trace)

    p = sub.add_parser("verify", help="prove every offset of a range is exactly once across the pipeline's tables")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--since", type=cli_types.seconds_ago, metavar="TIME",
                       help=f"the snapshots committed since TIME: {INSTANT} "
                            "(default: every snapshot since the last verification)")
    scope.add_argument("--snapshots", type=_snapshot_range, metavar="FROM..TO",
                       help="the snapshots FROM..TO of one table (inclusive)")
    scope.add_argument("--full", action="store_true", help="every row and every offset Kafka holds")
    p.add_argument("--engine", choices=("auto", "local", "spark"), default="auto",
                   help="where the checks run (auto: a Spark job above 5,000,000 offsets)")
    p.add_argument("--json", action="store_true", help=_json_help("the result"))
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("cost", help="what a pipeline uses per day (Kafka, tables, requests, compute) and, with "
                                    "LAKEHOUSE_PRICE_* set, what it costs")
    p.add_argument("--pipeline", type=cli_types.pipeline_name, required=True, help=PIPELINE_HELP)
    p.add_argument("--days", type=_days, default=7, metavar="N",
                   help="UTC days back, today included (1 to 90, default 7)")
    p.add_argument("--json", action="store_true", help=_json_help("the report"))
    p.set_defaults(fn=cmd_cost)
    for command in sorted(entry_points(group="lakehouse.commands"), key=lambda e: e.name):
        command.load()(sub)  # e.g. the development stack's `stack`, `airflow` and `produce`
    for action in _options(parser):
        if action.dest == "pipeline":  # every command's --pipeline, the development stack's too
            # argcomplete reads the `completer` it documents on an argparse action, which typeshed does not declare
            action.completer = complete_pipelines  # type: ignore[attr-defined]  # argcomplete's attribute
    return parser


def _options(parser: argparse.ArgumentParser) -> Iterable[argparse.Action]:
    """Every option of `parser` and of its subcommands, however deep."""
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):  # an alias names the same parser again
                yield from _options(subparser)


def _stdout_gone() -> bool:
    """Whether standard output is a pipe or socket whose reader went away (poll says POLLERR/POLLHUP), so a
    BrokenPipeError came from printing and not from a connection of the command's own."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no file descriptor (captured in-process), no poll: not a pipe
        return False


def _silence_stdout() -> None:
    """Point standard output at /dev/null: the interpreter's last flush of what is still buffered for the
    vanished reader then succeeds instead of printing 'Exception ignored ... BrokenPipeError' (the Python
    documentation's pattern for SIGPIPE, signal module)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except BrokenPipeError:  # --help or --version into a reader that went away
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # librdkafka's own lines (connection attempts, retries) are details: every failure they explain reaches
    # the user as one error naming what to check
    logging.getLogger("lakehouse.kafka").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL + 1)
    try:
        code: int = args.fn(args)
        sys.stdout.flush()  # inside the try: what is still buffered meets a vanished reader here, not at exit
        return code
    except BrokenPipeError as exc:  # `lakehouse ... | head -1`: stop quietly, as Unix tools do on SIGPIPE
        if not _stdout_gone():
            return _failed(exc, args)
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except errors.LakehouseError as exc:  # every error raised on purpose knows its exit code
        # an outage is one line (a driver's message may span several): what is unreachable and what to check
        shown = " ".join(str(exc).split()) if isinstance(exc, errors.RetryableError) else exc
        for line in exc.problems if isinstance(exc, SpecError) else (shown,):  # a spec's mistakes: one line each
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the CLI's last word: say what failed, not a traceback wall
        return _failed(exc, args)


def _failed(exc: Exception, args: argparse.Namespace) -> int:
    """An unexpected error: one paragraph on stderr (the traceback with --verbose); EXIT_FAILURE."""
    if args.verbose:
        raise exc
    from lakehouse.core.sparkenv import describe_error

    print(f"error: {describe_error(exc)}", file=sys.stderr)
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
