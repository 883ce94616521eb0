"""Shared fixtures: the platform started the way users start it, one broker per test session.

    lakehouse_home     (session, autouse) a private LAKEHOUSE_HOME, a free LAKEHOUSE_BROKER_PORT and JVMs
                       that start quickly (LAKEHOUSE_SPARK_JAVA_OPTIONS);
                       variables that would point tests at a real cluster are removed meanwhile
    stack              (session) `stack.up()` in that home, yields its status; `stack.down(purge=True)` after
    platform           `config.load()` once the stack runs
    spark              (session) the in-process Spark session with the Iceberg extensions and catalog `lake`
    own_home           an empty LAKEHOUSE_HOME of the test's own (tmp_path/home), set in the environment
    make_spec          factory: make_spec(**overrides) -> PipelineSpec with unique name, topic and tables
    unique_topic_spec  make_spec() with no overrides
    consume_all        consume_all(topic, platform) -> list[Message], read with assign until partition EOF
    free_tcp_port      a TCP port nobody listens on
    airflow_db         (session) `airflow db migrate` in the session's private AIRFLOW_HOME
    run_dag            run_dag(dag_id, pipelines_dir, conf=None, broken_specs=False) -> DagRun: parse dags/
                       as Airflow does (import errors fail the test, except that of dags/lakehouse_specs.py
                       when broken_specs=True) and run the DAG with `dag.test()`

Airflow reads its configuration when first imported, so `pytest_configure` points
AIRFLOW_HOME (metadata DB, logs) at a private folder before any test module loads.

Two layers: tests marked `slow` are the end-to-end layer (`make test-e2e`: Spark, the embedded broker,
Airflow, `lakehouse` processes); every other test is the unit layer (`make test-unit`), which starts none
of them. A unit-layer test that asks for `stack`, `spark` or `airflow_db` (also through `platform`,
`run_dag`, ...) fails before its set-up, one that starts a Spark session, a stack or such a process
fails when it does (`unit_layer_guard`). Waiting for something is `polling.wait_until`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

import hypothesis
import pytest
import yaml
from polling import wait_until

from lakehouse.core import config
from lakehouse.core import spec as spec_module
from lakehouse_airflow.spark import spark_connection
from lakehouse_dev import services as services_module
from lakehouse_dev import stack as stack_module

config_module = config
# Every path into the repository a test names starts at config.REPO_ROOT (never at a test file's own location);
# the test tree's own folders are these: UNIT (tests/unit/<package>/, the unit layer), E2E (tests/e2e/, the
# end-to-end layer, marked slow by tests/e2e/conftest.py) and SUPPORT (the support modules e2e, faults, pgserver,
# polling, on pytest's `pythonpath` in pyproject.toml).
TESTS = Path(__file__).parent
UNIT, E2E, SUPPORT = TESTS / "unit", TESTS / "e2e", TESTS / "support"
DAGS_FOLDER = config.REPO_ROOT / "dags"

# Variables that would send tests to a user's real cluster, catalog or warehouse.
_ISOLATED_PREFIXES = ("LAKEHOUSE_BOOTSTRAP_SERVERS", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE",
                      "LAKEHOUSE_KAFKA_", "LAKEHOUSE_S3_", "LAKEHOUSE_FAULT")
TEMPLATE_SPEC = config.REPO_ROOT / "include" / "pipelines" / "orders.yaml"

# Property tests judge outcomes, not speed: the suite runs in two processes on two cores beside JVMs, where
# one example may take longer than hypothesis's default 200 ms deadline without anything being wrong.
hypothesis.settings.register_profile("lakehouse", deadline=None)
hypothesis.settings.load_profile("lakehouse")


def pytest_configure(config: pytest.Config) -> None:
    """A private Airflow home per test session, set before anything imports airflow.

    Airflow turns the root logger up to INFO; py4j then logs its connection shutdown
    from finalizers after pytest closed its streams, hence py4j stays at WARNING.
    """
    logging.getLogger("py4j").setLevel(logging.WARNING)
    home = Path(tempfile.mkdtemp(prefix="lakehouse-airflow-"))
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        # the product's fault hook (lakehouse.core.hooks) loads tests/support/faults.py here and in every process
        # the tests start, so that LAKEHOUSE_FAULT can inject a fault
        "LAKEHOUSE_TEST_HOOKS": str(SUPPORT / "faults.py"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(config_module.REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW_CONN_SPARK_DEFAULT": spark_connection(),
        # dag.test() runs are triggered by the user `dag_test`: an operator here (USER and above may trigger),
        # since the backfill task checks the triggering user with the auth manager when it acts
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,dag_test:op",
    })
    # the Airflow provider finds its files by configuration (lakehouse_airflow.locations): the repository's, as the
    # development stack gives them to its Airflow (lakehouse_dev.airflow_stack.environment), unless set already
    for variable, folder in (("LAKEHOUSE_PIPELINES_DIR", "include/pipelines"),
                             ("LAKEHOUSE_EXPECTATIONS_DIR", "include/expectations"),
                             ("LAKEHOUSE_SPARK_JOBS_DIR", "spark_jobs")):
        os.environ.setdefault(variable, str(config_module.REPO_ROOT / folder))


# Ports of the servers tests start: blocks of PORT_BLOCK from a range of this pytest process's own, below the
# OS's ephemeral ports (32768 and up on Linux), so that two pytest-xdist workers starting servers at the same
# moment never pick the same port (a broker takes its PLAINTEXT port and the next free ones for its other
# listeners: all inside its block).
PORT_BLOCK = 8
PORTS_PER_WORKER = 2400


def _worker_index() -> int:
    """This process's place among pytest-xdist's workers (gw0 -> 0, gw1 -> 1, ...); 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(name) if name.isdigit() else 0


_PORT_START = 22000 + _worker_index() * PORTS_PER_WORKER
_next_ports = iter(range(_PORT_START, _PORT_START + PORTS_PER_WORKER, PORT_BLOCK))


def free_port() -> int:
    """A TCP port nobody listens on right now, with the next PORT_BLOCK - 1 free too, from this process's own
    range (see PORT_BLOCK); once that is used up, any port the OS picks."""
    from lakehouse_dev.processes import port_free

    for port in _next_ports:
        if all(port_free(p) for p in range(port, port + PORT_BLOCK)):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def free_tcp_port() -> int:
    """A TCP port nobody listens on right now."""
    return free_port()


# ---------------------------------------------------------------------------- the two layers

# The fixtures that start the end-to-end machinery, and what each starts.
END_TO_END_FIXTURES = {"stack": "the embedded broker", "services": "the object store, REST catalog and registry",
                       "spark": "a Spark session",
                       "airflow_db": "Airflow (`airflow db migrate`)"}
# Programs whose processes belong to the end-to-end layer: the CLI (ingest jobs, the stacks), Spark, Airflow.
END_TO_END_PROGRAMS = ("lakehouse", "spark-submit", "spark-class", "airflow")


def is_end_to_end(item: pytest.Item) -> bool:
    """Whether `item` is in the end-to-end layer (marked slow, itself or through its module's pytestmark)."""
    return item.get_closest_marker("slow") is not None


def misplaced(items: list[pytest.Item]) -> list[str]:
    """The tests under UNIT that are marked slow: the unit layer is a folder and a marker at once
    (`-m "not slow"` and tests/unit select the same tests), so an end-to-end test belongs in E2E."""
    return [item.nodeid for item in items if is_end_to_end(item) and Path(item.path).is_relative_to(UNIT)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before `-m` deselects (pytest calls a conftest's hook before its own mark plugin's)."""
    if found := misplaced(items):
        raise pytest.UsageError(f"marked slow but in {UNIT} (the unit layer): move them to {E2E}: {found}")


def _refusal(item: pytest.Item, what: str) -> str:
    return (f"{item.nodeid} is in the unit layer (not marked slow) but starts {what}: mark it "
            "@pytest.mark.slow (the end-to-end layer) or keep it off the real machinery")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A unit-layer test that asks for an end-to-end fixture fails before that fixture starts anything."""
    if is_end_to_end(item):
        return
    started = [f"{what} (fixture `{name}`)" for name, what in END_TO_END_FIXTURES.items()
               if name in getattr(item, "fixturenames", ())]
    if started:
        pytest.fail(_refusal(item, " and ".join(started)), pytrace=False)


@pytest.fixture(autouse=True)
def unit_layer_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the unit layer, starting a Spark session (SparkSession.Builder.getOrCreate, which
    lakehouse.core.sparkenv.session calls), the embedded stack, Airflow's stack, a Spark standalone
    cluster or a process of END_TO_END_PROGRAMS fails the test where it happens. pytest.fail raises
    an OutcomeException, which `except Exception` in the code under test does not swallow."""
    if is_end_to_end(request.node):
        return
    from pyspark.sql import SparkSession

    from lakehouse_dev import airflow_stack, spark_cluster

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            pytest.fail(_refusal(request.node, what))
        return refused

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refuse("a Spark session"))
    monkeypatch.setattr(stack_module, "up", refuse("the embedded stack (lakehouse_dev.stack.up)"))
    monkeypatch.setattr(airflow_stack, "up", refuse("Airflow (lakehouse_dev.airflow_stack.up)"))
    monkeypatch.setattr(spark_cluster, "up", refuse("a Spark cluster (lakehouse_dev.spark_cluster.up)"))

    class GuardedPopen(subprocess.Popen):
        def __init__(self, args, *more: Any, **kwargs: Any):
            first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")
            first = os.fsdecode(first)
            if kwargs.get("shell") and first.strip():
                first = first.split()[0]
            if Path(first).name in END_TO_END_PROGRAMS:
                pytest.fail(_refusal(request.node, f"a `{Path(first).name}` process"))
            super().__init__(args, *more, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", GuardedPopen)


# ---------------------------------------------------------------------------- homes, the stack, Spark

@pytest.fixture(scope="session", autouse=True)
def lakehouse_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private LAKEHOUSE_HOME and broker port for the whole session; the environment is restored after."""
    home = tmp_path_factory.mktemp("lakehouse-home")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(_ISOLATED_PREFIXES):
                mp.delenv(name)
        mp.setenv("LAKEHOUSE_HOME", str(home))
        mp.setenv("LAKEHOUSE_BROKER_PORT", str(free_port()))
        # the stack's other servers, and Airflow's log servers, on this process's ports too (see PORT_BLOCK)
        for name in services_module.DEFAULT_PORTS:
            mp.setitem(services_module.DEFAULT_PORTS, name, free_port())
        mp.setenv("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", str(free_port()))
        mp.setenv("AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT", str(free_port()))
        # the tests' JVMs handle little data and start often: quick start-up over peak speed
        mp.setenv("LAKEHOUSE_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        yield home


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty LAKEHOUSE_HOME of the test's own (`<tmp_path>/home`), set in the environment for the test;
    the session's home (and its stack, if one runs) stays untouched."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("LAKEHOUSE_HOME", str(home))
    return home


def _interrupt_on_sigterm() -> None:
    """Turn SIGTERM (a CI timeout, `timeout 300 pytest`) into KeyboardInterrupt, so pytest still
    tears the session down and stops the broker instead of leaving it running detached."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        def interrupt(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        signal.signal(signal.SIGTERM, interrupt)


@pytest.fixture(scope="session")
def stack(lakehouse_home: Path) -> dict:
    """The embedded stack, started with `stack.up()` as `lakehouse up` does; its status dict."""
    _interrupt_on_sigterm()
    status = stack_module.up()
    yield status
    stack_module.down(purge=True)


@pytest.fixture(scope="session")
def spark(stack: dict):
    """One in-process Spark session (Iceberg extensions, catalog `lake`) for the whole test session;
    operators that open a session in-process under dag.test() get this one too."""
    from lakehouse.core import sparkenv

    session = sparkenv.session(config.load(), ["lake"], "lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def services(stack: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A second stack home beside the session's, on the session's broker (LAKEHOUSE_BOOTSTRAP_SERVERS), running
    the real parts a platform team runs against: an S3-compatible object store holding the warehouse, an
    Iceberg REST catalog over it, and the schema registry (`stack.up(catalog="rest", object_store=True,
    registry=True)`, as `lakehouse stack up --catalog rest --object-store --registry`). {"home", "env": the
    variables that point a process at it, "status"}. The in-process Spark session serves the session's own
    home only: jobs on this one run as `lakehouse` processes."""
    home = tmp_path_factory.mktemp("services-home")
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_BOOTSTRAP_SERVERS": stack["bootstrap_servers"]}

    @contextlib.contextmanager
    def there():
        with pytest.MonkeyPatch.context() as mp:  # the session's own home everywhere else
            for name, value in env.items():
                mp.setenv(name, value)
            yield

    with there():
        status = stack_module.up(catalog="rest", object_store=True, registry=True)
    try:
        yield {"home": home, "env": env, "status": status}
    finally:
        with there():
            stack_module.down(purge=True)


@pytest.fixture
def registry_url(services: dict) -> str:
    """The `services` home's schema registry (Apicurio, Confluent-compatible API) as LAKEHOUSE_SCHEMA_REGISTRY_URL
    takes it: with its user's credentials, which config turns into basic auth."""
    from lakehouse_dev import settings

    state = settings.read_state_file(services["home"], stack_module.STATE_FILE)
    return services_module.registry_url(services["home"], state["services"]["registry"])


@pytest.fixture
def on_services(services: dict, monkeypatch: pytest.MonkeyPatch) -> config.PlatformConfig:
    """This test's environment pointed at the `services` home (REST catalog, S3 warehouse, registry); its
    platform configuration."""
    for name, value in services["env"].items():
        monkeypatch.setenv(name, value)
    return config.load(fresh=True)


@pytest.fixture
def kafka_user(stack: dict) -> Callable[..., dict[str, str]]:
    """Factory: kafka_user(grants) -> the LAKEHOUSE_* variables with which the platform connects to the session's
    broker as a new SCRAM user over SASL_SSL that holds exactly the ACLs of `grants` ((resource type, name,
    operation), e.g. ("TOPIC", "orders", "READ")), as an operator's restricted credentials would."""
    def factory(grants: list[tuple[str, str, str]]) -> dict[str, str]:
        conf = stack_module.add_user(f"user-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex, grants)
        return {"LAKEHOUSE_BOOTSTRAP_SERVERS": conf.pop("bootstrap.servers"),
                **{config.KAFKA_PREFIX + key.upper().replace(".", "_"): value for key, value in conf.items()}}

    return factory


@pytest.fixture
def platform(stack: dict) -> config.PlatformConfig:
    """The platform configuration a user's process would load once the stack is up."""
    return config.load()


def _merge(base: dict, overrides: dict) -> dict:
    """Deep-merge `overrides` into a copy of `base`; a None value removes the key."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _substitute(value: Any, suffix: str) -> Any:
    """Replace `{suffix}` in every string (plain replace: regex quantifiers like {3} stay intact)."""
    if isinstance(value, str):
        return value.replace("{suffix}", suffix)
    if isinstance(value, list):
        return [_substitute(v, suffix) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, suffix) for k, v in value.items()}
    return value


# Shorthand keyword -> where it lives in the spec YAML.
_SHORTHANDS = {
    "partitions": ("source", "partitions"),
    "retention_ms": ("source", "retention_ms"),
    "max_value_bytes": ("source", "max_value_bytes"),
    "key": ("source", "key"),
    "mode": ("target", "mode"),
    "table_key": ("target", "key"),
    "partition_by": ("target", "partition_by"),
    "fanout": ("target", "fanout"),
    "fields": ("contract", "fields"),
}


@pytest.fixture
def make_spec(tmp_path: Path) -> Callable[..., spec_module.PipelineSpec]:
    """Factory for pipeline specs based on include/pipelines/orders.yaml, unique per call.

    Each call writes `<tmp_path>/pipelines/<name>.yaml` and returns the loaded
    PipelineSpec with name `orders_<suffix>`, topic `orders-<suffix>`, tables
    `raw.orders_<suffix>` / `raw.orders_<suffix>_dlq` and readers' view
    `serve.orders_<suffix>` (quality suite `orders`). Overrides:
      - any top-level section as a dict, deep-merged: source={"partitions": 1},
        target={...}, contract={"fields": [...]}, slo={...}; a None value deletes a key;
      - shorthands: partitions, retention_ms, max_value_bytes, key, mode,
        table_key (target.key), partition_by, fanout, fields (contract.fields);
      - "{suffix}" inside any string is replaced by the call's suffix, e.g.
        fanout={"field": "status", "routes": {"cancelled": "raw.orders_{suffix}_cancelled"}}.
    `make_spec.directory` is the pipelines folder (for LAKEHOUSE_PIPELINES_DIR).
    """
    directory = tmp_path / "pipelines"
    directory.mkdir(exist_ok=True)
    template = yaml.safe_load(TEMPLATE_SPEC.read_text())

    def factory(**overrides: Any) -> spec_module.PipelineSpec:
        suffix = uuid.uuid4().hex[:10]
        raw = _merge(template, {
            "name": f"orders_{suffix}",
            "source": {"topic": f"orders-{suffix}"},
            "target": {"table": f"raw.orders_{suffix}"},
            "dead_letter": {"table": f"raw.orders_{suffix}_dlq"},
            "publish": {"view": f"serve.orders_{suffix}", "suite": "orders"},
        })
        sections: dict[str, Any] = {}
        for key, value in overrides.items():
            if key in _SHORTHANDS:
                section, field = _SHORTHANDS[key]
                sections.setdefault(section, {})[field] = value
            elif isinstance(value, dict) and isinstance(sections.get(key), dict):
                sections[key].update(copy.deepcopy(value))
            else:
                sections[key] = copy.deepcopy(value)  # a copy: shorthands are added into it
        for key, value in sections.items():
            value = _substitute(value, suffix)
            if isinstance(value, dict) and isinstance(raw.get(key), dict):
                raw[key] = _merge(raw[key], value)
            elif value is None:
                raw.pop(key, None)
            else:
                raw[key] = value
        path = directory / f"{raw['name']}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
        return spec_module.load_spec(path)

    factory.directory = directory  # type: ignore[attr-defined]
    return factory


@pytest.fixture
def unique_topic_spec(make_spec) -> spec_module.PipelineSpec:
    """The orders spec with a unique pipeline name, topic and tables."""
    return make_spec()


def consume_everything(topic: str, platform: config.PlatformConfig, timeout: float = 30.0) -> list:
    """Every record of `topic`, read with assign from the beginning until each partition reports EOF.

    EOF is where a read_committed consumer's log ends (the last stable offset). Raises AssertionError
    when a partition does not reach EOF within `timeout` seconds or the read fails.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(platform.kafka(**{
        "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }))
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, messages = set(partitions), []

        def read_to_eof() -> bool:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):  # blocks up to 0.5 s itself
                err = msg.error()
                if err is None:
                    messages.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise AssertionError(f"{topic} partition {msg.partition()}: {err.str()}")
            return not pending

        if pending:
            wait_until(read_to_eof, timeout, lambda: f"{topic}: EOF from partitions {sorted(pending)}", interval=0)
        return messages
    finally:
        consumer.close()


@pytest.fixture
def consume_all() -> Callable[..., list]:
    """consume_all(topic, platform, timeout=30.0) -> every record of the topic, in partition order."""
    return consume_everything


@pytest.fixture
def no_lineage_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(name)


@pytest.fixture
def lineage_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_lineage_settings) -> Path:
    """OpenLineage configured as users do, with the file transport: one JSON event per line (e2e.emitted)."""
    import json

    path = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "file")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__LOG_FILE_PATH", json.dumps(str(path)))  # JSON: kept as written
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__APPEND", "true")
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "lakehouse-tests")
    return path


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """The session's Airflow metadata DB, migrated with `airflow db migrate` as users do."""
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(os.environ["AIRFLOW_HOME"])


@pytest.fixture
def signed_in_page(airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """signed_in_page(pipelines_dir) -> (client, headers): the pipelines page's app (Starlette's TestClient)
    on a cache of `pipelines_dir` read once, now, and the Authorization header of the simple auth manager's
    `admin` (every DAG readable), with a JWT signed by a test secret."""
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from starlette.testclient import TestClient

    from e2e import page_reads

    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "lakehouse-page-tests-jwt-secret-" + "0123456789abcdef" * 3)
    forget_auth_manager()

    def signed_in(pipelines_dir: Path) -> tuple[Any, dict[str, str]]:
        # the plugin module as imported now: Airflow's plugin loading (a DAG run since the fixture started)
        # imports it again, and the app serves its own module's cache
        from lakehouse_airflow import ui as lakehouse_ui

        page_reads(monkeypatch, pipelines_dir, ui=lakehouse_ui)
        token = airflow_app.create_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
        return TestClient(lakehouse_ui.app), {"Authorization": f"Bearer {token}"}

    yield signed_in
    forget_auth_manager()


def forget_auth_manager() -> None:
    """Airflow's auth manager is built again from the configuration at its next use. purge_cached_app forgets
    the app and the manager, but not the JWT signer and validator, which BaseAuthManager caches per manager
    class for the process: a test that sets its own secret would otherwise sign with one secret and validate
    with another (403 "Invalid JWT token"), depending on which test ran first."""
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager

    airflow_app.purge_cached_app()
    BaseAuthManager._get_token_signer.cache_clear()
    BaseAuthManager._get_token_validator.cache_clear()


@pytest.fixture
def run_dag(airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """run_dag(dag_id, pipelines_dir, conf=None, broken_specs=False) -> the finished DagRun.

    Parses the repository's dags/ folder with Airflow's DagBag while
    LAKEHOUSE_PIPELINES_DIR points at `pipelines_dir` (so generated DAGs exist for the
    test's specs), fails on any import error, then runs the DAG with `dag.test()`:
    real task instances, XComs, deferrals and asset events in the session's metadata DB.
    `broken_specs=True` says the folder deliberately holds a broken spec: the import error
    of dags/lakehouse_specs.py (which lists broken specs) is then required, and the only one allowed.
    """
    from airflow.dag_processing.dagbag import DagBag

    specs_file = str(DAGS_FOLDER / "lakehouse_specs.py")

    def run(dag_id: str, pipelines_dir: Path | str, conf: dict | None = None, broken_specs: bool = False):
        monkeypatch.setenv("LAKEHOUSE_PIPELINES_DIR", str(pipelines_dir))
        bag = DagBag(str(DAGS_FOLDER))
        errors = dict(bag.import_errors)
        if broken_specs:
            assert errors.pop(specs_file, None), f"no import error of {specs_file}: {errors}"
        assert not errors, errors
        dag = bag.get_dag(dag_id)
        assert dag is not None, f"no DAG {dag_id!r}; have {sorted(bag.dag_ids)}"
        return dag.test(run_conf=conf)

    return run
