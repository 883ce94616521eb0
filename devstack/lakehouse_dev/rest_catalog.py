"""The Iceberg REST catalog for the development stack: Apache Iceberg's own server
(org.apache.iceberg.rest.RESTCatalogServer, what the apache/iceberg-rest-fixture image runs) from the Maven
Central jars `make setup` resolves (devstack/jvm/iceberg-rest), over a JdbcCatalog whose database is a SQLite
file under the stack's home, so namespaces and tables outlive a restart. It listens on 127.0.0.1 only: the
catalog has no authentication.

    <home>/rest-catalog/catalog.db   the JdbcCatalog's tables (iceberg_tables, iceberg_namespace_properties)
    <home>/logs/rest-catalog.log     the JVM's output (the caller redirects it there)

The table files themselves live in the warehouse the caller names (file:// or s3://); the server writes the
metadata files with its own FileIO (HadoopFileIO by default, S3FileIO with `io-impl` and `s3.*` properties),
and clients (Spark, pyiceberg) read and write data files with theirs: the server hands out no storage
configuration (its GET /v1/config has empty defaults and overrides).

The server is configured through the environment only: every `CATALOG_<NAME>` variable is a catalog property
(prefix dropped, `__` -> `-`, `_` -> `.`, lower-cased), e.g. CATALOG_URI -> uri, CATALOG_IO__IMPL -> io-impl,
CATALOG_REST_PORT -> rest.port. A property whose name has an underscore cannot be expressed that way.

RESTCatalogServer's own main would listen on every interface (Jetty's `new Server(port)`, 0.0.0.0; there is no
host setting) and with SO_REUSEPORT (a second server on a taken port would start too and share it). So the JVM
runs Jetty's XmlConfiguration (org.eclipse.jetty.xml.XmlConfiguration, jar jetty-xml) on
devstack/jvm/iceberg-rest/loopback.xml instead, which wires the fixture's own objects: the backend catalog by
RESTCatalogServer.initializeBackendCatalog (the CATALOG_* environment and the fixture's defaults, unchanged),
RESTServerCatalogAdapter, RESTCatalogServlet in a ServletContextHandler with gzip, on a connector bound to
127.0.0.1 and the `rest.port` property, without SO_REUSEPORT. A port already taken fails the start (the JVM
exits with code 1 after "Failed to bind to /127.0.0.1:<port>"), and wait_ready says so; given the pid, it
also trusts an answer only from a socket that pid listens on (not another server's on that port).
The caller still checks the port is free first (processes.port_free), and trusts a pid only after
is_server_process. This module gives the command line, the environment, the readiness check and the identity
check; the caller (lakehouse_dev.services) spawns and stops the process (SIGTERM: it exits at once, code 143).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from lakehouse.core.errors import LakehouseError
from lakehouse_dev import jvm

PART = "iceberg-rest"
HOST = "127.0.0.1"  # the only interface it listens on (loopback.xml)
# The JVM's main class: Jetty's XmlConfiguration, which builds and starts what CONFIG describes.
MAIN = "org.eclipse.jetty.xml.XmlConfiguration"
# RESTCatalogServer on 127.0.0.1: committed next to the POM, so the repository's copy even when
# LAKEHOUSE_JVM_DIR points the jars elsewhere.
CONFIG = jvm.JVM_DIR / PART / "loopback.xml"
# The fixture's own main class, what this module ran before loopback.xml: is_server_process still
# recognises it, so that a server started by an older checkout can be stopped.
FIXTURE_MAIN = "org.apache.iceberg.rest.RESTCatalogServer"
CATALOG_IMPL = "org.apache.iceberg.jdbc.JdbcCatalog"
CATALOG_NAME = "rest_backend"  # the server's default name of its backend catalog
JDBC_TABLES = ("iceberg_tables", "iceberg_namespace_properties")  # what the JdbcCatalog creates in its database
# Names the process on its command line (is_server_process): the server itself reads no system property.
HOME_PROPERTY = "lakehouse.rest-catalog.home"
# Small and few threads: two cores are shared with Spark, the Python workers and Airflow. The server keeps
# only table metadata in memory (~100 MB resident when idle); C1 only and the serial collector start it
# sooner and keep compiler and GC threads to one or two.
DEFAULT_JAVA_OPTIONS = ("-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 "
                        "-Xss512k -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true "
                        "-Djava.net.preferIPv4Stack=true")
# slf4j-simple: warnings and up, with the time. RESTCatalogServlet logs every 4xx answer (a table that does
# not exist, a commit conflict) as an ERROR with its stack trace, which the client receives in the answer's
# body anyway; the first INFO line, silenced with the rest, would print the catalog's properties, secrets
# included. LAKEHOUSE_REST_CATALOG_JAVA_OPTIONS (appended after these) can set other levels.
LOGGING = ("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.showDateTime=true",
           "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
           "-Dorg.slf4j.simpleLogger.log.org.apache.iceberg.rest.RESTCatalogServlet=off",
           "-Dorg.slf4j.simpleLogger.log.org.apache.hadoop.util.NativeCodeLoader=error")
# S3-compatible servers other than AWS reject the SDK's default checksums (apache/iceberg issue 14439).
S3_CHECKSUM_OPTIONS = ("-Daws.requestChecksumCalculation=when_required",
                       "-Daws.responseChecksumValidation=when_required")
# SQLite under the JdbcCatalog's pool of two connections: wait for the other's write lock, not fail at once.
SQLITE_OPTIONS = "busy_timeout=10000"


class RestCatalogError(LakehouseError, RuntimeError):
    """The REST catalog cannot be configured, or did not answer in time; the message says why."""


@dataclass(frozen=True)
class Layout:
    """Where one stack's REST catalog keeps its state."""

    home: Path

    @property
    def folder(self) -> Path:
        return self.home / "rest-catalog"

    @property
    def database(self) -> Path:
        """The SQLite database of the JdbcCatalog: created by the server at its first start, then reused."""
        return self.folder / "catalog.db"

    @property
    def jdbc_uri(self) -> str:
        return f"jdbc:sqlite:{self.database}?{SQLITE_OPTIONS}"

    @property
    def log(self) -> Path:
        """Where the caller should send the JVM's output."""
        return self.home / "logs" / "rest-catalog.log"

    @property
    def initialized(self) -> bool:
        """Whether the database holds the JdbcCatalog's tables (a server ran on it before). Read while no server
        runs on it; a database that cannot be read counts as not initialized (the server then says why)."""
        if not self.database.is_file():
            return False
        try:
            with contextlib.closing(sqlite3.connect(f"{self.database.as_uri()}?mode=ro", uri=True, timeout=10)) as db:
                found = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error:
            return False
        return set(JDBC_TABLES) <= found


def env_name(prop: str) -> str:
    """The CATALOG_* variable RESTCatalogServer reads as catalog property `prop` (`s3.path-style-access` ->
    CATALOG_S3_PATH__STYLE__ACCESS). RestCatalogError for a name the mapping cannot express."""
    name = "CATALOG_" + prop.replace("-", "__").replace(".", "_").upper()
    if not prop or property_name(name) != prop:
        raise RestCatalogError(f"catalog property {prop!r} cannot be passed to the REST catalog server: its "
                               f"CATALOG_* variables name lower-case properties without '_' (and without '.' "
                               f"or '-' next to each other)")
    return name


def property_name(env_name: str) -> str:
    """The catalog property RESTCatalogServer makes of variable `env_name` (RCKUtils.environmentCatalogConfig:
    prefix dropped, `__` -> `-`, then `_` -> `.`, lower-cased)."""
    return env_name.removeprefix("CATALOG_").replace("__", "-").replace("_", ".").lower()


def environment(layout: Layout, port: int, warehouse: str, properties: Mapping[str, str] | None = None,
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: `base` (os.environ by default) without any CATALOG_* variable of its own,
    plus a JdbcCatalog on the layout's SQLite file, the `warehouse` URI (file:///..., s3://bucket/prefix),
    the port, and the extra catalog `properties` (io-impl, s3.endpoint, s3.path-style-access, client.region,
    s3.access-key-id, ...; they override the defaults)."""
    if not warehouse:
        raise RestCatalogError("the REST catalog needs a warehouse URI (file:///... or s3://bucket/prefix)")
    if not 0 < port < 65536:
        raise RestCatalogError(f"invalid port for the REST catalog: {port}")
    catalog = {
        "catalog-impl": CATALOG_IMPL,
        "uri": layout.jdbc_uri,
        "warehouse": warehouse,
        "rest.port": str(port),
        "jdbc.schema-version": "V1",  # views too (the server's default, stated here)
        "jdbc.strict-mode": "true",  # a table only in an existing namespace (as the fixture image)
        # Only on a new database. JdbcCatalog.initializeCatalogTables asks SQLite whether each of its tables
        # exists with DatabaseMetaData.getTables and never closes the answer (Iceberg 1.10.1): when the table
        # is there, that statement stays active and keeps SQLite's shared lock on one of the pool's two
        # connections, so every write through the other fails after busy_timeout (a 500 "UncheckedSQLException:
        # Unknown failure"): a restarted catalog refused about every other commit until the JVM's garbage
        # collector happened to finalize the statement.
        "jdbc.init-catalog-tables": "false" if layout.initialized else "true",
    }
    catalog.update(properties or {})
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("CATALOG_")}
    env.update({env_name(prop): str(value) for prop, value in catalog.items()})
    return env


def java_command(layout: Layout, s3: bool = False) -> list[str]:
    """The `java` command line of the server (JvmPartMissing when set-up has not resolved its jars). With
    `s3`, the AWS SDK computes checksums only when required (S3-compatible servers other than AWS)."""
    options = (os.environ.get("LAKEHOUSE_REST_CATALOG_JAVA_OPTIONS") or DEFAULT_JAVA_OPTIONS).split()
    lib = jvm.lib(PART)
    if not any(lib.glob("jetty-xml-*.jar")):
        raise jvm.JvmPartMissing(f"the {PART} jars in {lib} predate jetty-xml (the REST catalog's launcher): "
                                 f"run `make setup` (it resolves {jvm.folder() / PART / 'pom.xml'} again)")
    if not CONFIG.is_file():
        raise jvm.JvmPartMissing(f"the REST catalog's Jetty configuration {CONFIG} is missing")
    return [jvm.java(), *LOGGING, *(S3_CHECKSUM_OPTIONS if s3 else ()), *options,
            f"-D{HOME_PROPERTY}={layout.folder}", "-cp", jvm.classpath(PART), MAIN, str(CONFIG)]


def command(layout: Layout, port: int, warehouse: str, properties: Mapping[str, str] | None = None,
            base: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment to start the server for `layout` on `port` (see `environment`);
    creates the layout's folders. The caller spawns it (stdout and stderr to `layout.log`)."""
    env = environment(layout, port, warehouse, properties, base)
    io_impl = (properties or {}).get("io-impl", "")
    s3 = warehouse.startswith(("s3://", "s3a://")) or io_impl.endswith("S3FileIO")
    cmd = java_command(layout, s3=s3)
    layout.folder.mkdir(parents=True, exist_ok=True)
    layout.log.parent.mkdir(parents=True, exist_ok=True)
    return cmd, env


def url(port: int) -> str:
    """The catalog's base URI for clients (Spark's `uri`, pyiceberg's `uri`)."""
    return f"http://{HOST}:{port}"


def ready(base_url: str, timeout: float = 2.0) -> bool:
    """Whether GET <base_url>/v1/config answers 200 now."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/config", timeout=timeout) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(base_url: str, timeout: float = 60.0, pid: int | None = None) -> None:
    """Poll GET <base_url>/v1/config until it answers 200 (with `pid`: from a socket process `pid` listens on,
    not another server's on that port). RestCatalogError after `timeout` seconds, or as soon as process `pid`
    (when given) has exited; it says when the port is taken by another process."""
    port = _port(base_url)
    deadline = time.monotonic() + timeout
    while True:
        if ready(base_url) and (pid is None or port is None or _listens(pid, port)):
            return
        if pid is not None and not _alive(pid):
            why = f"the REST catalog (pid {pid}) exited before answering {base_url}/v1/config"
            if port is not None and not _port_free(port):
                why += (f": port {port} of {HOST} is already in use by another process (the REST catalog "
                        f"does not share its port); stop that process or start the catalog on another port")
            raise RestCatalogError(why)
        if time.monotonic() >= deadline:
            why = f"the REST catalog did not answer {base_url}/v1/config within {timeout:.0f}s"
            if pid is not None and port is not None and ready(base_url):
                why += f" (another process answers on port {port}, not pid {pid})"
            raise RestCatalogError(why)
        time.sleep(0.2)


def _port(base_url: str) -> int | None:
    try:
        return urlsplit(base_url).port
    except ValueError:
        return None


def _port_free(port: int) -> bool:
    """Whether a server could bind HOST:`port` now (SO_REUSEADDR, as Jetty's connector)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP `port` (/proc/net/tcp{,6} and /proc/<pid>/fd)."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                sockets.add(f"socket:[{fields[9]}]")
    if not sockets:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                return True
        except OSError:
            continue
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def is_server_process(pid: int, layout: Layout) -> bool:
    """Whether `pid` is the REST catalog of this `layout` (guards against signalling a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return ((MAIN.encode() in cmdline or FIXTURE_MAIN.encode() in cmdline)
            and f"-D{HOME_PROPERTY}={layout.folder}".encode() in cmdline)
