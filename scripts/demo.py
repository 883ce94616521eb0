"""`make demo`: events flow from Kafka topics into Iceberg tables, exactly once, for about a minute.

Starts the embedded stack, creates the topics, runs a live producer (with some
bad records) and the continuous ingest job of each demo pipeline, shows progress,
then prints the status and a sample of raw.orders and raw.orders_dlq.
DEMO_SECONDS sets how long the producers run (default 60).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lakehouse import config, offsets, stack
from lakehouse.spec import load_all
from lakehouse.status import pipeline_status, render

LAKEHOUSE = str(Path(sys.executable).with_name("lakehouse"))
SECONDS = int(os.environ.get("DEMO_SECONDS", "60"))
RATES = {"orders": 500, "customers": 20}


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(*args: str) -> None:
    subprocess.run([LAKEHOUSE, *args], check=True)


def start(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([LAKEHOUSE, *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def reset_if_broker_was_restarted(specs) -> None:
    """The embedded broker keeps topics in memory: after a restart, old tables point at offsets
    of topics that no longer exist (the pipeline would rightly stop: topic recreated)."""
    catalog = offsets.open_catalog(config.load(), "lake")
    existing = {t for s in specs for t in (*s.target.tables, s.dead_letter_table) if catalog.table_exists(t)}
    if existing:
        print(f"the broker was restarted, so its topics are new; dropping the demo tables from the "
              f"previous run: {', '.join(sorted(existing))}")
        for t in sorted(existing):
            catalog.purge_table(t)


def wait_until_ready(specs, jobs, timeout: float = 180.0) -> None:
    """An ingest job is ready once it has created its tables (Spark is up)."""
    catalog = offsets.open_catalog(config.load(), "lake")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(catalog.table_exists(t) for s in specs for t in (*s.target.tables, s.dead_letter_table)):
            return
        if any(j.poll() is not None for j in jobs):
            return  # reported by the progress loop
        time.sleep(1)


def main() -> int:
    specs = list(load_all().values())
    say("starting the embedded stack (Kafka-compatible broker, SQLite JDBC catalog, local warehouse)")
    was_running = stack.status()["broker"]["running"]
    run("stack", "up")
    if not was_running:
        reset_if_broker_was_restarted(specs)
    run("topics")
    logs = config.lakehouse_home() / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    say(f"live producers for {SECONDS}s and continuous ingestion (5 s trigger); logs in {logs}")
    jobs = [start("ingest", "--pipeline", s.name, "--trigger-interval", "5s", log=logs / f"ingest-{s.name}.log")
            for s in specs]
    wait_until_ready(specs, jobs)
    producers = [start("produce", "--pipeline", s.name, "--count", str(RATES.get(s.name, 100) * SECONDS),
                       "--rate", str(RATES.get(s.name, 100)), "--bad-ratio", "0.02", "--quiet",
                       log=logs / f"produce-{s.name}.log") for s in specs]
    try:
        started = time.monotonic()
        while any(p.poll() is None for p in producers) or time.monotonic() - started < SECONDS:
            time.sleep(5)
            line = []
            for s in specs:
                st = pipeline_status(s)
                line.append(f"{s.name}: {st['rows']} rows, {st['dead_letters']} dead letters, "
                            f"lag {st['lag_records'] if st['lag_records'] is not None else '?'}")
            print(f"[{time.monotonic() - started:5.0f}s] " + " | ".join(line), flush=True)
            for job, s in zip(jobs, specs):
                if job.poll() is not None:
                    print(f"ingest job of {s.name} stopped (exit {job.returncode}); see {logs}/ingest-{s.name}.log")
                    return 1
        say("producers done; waiting for the last batches to land")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            lags = [pipeline_status(s)["lag_records"] for s in specs]
            if all(lag == 0 for lag in lags):
                break
            time.sleep(2)
    finally:
        for p in producers + jobs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in jobs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    say("status")
    print(render([pipeline_status(s) for s in specs]))

    catalog = offsets.open_catalog(config.load(), "lake")
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
        print(f"  {kind:<18} {len(rows_):>5}  e.g. offset {example['_kafka']['partition']}:"
              f"{example['_kafka']['offset']}: {example['error_detail'][:70]}")

    say("what next")
    print("  .venv/bin/lakehouse status                     lag, recovery points and counts")
    print("  .venv/bin/lakehouse ingest --pipeline orders --trigger-interval 5s   keep ingesting")
    print("  .venv/bin/lakehouse replay --pipeline orders --dead-letters          after fixing a contract")
    print("  make stack-down     stop the broker (topics are in memory and go with it)")
    print("  make clean          stop it and delete tables, catalog and warehouse (.lakehouse/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
