"""Kafka settings for sending synthetic records: the producer's configuration and the topic's timestamp bounds.

`producer_config` is what lakehouse_dev.produce (and the benchmarks' own producers) give librdkafka;
`accept_any_timestamp` lets a topic keep the far-future Kafka timestamps of `bad_kafka_timestamp` records,
and `takes_future_timestamps` tells whether a topic does.
"""

from __future__ import annotations

from lakehouse.core import config, errors, retry
from lakehouse.core.spec import PipelineSpec
from lakehouse_dev.defects import MAX_SENDABLE_BYTES
from lakehouse_dev.record_formats import ProduceError


def producer_config(spec: PipelineSpec, platform: config.PlatformConfig) -> dict:
    """librdkafka settings: murmur2 like the Java client, idempotent, small linger; LAKEHOUSE_KAFKA_* win."""
    defaults = {
        "partitioner": "murmur2_random",   # same key -> same partition as Java clients and Kafka Connect
        "enable.idempotence": True,        # retries neither duplicate nor reorder a key's events
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 30_000,      # fail within 30 s instead of librdkafka's 5 minutes
        "message.max.bytes": max(MAX_SENDABLE_BYTES, spec.source.max_value_bytes + 64 * 1024),
    }
    return {**defaults, **platform.kafka()}


def accept_any_timestamp(topic: str, platform: config.PlatformConfig) -> None:
    """Let `topic` keep producers' timestamps however far ahead (message.timestamp.after.max.ms at its maximum,
    Apache Kafka's default before 4.0; 4.x refuses a whole batch holding a record more than an hour ahead):
    what a cluster configured so delivers, for the benchmark's and the tests' `bad_kafka_timestamp` records
    (the reader's own checks of Kafka timestamps). Returns once the topic's configuration reads back so: Apache
    Kafka answers the change when the controller has it, and a describe right after may still see the old bound."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(platform.kafka())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(
        "message.timestamp.after.max.ms", str(2 ** 63 - 1), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    def applied(_attempt: int) -> None:
        if not takes_future_timestamps(topic, platform):
            raise errors.RetryableError(f"topic {topic}: the brokers do not show the new timestamp bound yet")

    retry.transient(f"topic {topic}'s message.timestamp.after.max.ms", deadline_s=30, first_wait_s=0.05,
                    max_wait_s=0.5, error=ProduceError,
                    next_step="the controller took the change but no broker shows it yet: check the brokers' logs",
                    ).run(applied)


def takes_future_timestamps(topic: str, platform: config.PlatformConfig) -> bool:
    """Whether `topic` keeps a producer's timestamp years ahead (CreateTime, no bound on how far ahead)."""
    from lakehouse.core import topics

    try:
        found = topics.describe_config(topic, ["message.timestamp.type", "message.timestamp.after.max.ms"], platform)
    except errors.TopicError as exc:
        raise ProduceError(str(exc)) from None
    bound = found["message.timestamp.after.max.ms"]
    return found["message.timestamp.type"] != "LogAppendTime" and (bound is None or int(bound) >= 2**62)
