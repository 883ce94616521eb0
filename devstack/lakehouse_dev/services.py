"""The embedded stack's optional servers, beside its Kafka broker: an S3-compatible object store, an Iceberg REST
catalog and a schema registry, each asked for when the stack starts and then told to every client of the stack
(lakehouse_dev.settings):

    object_store   `stack up --object-store` (LAKEHOUSE_STACK_OBJECT_STORE=true): lakehouse_dev.object_store on
                   127.0.0.1:19000 (or the next free port); the warehouse becomes s3://lakehouse/warehouse, read
                   and written with S3FileIO (Spark) and pyarrow's S3 (pyiceberg) under a generated key
    rest_catalog   `stack up --catalog rest` (LAKEHOUSE_STACK_CATALOG=rest): Apache Iceberg's REST catalog server
                   (lakehouse_dev.rest_catalog) on 127.0.0.1:18181 or the next free port, over a SQLite JDBC
                   backend in the home, its warehouse on the object store when there is one; every catalog name
                   of the platform is then that REST catalog (LAKEHOUSE_CATALOG_URI=http://...)
    registry       `stack up --registry` (LAKEHOUSE_STACK_REGISTRY=true): Apicurio Registry 3
                   (lakehouse_dev.registry) on 127.0.0.1:18081 or the next free port, its Confluent-compatible
                   API behind HTTP basic auth as user `lakehouse` (generated password in security/)

What runs is recorded in stack.json under `services` (pid, port, address: never a secret). Each server keeps its
state under the home (`object-store/`, `rest-catalog/`, `registry/`) across restarts; `stack down --purge`
deletes it.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError, LakehouseError
from lakehouse_dev import jvm, object_store, processes, registry, rest_catalog

SERVICES = ("object_store", "rest_catalog", "registry")  # the start order: the catalog's warehouse may be on S3
FOLDERS = {"object_store": "object-store", "rest_catalog": "rest-catalog", "registry": "registry"}
DEFAULT_PORTS = {"object_store": object_store.DEFAULT_PORT, "rest_catalog": 18181, "registry": 18081}
REGISTRY_USER = "lakehouse"
REGISTRY_PASSWORD_FILE = "registry.password"
STOP_TIMEOUT_S = 20.0
START_TIMEOUT_S = 120.0


class ServiceError(LakehouseError, RuntimeError):
    """One of the stack's servers cannot be started, reached or stopped; the message says what to do."""


@dataclass(frozen=True)
class Wanted:
    """Which optional servers the stack should run."""

    object_store: bool = False
    rest_catalog: bool = False
    registry: bool = False

    def names(self) -> tuple[str, ...]:
        return tuple(name for name in SERVICES if getattr(self, name))


def wanted(catalog: str | None = None, object_store_: bool | None = None, registry_: bool | None = None) -> Wanted:
    """The servers asked for by argument, else LAKEHOUSE_STACK_CATALOG (jdbc or rest),
    LAKEHOUSE_STACK_OBJECT_STORE and LAKEHOUSE_STACK_REGISTRY (booleans). Raises ServiceError for a value
    that is none of those."""
    kind = (catalog or os.environ.get("LAKEHOUSE_STACK_CATALOG") or "jdbc").strip().lower()
    if kind not in ("jdbc", "rest"):
        raise ServiceError(f"catalog {kind!r}: the embedded stack runs a jdbc (SQLite) or a rest catalog")
    try:
        store = object_store_ if object_store_ is not None else config.parse_bool(
            os.environ.get("LAKEHOUSE_STACK_OBJECT_STORE"), "LAKEHOUSE_STACK_OBJECT_STORE", default=False)
        schemas = registry_ if registry_ is not None else config.parse_bool(
            os.environ.get("LAKEHOUSE_STACK_REGISTRY"), "LAKEHOUSE_STACK_REGISTRY", default=False)
    except ConfigurationError as exc:
        raise ServiceError(str(exc)) from None
    return Wanted(object_store=bool(store), rest_catalog=kind == "rest", registry=bool(schemas))


# ---------------------------------------------------------------------------- identity

def is_running(home: Path, name: str, entry: dict | None) -> bool:
    """Whether the server `name` that `entry` (its stack.json record) describes runs."""
    pid = (entry or {}).get("pid")
    return processes.pid_alive(pid) and _is_ours(home, name)(pid)


def _is_ours(home: Path, name: str):
    if name == "object_store":
        layout = object_store.Layout(home)
        return lambda pid: object_store.is_server_process(pid, layout) or processes.started_here(pid)
    if name == "rest_catalog":
        layout = rest_catalog.Layout(home)
        return lambda pid: rest_catalog.is_server_process(pid, layout) or processes.started_here(pid)
    layout = registry.Layout(home)
    return lambda pid: registry.is_server_process(pid, layout) or processes.started_here(pid)


# ---------------------------------------------------------------------------- starting

def start(home: Path, name: str, running: dict[str, dict], port: int | None = None) -> dict:
    """Start server `name` for the stack in `home` (`running`: the records of those already up, which it
    may build on) on `port` (default: the first free one from its usual port) and wait until it answers;
    its stack.json record. Raises ServiceError quoting its log."""
    taken = {entry["port"] for entry in running.values() if entry.get("port")}
    port = port or processes.free_port(DEFAULT_PORTS[name], taken)
    try:
        if name == "object_store":
            return start_object_store(home, port)
        if name == "rest_catalog":
            return start_rest_catalog(home, port, running.get("object_store"))
        return _start_registry(home, port)
    except (jvm.JvmPartMissing, object_store.ObjectStoreError, rest_catalog.RestCatalogError,
            registry.RegistryError) as exc:
        raise ServiceError(str(exc)) from None


def _failed(proc, name: str, log: Path, why: str) -> ServiceError:
    processes.stop(proc.pid, lambda pid: True, STOP_TIMEOUT_S)
    return ServiceError(f"the stack's {name.replace('_', ' ')} {why}; the end of {log}:\n{processes.log_tail(log)}")


def start_object_store(home: Path, port: int) -> dict:
    layout = object_store.Layout(home)
    credentials = object_store.ensure_credentials(layout.folder)
    endpoint = object_store.endpoint(port)
    # the stack's server accepts its own generated key only, whatever key pair this shell sets for a compose one
    env = {k: v for k, v in os.environ.items()
           if k not in (object_store.ACCESS_KEY_VARIABLE, object_store.SECRET_KEY_VARIABLE)}
    proc = processes.spawn(object_store.serve_command(layout, port), layout.log, env=env)
    try:
        object_store.wait_ready(endpoint, proc=proc)
        object_store.create_bucket(endpoint, credentials)
    except object_store.ObjectStoreError as exc:
        raise _failed(proc, "object_store", layout.log, str(exc)) from None
    return {"pid": proc.pid, "port": port, "endpoint": endpoint, "bucket": object_store.DEFAULT_BUCKET,
            "warehouse": f"s3://{object_store.DEFAULT_BUCKET}/{object_store.WAREHOUSE_PREFIX}",
            "region": object_store.REGION}


def object_store_settings(home: Path, entry: dict) -> dict:
    """The ObjectStoreConfig settings of the stack's object store (its generated key from its folder)."""
    credentials = object_store.ensure_credentials(object_store.Layout(home).folder)
    return {"endpoint": entry["endpoint"], "path_style_access": True, "region": entry.get("region"),
            "access_key_id": credentials.access_key_id, "secret_access_key": credentials.secret_access_key}


def start_rest_catalog(home: Path, port: int, store: dict | None) -> dict:
    layout = rest_catalog.Layout(home)
    base = dict(os.environ)
    if store:
        warehouse = f"{store['warehouse']}/rest"
        settings = object_store_settings(home, store)
        properties = {"io-impl": "org.apache.iceberg.aws.s3.S3FileIO", "s3.endpoint": settings["endpoint"],
                      "s3.path-style-access": "true", "client.region": settings["region"]}
        # the key reaches the server as the AWS SDK's variables, never as a property it could log
        base.update(AWS_ACCESS_KEY_ID=settings["access_key_id"], AWS_SECRET_ACCESS_KEY=settings["secret_access_key"])
    else:
        warehouse = (home / "warehouse" / "rest").as_uri()
        (home / "warehouse" / "rest").mkdir(parents=True, exist_ok=True)
        properties = {}
    cmd, env = rest_catalog.command(layout, port, warehouse, properties, base)
    proc = processes.spawn(cmd, layout.log, env=env)
    url = rest_catalog.url(port)
    try:
        rest_catalog.wait_ready(url, timeout=START_TIMEOUT_S, pid=proc.pid)
    except rest_catalog.RestCatalogError as exc:
        raise _failed(proc, "rest_catalog", layout.log, str(exc)) from None
    return {"pid": proc.pid, "port": port, "url": url, "warehouse": warehouse}


def registry_password(home: Path) -> str:
    """The stack registry user's password: kept in security/ (0600), generated on first use."""
    folder = home / "security"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / REGISTRY_PASSWORD_FILE
    try:
        found = path.read_text().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(password + "\n")
    return password


def _start_registry(home: Path, port: int) -> dict:
    layout = registry.Layout(home)
    password = registry_password(home)
    registry.prepare(layout, {REGISTRY_USER: password})
    management = processes.free_port(port + 1, {port})
    proc = processes.spawn(registry.java_command(layout, port, management), layout.log)
    url = registry.ccompat_url(f"http://127.0.0.1:{port}")
    try:
        registry.wait_ready(url, timeout=START_TIMEOUT_S, auth=(REGISTRY_USER, password), process=proc)
    except registry.RegistryError as exc:
        raise _failed(proc, "registry", layout.log, str(exc)) from None
    return {"pid": proc.pid, "port": port, "management_port": management, "url": url, "user": REGISTRY_USER}


def registry_url(home: Path, entry: dict) -> str:
    """LAKEHOUSE_SCHEMA_REGISTRY_URL of the stack's registry: its Confluent-compatible API with the user's
    credentials as user info (config turns them into basic auth and never prints them)."""
    from urllib.parse import quote, urlsplit

    parts = urlsplit(entry["url"])
    user = quote(entry.get("user", REGISTRY_USER), safe="")
    return parts._replace(netloc=f"{user}:{quote(registry_password(home), safe='')}@{parts.netloc}").geturl()


# ---------------------------------------------------------------------------- stopping

def stop(home: Path, name: str, entry: dict | None) -> bool:
    """Stop server `name` (SIGTERM, SIGKILL after a while); True if it was running."""
    try:
        return processes.stop((entry or {}).get("pid"), _is_ours(home, name), STOP_TIMEOUT_S)
    except RuntimeError as exc:
        raise ServiceError(str(exc)) from None


def folders(home: Path) -> list[Path]:
    """What `stack down --purge` deletes of the servers' state."""
    return [home / folder for folder in FOLDERS.values()]


def describe(home: Path, records: dict[str, dict]) -> dict[str, dict]:
    """Each server stack.json records: whether it runs, its pid, port and address (no secret)."""
    out = {}
    for name in SERVICES:
        entry = records.get(name)
        if entry is None:
            continue
        running = is_running(home, name, entry)
        out[name] = {"running": running, "pid": entry.get("pid") if running else None, "port": entry.get("port"),
                     **{key: entry[key] for key in ("endpoint", "url", "warehouse", "bucket", "user") if key in entry}}
    return out
