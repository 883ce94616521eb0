"""Apache Kafka for the development stack: one KRaft node (broker and controller in one JVM) from the
Maven Central jars `make setup` resolves (devstack/jvm/kafka), its log on disk under the stack's home.

    <home>/kafka/server.properties   written at every start (the ports may change; the log stays)
    <home>/kafka/log4j2.properties   WARN and up, plus the authorizer's denials
    <home>/kafka/data/               the log: formatted once (`kafka-storage format`), kept across restarts
    <home>/logs/broker.log           the JVM's output
    <home>/security/                 the CA and the broker's key (broker-keystore.pem), the client password

Listeners, each on 127.0.0.1:

    PLAINTEXT       the stack's port (19092 by default): no login; its principal, User:ANONYMOUS, is a super
                    user, so the stack administers users and ACLs there
    SSL             TLS with the stack's CA (ca.pem), no login (User:ANONYMOUS)
    SASL_PLAINTEXT  SCRAM-SHA-512 or SCRAM-SHA-256 logins without TLS
    SASL_SSL        SCRAM-SHA-512 or SCRAM-SHA-256 logins over TLS (the certificate names IP 127.0.0.1 and
                    localhost, as librdkafka checks)
    CONTROLLER      the KRaft quorum (static voter 1), PLAINTEXT

The others take the next free ports after the stack's (recorded in stack.json). ACLs are enforced
(StandardAuthorizer, nothing allowed without an ACL): the stack's client user `lakehouse` is granted every
operation on topics, groups, transactional ids and the cluster; `add_user` creates others with the ACLs a
test or an operator names.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from lakehouse.core.errors import LakehouseError
from lakehouse_dev import jvm, processes

MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
SCRAM_ITERATIONS = 4096
CLIENT_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Small and few threads: two cores are shared with Spark, the Python workers and Airflow.
DEFAULT_JAVA_OPTIONS = ("-Xms128m -Xmx512m -XX:+UseG1GC -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1 "
                        "-XX:CICompilerCount=2 -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true")
LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = INFO
logger.authorizer.additivity = false
logger.authorizer.appenderRef.out.ref = OUT
"""


class BrokerError(LakehouseError, RuntimeError):
    """The broker cannot be configured or formatted; the message says why."""


@dataclass(frozen=True)
class Layout:
    """Where one stack's broker keeps its configuration and log."""

    home: Path

    @property
    def folder(self) -> Path:
        return self.home / "kafka"

    @property
    def properties(self) -> Path:
        return self.folder / "server.properties"

    @property
    def log4j(self) -> Path:
        return self.folder / "log4j2.properties"

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def formatted(self) -> bool:
        return (self.data / "meta.properties").exists()


def cluster_id() -> str:
    """A new cluster id as Kafka makes them (Uuid.randomUuid: 16 bytes, URL-safe base64 without padding, never
    starting with '-', which a command line would take for an option)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def listener_ports(port: int) -> dict[str, int]:
    """The port of every listener: PLAINTEXT on `port`, the others on the next free ports after it (else
    any free port)."""
    ports = {"PLAINTEXT": port}
    for name in (*CLIENT_PROTOCOLS[1:], "CONTROLLER"):
        ports[name] = processes.free_port(max(ports.values()) + 1, set(ports.values()))
    return ports


def server_properties(layout: Layout, ports: dict[str, int], keystore: Path) -> str:
    """The broker's configuration: one KRaft node, the listeners of `ports`, SCRAM on the SASL listeners,
    TLS with the PEM `keystore` (key and certificate), ACLs enforced."""
    clients = [p for p in CLIENT_PROTOCOLS if p in ports]
    listeners = ",".join(f"{name}://127.0.0.1:{ports[name]}" for name in (*clients, "CONTROLLER"))
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    lines = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{ports['CONTROLLER']}",
        "controller.listener.names": "CONTROLLER",
        "listeners": listeners,
        "advertised.listeners": ",".join(f"{name}://127.0.0.1:{ports[name]}" for name in clients),
        "listener.security.protocol.map": ",".join(f"{n}:{n}" for n in clients) + ",CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(layout.data),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",  # topics are declared (`lakehouse topics`), as on most clusters
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.check.interval.ms": "5000",  # retention acts within seconds of a change
        "log.cleaner.backoff.ms": "2000",  # and compaction
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.client.auth": "none",
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",  # PLAINTEXT, SSL and the controller: the stack's own connections
        "allow.everyone.if.no.acl.found": "false",
    }
    for listener in ("sasl_plaintext", "sasl_ssl"):
        for mechanism in MECHANISMS:
            lines[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = jaas
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def java_command(layout: Layout) -> list[str]:
    options = (os.environ.get("LAKEHOUSE_KAFKA_JAVA_OPTIONS") or DEFAULT_JAVA_OPTIONS).split()
    return [jvm.java(), *options, f"-Dlog4j2.configurationFile=file:{layout.log4j}",
            f"-Dkafka.logs.dir={layout.home / 'logs'}", "-cp", jvm.classpath("kafka"), MAIN, str(layout.properties)]


def prepare(layout: Layout, ports: dict[str, int], keystore: Path) -> None:
    """Write the broker's configuration for `ports`, and format its log folder the first time (a new
    cluster id). Raises BrokerError when formatting fails, quoting the storage tool."""
    layout.folder.mkdir(parents=True, exist_ok=True)
    layout.properties.write_text(server_properties(layout, ports, keystore))
    layout.log4j.write_text(LOG4J2)
    if layout.formatted:
        return
    done = subprocess.run([jvm.java(), "-Xmx256m", "-XX:TieredStopAtLevel=1",
                           f"-Dlog4j2.configurationFile=file:{layout.log4j}", "-cp", jvm.classpath("kafka"),
                           STORAGE_TOOL, "format", f"--cluster-id={cluster_id()}", "--config", str(layout.properties)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise BrokerError(f"kafka-storage format of {layout.data} failed ({done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()[-2000:]}")


def is_broker_process(pid: int, layout: Layout) -> bool:
    """Whether `pid` is the broker of this `layout` (guards against signalling a recycled pid)."""
    cmdline = processes.command_line(pid) or []
    return MAIN.encode() in cmdline and str(layout.properties).encode() in cmdline


# ---------------------------------------------------------------------------- users and ACLs

def _admin(conf: dict):
    from confluent_kafka.admin import AdminClient

    # librdkafka's connection logs go to a logger the stack keeps silent (see lakehouse_dev.stack)
    return AdminClient({"logger": logging.getLogger("lakehouse.kafka"), **conf})


def _wait(admin, futures: dict, timeout: float = 30.0) -> None:
    """Wait for an admin request's `futures` (the client `admin` must live until they resolve)."""
    for future in futures.values():
        future.result(timeout=timeout)


def set_password(admin_conf: dict, user: str, password: str) -> None:
    """Create or update SCRAM credentials of `user` for both mechanisms (over an admin connection)."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = _admin(admin_conf)
    for mechanism in MECHANISMS:  # one alteration of a user per request
        info = ScramCredentialInfo(getattr(ScramMechanism, mechanism.replace("-", "_")), SCRAM_ITERATIONS)
        _wait(admin, admin.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())]))


def allow(admin_conf: dict, user: str, grants: list[tuple[str, str, str]]) -> None:
    """ACLs allowing `user` each (resource type, name, operation) of `grants`, e.g. ("TOPIC", "orders",
    "READ"); a name of `*` is every resource of the type, a name ending in `*` a prefix."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    bindings = []
    for resource, name, operation in grants:
        pattern = ResourcePatternType.PREFIXED if name.endswith("*") and name != "*" else ResourcePatternType.LITERAL
        bindings.append(AclBinding(getattr(ResourceType, resource), name.rstrip("*") or "*", pattern,
                                   f"User:{user}", "*", getattr(AclOperation, operation), AclPermissionType.ALLOW))
    admin = _admin(admin_conf)
    _wait(admin, admin.create_acls(bindings))


EVERYTHING = [("TOPIC", "*", "ALL"), ("GROUP", "*", "ALL"), ("TRANSACTIONAL_ID", "*", "ALL"),
              ("BROKER", "kafka-cluster", "ALL")]


def add_user(admin_conf: dict, user: str, password: str, grants: list[tuple[str, str, str]]) -> None:
    """A SCRAM user (both mechanisms) with exactly the ACLs of `grants` (see `allow`)."""
    set_password(admin_conf, user, password)
    if grants:
        allow(admin_conf, user, grants)


def await_login(conf: dict, timeout: float = 30.0) -> None:
    """Wait until a client with `conf` (a SCRAM login) is accepted: credentials reach the listeners through
    the metadata log a moment after they are written. Raises BrokerError after `timeout`."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            _admin(conf).list_topics(timeout=5)
            return
        except KafkaException as exc:
            last = str(exc)
        time.sleep(0.2)
    raise BrokerError(f"the broker did not accept {conf.get('sasl.username')!r}'s login within {timeout:.0f}s: {last}")
