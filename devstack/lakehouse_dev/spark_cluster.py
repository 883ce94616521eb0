"""A Spark standalone cluster for the embedded stack: one master and one worker, from the pip pyspark.

`lakehouse stack up --spark-cluster` starts them the way a Spark operator would by hand:

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 7077 --webui-port 8081
    spark-class org.apache.spark.deploy.worker.Worker --cores 4 --memory 4g --webui-port 8082 spark://127.0.0.1:7077

and records the master URL in `<LAKEHOUSE_HOME>/spark-cluster.json`, which `config.load()`
reads: from then on every job of this home (the CLI, spark-submit from Airflow through the
`spark_default` connection, the tests) runs its executors in their own JVMs under the
worker instead of inside the driver. LAKEHOUSE_SPARK_MASTER still wins over that file.

    logs/spark-master.log, logs/spark-worker.log   the daemons' output
    spark/work/<app>/<executor>/stderr             each executor's output (the worker's work dir)

The worker offers more cores than a small machine has (`cores`, default 4) so that the
continuous ingest job and a maintenance or backfill job can hold executors at the same
time; each application takes at most `spark.cores.max` of them (sparkenv.spark_conf).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from lakehouse.core import config
from lakehouse.core.errors import LakehouseError
from lakehouse_dev import settings
from lakehouse_dev.airflow_stack import port_free
from lakehouse_dev.processes import pid_alive

STATE_FILE = "spark-cluster.json"
DEFAULT_PORT = 7077
DEFAULT_UI_PORT = 8081  # Airflow's API server has 8080
DEFAULT_CORES = 4
DEFAULT_MEMORY = "4g"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(LakehouseError, RuntimeError):
    """The standalone cluster cannot be started, reached or stopped; the message says what to do."""


def _state_path(home: Path) -> Path:
    return home / STATE_FILE


def _spark_class() -> str:
    """`spark-class` of the pip pyspark next to this interpreter (the one spark-submit uses)."""
    candidate = Path(sys.executable).with_name("spark-class")
    if candidate.exists():
        return str(candidate)
    try:
        import pyspark
    except ImportError as exc:
        raise SparkClusterError("pyspark is not installed: run `make setup`") from exc
    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _alive(pid: int | None) -> bool:
    """Whether `pid` runs and is a Spark daemon (not a recycled pid)."""
    if not pid_alive(pid):
        return False
    try:
        return b"org.apache.spark.deploy." in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid we recorded


def master_info(ui_url: str, timeout: float = 2.0) -> dict | None:
    """The master's JSON view (workers, active and completed applications), None if it does not answer."""
    try:
        with urllib.request.urlopen(f"{ui_url.rstrip('/')}/json/", timeout=timeout) as response:
            return json.load(response)
    except (OSError, ValueError, urllib.error.URLError):
        return None


def status() -> dict:
    """Whether this home's cluster runs: {running, master, master_ui, workers_alive, cores, pids, logs}."""
    home = config.lakehouse_home()
    state = settings.read_state_file(home, STATE_FILE)
    if not state:
        return {"running": False, "master": None}
    info = master_info(state["master_ui"]) if _alive(state.get("master_pid")) else None
    alive = [w for w in (info or {}).get("workers", []) if w.get("state") == "ALIVE"]
    return {**state, "running": bool(info) and bool(alive), "workers_alive": len(alive),
            "cores": sum(w.get("cores", 0) for w in alive)}


def _launch(home: Path, name: str, args: list[str]) -> subprocess.Popen:
    log = home / "logs" / f"spark-{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # the executors' local files (shuffle blocks, fetched jars) under the stack's home, not /tmp
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(log.parent),
               SPARK_LOCAL_DIRS=str(home / "spark" / "local"),
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    env.pop("SPARK_HOME", None)  # spark-class finds the pip package's own home
    with open(log, "ab") as handle:
        handle.write(f"\n=== {datetime.now(timezone.utc).isoformat()} {' '.join(args)}\n".encode())
        handle.flush()
        # a session of its own: the daemons outlive the CLI, and stopping the worker's group
        # also stops the executors it launched
        return subprocess.Popen([_spark_class(), *args], stdin=subprocess.DEVNULL, stdout=handle,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)


def _log_tail(home: Path, name: str, lines: int = 15) -> str:
    try:
        text = (home / "logs" / f"spark-{name}.log").read_text(errors="replace")
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def up(port: int | None = None, ui_port: int | None = None, cores: int = DEFAULT_CORES,
       memory: str = DEFAULT_MEMORY) -> dict:
    """Start the master and one worker unless they run; return `status()` plus `started`.

    Raises SparkClusterError when a port is taken, or the master or worker does not come up
    within START_TIMEOUT_S (quoting its log).
    """
    home = config.lakehouse_home()
    current = status()
    if current["running"]:
        return {**current, "started": False}
    down()  # half a cluster (a dead worker, a deaf master) is replaced, not trusted
    port = port or DEFAULT_PORT
    ui_port = ui_port or DEFAULT_UI_PORT
    worker_ui_port = ui_port + 1
    for wanted, what in ((port, "master"), (ui_port, "master web UI"), (worker_ui_port, "worker web UI")):
        if not port_free(wanted):
            raise SparkClusterError(f"port {wanted} for the Spark {what} is in use; choose other ports "
                                    f"(--spark-port / --spark-ui-port) or stop what listens there")
    master_url = f"spark://127.0.0.1:{port}"
    ui_url = f"http://127.0.0.1:{ui_port}"
    master = _launch(home, "master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port),
                                      "--webui-port", str(ui_port)])
    state = {"master": master_url, "master_ui": ui_url, "master_pid": master.pid,
             "logs": str(home / "logs"), "work_dir": str(home / "spark" / "work"),
             "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _write_state(home, state)
    _wait(home, "master", master, lambda: master_info(ui_url) is not None)
    (home / "spark" / "work").mkdir(parents=True, exist_ok=True)
    worker = _launch(home, "worker", [WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(cores),
                                      "--memory", memory, "--webui-port", str(worker_ui_port),
                                      "--work-dir", state["work_dir"], master_url])
    state["worker_pid"] = worker.pid
    _write_state(home, state)
    _wait(home, "worker", worker, lambda: status()["workers_alive"] > 0)
    config.load(fresh=True)  # this process now runs its jobs on the master
    return {**status(), "started": True}


def _write_state(home: Path, state: dict) -> None:
    home.mkdir(parents=True, exist_ok=True)
    tmp = _state_path(home).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(_state_path(home))


def _wait(home: Path, name: str, proc: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            down()
            what = f"exited with code {proc.returncode}" if proc.returncode is not None else \
                f"did not come up within {START_TIMEOUT_S:.0f}s"
            raise SparkClusterError(f"the Spark {name} {what}; the end of its log:\n{_log_tail(home, name)}")
        time.sleep(0.25)


def _stop(pid: int | None) -> bool:
    """SIGTERM the daemon's process group (its executors too), SIGKILL after STOP_TIMEOUT_S."""
    if not _alive(pid):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if not _alive(pid):
            return True
    raise SparkClusterError(f"Spark daemon {pid} survived SIGKILL")


def down() -> dict:
    """Stop the worker (with its executors), then the master; forget the cluster. Idempotent."""
    home = config.lakehouse_home()
    state = settings.read_state_file(home, STATE_FILE)
    stopped = [_stop(state.get("worker_pid")), _stop(state.get("master_pid"))]
    _state_path(home).unlink(missing_ok=True)
    config.load(fresh=True)
    return {"stopped": any(stopped), "master": state.get("master")}
