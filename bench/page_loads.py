"""`python -m bench.page_loads`: what 50 concurrent loads of the pipelines page do to the Execution API
that running tasks send their heartbeats to, and to the API server's threads.

Why: Airflow's API server runs sync handlers on one shared pool of 40 threads (AnyIO's default limiter);
the Execution API's handlers, the task heartbeat (`PUT /execution/task-instances/{id}/heartbeat`) among
them, are sync `def`s on that pool. The page used to compute every overview inside a sync handler (Kafka
timeouts of 10-15 s per pipeline), so a few dozen page loads held the 40 threads and heartbeats queued
behind them. Now the page answers from `lakehouse.ops.overview_cache` on threads of its own.

What it does: a scratch LAKEHOUSE_HOME, N pipeline specs whose broker address nobody listens on (the worst
case: every background read waits for Kafka's timeouts), Airflow's API server alone
(`lakehouse_dev.airflow_stack`, as `lakehouse airflow up` starts it), signed in as the stack's admin. Then:

1. idle: IDLE_HEARTBEATS sequential calls of the Execution API's health endpoint (`GET /execution/health`,
   a sync handler on the same shared pool as the heartbeat endpoint, which needs no running task);
2. load: LOADS clients start at once through a barrier and each loads the page again as soon as it has
   its answer, for `seconds` (half `/lakehouse/`, half `/lakehouse/api/pipelines`): LOADS page loads in
   flight all along. Meanwhile one client calls the health endpoint every 50 ms and another samples the API
   server's threads (its whole process tree, from /proc) every 50 ms.

A heartbeat counts as lost when it is not answered within Airflow's [workers] execution_api_timeout (5 s by
default): that is when a task runner gives up on it. The numbers (seconds, percentiles, status counts,
threads) are printed as JSON and written to reports/bench/page_loads.json. tests/e2e/test_ui.py runs `measure`
and asserts its outcomes (every load and heartbeat answered 200, none lost, threads bounded), not times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

LOADS = 50
SECONDS = 10.0  # how long the LOADS clients keep loading the page
IDLE_HEARTBEATS = 40
HEARTBEAT_EVERY_S = 0.05
SHARED_POOL = 40  # threads of AnyIO's default limiter: Starlette's sync handlers and the Execution API share them
REPORT = Path(__file__).resolve().parent.parent / "reports" / "bench" / "page_loads.json"


def heartbeat_timeout() -> float:
    """Seconds a task runner waits for an Execution API answer ([workers] execution_api_timeout)."""
    from airflow.configuration import conf

    return conf.getfloat("workers", "execution_api_timeout", fallback=5.0)


def threads_of(pid: int) -> int:
    """Threads of process `pid` and of every process below it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {pid}, True
    while grew:
        below = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    count = 0
    for member in tree:
        try:
            count += len(list(Path(f"/proc/{member}/task").iterdir()))
        except OSError:
            continue
    return count


def call(url: str, token: str | None = None, timeout: float = 180.0) -> int | None:
    """The HTTP status of GET `url` (None: no answer within `timeout`, or the connection failed)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def summary(seconds: list[float]) -> dict:
    """count, p50, p95 and max of `seconds` (None when empty), rounded to the millisecond."""
    if not seconds:
        return {"count": 0, "p50_s": None, "p95_s": None, "max_s": None}
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"count": len(ordered), "p50_s": round(statistics.median(ordered), 3), "p95_s": round(p95, 3),
            "max_s": round(ordered[-1], 3)}


def measure(url: str, pid: int, token: str, loads: int = LOADS, seconds: float = SECONDS,
            idle_heartbeats: int = IDLE_HEARTBEATS) -> dict:
    """Idle heartbeats, then `loads` clients loading the page over and over for `seconds`, beside a heartbeat
    every 50 ms (see the module doc).

    {"heartbeat_timeout_s", "idle": {count, p50_s, p95_s, max_s, statuses}, "loads": {... statuses},
     "during": {... statuses, lost}: the heartbeats sent before the last load was answered,
     "load_seconds": how long the loads were in flight,
     "threads": {baseline, peak, growth, shared_pool}}; statuses count HTTP codes ("none": no answer).
    """
    limit = heartbeat_timeout()
    health = f"{url}/execution/health"

    def timed(target: str, auth: str | None, timeout: float) -> tuple[float, float, int | None]:
        sent = time.monotonic()
        status = call(target, auth, timeout)
        return sent, time.monotonic(), status

    call(health, None, limit)  # the first answer of a fresh server includes imports: not an idle heartbeat
    idle = [timed(health, None, limit) for _ in range(idle_heartbeats)]
    baseline = threads_of(pid)
    heartbeats: list[tuple[float, float, int | None]] = []
    answered: list[tuple[float, float, int | None]] = []
    peak = [baseline]
    done = threading.Event()

    def heartbeat() -> None:
        while not done.is_set():
            heartbeats.append(timed(health, None, limit))
            done.wait(HEARTBEAT_EVERY_S)

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], threads_of(pid))
            done.wait(HEARTBEAT_EVERY_S)

    gate = threading.Barrier(loads)

    def load(n: int) -> None:
        gate.wait()
        until = time.monotonic() + seconds
        while True:
            answered.append(timed(f"{url}/lakehouse/" if n % 2 else f"{url}/lakehouse/api/pipelines", token, 180.0))
            if time.monotonic() >= until:
                return

    watchers = [threading.Thread(target=heartbeat), threading.Thread(target=sample)]
    pages = [threading.Thread(target=load, args=(n,)) for n in range(loads)]
    for thread in watchers + pages:
        thread.start()
    for thread in pages:
        thread.join(timeout=seconds + 300)
    first = min((at for at, _, _ in answered), default=time.monotonic())
    last = max((at for _, at, _ in answered), default=time.monotonic())
    time.sleep(0.5)
    done.set()
    for thread in watchers:
        thread.join(timeout=limit + 10)
    during = [h for h in heartbeats if first <= h[0] <= last]

    def statuses(found: list[tuple[float, float, int | None]]) -> dict[str, int]:
        return dict(Counter("none" if s is None else str(s) for _, _, s in found))

    return {
        "heartbeat_timeout_s": limit,
        "idle": {**summary([b - a for a, b, _ in idle]), "statuses": statuses(idle)},
        "load_seconds": round(last - first, 3),
        "loads": {**summary([b - a for a, b, _ in answered]), "statuses": statuses(answered),
                  "per_s": round(len(answered) / max(last - first, 1e-9), 1)},
        "during": {**summary([b - a for a, b, _ in during]), "statuses": statuses(during),
                   "lost": sum(1 for _, _, s in during if s is None)},
        "threads": {"baseline": baseline, "peak": peak[0], "growth": peak[0] - baseline, "shared_pool": SHARED_POOL},
    }


def write_specs(folder: Path, count: int) -> None:
    """`count` copies of the repository's orders spec under their own names, topics and tables."""
    import yaml

    from lakehouse.core import config

    template = yaml.safe_load((config.REPO_ROOT / "include" / "pipelines" / "orders.yaml").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        spec = json.loads(json.dumps(template))
        name = f"orders_page_{n}"
        spec["name"] = name
        spec["source"]["topic"] = name.replace("_", "-")
        spec["target"]["table"] = f"raw.{name}"
        spec["dead_letter"]["table"] = f"raw.{name}_dlq"
        if "publish" in spec:
            spec["publish"]["view"] = f"serve.{name}"
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def sign_in(started: dict) -> str:
    """A JWT of the stack's admin user from Airflow's POST /auth/token."""
    request = urllib.request.Request(
        f"{started['url']}/auth/token", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"username": started["user"], "password": started["password"]}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["access_token"]


def wait_for_cards(url: str, token: str, timeout: float = 120.0) -> None:
    """Until /lakehouse/api/pipelines answers 200 (the background refresher read the pipelines folder)."""
    deadline = time.monotonic() + timeout
    while call(f"{url}/lakehouse/api/pipelines", token, 30.0) != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"the pipelines page did not answer 200 within {timeout:.0f}s")
        time.sleep(0.5)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.page_loads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=LOADS, help="concurrent page loads (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=SECONDS,
                        help="how long the clients keep loading the page (default %(default)s)")
    parser.add_argument("--pipelines", type=int, default=3, help="spec files on the page (default %(default)s)")
    parser.add_argument("--out", type=Path, default=REPORT, help="the JSON report (default %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lakehouse-page-loads-") as scratch:
        os.environ["LAKEHOUSE_HOME"] = str(Path(scratch) / "home")
        os.environ["LAKEHOUSE_PIPELINES_DIR"] = str(Path(scratch) / "pipelines")
        os.environ["LAKEHOUSE_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{_free_port()}"  # nobody listens: reads time out
        write_specs(Path(scratch) / "pipelines", args.pipelines)
        from lakehouse_dev import airflow_stack

        os.environ["AIRFLOW_HOME"] = str(airflow_stack.home())  # this process reads Airflow's settings there too
        try:
            started = airflow_stack.up(port=_free_port(), components=("api-server",))
            url, pid = started["url"], started["running"]["api-server"]
            token = sign_in(started)
            wait_for_cards(url, token)
            found = {"loads_asked": args.loads, "pipelines": args.pipelines, **measure(url, pid, token, args.loads, args.seconds)}
        finally:
            airflow_stack.down()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps(found, indent=2))
    ok = (set(found["loads"]["statuses"]) == {"200"} and found["during"]["lost"] == 0
          and set(found["during"]["statuses"]) == {"200"} and found["threads"]["growth"] < SHARED_POOL)
    print(f"{'held' if ok else 'NOT held'}: {found['loads']['count']} page loads by {args.loads} clients in "
          f"{found['load_seconds']}s (p95 {found['loads']['p95_s']}s), heartbeats during them "
          f"p95 {found['during']['p95_s']}s / max {found['during']['max_s']}s (idle p95 {found['idle']['p95_s']}s), "
          f"{found['during']['lost']} lost, threads {found['threads']['baseline']} -> {found['threads']['peak']}",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
