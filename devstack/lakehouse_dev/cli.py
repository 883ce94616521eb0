"""The development stack's commands, which `lakehouse` adds through the `lakehouse.commands` entry points.

    lakehouse stack up|down|status [--json]      the embedded Kafka broker and local catalog
    lakehouse stack up --spark-cluster           ... plus a Spark standalone master and worker
    lakehouse stack up --auth scram-sha-512 --tls   ... with a broker that requires a SASL login over TLS
    lakehouse produce --pipeline NAME --count N  synthetic records in the spec's formats (Debezium change
                                                 events for target.mode cdc), some of them bad
    lakehouse airflow up|down|status [--json]    Airflow 3 (API server, scheduler, ...) for the embedded stack

`stack status` exits 1 when the broker does not run (or does not answer), and `airflow status` exits 1
when none of Airflow's components runs, after printing what they found: a script or a health check can
tell "nothing runs" from "runs" by the exit code alone.
"""

from __future__ import annotations

import argparse
import sys

from lakehouse.cli import print_json
from lakehouse.core import config
from lakehouse.core.cli_types import at_least, pipeline_name, port, rate, ratio, seed
from lakehouse.core.errors import EXIT_FAILURE
from lakehouse.core.spec import load_pipeline


def cmd_stack(args) -> int:
    from lakehouse_dev import spark_cluster, stack

    if args.action == "up":
        result = stack.up(port=args.port, auth=args.auth, tls=args.tls, catalog=args.catalog,
                          object_store=args.object_store, registry=args.registry)
        if args.spark_cluster:
            spark_cluster.up(port=args.spark_port, ui_port=args.spark_ui_port)
    elif args.action == "down":
        result = {**stack.down(purge=args.purge), "spark_cluster": spark_cluster.down()}
    else:
        result = stack.status()
    if args.action != "down":
        result["spark_cluster"] = spark_cluster.status()
    if args.json:
        print_json(result)
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
            listeners = broker.get("listeners") or {}
            if listeners:
                print("listeners  " + ", ".join(f"{name} {address}" for name, address in listeners.items()))
            print(f"catalog    {result.get('catalog_uri')}")
            print(f"warehouse  {result.get('warehouse')}")
            for name, server in (result.get("services") or {}).items():
                where = server.get("url") or server.get("endpoint")
                print(f"{name.replace('_', ' '):<10} {where} ({'running' if server['running'] else 'NOT running'})")
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
    if args.action == "status" and not result.get("broker", {}).get("running"):
        return EXIT_FAILURE  # nothing to use: the broker, the one piece every command needs, is not running
    return 0


def cmd_produce(args) -> int:
    from lakehouse.core import topics
    from lakehouse_dev import produce

    spec = load_pipeline(args.pipeline)
    topics.ensure_topics([spec])

    def progress(sent: int) -> None:
        print(f"\rproduced {sent}/{args.count}", end="", file=sys.stderr, flush=True)

    report = produce.produce(spec, args.count, rate=args.rate, bad_ratio=args.bad_ratio, seed=args.seed,
                             on_progress=None if args.quiet else progress, connect_schemas=args.connect_schemas)
    if not args.quiet:
        print(file=sys.stderr)
    bad = sum(report.bad_by_kind.values())
    print(f"produced {report.sent} records to {spec.source.topic} ({bad} bad: "
          f"{', '.join(f'{k}={v}' for k, v in sorted(report.bad_by_kind.items())) or 'none'}) "
          f"in {report.seconds:.1f}s")
    if report.changes is not None:
        changes = report.changes
        print(f"change stream: {changes.snapshot} snapshot rows, then "
              f"{', '.join(f'{op}={n}' for op, n in sorted(changes.by_op.items()) if op != 'r') or 'no changes'}; "
              f"once ingested the table holds {len(changes.final_rows)} rows, "
              f"{len(changes.deleted_keys)} keys deleted")
    return 0


def print_airflow_login(result: dict, indent: str = "") -> None:
    """The Airflow URL, the pipelines page and the login, as `airflow up` and the demo print them."""
    print(f"{indent}airflow    {result['url']}  (user {result['user']}, password {result['password']}; "
          f"kept in {result['password_file']})")
    print(f"{indent}pipelines  {result['page']}")


def cmd_airflow(args) -> int:
    from lakehouse_dev import airflow_stack

    if args.action == "up":
        result = airflow_stack.up(port=args.port)
    elif args.action == "down":
        result = {"stopped": airflow_stack.down()}
    else:
        result = airflow_stack.status()
    if args.json:
        print_json(result)
    elif args.action == "down":
        stopped = result["stopped"]
        print("airflow stopped: "
              + (", ".join(f"{c} (pid {p})" for c, p in stopped.items()) or "nothing was running"))
    else:
        print_airflow_login(result)
        for component, pid in result["running"].items():
            print(f"{component:<14} {'pid ' + str(pid) if pid else 'NOT running'}  log {result['logs'][component]}")
    if args.action == "status" and not any(result["running"].values()):
        return EXIT_FAILURE  # no component runs
    return 0


def add_stack_command(sub) -> None:
    p = sub.add_parser("stack", help="start, stop or inspect the embedded stack")
    p.add_argument("action", choices=("up", "down", "status"),
                   help="up: start (or keep) the broker and catalog; down: stop them; status: what runs (exit 1: "
                        "no broker)")
    p.add_argument("--port", type=port, help="broker port for `up` (default 19092 or LAKEHOUSE_BROKER_PORT)")
    p.add_argument("--auth", choices=("none", "scram-sha-512", "scram", "scram-sha-256"),
                   help="with `up`: clients log in with SASL/SCRAM as user `lakehouse` (generated password in "
                        "<home>/security/kafka.password) (default none or LAKEHOUSE_BROKER_AUTH)")
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                   help="with `up`: TLS listener with a self-signed CA (<home>/security/ca.pem) "
                        "(default off or LAKEHOUSE_BROKER_TLS)")
    p.add_argument("--catalog", choices=("jdbc", "rest"),
                   help="with `up`: the catalog every pipeline uses: the SQLite JDBC catalog, or an Iceberg REST "
                        "catalog server the stack runs (default jdbc or LAKEHOUSE_STACK_CATALOG)")
    p.add_argument("--object-store", action=argparse.BooleanOptionalAction, default=None,
                   help="with `up`: run an S3-compatible object store and put the warehouse on "
                        "s3://lakehouse/warehouse (default off or LAKEHOUSE_STACK_OBJECT_STORE)")
    p.add_argument("--registry", action=argparse.BooleanOptionalAction, default=None,
                   help="with `up`: run a schema registry (Apicurio, Confluent-compatible API, basic auth) and "
                        "give it to the pipelines (default off or LAKEHOUSE_STACK_REGISTRY)")
    p.add_argument("--purge", action="store_true", help="with `down`: also delete the catalog and warehouse")
    p.add_argument("--spark-cluster", action="store_true",
                   help="with `up`: also start a Spark standalone master and worker; jobs of this home run on it")
    p.add_argument("--spark-port", type=port, help="Spark master port (default 7077)")
    p.add_argument("--spark-ui-port", type=port,
                   help="Spark master web UI port (default 8081; the worker's is +1)")
    p.add_argument("--json", action="store_true", help="print the stack's state as JSON instead of text")
    p.set_defaults(fn=cmd_stack)


def add_produce_command(sub) -> None:
    p = sub.add_parser("produce", help="produce synthetic records for a pipeline")
    p.add_argument("--pipeline", type=pipeline_name, required=True,
                   help="the pipeline whose source topic gets the records (its contract shapes them)")
    p.add_argument("--count", type=at_least(0), required=True, help="how many records to produce (0 or more)")
    p.add_argument("--rate", type=rate, help="records per second (default: as fast as possible)")
    p.add_argument("--bad-ratio", type=ratio, default=0.0, help="share of malformed or invalid records, 0 to 1")
    p.add_argument("--seed", type=seed, help="random seed: the same seed produces the same records (default: random)")
    p.add_argument("--connect-schemas", action="store_true",
                   help="change streams (target.mode cdc) in JSON: each key and value with its Kafka Connect schema, "
                        "as JsonConverter writes them with schemas.enable=true (default: the plain envelope)")
    p.add_argument("--quiet", action="store_true", help="no progress counter on stderr")
    p.set_defaults(fn=cmd_produce)


def add_airflow_command(sub) -> None:
    p = sub.add_parser("airflow", help="start, stop or inspect Airflow for the embedded stack")
    p.add_argument("action", choices=("up", "down", "status"),
                   help="up: start Airflow's components; down: stop them; status: what runs (exit 1: none)")
    p.add_argument("--port", type=port, help="API server port for `up` (default 8080 or LAKEHOUSE_AIRFLOW_PORT)")
    p.add_argument("--json", action="store_true", help="print Airflow's state as JSON instead of text")
    p.set_defaults(fn=cmd_airflow)
