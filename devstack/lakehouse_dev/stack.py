"""The embedded stack: Apache Kafka, the Iceberg catalog and the warehouse.

Everything lives under `config.lakehouse_home()`:

    stack.json        pid, ports and start time of the running broker, its listeners, and how clients reach
                      it (bootstrap servers, security protocol, mechanism, user: never the password)
    kafka/            the broker's configuration and its log (lakehouse_dev.kafka_broker): kept across
                      restarts, deleted by `down(purge=True)`
    logs/broker.log   the broker's output
    security/         owner-only (0700): the generated client password (kafka.password, 0600), the CA
                      (ca.pem) and the broker's key and certificate (broker-keystore.pem, 0600)
    catalog.db        the SQLite Iceberg JDBC catalog (unless LAKEHOUSE_CATALOG_URI says otherwise)
    warehouse/        table data and metadata (unless LAKEHOUSE_WAREHOUSE says otherwise)

The broker is Apache Kafka itself, one KRaft node from the jars `make setup` resolves from Maven Central,
with a PLAINTEXT, an SSL, a SASL_PLAINTEXT and a SASL_SSL listener (SCRAM-SHA-512 and SCRAM-SHA-256 over TLS
with a CA made here) and ACLs enforced; see lakehouse_dev.kafka_broker. When LAKEHOUSE_BOOTSTRAP_SERVERS
points at another cluster, the stack starts no broker and reports that cluster instead.

Which listener clients use is the stack's choice (`up(auth=..., tls=...)`, LAKEHOUSE_BROKER_AUTH /
LAKEHOUSE_BROKER_TLS, `lakehouse stack up --auth scram-sha-512 --tls`): plain by default; with a login,
as user `lakehouse` with a generated password kept in security/kafka.password. `config.load()` hands those
settings to every client (lakehouse_dev.settings). Changing the choice on a running broker takes effect at
once: every listener is always there.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError, KafkaAuthError, LakehouseError, TopicError
from lakehouse_dev import jvm, kafka_broker, processes, services, settings

CATALOG_NAME = "lake"
STATE_FILE = "stack.json"
LOG_FILE = Path("logs") / "broker.log"
SECURITY_DIR = "security"
PASSWORD_FILE = "kafka.password"
CA_FILE, KEYSTORE_FILE = "ca.pem", "broker-keystore.pem"
KAFKA_USER = "lakehouse"
AUTH_CHOICES = {"none": None, "off": None, "scram": "SCRAM-SHA-512", "scram-sha-512": "SCRAM-SHA-512",
                "scram-sha-256": "SCRAM-SHA-256"}
START_TIMEOUT_S = 90.0  # a JVM on two busy cores
STOP_TIMEOUT_S = 20.0   # a controlled shutdown flushes and closes the log

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
    except ConfigurationError as exc:
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

pid_alive = processes.pid_alive


def _layout(home: Path) -> kafka_broker.Layout:
    return kafka_broker.Layout(home)


def _is_broker_process(pid: int, home: Path | None = None) -> bool:
    """Whether `pid` is the Kafka broker of the stack in `home` (guards against signalling a recycled pid)."""
    return kafka_broker.is_broker_process(pid, _layout(home or _home())) or processes.started_here(pid)


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
    from lakehouse.core import topics

    if not _tcp_open(kafka_conf["bootstrap.servers"], timeout=min(timeout, 1.0)):
        return None, None
    try:
        platform = config.PlatformConfig(home=_home(), bootstrap_servers=kafka_conf["bootstrap.servers"],
                                         kafka_extra={k: v for k, v in kafka_conf.items()
                                                      if k != "bootstrap.servers"})
        return topics.topic_partitions(platform, timeout=timeout), None
    except TopicError:
        return None, None
    except KafkaAuthError as exc:
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


def _tls_files(home: Path) -> tuple[Path, Path]:
    """(CA certificate, broker keystore: its key and certificate in one PEM file, 0600) for 127.0.0.1 and
    localhost: a self-signed CA made on first use (its key is not kept), reused until 30 days before the
    certificate expires."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = _security_dir(home)
    ca_path, keystore = folder / CA_FILE, folder / KEYSTORE_FILE
    now = datetime.now(timezone.utc)
    if ca_path.exists() and keystore.exists():
        try:
            cert = x509.load_pem_x509_certificate(keystore.read_bytes())  # the first certificate in the file
            if cert.not_valid_after_utc > now + timedelta(days=30):
                return ca_path, keystore
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
    # Kafka's PEM key store: the certificate chain and the (unencrypted PKCS#8) key in one file
    _write_private(keystore, cert.public_bytes(serialization.Encoding.PEM).decode()
                   + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()).decode())
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    os.chmod(ca_path, 0o644)
    return ca_path, keystore


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
    except ConfigurationError as exc:
        raise StackError(str(exc)) from None
    return conf


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

        # pyiceberg creates the JDBC catalog tables (the V1 schema Spark's JdbcCatalog also reads); a REST
        # catalog answers its configuration
        catalog = open_catalog(platform, CATALOG_NAME, fresh=True)
        if hasattr(catalog, "engine"):
            catalog.engine.dispose()
    except Exception as exc:  # sqlalchemy and driver errors have no common base worth naming
        raise StackError(f"cannot initialise the Iceberg catalog at {config.redact(platform.catalog_uri)}: "
                         f"{exc}") from exc


# ---------------------------------------------------------------------------- public API

def _client_listener(state: dict, security: Security) -> str:
    """The bootstrap address of the running broker's listener for `security`'s protocol."""
    listeners = state.get("listeners") or {}
    if security.protocol not in listeners:
        raise StackError(f"the embedded broker has no {security.protocol} listener (it has "
                         f"{', '.join(listeners) or 'none'}); restart it with `lakehouse stack down` and "
                         f"`lakehouse stack up`")
    return listeners[security.protocol]


def _client_state(home: Path, state: dict, security: Security) -> dict:
    """`state` with clients pointed at the listener of `security` (what config.load() reads)."""
    out = {key: value for key, value in state.items() if key != "security"}
    out["bootstrap_servers"] = _client_listener(state, security)
    if security.secured:
        out["security"] = _security_state(home, security)
    return out


def status() -> dict:
    """Where the platform's pieces are and whether the broker runs.

    Returns a dict with `home`, `bootstrap_servers`, `catalog_uri`, `warehouse`,
    `broker` ({running, reachable, embedded, pid, port, listeners, log, started_at, security,
    error}), `services` (each optional server stack.json records: {running, pid, port, address})
    and `topics` (a list of {name, partitions}, or None when Kafka does not answer). `security` is {protocol, mechanism, username, ca_location} (never the
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
                  "port": None, "listeners": None, "log": None, "started_at": None}
    else:
        pid = state.get("pid")
        alive = pid_alive(pid) and _is_broker_process(pid, home)
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
            "listeners": state.get("listeners") if alive else None,
            "log": str(home / LOG_FILE),
            "started_at": state.get("started_at") if alive else None,
        }
    broker.update(security=security, error=refused)
    return {
        "home": str(home),
        "bootstrap_servers": platform.bootstrap_servers,
        "catalog_uri": config.redact(platform.catalog_uri),  # never print a database password
        "warehouse": platform.warehouse,
        "broker": broker,
        "services": services.describe(home, state.get("services") or {}),
        "topics": None if topic_counts is None else [{"name": name, "partitions": count}
                                                      for name, count in topic_counts.items()],
    }


def up(port: int | None = None, auth: str | None = None, tls: bool | None = None, catalog: str | None = None,
       object_store: bool | None = None, registry: bool | None = None) -> dict:
    """Start the embedded stack unless it already runs; return `status()` plus `started`.

    The broker's PLAINTEXT port is `port`, else LAKEHOUSE_BROKER_PORT, else 19092 (its other listeners
    take the next free ports). `auth` (none, scram-sha-512 or scram, scram-sha-256; else
    LAKEHOUSE_BROKER_AUTH) makes clients log in as user `lakehouse` with a generated password kept in
    <home>/security/kafka.password (0600); `tls` (else LAKEHOUSE_BROKER_TLS) makes them speak TLS,
    trusting the stack's CA (<home>/security/ca.pem). Neither given: a running broker's clients are kept
    as they are, a new broker's are plain. Asking a running broker for other security points clients at
    that listener at once. With LAKEHOUSE_BOOTSTRAP_SERVERS set no broker is started: the catalog and
    warehouse are prepared and the external cluster must answer.
    `catalog` ("rest"; else LAKEHOUSE_STACK_CATALOG), `object_store` and `registry` (else
    LAKEHOUSE_STACK_OBJECT_STORE, LAKEHOUSE_STACK_REGISTRY) also start those servers (lakehouse_dev.services)
    unless they run; a server asked for once keeps running until `down`.
    Raises StackError when the port is taken by something else, the broker runs on another port than
    asked for, a server does not come up in time (quoting its log), or the catalog cannot be initialised.
    """
    home = _home()
    with _locked(home):
        try:
            servers = services.wanted(catalog, object_store, registry)
        except services.ServiceError as exc:
            raise StackError(str(exc)) from None
        state = settings.read_state_file(home, STATE_FILE)
        if _external_bootstrap():  # another cluster's Kafka: only the optional servers run here
            platform = config.load(fresh=True)
            answered, refused = _kafka_probe(platform.kafka(), timeout=5.0)
            if refused:
                raise StackError(refused)
            if answered is None:
                raise StackError(f"LAKEHOUSE_BOOTSTRAP_SERVERS={platform.bootstrap_servers} does not answer; "
                                 f"start that cluster or unset the variable to use the embedded broker")
            running = _ensure_services(home, state.get("services") or {}, servers)
            if running:
                _write_state(home, {"services": running})
            _prepare_storage(config.load(fresh=True))
            return {**status(), "started": False}

        requested = _requested_port(port)
        wanted = _requested_security(auth, tls)
        pid = state.get("pid")
        started = False
        if pid_alive(pid) and _is_broker_process(pid, home) and state.get("listeners") \
                and _kafka_answers(_admin_conf(state), timeout=3.0) is not None:
            running_port = state.get("port")
            if requested is not None and requested != running_port:
                raise StackError(f"the embedded broker already runs on port {running_port} (pid {pid}); "
                                 f"stop it first (stack down) to move it to port {requested}")
            if wanted is not None and wanted != _state_security(state):
                state = _client_state(home, state, wanted)
        else:
            if pid:  # alive but deaf (hung or half-started): replace it rather than trust it
                _stop(pid, home)
            _state_path(home).unlink(missing_ok=True)
            port = requested or config.DEFAULT_BROKER_PORT
            if not processes.port_free(port):
                raise StackError(
                    f"port {port} is already in use by another process, so the embedded broker cannot listen "
                    f"on it. Choose another port with LAKEHOUSE_BROKER_PORT=<port> (or the port argument of "
                    f"up), or, if a Kafka broker you want to use listens there, set "
                    f"LAKEHOUSE_BOOTSTRAP_SERVERS=127.0.0.1:{port}.")
            proc, listeners = _start_broker(home, port)
            broker = {"pid": proc.pid, "port": port, "listeners": listeners, "log": str(home / LOG_FILE),
                      "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      "services": state.get("services") or {}}
            security = wanted or Security()
            if security.mechanism:
                _await_login(proc, home, broker, security)
            state, started = _client_state(home, broker, security), True
        state["services"] = _ensure_services(home, state.get("services") or {}, servers)
        _write_state(home, state)
        _prepare_storage(config.load(fresh=True))
        return {**status(), "started": started}


def _ensure_services(home: Path, records: dict[str, dict], wanted: services.Wanted) -> dict[str, dict]:
    """The records of the stack's servers once every one `wanted` names runs (started here when it does not);
    those that stopped are forgotten. Raises StackError when one does not start."""
    running = {name: entry for name, entry in records.items() if services.is_running(home, name, entry)}
    for name in wanted.names():
        if name not in running:
            try:
                running[name] = services.start(home, name, running)
            except services.ServiceError as exc:
                raise StackError(str(exc)) from None
    return running


def add_user(name: str, password: str, grants: list[tuple[str, str, str]], tls: bool = True,
             mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    """A SCRAM user of the running embedded broker with exactly the ACLs of `grants`, each (resource type,
    name, operation) as kafka_broker.allow takes them, e.g. ("TOPIC", "orders", "READ"). Returns the
    librdkafka settings that log in as it (SASL_SSL with the stack's CA, or SASL_PLAINTEXT without `tls`),
    once the broker accepts the login. Raises StackError when no embedded broker runs."""
    home = _home()
    state = settings.read_state_file(home, STATE_FILE)
    if not (pid_alive(state.get("pid")) and _is_broker_process(state["pid"], home) and state.get("listeners")):
        raise StackError("no embedded broker runs: start it with `lakehouse stack up`")
    security = Security(mechanism, tls)
    kafka_broker.add_user(_admin_conf(state), name, password, grants)
    conf = {"bootstrap.servers": _client_listener(state, security), "security.protocol": security.protocol,
            "sasl.mechanism": mechanism, "sasl.username": name, "sasl.password": password}
    if tls:
        conf["ssl.ca.location"] = str(home / SECURITY_DIR / CA_FILE)
    kafka_broker.await_login(conf)
    return conf


def restart(name: str, pause_s: float = 0.0, home: Path | None = None) -> dict:
    """Stop the stack's server `name` (one of lakehouse_dev.services.SERVICES), wait `pause_s` seconds (an
    outage), and start it again on the same port, so its clients find it where they left it; its new
    record. `home`: the stack's (default LAKEHOUSE_HOME's). Raises StackError when it does not run or does
    not come back."""
    home = home or _home()
    with _locked(home):
        state = settings.read_state_file(home, STATE_FILE)
        records = state.get("services") or {}
        if name not in records:
            raise StackError(f"the stack runs no {name}: start it with `lakehouse stack up`")
        try:
            services.stop(home, name, records[name])
            time.sleep(pause_s)
            others = {other: entry for other, entry in records.items() if other != name}
            records[name] = services.start(home, name, others, port=records[name]["port"])
        except services.ServiceError as exc:
            raise StackError(str(exc)) from None
        state["services"] = records
        _write_state(home, state)
        return records[name]


def _admin_conf(state: dict) -> dict:
    """librdkafka settings of the stack's own administration: the PLAINTEXT listener (a super user)."""
    return {"bootstrap.servers": (state.get("listeners") or {}).get("PLAINTEXT", "")}


def _start_broker(home: Path, port: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """Launch Apache Kafka detached with its PLAINTEXT listener on 127.0.0.1:`port`, wait until it answers
    there, and give the stack's user `lakehouse` its password and ACLs. Returns the process and each
    client listener's address by protocol."""
    layout = _layout(home)
    ports = kafka_broker.listener_ports(port)
    _, keystore = _tls_files(home)
    try:
        kafka_broker.prepare(layout, ports, keystore)
        cmd = kafka_broker.java_command(layout)
    except (kafka_broker.BrokerError, jvm.JvmPartMissing) as exc:
        raise StackError(str(exc)) from None
    log_path = home / LOG_FILE
    proc = processes.spawn(cmd, log_path)
    listeners = {name: f"127.0.0.1:{ports[name]}" for name in kafka_broker.CLIENT_PROTOCOLS}
    _await_answer(proc, home, {"bootstrap.servers": listeners["PLAINTEXT"]},
                  f"the embedded broker on port {port}", log_path)
    try:
        kafka_broker.add_user(_admin_conf({"listeners": listeners}), KAFKA_USER, _client_password(home),
                              kafka_broker.EVERYTHING)
    except Exception as exc:  # noqa: BLE001 - confluent-kafka's admin errors: the broker refused or failed
        _stop(proc.pid, home)
        raise StackError(f"the embedded broker did not take the stack's user {KAFKA_USER!r}: {exc}") from exc
    return proc, listeners


def _await_login(proc: subprocess.Popen, home: Path, state: dict, security: Security) -> None:
    """Wait until the broker accepts the stack user's login on the listener of `security`."""
    conf = {"bootstrap.servers": _client_listener(state, security),
            **settings.embedded_kafka_security(home, {"security": _security_state(home, security)})}
    try:
        kafka_broker.await_login(conf)
    except kafka_broker.BrokerError as exc:
        _stop(proc.pid, home)
        raise StackError(f"{exc}; the end of {home / LOG_FILE}:\n{processes.log_tail(home / LOG_FILE)}") from None


def _await_answer(proc: subprocess.Popen, home: Path, conf: dict, what: str, log_path: Path) -> None:
    """Wait until a client with `conf` gets a metadata answer; StackError (quoting the log) when `proc`
    exits or START_TIMEOUT_S passes."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            processes.forget(proc.pid)
            raise StackError(f"{what} exited with code {proc.returncode} while starting; "
                             f"the end of {log_path}:\n{processes.log_tail(log_path)}")
        answered, refused = _kafka_probe(conf, timeout=1.0)
        if answered is not None:
            return
        if refused or time.monotonic() > deadline:
            _stop(proc.pid, home)
            raise StackError(f"{what} did not answer within {START_TIMEOUT_S:.0f}s"
                             f"{': ' + refused if refused else ''}; the end of {log_path}:\n{processes.log_tail(log_path)}")
        time.sleep(0.2)


def _stop(pid: int, home: Path, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker `pid` of the stack in `home` (SIGTERM: a controlled shutdown; SIGKILL after `timeout`);
    True if it was running. A pid that is not this stack's broker (recycled) is left alone."""
    try:
        return processes.stop(pid, lambda p: _is_broker_process(p, home), timeout)
    except RuntimeError as exc:
        raise StackError(str(exc)) from None


def down(purge: bool = False) -> dict:
    """Stop the embedded broker and forget it; with `purge` also delete its log, the local catalog,
    warehouse, logs and the generated credentials and certificates.

    Returns {stopped: bool, pid, purged: [paths removed]}. Idempotent: stopping a
    stack that does not run returns stopped=False. Purge only removes paths under
    the stack's home, never a catalog or warehouse configured elsewhere.
    Raises StackError when the broker cannot be killed.
    """
    home = _home()
    with _locked(home):
        state = settings.read_state_file(home, STATE_FILE)
        for name, entry in reversed(list((state.get("services") or {}).items())):
            try:
                services.stop(home, name, entry)
            except services.ServiceError as exc:
                raise StackError(str(exc)) from None
        pid = state.get("pid")
        stopped = _stop(pid, home) if pid else False
        _state_path(home).unlink(missing_ok=True)
        purged: list[str] = []
        if purge:
            for path in [*(home / name for name in ("catalog.db", "catalog.db-journal", "catalog.db-wal",
                                                     "catalog.db-shm", "warehouse", "kafka", "logs", SECURITY_DIR)),
                         *services.folders(home)]:
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
                else:
                    continue
                purged.append(str(path))
        config.load(fresh=True)
        return {"stopped": stopped, "pid": pid, "purged": purged}
