"""Source topics as the pipeline specs declare them: partitions, replication and retention.

`ensure_topics(specs)` creates what is missing and warns (`TopicMismatchWarning`)
about existing topics that disagree with their spec; it never deletes or
shrinks anything, because a topic is the system of record. `plan_topics(specs)` says what
it would do (`lakehouse topics --dry-run`) and changes nothing. `require_broker` answers
within seconds whether Kafka answers at all, so a command fails fast with one line naming
the setting to check instead of waiting out each client's timeout. `describe_retention` reads a
topic's `retention.ms`; `record_timestamps` the Kafka timestamps of given records (how old
the oldest record not yet ingested is).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from lakehouse.core import config, kafka_security, retry
from lakehouse.core.errors import BrokerUnreachableError, RetryableError, TopicError
from lakehouse.core.spec import PipelineSpec

log = logging.getLogger(__name__)

# Kafka's own bookkeeping topics are not pipeline sources; keep them out of listings.
INTERNAL_PREFIX = "__"


BROKER_CHECK_S = 4.0  # how long `require_broker` waits for a metadata answer


def require_broker(platform: config.PlatformConfig | None = None, timeout: float | None = None) -> None:
    """Raise BrokerUnreachableError unless the platform's Kafka answers a metadata request within `timeout`
    seconds (default BROKER_CHECK_S; KafkaAuthError at once when it refuses the credentials or
    the TLS handshake).

    A command calls it before anything else touches Kafka or the catalog: with the broker down it fails
    within seconds and has created nothing, rather than waiting out every client's own timeout (and
    printing librdkafka's reconnect attempts) before reporting a half-answer.
    """
    platform = platform or config.load()
    timeout = BROKER_CHECK_S if timeout is None else timeout
    conf, watch = kafka_security.watched(platform.kafka(logger=logging.getLogger("lakehouse.kafka")))
    admin = AdminClient(conf)
    try:
        kafka_security.list_topics(admin, watch, timeout)
    except KafkaException:
        setting = ("LAKEHOUSE_BOOTSTRAP_SERVERS" if "LAKEHOUSE_BOOTSTRAP_SERVERS" in os.environ else
                   "LAKEHOUSE_BOOTSTRAP_SERVERS (unset: the embedded broker of LAKEHOUSE_HOME; start it with "
                   "`lakehouse stack up`)")
        raise BrokerUnreachableError(
            f"Kafka is unreachable: nothing answered at {kafka_security.describe(platform.kafka())} within "
            f"{timeout:g}s; check {setting} and that the broker runs") from None


class TopicMismatchWarning(UserWarning):
    """An existing topic differs from its spec (fewer partitions, shorter retention)."""


def admin_client(platform: config.PlatformConfig | None = None) -> AdminClient:
    """An AdminClient for the platform's Kafka (librdkafka logs go to the `lakehouse.kafka` logger)."""
    return _watched_admin(platform or config.load())[0]


def _watched_admin(platform: config.PlatformConfig) -> tuple[AdminClient, kafka_security.ErrorWatch]:
    """An AdminClient whose authentication and TLS errors the returned watch keeps."""
    conf, watch = kafka_security.watched(platform.kafka(logger=logging.getLogger("lakehouse.kafka")))
    return AdminClient(conf), watch


def topic_partitions(platform: config.PlatformConfig | None = None, timeout: float = 10.0,
                     include_internal: bool = False) -> dict[str, int]:
    """Partition count of every topic on the cluster, by name.

    Raises TopicError when the cluster does not answer within `timeout` seconds, and
    KafkaAuthError at once when it refuses the credentials or the TLS handshake.
    """
    platform = platform or config.load()
    admin, watch = _watched_admin(platform)
    try:
        metadata = kafka_security.list_topics(admin, watch, timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot list topics on {kafka_security.describe(platform.kafka())}: "
                         f"{exc.args[0].str()}") from None
    return {name: len(meta.partitions) for name, meta in sorted(metadata.topics.items())
            if include_internal or not name.startswith(INTERNAL_PREFIX)}


def describe_config(topic: str, names: Iterable[str], platform: config.PlatformConfig | None = None,
                    timeout: float = 10.0) -> dict[str, str | None]:
    """The values of the topic configs `names` as the broker reports them (its default for one the topic does
    not set; None for one it does not report).

    Raises TopicError when the topic does not exist or the broker does not answer, and
    KafkaAuthError when it refuses the credentials.
    """
    platform = platform or config.load()
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin, watch = _watched_admin(platform)  # keep a reference: a collected client fails its pending futures
    future = admin.describe_configs([resource], request_timeout=timeout)[resource]
    try:
        entries = kafka_security.wait_future(future, admin, watch, timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise TopicError(f"topic {topic!r} does not exist on {platform.bootstrap_servers}") from None
        raise TopicError(f"cannot describe the configs of topic {topic!r}: {err.str()}") from None
    return {name: (entries[name].value if name in entries else None) for name in names}


def describe_retention(topic: str, platform: config.PlatformConfig | None = None,
                       timeout: float = 10.0) -> int | None:
    """The topic's `retention.ms` as the broker reports it (Apache Kafka always reports one: its default when
    the topic sets none), or None when it reports none. Raises as `describe_config`."""
    value = describe_config(topic, ["retention.ms"], platform, timeout)["retention.ms"]
    return None if value is None else int(value)


def record_timestamps(kafka_conf: dict, topic: str, starts: dict[int, int], timeout: float = 10.0) -> dict[int, int]:
    """Kafka timestamp (ms) of the record at `starts[p]` per partition; partitions that return none
    within `timeout` seconds are left out."""
    if not starts:
        return {}
    consumer = Consumer({"logger": logging.getLogger("lakehouse.kafka"), **kafka_conf, "group.id": "lakehouse-status",
                         "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    found: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + timeout
        pending = set(starts)
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(pending), timeout=0.5):
                p = msg.partition()
                if p not in pending:
                    continue
                if msg.error() is None:
                    found[p] = msg.timestamp()[1]
                pending.discard(p)  # a record or end-of-partition: either way done with p
    finally:
        consumer.close()
    return found


@dataclass
class TopicPlan:
    """What `ensure_topics` does to the specs' topics: `create` (topic, partitions, replication_factor, config
    of each missing one, in spec order), `mismatches` (why an existing topic disagrees with its spec: left as
    it is, since growing partitions moves keys), `unchanged` (existing topics that match)."""

    create: list[dict] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def plan_topics(specs: Iterable[PipelineSpec], platform: config.PlatformConfig | None = None,
                timeout: float = 15.0) -> TopicPlan:
    """What `ensure_topics(specs)` would create and which existing topics disagree with their spec; reads
    metadata and topic configs only. Raises as `ensure_topics`."""
    platform = platform or config.load()
    existing = topic_partitions(platform, timeout=timeout, include_internal=True)
    wanted: dict[str, PipelineSpec] = {}
    for spec in specs:
        wanted.setdefault(spec.source.topic, spec)  # the first spec of a shared topic decides

    plan = TopicPlan()
    for topic, spec in wanted.items():
        src = spec.source
        if topic not in existing:
            plan.create.append({"topic": topic, "partitions": src.partitions,
                                "replication_factor": src.replication_factor,
                                "config": {} if src.retention_ms is None else {"retention.ms": str(src.retention_ms)}})
            continue
        found = len(plan.mismatches)
        if existing[topic] < src.partitions:
            plan.mismatches.append(
                f"topic {topic!r} has {existing[topic]} partition(s) but pipeline {spec.name!r} declares "
                f"{src.partitions} in {spec.path}; it is left as it is. Increase them on the broker "
                f"(kafka-topics --alter --partitions {src.partitions}) knowing that keys then move to "
                f"other partitions, or lower source.partitions in the spec.")
        if src.retention_ms is not None and src.retention_ms >= 0:
            actual = describe_retention(topic, platform, timeout=timeout)
            if actual is not None and 0 <= actual < src.retention_ms:
                plan.mismatches.append(
                    f"topic {topic!r} keeps records for retention.ms={actual} but pipeline {spec.name!r} "
                    f"declares {src.retention_ms} in {spec.path}; records may age out before they are "
                    f"ingested or replayed.")
        if len(plan.mismatches) == found:
            plan.unchanged.append(topic)
    return plan


def ensure_topics(specs: Iterable[PipelineSpec], platform: config.PlatformConfig | None = None,
                  timeout: float = 15.0) -> list[str]:
    """Create every spec's source topic that does not exist yet.

    Returns the names of the topics created, in spec order. An existing topic
    with fewer partitions than its spec, or a shorter retention, is left as it
    is and reported with a TopicMismatchWarning (adding partitions moves keys to
    other partitions, so it is an operator's decision, not a side effect).
    Raises TopicError when Kafka rejects a creation or does not answer, and
    KafkaAuthError when it refuses the credentials.
    """
    platform = platform or config.load()
    plan = plan_topics(specs, platform, timeout)
    for message in plan.mismatches:
        _warn(message)
    missing = [NewTopic(c["topic"], num_partitions=c["partitions"], replication_factor=c["replication_factor"],
                        config=c["config"]) for c in plan.create]
    created: list[str] = []
    if missing:
        admin, watch = _watched_admin(platform)
        futures = admin.create_topics(missing, request_timeout=timeout)
        for new in missing:
            try:
                kafka_security.wait_future(futures[new.topic], admin, watch, timeout)
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # created concurrently by someone else: that is what we wanted
                raise TopicError(f"cannot create topic {new.topic!r} on {platform.bootstrap_servers}: "
                                 f"{err.str()}") from None
            log.info("created topic %s (%d partitions)", new.topic, new.num_partitions)
            created.append(new.topic)
        if created:
            _await_metadata(admin, watch, {new.topic: new.num_partitions for new in missing if new.topic in created},
                            timeout)
    return created


def _await_metadata(admin: AdminClient, watch: kafka_security.ErrorWatch, expected: dict[str, int],
                    timeout: float) -> None:
    """Until every topic of `expected` (name -> partitions) is in the cluster's metadata with each partition led.
    CreateTopics answers once the controller holds a topic; the brokers learn it a moment later, and a listing
    or a consumer in between does not see it (Apache Kafka's metadata propagation)."""
    def visible(_attempt: int) -> None:
        topics = kafka_security.list_topics(admin, watch, timeout).topics
        for name, partitions in expected.items():
            found = topics.get(name)
            if found is None or found.error is not None or len(found.partitions) < partitions \
                    or any(p.leader < 0 for p in found.partitions.values()):
                raise RetryableError(f"topic {name} is not in the brokers' metadata yet")

    retry.transient(f"the new topics {', '.join(expected)}", deadline_s=timeout, first_wait_s=0.05, max_wait_s=0.5,
                    error=TopicError, next_step="the controller created them but no broker serves them yet: check "
                    "the brokers' logs").run(visible)


def _warn(message: str) -> None:
    # a warning, not a log line: the CLI shows it, Airflow captures it, tests can assert it
    warnings.warn(message, TopicMismatchWarning, stacklevel=3)
