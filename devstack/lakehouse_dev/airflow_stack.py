"""Airflow 3 for the embedded stack: one metadata DB, an API server and the background components.

Everything lives under `<LAKEHOUSE_HOME>/airflow/` (AIRFLOW_HOME):

    airflow.db                  the SQLite metadata database, unless LAKEHOUSE_AIRFLOW_DB_URI names another
    passwords.json              the simple auth manager's password file; user `admin`, generated once
    secrets.json                JWT and API secret keys, generated once, shared by all components
    state.json                  port and URL of the running API server
    <component>.pid / .log      one per component: api-server, scheduler, dag-processor, triggerer

Settings (environment variables, read on every `up`):

    LAKEHOUSE_AIRFLOW_PORT         port of the API server (default 8080; `--port` wins)
    LAKEHOUSE_AIRFLOW_DB_URI       SQLAlchemy URI of the metadata DB, e.g.
                                   postgresql+psycopg2://airflow:PW@127.0.0.1:5432/airflow
                                   (default: sqlite:///<AIRFLOW_HOME>/airflow.db). The PostgreSQL
                                   database must exist; `up` migrates its schema.
    LAKEHOUSE_AIRFLOW_DAGS_FOLDER  folder of DAG files (default: the repository's dags/)

`airflow db migrate` runs on every `up`, on whichever database is configured. Use
PostgreSQL for anything beyond one person's laptop: the scheduler, the DAG processor,
the API server and the executor's workers then write to the metadata DB at the same time
without SQLite's single-writer lock (the compose stack does the same).

The hooks, operators, sensors and the pipelines page come from the installed provider
(airflow-provider-lakehouse, providers/lakehouse, which set-up installs); Airflow's plugins folder is
the repository's plugins/. The provider finds its files by configuration (lakehouse_airflow.locations):
the stack gives it the repository's folders of specs, expectation suites and Spark jobs
(LAKEHOUSE_PIPELINES_DIR, LAKEHOUSE_EXPECTATIONS_DIR, LAKEHOUSE_SPARK_JOBS_DIR) unless the environment
sets them. The `spark_default` connection comes from `lakehouse_airflow.spark.spark_connection()`.

Executor: Airflow 3 removed the SequentialExecutor, and its LocalExecutor runs on
SQLite as on PostgreSQL (tasks talk to the Execution API, not to the database), so the
stack uses LocalExecutor with PARALLELISM slots, whatever the metadata DB: task
instances run in parallel worker processes. Each continuous ingest job holds one slot
for as long as it runs, and maintenance, publishing and backfills need the others.
`down()` stops the scheduler first, then the ingest jobs (they run in their own
process groups, holding their pipeline locks), then the other components.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from lakehouse.core import config
from lakehouse.core.errors import LakehouseError

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
DEFAULT_PORT = 8080
ADMIN_USER = "admin"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
PARALLELISM = 8
MIGRATE_TIMEOUT_S = 300.0
DAGS_FOLDER = config.REPO_ROOT / "dags"
PLUGINS_FOLDER = config.REPO_ROOT / "plugins"
SPARK_JOBS_FOLDER = config.REPO_ROOT / "spark_jobs"
SPARK_JOBS_VARIABLE = "LAKEHOUSE_SPARK_JOBS_DIR"  # read by the provider, lakehouse_airflow.locations
DB_URI_VARIABLE = "LAKEHOUSE_AIRFLOW_DB_URI"
DAGS_FOLDER_VARIABLE = "LAKEHOUSE_AIRFLOW_DAGS_FOLDER"
# Every variable this module reads (config.ENVIRONMENT lists config's own).
ENVIRONMENT = ("LAKEHOUSE_AIRFLOW_PORT", DB_URI_VARIABLE, DAGS_FOLDER_VARIABLE, SPARK_JOBS_VARIABLE)
# SQLAlchemy dialects Airflow 3 can keep its metadata in, as this stack configures it
METADATA_DIALECTS = ("postgresql", "sqlite")


class AirflowStackError(LakehouseError, RuntimeError):
    """Airflow cannot be migrated, started or stopped; the message quotes the component's log."""


def home() -> Path:
    """AIRFLOW_HOME of the embedded stack: `<LAKEHOUSE_HOME>/airflow`."""
    return config.lakehouse_home() / "airflow"


def _port(port: int | None) -> int:
    if port is not None:
        return port
    raw = os.environ.get("LAKEHOUSE_AIRFLOW_PORT", str(DEFAULT_PORT))
    try:
        return int(raw)
    except ValueError:
        raise AirflowStackError(f"LAKEHOUSE_AIRFLOW_PORT={raw!r} is not a port number") from None


def _configured_db() -> str:
    return os.environ.get(DB_URI_VARIABLE) or f"sqlite:///{home() / 'airflow.db'}"


def metadata_db() -> str:
    """SQLAlchemy URI of the metadata DB: LAKEHOUSE_AIRFLOW_DB_URI, else SQLite in AIRFLOW_HOME.

    Raises AirflowStackError for a URI that is not PostgreSQL or SQLite (`postgres://`, the
    spelling SQLAlchemy no longer accepts, included), a SQLite URI without an absolute file
    path, or PostgreSQL without the asyncpg driver (Airflow 3 opens the DB with it too).
    """
    uri = _configured_db()
    dialect = urlsplit(uri).scheme.split("+")[0]
    if dialect not in METADATA_DIALECTS:
        raise AirflowStackError(
            f"{DB_URI_VARIABLE}={config.redact(uri)!r}: Airflow's metadata DB must be PostgreSQL "
            f"(postgresql+psycopg2://USER:PASSWORD@HOST:5432/DATABASE) or SQLite (sqlite:////absolute/path.db)")
    if dialect == "postgresql" and importlib.util.find_spec("asyncpg") is None:
        raise AirflowStackError(f"{DB_URI_VARIABLE} names a PostgreSQL metadata DB, which Airflow 3 also opens with "
                                f"the asyncpg driver, and asyncpg is not installed: install the project's "
                                f"requirements (make setup)")
    if dialect == "sqlite" and not uri.startswith("sqlite:////"):
        raise AirflowStackError(f"{DB_URI_VARIABLE}={uri!r}: a SQLite metadata DB needs an absolute file path "
                                f"(sqlite:////absolute/path.db)")
    return uri


def dags_folder() -> Path:
    """The folder Airflow reads DAG files from: LAKEHOUSE_AIRFLOW_DAGS_FOLDER, else the repository's dags/.

    Raises AirflowStackError when the configured folder does not exist.
    """
    configured = os.environ.get(DAGS_FOLDER_VARIABLE)
    if not configured:
        return DAGS_FOLDER
    folder = Path(configured).expanduser().resolve()
    if not folder.is_dir():
        raise AirflowStackError(f"{DAGS_FOLDER_VARIABLE}={configured!r} is not a folder; create it or unset "
                                f"the variable to read the repository's dags/")
    return folder


def _json_once(path: Path, make: dict) -> dict:
    """The JSON object in `path`, written from `make` (owner-only) the first time."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(make, handle)
            handle.write("\n")
    return json.loads(path.read_text())


def _spark_connection() -> str:
    """`lakehouse_airflow.spark.spark_connection()` of the installed provider."""
    from lakehouse_airflow.spark import spark_connection

    return spark_connection()


def admin_password() -> str:
    """The `admin` user's password, generated on first use and kept in passwords.json."""
    passwords = _json_once(home() / "passwords.json", {ADMIN_USER: secrets.token_urlsafe(12)})
    return passwords[ADMIN_USER]


def environment(port: int | None = None) -> dict[str, str]:
    """The environment every Airflow component of the embedded stack runs with.

    Settings here override inherited AIRFLOW__* variables: the embedded stack
    owns its home, database, folders and secrets. Raises AirflowStackError for an
    unusable LAKEHOUSE_AIRFLOW_* setting.
    """
    port = _port(port)
    database, dags = metadata_db(), dags_folder()
    airflow_home = home()
    keys = _json_once(airflow_home / "secrets.json",
                      {"jwt_secret": secrets.token_urlsafe(32), "secret_key": secrets.token_urlsafe(32)})
    admin_password()
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_home / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(airflow_home / "logs"),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__SECRET_KEY": keys["secret_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
        "AIRFLOW_CONN_SPARK_DEFAULT": _spark_connection(),
        "LAKEHOUSE_HOME": str(config.lakehouse_home()),
        # the provider's files (lakehouse_airflow.locations): the repository's, unless the environment says
        "LAKEHOUSE_PIPELINES_DIR": str(config.pipelines_dir()),
        "LAKEHOUSE_EXPECTATIONS_DIR": str(config.expectations_dir()),
        SPARK_JOBS_VARIABLE: env.get(SPARK_JOBS_VARIABLE) or str(SPARK_JOBS_FOLDER),
        "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": env.get("PYSPARK_DRIVER_PYTHON", sys.executable),
        "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
    })
    return env


def _airflow() -> str:
    return str(Path(sys.executable).with_name("airflow"))


def _pid_file(component: str) -> Path:
    return home() / f"{component}.pid"


def _log_file(component: str) -> Path:
    return home() / f"{component}.log"


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in tail) or "    (empty)"


def _running_pid(component: str) -> int | None:
    """The pid of `component` if its pid file names a live `airflow <component>` process."""
    try:
        pid = int(_pid_file(component).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # A recycled pid, or a zombie, is not our component. Airflow retitles its processes
    # (`airflow api_server -- host:...`), so both spellings of the name count.
    if stat.rsplit(")", 1)[1].split()[0] == "Z" or "airflow" not in cmdline \
            or not {component, component.replace("-", "_")} & set(cmdline.split()):
        return None
    return pid


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def port_free(port: int) -> bool:
    """Whether something could listen on 127.0.0.1:`port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def migrate(port: int | None = None) -> None:
    """`airflow db migrate` on the stack's metadata DB. Raises AirflowStackError with its output."""
    home().mkdir(parents=True, exist_ok=True)
    env = environment(port)
    done = subprocess.run([_airflow(), "db", "migrate"], env=env, capture_output=True, text=True,
                          timeout=MIGRATE_TIMEOUT_S)
    if done.returncode != 0:
        where = config.redact(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        hint = ("" if where.startswith("sqlite") else
                "; the database must exist and accept this user (CREATE DATABASE ... OWNER ...), "
                f"or unset {DB_URI_VARIABLE} to use SQLite")
        raise AirflowStackError(f"airflow db migrate failed on {where} (exit {done.returncode}){hint}:\n"
                                f"{done.stderr[-3000:]}")


def _start(component: str, port: int, env: dict[str, str]) -> subprocess.Popen:
    args = [_airflow(), component]
    if component == "api-server":
        args += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log = _log_file(component)
    with open(log, "ab") as handle:
        # a new session: the components outlive the CLI call and ignore the terminal's Ctrl-C
        proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _pid_file(component).write_text(f"{proc.pid}\n")
    return proc


def up(port: int | None = None, components: tuple[str, ...] = COMPONENTS,
       timeout: float = START_TIMEOUT_S) -> dict:
    """Migrate the metadata DB and start the components that do not run yet; returns `status()`.

    Waits until the API server answers its health endpoint. Raises AirflowStackError
    when a component exits while starting or the API server does not answer within
    `timeout` seconds (quoting its log), or when the API server already runs on
    another port.
    """
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise AirflowStackError(f"unknown Airflow components {sorted(unknown)}; known: {', '.join(COMPONENTS)}")
    port = _port(port)
    state = _read_state()
    if _running_pid("api-server") and state.get("port") not in (None, port):
        raise AirflowStackError(f"Airflow's API server already runs on port {state['port']}; "
                                f"stop it first (lakehouse airflow down) to move it to port {port}")
    if _running_pid("api-server") is None and "api-server" in components and not port_free(port):
        raise AirflowStackError(f"port {port} is already in use by another process, so Airflow's API server "
                                f"cannot listen on it; choose another with LAKEHOUSE_AIRFLOW_PORT=<port> or --port")
    migrate(port)
    env = environment(port)
    started = {}
    for component in components:
        if _running_pid(component) is None:
            started[component] = _start(component, port, env)
    (home() / "state.json").write_text(json.dumps({"port": port, "url": _url(port)}) + "\n")
    deadline = time.monotonic() + timeout
    while not _answers(_url(port)):
        for component, proc in started.items():
            # poll() rather than /proc: right after the fork the child is not retitled `airflow ...` yet
            if proc.poll() is not None:
                raise AirflowStackError(f"airflow {component} exited while starting; the end of "
                                        f"{_log_file(component)}:\n{_log_tail(_log_file(component))}")
        if time.monotonic() > deadline:
            raise AirflowStackError(f"Airflow's API server did not answer on {_url(port)} within {timeout:.0f}s; "
                                    f"the end of {_log_file('api-server')}:\n{_log_tail(_log_file('api-server'))}")
        time.sleep(0.5)
    return status()


def _read_state() -> dict:
    try:
        return json.loads((home() / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _stop(pid: int, timeout: float) -> None:
    """SIGTERM the component's process group, SIGKILL it after `timeout` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if this process started it
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def down(timeout: float = STOP_TIMEOUT_S) -> dict:
    """Stop every running component (and the workers it started); returns {component: pid stopped}.

    Idempotent: components that do not run are skipped. The database, logs and
    passwords stay.
    """
    from lakehouse.ops import supervision

    stopped = {}
    scheduler = _running_pid("scheduler")
    if scheduler is not None:  # first, so no new ingest run starts while the jobs stop
        _stop(scheduler, timeout)
        stopped["scheduler"] = scheduler
    for pipeline, pgid in supervision.stop_locked_jobs(config.load()).items():
        stopped[f"ingest job {pipeline}"] = pgid
    for component in COMPONENTS:
        pid = _running_pid(component)
        if pid is not None:
            _stop(pid, timeout)
            stopped[component] = pid
        _pid_file(component).unlink(missing_ok=True)
    (home() / "state.json").unlink(missing_ok=True)
    return stopped


def status() -> dict:
    """{home, url, page, user, password, password_file, metadata_db (password redacted), dags_folder,
    running: {component: pid or None}, healthy, logs: {component: log file}}."""
    state = _read_state()
    url = state.get("url") or _url(_port(None))
    password_file = home() / "passwords.json"
    return {
        "home": str(home()),
        "url": url,
        "page": f"{url}/lakehouse/",
        "user": ADMIN_USER,
        "password": admin_password() if password_file.exists() else None,
        "password_file": str(password_file),
        "metadata_db": config.redact(_configured_db()),
        "dags_folder": os.environ.get(DAGS_FOLDER_VARIABLE) or str(DAGS_FOLDER),
        "running": {component: _running_pid(component) for component in COMPONENTS},
        "healthy": _answers(url),
        "logs": {component: str(_log_file(component)) for component in COMPONENTS},
    }
