"""`lakehouse produce`: send a pipeline's synthetic records to its source topic and report what was sent.

`produce(spec, count, ...)` sends `count` records to the spec's source topic in the spec's formats
(value_format json, avro, protobuf or json_schema; keys as text or records in `source.key.format`,
lakehouse_dev.record_formats) and returns a `ProduceReport`. The records are lakehouse_dev.synthesis'
(`synthesize` yields the same ones without Kafka): valid records that honour every rule of the contract and
look like production traffic (lakehouse_dev.record_factory), or for a pipeline in `target.mode: cdc` a
Debezium change stream (lakehouse_dev.change_streams).

With `bad_ratio` > 0, about that share of the records is broken on purpose, one defect per record,
the kinds taken in turn from lakehouse_dev.defects.BAD_KINDS: those the spec and its formats can carry (no
`bad_enum` without an enum field, no `null_key` when keys are optional, no `wrong_type` in a typed Avro
record, a malformed payload of the value's own format). The kind names are the decoder's `error_kind`
values, and each broken record is checked against the reader's own verdict (lakehouse_dev.verdicts) before
it is sent, so a report's `bad_by_kind` is what an ingest dead-letters. Each broken record also carries a
`fault` header naming its kind. Some defects are hostile to the reader rather than the contract: a string
that is not Unicode, an event time no datetime holds, a Kafka timestamp past year 9999 (sent only to a
topic that keeps it, lakehouse_dev.producer_settings). (A header key that is not UTF-8 cannot be among
them: confluent-kafka's producer sends `str(key)` for a bytes key, and crashes on a str key with a lone
surrogate.) Sends are paced by lakehouse_dev.rate_limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from lakehouse.core import config
from lakehouse.core.spec import PipelineSpec
from lakehouse_dev.producer_settings import producer_config, takes_future_timestamps
from lakehouse_dev.rate_limit import RateLimiter
from lakehouse_dev.record_formats import ProduceError
from lakehouse_dev.synthesis import check_arguments, record_source


@dataclass
class ProduceReport:
    """What a produce run sent: counts per defect kind (only kinds sent) and per partition; for a change
    stream also what the table must hold once every record is ingested (`changes`, a ChangeSummary)."""

    sent: int
    bad_by_kind: dict[str, int]
    per_partition: dict[int, int]
    seconds: float
    topic: str = ""
    changes: Any = None

    @property
    def bad(self) -> int:
        return sum(self.bad_by_kind.values())

    @property
    def valid(self) -> int:
        return self.sent - self.bad


def produce(spec: PipelineSpec, count: int, rate: float | None = None, bad_ratio: float = 0.0,
            seed: int | None = None, platform: config.PlatformConfig | None = None,
            on_progress: Callable[[int], Any] | None = None, connect_schemas: bool = False) -> ProduceReport:
    """Send `count` synthetic records to the spec's source topic and wait until all are acknowledged.

    `rate` paces sends to about that many records per second (unlimited when
    None); `on_progress(sent)` is called about every second with the number of
    records acknowledged so far, and once at the end. A change stream's report
    says what its table must hold (`changes`). Returns a ProduceReport.
    Raises ProduceError when the topic does not exist, Kafka does not answer, or
    any record is not delivered (the first delivery error is quoted), and
    ValueError for a bad count, rate or ratio.
    """
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    check_arguments(count, bad_ratio)
    platform = platform or config.load()
    topic = spec.source.topic
    stream = record_source(spec, seed, None, platform, connect_schemas)  # argument and contract errors first
    producer = Producer(producer_config(spec, platform))
    try:
        existing = producer.list_topics(timeout=10).topics  # all topics: never triggers auto-creation
    except KafkaException as exc:
        raise ProduceError(f"cannot reach Kafka at {platform.bootstrap_servers}: {exc.args[0].str()}") from None
    if topic not in existing:
        raise ProduceError(f"topic {topic!r} of pipeline {spec.name!r} does not exist on "
                           f"{platform.bootstrap_servers}; create it first (lakehouse.topics.ensure_topics)")
    if not takes_future_timestamps(topic, platform):
        # Apache Kafka refuses a batch holding a timestamp more than message.timestamp.after.max.ms ahead (an
        # hour by default since 4.0), or overwrites it (LogAppendTime): that defect never reaches a reader here
        stream.kinds = tuple(kind for kind in stream.kinds if kind != "bad_kafka_timestamp")

    delivered = 0
    per_partition: dict[int, int] = {}
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        nonlocal delivered
        if err is not None:
            failures.append(f"{err.str()} (partition {msg.partition()}, key {msg.key()!r})")
            return
        delivered += 1
        per_partition[msg.partition()] = per_partition.get(msg.partition(), 0) + 1

    def fail(queued: int) -> ProduceError:
        producer.purge()
        producer.flush(5)
        return ProduceError(f"delivery to topic {topic!r} on {platform.bootstrap_servers} failed for "
                            f"{len(failures)} record(s) after {delivered} of {queued} were delivered; "
                            f"first error: {failures[0]}")

    limiter = RateLimiter(rate, sleep=lambda s: producer.poll(s)) if rate else None
    bad_by_kind: dict[str, int] = {}
    started = last_progress = time.monotonic()
    queued = 0
    for record in stream.records(count, bad_ratio):
        if limiter is not None:
            limiter.acquire()
        stamped = {} if record.timestamp is None else {"timestamp": record.timestamp}
        while True:
            try:
                producer.produce(topic, value=record.value, key=record.key, headers=record.headers,
                                 on_delivery=on_delivery, **stamped)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
            except KafkaException as exc:
                raise ProduceError(f"cannot send to topic {topic!r}: {exc.args[0].str()}") from None
        queued += 1
        if record.kind is not None:
            bad_by_kind[record.kind] = bad_by_kind.get(record.kind, 0) + 1
        producer.poll(0)
        if failures:
            raise fail(queued)
        if on_progress is not None and time.monotonic() - last_progress >= 1.0:
            last_progress = time.monotonic()
            on_progress(delivered)

    remaining = producer.flush(60)
    if failures:
        raise fail(queued)
    if remaining:
        raise ProduceError(f"{remaining} record(s) to topic {topic!r} were not acknowledged by "
                           f"{platform.bootstrap_servers} within 60 s of the last send")
    if on_progress is not None:
        on_progress(delivered)
    return ProduceReport(sent=delivered, bad_by_kind=bad_by_kind, per_partition=dict(sorted(per_partition.items())),
                         seconds=time.monotonic() - started, topic=topic,
                         changes=getattr(stream, "summary", lambda: None)())
