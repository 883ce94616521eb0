"""`lakehouse`: the platform's command line.

    lakehouse stack up|down|status [--json]      the embedded Kafka broker and local catalog
    lakehouse stack up --spark-cluster           ... plus a Spark standalone master and worker
    lakehouse stack up --auth scram-sha-512 --tls   ... with a broker that requires a SASL login over TLS
    lakehouse pipelines [--json]                 validate and list the pipeline specs
    lakehouse topics [--pipeline NAME]           create the pipelines' source topics
    lakehouse produce --pipeline NAME --count N  synthetic events, some of them bad
    lakehouse ingest --pipeline NAME --once      Kafka -> Iceberg, exactly once
    lakehouse replay --pipeline NAME ...         re-ingest offsets, a time range or dead letters
    lakehouse status [--pipeline NAME] [--json]  lag, recovery points, row and dead-letter counts
    lakehouse airflow up|down|status [--json]    Airflow 3 (API server, scheduler, ...) for the embedded stack
    lakehouse maintain --pipeline NAME           compact, expire snapshots, remove orphans (receipt per table)
    lakehouse retention --pipeline NAME          check topic retention against lag + outage + replay window

Exit codes: 0 ok, 1 failure, 2 bad spec/configuration/arguments, 3 the source needs
attention (offset gap, topic recreated, topic missing, retention too short).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime, timezone

from lakehouse import config
from lakehouse.spec import SpecError, UnknownPipelineError, load_all, load_pipeline, parse_duration

EXIT_FAILURE, EXIT_CONFIG, EXIT_SOURCE = 1, 2, 3


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_stack(args) -> int:
    from lakehouse import spark_cluster, stack

    if args.action == "up":
        result = stack.up(port=args.port, auth=args.auth, tls=args.tls)
        if args.spark_cluster:
            spark_cluster.up(port=args.spark_port, ui_port=args.spark_ui_port)
    elif args.action == "down":
        result = {**stack.down(purge=args.purge), "spark_cluster": spark_cluster.down()}
    else:
        result = stack.status()
    if args.action != "down":
        result["spark_cluster"] = spark_cluster.status()
    if args.json:
        _print_json(result)
    else:
        broker = result.get("broker", {})
        if args.action == "down":
            print("embedded stack stopped" + (" and its state removed" if args.purge else ""))
        else:
            print(f"kafka      {result.get('bootstrap_servers')} "
                  f"({'embedded' if broker.get('embedded') else 'external'}, "
                  f"{'running' if broker.get('running') else 'NOT running'})")
            security = broker.get("security") or {}
            if security.get("protocol", "PLAINTEXT") != "PLAINTEXT":  # never the password: it is not in there
                print(f"security   {security['protocol']}"
                      + (f", {security['mechanism']} as user {security.get('username')!r}"
                         if security.get("mechanism") else "")
                      + (f", CA {security['ca_location']}" if security.get("ca_location") else ""))
            if broker.get("error"):
                print(f"error      {broker['error']}")
            print(f"catalog    {result.get('catalog_uri')}")
            print(f"warehouse  {result.get('warehouse')}")
            print(f"home       {result.get('home')}")
            cluster = result["spark_cluster"]
            if cluster.get("master"):
                print(f"spark      {cluster['master']} ({cluster.get('workers_alive', 0)} worker(s), "
                      f"{cluster.get('cores', 0)} cores, {'running' if cluster['running'] else 'NOT running'}; "
                      f"UI {cluster.get('master_ui')})")
            else:
                print(f"spark      {config.load().spark_master}")
            for topic in result.get("topics") or []:
                print(f"topic      {topic['name']} ({topic['partitions']} partitions)")
    return 0


def cmd_pipelines(args) -> int:
    specs = load_all()
    if args.json:
        _print_json([{"name": s.name, "topic": s.source.topic, "tables": list(s.target.tables),
                      "dead_letter_table": s.dead_letter_table, "mode": s.target.mode, "path": s.path}
                     for s in specs.values()])
    else:
        for s in specs.values():
            print(f"{s.name:<16} {s.source.topic} -> {', '.join(s.qualified(t) for t in s.target.tables)} "
                  f"({s.target.mode}; dead letters {s.qualified(s.dead_letter_table)})")
    return 0


def _specs(name: str | None):
    return [load_pipeline(name)] if name else list(load_all().values())


def cmd_topics(args) -> int:
    from lakehouse import topics

    created = topics.ensure_topics(_specs(args.pipeline))
    for topic in created:
        print(f"created topic {topic}")
    if not created:
        print("all topics exist")
    return 0


def cmd_produce(args) -> int:
    from lakehouse import produce, topics

    spec = load_pipeline(args.pipeline)
    topics.ensure_topics([spec])

    def progress(sent: int) -> None:
        print(f"\rproduced {sent}/{args.count}", end="", file=sys.stderr, flush=True)

    report = produce.produce(spec, args.count, rate=args.rate, bad_ratio=args.bad_ratio, seed=args.seed,
                             on_progress=None if args.quiet else progress)
    if not args.quiet:
        print(file=sys.stderr)
    bad = sum(report.bad_by_kind.values())
    print(f"produced {report.sent} records to {spec.source.topic} ({bad} bad: "
          f"{', '.join(f'{k}={v}' for k, v in sorted(report.bad_by_kind.items())) or 'none'}) "
          f"in {report.seconds:.1f}s")
    return 0


def cmd_ingest(args) -> int:
    """One ingest process per pipeline (a second one would write the same offsets twice): the job
    holds the pipeline's lock, or runs under its supervisor's."""
    from lakehouse.ingest import IngestJob
    from lakehouse.supervision import JobLock

    spec = load_pipeline(args.pipeline)
    with JobLock.unless_supervised(config.load(), spec.name):
        return _ingest(IngestJob(spec, accept_gap=args.accept_gap), args)


def _ingest(job, args) -> int:
    from lakehouse.ingest import receipt_line

    metrics = None
    if args.metrics_port and not args.once:
        from lakehouse.metrics import IngestMetrics

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
        interval = parse_duration(args.trigger_interval) if args.trigger_interval else None
        job.run_continuous(interval, on_batch=show, max_batches=args.max_batches)
        if not args.json:
            print("stopped after finishing the batch in flight")
    return 0


def _env_port(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    if not value.isdigit():
        raise SystemExit(f"error: {name}={value!r} is not a port number")
    return int(value)


def _time_ms(text: str) -> int:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp() * 1000)


def cmd_replay(args) -> int:
    from lakehouse.ingest import IngestJob
    from lakehouse.replay import Replay, ReplayError, parse_offset_ranges

    spec = load_pipeline(args.pipeline)
    if args.into_table and args.dead_letters:
        raise ReplayError("--into-table replays offsets or a time range, not dead letters")
    ranges = parse_offset_ranges(args.offsets) if args.offsets else None
    replay = Replay(IngestJob(spec))
    if args.dead_letters:
        receipt = replay.dead_letters(args.error_kind)
    else:
        if ranges is None:
            ranges = replay.resolve_time_range(args.from_time, args.to_time)
        if not ranges:
            print("no records in that time range")
            return 0
        receipt = replay.into_table(ranges, args.into_table) if args.into_table else replay.offsets(ranges)
    from lakehouse import events

    target = args.into_table or ", ".join(spec.target.tables)
    inserted = sum(receipt.inserted_by_table.values())
    events.record(events.Event(
        spec.name, "backfill" if args.backfill else "replay", "ok",
        f"{receipt.kind} of {receipt.records} records into {target}: {inserted} rows inserted",
        metrics={"records": receipt.records, "inserted": inserted,
                 "dead_letters_added": receipt.dead_letters_added, "seconds": receipt.seconds},
        details={**receipt.to_json(), "target": target}), catalog=spec.catalog)
    if args.json:
        _print_json(receipt.to_json())
    else:
        print(f"{receipt.kind}: {receipt.records} records; inserted "
              + ", ".join(f"{t} +{n}" for t, n in receipt.inserted_by_table.items())
              + f"; dead letters resolved {receipt.dead_letters_resolved}, added {receipt.dead_letters_added} "
                f"in {receipt.seconds:.1f}s")
    return 0


def cmd_status(args) -> int:
    from lakehouse.status import pipeline_status, render

    statuses = [pipeline_status(s) for s in _specs(args.pipeline)]
    if args.json:
        _print_json(statuses if not args.pipeline else statuses[0])
    else:
        print(render(statuses))
    return 0


def cmd_maintain(args) -> int:
    from lakehouse import maintenance

    receipt = maintenance.run(load_pipeline(args.pipeline), run_id=args.run_id)
    if args.json:
        print(json.dumps(receipt.to_json(), separators=(",", ":"), default=str), flush=True)
    else:
        for table in receipt.tables:
            print(f"{table.status:<8} {table.message}")
    return 0 if receipt.ok else EXIT_FAILURE


def cmd_retention(args) -> int:
    from lakehouse import retention

    report = retention.align(load_pipeline(args.pipeline))
    if args.json:
        print(json.dumps(report.to_json(), separators=(",", ":"), default=str), flush=True)
    else:
        print(f"{report.status:<8} {report.message}")
    return EXIT_SOURCE if report.status == "failed" else 0


def print_airflow_login(result: dict, indent: str = "") -> None:
    """The Airflow URL, the pipelines page and the login, as `airflow up` and the demo print them."""
    print(f"{indent}airflow    {result['url']}  (user {result['user']}, password {result['password']}; "
          f"kept in {result['password_file']})")
    print(f"{indent}pipelines  {result['page']}")


def cmd_airflow(args) -> int:
    from lakehouse import airflow_stack

    if args.action == "up":
        result = airflow_stack.up(port=args.port)
    elif args.action == "down":
        result = {"stopped": airflow_stack.down()}
    else:
        result = airflow_stack.status()
    if args.json:
        _print_json(result)
    elif args.action == "down":
        stopped = result["stopped"]
        print("airflow stopped: "
              + (", ".join(f"{c} (pid {p})" for c, p in stopped.items()) or "nothing was running"))
    else:
        print_airflow_login(result)
        for component, pid in result["running"].items():
            print(f"{component:<14} {'pid ' + str(pid) if pid else 'NOT running'}  log {result['logs'][component]}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakehouse", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stack", help="start, stop or inspect the embedded stack")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--port", type=int, help="broker port for `up` (default 19092 or LAKEHOUSE_BROKER_PORT)")
    p.add_argument("--auth", choices=("none", "scram-sha-512", "scram", "scram-sha-256"),
                   help="with `up`: clients log in with SASL/SCRAM as user `lakehouse` (generated password in "
                        "<home>/security/kafka.password) (default none or LAKEHOUSE_BROKER_AUTH)")
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                   help="with `up`: TLS listener with a self-signed CA (<home>/security/ca.pem) "
                        "(default off or LAKEHOUSE_BROKER_TLS)")
    p.add_argument("--purge", action="store_true", help="with `down`: also delete the catalog and warehouse")
    p.add_argument("--spark-cluster", action="store_true",
                   help="with `up`: also start a Spark standalone master and worker; jobs of this home run on it")
    p.add_argument("--spark-port", type=int, help="Spark master port (default 7077)")
    p.add_argument("--spark-ui-port", type=int, help="Spark master web UI port (default 8081; the worker's is +1)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_stack)

    p = sub.add_parser("pipelines", help="validate and list pipeline specs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_pipelines)

    p = sub.add_parser("topics", help="create the source topics of the pipelines")
    p.add_argument("--pipeline")
    p.set_defaults(fn=cmd_topics)

    p = sub.add_parser("produce", help="produce synthetic records for a pipeline")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    p.add_argument("--bad-ratio", type=float, default=0.0, help="share of malformed or invalid records")
    p.add_argument("--seed", type=int)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_produce)

    p = sub.add_parser("ingest", help="ingest a pipeline's topic into its tables")
    p.add_argument("--pipeline", required=True)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="catch up to the end of every partition and exit")
    mode.add_argument("--trigger-interval", help="continuous mode: one batch per interval (default: spec)")
    p.add_argument("--max-batches", type=int, help="continuous mode: stop after this many batches")
    p.add_argument("--accept-gap", action="store_true",
                   help="continue past records that aged out of Kafka, recording the gap in the table")
    p.add_argument("--json", action="store_true", help="one JSON receipt per batch")
    p.add_argument("--metrics-port", type=int, default=_env_port("LAKEHOUSE_METRICS_PORT"),
                   help="continuous mode: serve Prometheus /metrics on 127.0.0.1:PORT (env LAKEHOUSE_METRICS_PORT)")
    p.set_defaults(fn=cmd_ingest)

    p = sub.add_parser("replay", help="re-ingest offsets, a time range, or dead letters (idempotent)")
    p.add_argument("--pipeline", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--offsets", help="PARTITION:START-END[,...], end exclusive, e.g. 0:100-200,1:0-50")
    what.add_argument("--from-time", type=_time_ms, help="ISO-8601 start of a time range (Kafka timestamps)")
    what.add_argument("--dead-letters", action="store_true", help="decode dead letters again with the contract")
    p.add_argument("--to-time", type=_time_ms, help="ISO-8601 end of the time range (default: now)")
    p.add_argument("--error-kind", help="with --dead-letters: only this error kind")
    p.add_argument("--into-table", help="write the range's valid records into this namespace.table instead of "
                                        "the pipeline's tables (created from the contract if missing)")
    p.add_argument("--backfill", action="store_true",
                   help="record the run as a `backfill` event on the ops timeline (default: a `replay` event)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_replay)

    p = sub.add_parser("status", help="lag, recovery points and counts per pipeline")
    p.add_argument("--pipeline")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)

    p = sub.add_parser("airflow", help="start, stop or inspect Airflow for the embedded stack")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--port", type=int, help="API server port for `up` (default 8080 or LAKEHOUSE_AIRFLOW_PORT)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_airflow)

    p = sub.add_parser("maintain", help="compact, rewrite manifests, expire snapshots and remove orphan files")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--run-id", help="tag for this run's `maintenance` events (default: random)")
    p.add_argument("--json", action="store_true", help="the receipt as one JSON line")
    p.set_defaults(fn=cmd_maintain)

    p = sub.add_parser("retention", help="check Kafka retention covers lag, outages and the replay window; "
                                         "apply data retention")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_retention)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from lakehouse.airflow_stack import AirflowStackError
    from lakehouse.kafka_source import SourceError
    from lakehouse.replay import ReplayError
    from lakehouse.spark_cluster import SparkClusterError
    from lakehouse.supervision import JobAlreadyRunningError
    from lakehouse.tables import SchemaIncompatibleError

    try:
        return args.fn(args)
    except (SpecError, UnknownPipelineError, config.ConfigError, ReplayError, SchemaIncompatibleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (AirflowStackError, JobAlreadyRunningError, SparkClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SOURCE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's last word: say what failed, not a traceback wall
        if args.verbose:
            raise
        from lakehouse.sparkenv import describe_error

        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
