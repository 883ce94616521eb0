"""`make demo`: events flow from Kafka topics into Iceberg tables, exactly once, operated by Airflow.

Starts the embedded stack and Airflow (both left running, with the pipelines page),
creates the topics and hands the continuous pipelines (orders, customers) to Airflow: the
`<pipeline>_ingest` DAGs run the supervised continuous ingest jobs, `_publish`,
`_maintenance` and `retention_alignment` are unpaused on their schedules. Live producers
(with some bad records) run meanwhile for every pipeline, the Avro `payments` and the
Debezium change stream `inventory` included. Those two are `trigger.mode: scheduled`:
once the live phase ends a `--once` job each catches up (one Spark JVM per continuous job
is what two cores hold), and their DAGs are unpaused to run every 5 minutes. The demo
publishes every pipeline (the change stream's verification and publication included) once the
lag is 0, then prints the status, samples of raw.orders, raw.payments
and raw.inventory (against what the change stream says the table must hold), the dead
letters by reason and the readers' view. Without Airflow (it did not start) the demo runs
the ingest jobs itself. DEMO_SECONDS sets how long rows land live (default 60): the live phase starts
once every continuous job has landed its first batch (spark-submit under Airflow takes a while on two
cores), at most STARTUP_S after the producers started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import JobAlreadyRunningError
from lakehouse.core.spec import load_all
from lakehouse.ops.status import pipeline_status, render
from lakehouse.ops.supervision import JobLock
from lakehouse_dev import airflow_stack
from lakehouse_dev.cli import print_airflow_login

LAKEHOUSE = str(Path(sys.executable).with_name("lakehouse"))
SECONDS = int(os.environ.get("DEMO_SECONDS", "60"))
RATES = {"orders": 500, "customers": 20, "payments": 100, "inventory": 40}
TRICKLE_RATE = 5  # records/s per pipeline while the publish DAGs run
STARTUP_S = 180  # at most this long for the continuous jobs' first batch before the live phase counts


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(*args: str) -> None:
    subprocess.run([LAKEHOUSE, *args], check=True)


def start(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([LAKEHOUSE, *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def reset_if_the_log_is_new(specs) -> None:
    """The embedded broker keeps its log across restarts; when the log is new (its folder was deleted, the
    catalog kept), old tables point at offsets of topics that no longer exist (the pipeline would rightly
    stop: topic recreated), so the demo starts its tables afresh."""
    catalog = open_catalog(config.load(), "lake")
    existing = {t for s in specs for t in s.owned_tables if catalog.table_exists(t)}
    if existing:
        print(f"the broker's log is new, so its topics are too; dropping the demo tables from the "
              f"previous run: {', '.join(sorted(existing))}")
        for t in sorted(existing):
            catalog.purge_table(t)


def landed(status: dict) -> int:
    """Rows and dead letters a pipeline's tables hold (`pipeline_status`)."""
    return (status["rows"] or 0) + (status["dead_letters"] or 0)


def wait_until_ready(specs, jobs, timeout: float = 300.0) -> bool:
    """An ingest job is ready once it has created its tables (Spark is up); False on timeout."""
    catalog = open_catalog(config.load(), "lake")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(catalog.table_exists(t) for s in specs for t in s.owned_tables):
            return True
        if any(j.poll() is not None for j in jobs):
            return True  # reported by the progress loop
        time.sleep(1)
    return False


def airflow(*args: str, timeout: float = 120.0) -> str:
    """`airflow ARGS` against the demo's Airflow; retried while the DAG processor has not parsed the DAGs yet."""
    env = {**os.environ, **airflow_stack.environment()}
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run([str(Path(sys.executable).with_name("airflow")), *args], env=env,
                              capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout
        if time.monotonic() > deadline:
            raise RuntimeError(f"airflow {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
        time.sleep(3)


def hand_to_airflow(specs) -> None:
    """Unpause every DAG of the given pipelines: the `@continuous` ingest DAGs start their jobs at once."""
    dag_ids = [f"{s.name}_{kind}" for s in specs for kind in ("ingest", "publish", "maintenance")]
    for dag_id in [*dag_ids, "retention_alignment"]:
        airflow("dags", "unpause", dag_id)
    print("unpaused: " + ", ".join([*dag_ids, "retention_alignment"]))


def dags_of(specs) -> str:
    """The regular expression of the ingest, publish and maintenance DAGs of `specs`."""
    return f"^({'|'.join(s.name for s in specs)})_(ingest|publish|maintenance)$"


def wait_for_running_job(spec, timeout: float = 600.0) -> bool:
    """Wait until no ingest job of `spec` runs (an `_ingest` DAG run still on its way when the demo paused the
    DAG); False after `timeout` seconds."""
    lock = JobLock(config.load(), spec.name)
    deadline, told = time.monotonic() + timeout, False
    while True:
        try:
            lock.acquire().release()
            return True
        except JobAlreadyRunningError as exc:
            if time.monotonic() > deadline:
                print(f"{spec.name}: {exc}")
                return False
            if not told:
                print(f"{spec.name}: waiting for the ingest job already running to finish ({exc})", flush=True)
                told = True
            time.sleep(5)


def catch_up(specs, logs: Path) -> bool:
    """A `--once` job per scheduled pipeline, one after the other (two cores: side by side, or beside the
    publish DAGs, they only slow each other down), as their `_ingest` DAGs run on schedule; False when one
    fails (its log says why)."""
    for s in specs:
        if not wait_for_running_job(s):
            return False
        started = time.monotonic()
        job = start("ingest", "--pipeline", s.name, "--once", log=logs / f"ingest-{s.name}.log")
        if job.wait() != 0:
            print(f"the --once job of {s.name} failed (exit {job.returncode}); see {logs}/ingest-{s.name}.log")
            return False
        print(f"{s.name}: caught up in {time.monotonic() - started:.0f}s")
    return True


def change_stream_summary(log: Path) -> str:
    """The producer's last word on a change stream: what the table holds once every record is ingested."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("change stream:")] \
        if log.exists() else []
    return lines[-1] if lines else "change stream: (no summary in the producer's log)"


def publish_now(specs, timeout: float = 300.0) -> None:
    """Trigger each `<pipeline>_publish` DAG (quality, freshness and lag gates, publish) and wait for it."""
    runs = {}
    for s in specs:
        runs[s.name] = f"demo__{time.strftime('%Y%m%dT%H%M%S')}"
        # a run of a paused DAG stays queued: the scheduled pipelines' DAGs are still paused here
        airflow("dags", "unpause", f"{s.name}_publish")
        airflow("dags", "trigger", f"{s.name}_publish", "--run-id", runs[s.name])
    deadline = time.monotonic() + timeout
    pending = {name: "queued" for name in runs}
    while pending and time.monotonic() < deadline:
        time.sleep(5)
        for name in list(pending):
            out = airflow("dags", "list-runs", f"{name}_publish", "--output", "json")
            listed = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("[")))
            pending[name] = next((r["state"] for r in listed if r["run_id"] == runs[name]), "queued")
            if pending[name] in ("success", "failed"):
                print(f"{name}_publish: {pending[name]}")
                del pending[name]
    for name, state in pending.items():
        print(f"{name}_publish: still {state} after {timeout:.0f}s; follow it in the Airflow UI")


def main() -> int:
    specs = list(load_all().values())
    continuous = [s for s in specs if s.trigger.mode == "continuous"]
    scheduled = [s for s in specs if s.trigger.mode == "scheduled"]
    say("starting the embedded stack (Apache Kafka, SQLite JDBC catalog, local warehouse)")
    new_log = not (config.lakehouse_home() / "kafka" / "data" / "meta.properties").exists()
    run("stack", "up")
    if new_log:
        reset_if_the_log_is_new(specs)
    run("topics")

    say("starting Airflow (API server, scheduler, DAG processor, triggerer); it keeps running after the demo")
    airflow_started = subprocess.run([LAKEHOUSE, "airflow", "up"]).returncode == 0
    if not airflow_started:
        print("Airflow did not start (see the error above); the demo runs the ingest jobs itself")

    logs = config.lakehouse_home() / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    jobs = []
    if airflow_started:
        say("handing the pipelines to Airflow: the ingest DAGs submit the continuous jobs with spark-submit")
        if scheduled:  # a demo run before this one left them unpaused: they catch up below, then are unpaused
            airflow("dags", "pause", "--treat-dag-id-as-regex", "-y", dags_of(scheduled))
        hand_to_airflow(continuous)
    else:
        say(f"continuous ingestion (5 s trigger); logs in {logs}")
        jobs = [start("ingest", "--pipeline", s.name, "--trigger-interval", "5s", log=logs / f"ingest-{s.name}.log")
                for s in continuous]
    if not wait_until_ready(continuous, jobs):
        print("the ingest jobs did not create their tables in 5 minutes; see the <pipeline>_ingest task logs "
              f"in Airflow or {logs}")
        return 1

    say(f"producers started, logs in {logs}; rows land live for {SECONDS}s once every continuous ingest job "
        f"has landed its first batch")
    # the continuous pipelines' producers run until the live phase ends (they are stopped then); the scheduled
    # pipelines' produce a fixed count, whose change-stream summary the demo shows at the end
    producers = [start("produce", "--pipeline", s.name, "--count",
                       str(RATES.get(s.name, 100) * (SECONDS + (STARTUP_S if s in continuous else 0))),
                       "--rate", str(RATES.get(s.name, 100)), "--bad-ratio", "0.02", "--quiet",
                       log=logs / f"produce-{s.name}.log") for s in specs]
    try:
        started = time.monotonic()
        landed_before = {s.name: landed(pipeline_status(s, with_timeline=False)) for s in continuous}
        live_from, told = None, None
        while live_from is None or time.monotonic() - live_from < SECONDS \
                or any(p.poll() is None for p, s in zip(producers, specs) if s not in continuous):
            time.sleep(5)
            statuses = {s.name: pipeline_status(s, with_timeline=False) for s in specs}
            line = [f"{name}: {st['rows']} rows, {st['dead_letters']} dead letters, "
                    f"lag {st['lag_records'] if st['lag_records'] is not None else '?'}" for name, st in statuses.items()]
            print(f"[{time.monotonic() - started:5.0f}s] " + " | ".join(line), flush=True)
            if live_from is None:
                starting = [s.name for s in continuous if landed(statuses[s.name]) == landed_before[s.name]]
                if not starting or time.monotonic() - started > STARTUP_S:
                    live_from = time.monotonic()
                    print(f"{', '.join(starting)}: no batch landed within {STARTUP_S}s; see the <pipeline>_ingest "
                          f"task logs in Airflow or {logs}" if starting else
                          f"every continuous ingest job landed its first batch after {live_from - started:.0f}s "
                          f"(Spark starting); rows now land live for {SECONDS}s", flush=True)
                elif starting != told:
                    print(f"        waiting for the first batch of {', '.join(starting)} (the job is starting)",
                          flush=True)
                    told = starting
            for job, s in zip(jobs, continuous):
                if job.poll() is not None:
                    print(f"ingest job of {s.name} stopped (exit {job.returncode}); see {logs}/ingest-{s.name}.log")
                    return 1
        for p in producers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        say("producers stopped; waiting for the last batches to land")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            lags = [pipeline_status(s, with_timeline=False)["lag_records"] for s in continuous]
            if all(lag == 0 for lag in lags):
                break
            time.sleep(2)
    finally:
        for p in producers + jobs:  # Airflow's ingest jobs keep running
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in jobs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    if scheduled:
        say(f"scheduled pipelines ({', '.join(s.name for s in scheduled)}): a `--once` job each catches up, "
            f"as their ingest DAGs do every 5 minutes")
        if not catch_up(scheduled, logs):
            return 1

    if airflow_started:
        say("write-audit-publish: triggering the publish DAGs (quality suite, freshness and lag gates)")
        # traffic keeps flowing, as it does in production: the freshness gate (newest event at most
        # the SLO old) would otherwise wait for events that stopped coming with the producers
        trickle = [start("produce", "--pipeline", s.name, "--count", str(TRICKLE_RATE * 600), "--rate",
                         str(TRICKLE_RATE), "--quiet", log=logs / f"trickle-{s.name}.log") for s in continuous]
        try:
            publish_now(continuous + scheduled)  # the caught-up scheduled pipelines too: Avro, the change stream
        finally:
            for p in trickle:
                p.send_signal(signal.SIGTERM)
    if scheduled and airflow_started:  # from now on Airflow runs them on their schedules
        airflow("dags", "unpause", "--treat-dag-id-as-regex", "-y", dags_of(scheduled))
        print(f"unpaused the DAGs of {', '.join(s.name for s in scheduled)} (matching {dags_of(scheduled)})")

    say("status")
    print(render([pipeline_status(s) for s in specs]))

    catalog = open_catalog(config.load(), "lake")
    orders = next(s for s in specs if s.name == "orders")
    say(f"sample of {orders.qualified(orders.target.table)}")
    sample = catalog.load_table(orders.target.table).scan(limit=5).to_arrow()
    for row in sample.to_pylist():
        k = row["_kafka"]
        print(f"  {row['order_id']:<12} {row['status']:<10} {row['amount']:>9.2f} {row['currency']} "
              f"{row['event_time']:%Y-%m-%d %H:%M:%S}  from {k['topic']}[{k['partition']}]@{k['offset']}")
    say(f"dead letters in {orders.qualified(orders.dead_letter_table)} by reason")
    dead = catalog.load_table(orders.dead_letter_table).scan(selected_fields=("error_kind", "error_detail", "_kafka"))
    counts: dict[str, list] = {}
    for row in dead.to_arrow().to_pylist():
        counts.setdefault(row["error_kind"], []).append(row)
    for kind, rows_ in sorted(counts.items()):
        example = rows_[0]
        print(f"  {kind:<22} {len(rows_):>5}  e.g. offset {example['_kafka']['partition']}:"
              f"{example['_kafka']['offset']}: {example['error_detail'][:70]}")

    for s in scheduled:
        show_scheduled(catalog, s, logs)

    table = catalog.load_table(orders.target.table)
    published = table.metadata.refs.get(orders.publish.branch)
    if published is not None:
        count = len(table.scan(snapshot_id=published.snapshot_id, selected_fields=("order_id",)).to_arrow())
        say(f"readers' view {orders.qualified(orders.publish.view)}: {count} audited rows "
            f"(branch {orders.publish.branch!r} at snapshot {published.snapshot_id})")

    say("what next")
    print("  .venv/bin/lakehouse status                     lag, recovery points and counts")
    if airflow_started:
        print(f"  the ingest jobs keep running under Airflow (DAGs {', '.join(s.name + '_ingest' for s in continuous)}; "
              f"{', '.join(s.name + '_ingest' for s in scheduled)} every 5 minutes)")
        print_airflow_login(airflow_stack.status(), indent="  ")
    else:
        print("  .venv/bin/lakehouse ingest --pipeline orders --trigger-interval 5s   keep ingesting")
    print("  .venv/bin/lakehouse replay --pipeline orders --dead-letters          after fixing a contract")
    print("  make stack-down     stop Airflow and the broker (its log stays on disk: the topics are there at the next stack up)")
    print("  make clean          stop it and delete tables, catalog and warehouse (.lakehouse/)")
    return 0


def show_scheduled(catalog, spec, logs: Path) -> None:
    """A sample of a scheduled pipeline's table and its dead letters by reason; for a change stream, the
    table's rows beside what the producer says it must hold."""
    table = catalog.load_table(spec.target.table)
    rows = table.scan().to_arrow()
    say(f"{spec.qualified(spec.target.table)}: {rows.num_rows} rows, {spec.source.value_format} values"
        + (" (Debezium change events)" if spec.is_cdc else ""))
    if spec.is_cdc:
        print(f"  {change_stream_summary(logs / f'produce-{spec.name}.log')}")
        ops = {}
        for cdc in rows.column("_cdc").to_pylist():
            ops[cdc["op"]] = ops.get(cdc["op"], 0) + 1
        print(f"  rows by the change that wrote them: {', '.join(f'{op}={n}' for op, n in sorted(ops.items()))}")
    for row in rows.slice(0, 3).to_pylist():
        shown = {k: v for k, v in row.items() if k not in ("_kafka", "_ingested_at", "_cdc") and v is not None}
        print("  " + ", ".join(f"{k}={v}" for k, v in list(shown.items())[:7])[:150])
    dead = catalog.load_table(spec.dead_letter_table).scan(selected_fields=("error_kind",)).to_arrow()
    counts: dict[str, int] = {}
    for kind in dead.column("error_kind").to_pylist():
        counts[kind] = counts.get(kind, 0) + 1
    print(f"  dead letters: {', '.join(f'{k}={n}' for k, n in sorted(counts.items())) or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
