"""How the planner reads a topic's state (lakehouse.ingest.plan.topic_state) from a broker that is not well: no
broker, the client library's answers played by fakes.

Right after Apache Kafka comes back from a freeze or a restart it is fenced until its controller unfences it:
the admin client describes the topic, while the consumer's metadata does not know where a partition lives yet
("Local: Unknown partition"). That is the broker not answering yet, retried by the job within its budget
(BrokerUnavailableError), never the end of the job; a refusal stays an error of the source.
(The broker actually frozen and thawed under a running job: tests/e2e/test_transient_faults.py.)
"""

from __future__ import annotations

import concurrent.futures
import types

import pytest
from confluent_kafka import KafkaError, KafkaException
from tests.unit.ingest.test_poison_records import FakeMessage

from lakehouse.core import errors
from lakehouse.ingest import plan

TOPIC = "orders"


def message(partition: int, offset: int, code: int | None = None) -> FakeMessage:
    return FakeMessage(offset, partition=partition, error=None if code is None else KafkaError(code, "from the fake"))


class Consumer:
    """Watermarks (low, high) per partition, or the KafkaError code the admin client's ListOffsets answers for
    it; consume() hands out `batches` one call at a time."""

    def __init__(self, watermarks: dict[int, tuple[int, int] | int], batches: list[list[FakeMessage]] = ()):
        self.watermarks, self.batches, self.closed, self.created = watermarks, list(batches), False, False

    def list_offsets(self, asked: dict, isolation_level, request_timeout) -> dict:
        """The admin client's answer: a future per partition, its offset the low (earliest) or high (latest)
        watermark, or its error."""
        from confluent_kafka.admin import OffsetSpec

        futures = {}
        for tp, spec in asked.items():
            future = concurrent.futures.Future()
            found = self.watermarks[tp.partition]
            if isinstance(found, int):
                future.set_exception(KafkaException(KafkaError(found, "Failed to list offsets")))
            else:
                latest = spec.__class__ is OffsetSpec.latest().__class__
                future.set_result(types.SimpleNamespace(offset=found[1] if latest else found[0]))
            futures[tp] = future
        return futures

    def assign(self, partitions):
        self.assigned = {tp.partition: tp.offset for tp in partitions}

    def consume(self, num_messages, timeout):
        return self.batches.pop(0) if self.batches else []

    def close(self):
        self.closed = True


@pytest.fixture
def broker(monkeypatch):
    """broker(consumer): topic_state asks the described two-partition TOPIC, and reads with `consumer`."""
    described = types.SimpleNamespace(topic_id=None, partitions=[types.SimpleNamespace(id=0),
                                                                 types.SimpleNamespace(id=1)])

    answering: list[Consumer] = []

    class Admin:
        def __init__(self, conf):
            pass

        def describe_topics(self, topics, request_timeout):
            return {TOPIC: None}

        def list_offsets(self, asked, isolation_level, request_timeout):
            return answering[0].list_offsets(asked, isolation_level, request_timeout)

    monkeypatch.setattr(plan, "AdminClient", Admin)
    monkeypatch.setattr(plan.kafka_security, "wait_future", lambda future, admin, watch, timeout:
                        future.result() if isinstance(future, concurrent.futures.Future) else described)

    def created(consumer: Consumer) -> Consumer:
        consumer.created = True
        return consumer

    def use(consumer: Consumer) -> Consumer:
        answering[:] = [consumer]
        monkeypatch.setattr(plan, "kafka_consumer", lambda *args, **kwargs: created(consumer))
        return consumer

    return use


@pytest.mark.parametrize("code", [KafkaError._UNKNOWN_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                                  KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TIMED_OUT,
                                  KafkaError._ALL_BROKERS_DOWN, KafkaError._NOENT, KafkaError.UNKNOWN_LEADER_EPOCH,
                                  KafkaError.FENCED_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
                                  KafkaError.REQUEST_TIMED_OUT, KafkaError.BROKER_NOT_AVAILABLE,
                                  KafkaError.REPLICA_NOT_AVAILABLE, KafkaError.KAFKA_STORAGE_ERROR,
                                  KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_watermarks_the_client_cannot_tell_yet_are_retried(broker, code):
    consumer = broker(Consumer({0: (0, 10), 1: code}))
    with pytest.raises(errors.BrokerUnavailableError) as info:
        plan.topic_state({"bootstrap.servers": "127.0.0.1:9"}, TOPIC, timeout=0.2)
    assert isinstance(info.value, errors.RetryableError)
    assert f"topic {TOPIC!r} partition 1: no watermarks yet" in str(info.value)
    assert consumer.closed or not consumer.created  # no consumer left open


def test_watermarks_refused_end_the_job_as_a_source_error(broker):
    consumer = broker(Consumer({0: KafkaError.TOPIC_AUTHORIZATION_FAILED, 1: (0, 10)}))
    with pytest.raises(errors.SourceError) as info:
        plan.topic_state({"bootstrap.servers": "127.0.0.1:9"}, TOPIC, timeout=0.2)
    assert not isinstance(info.value, errors.RetryableError)
    assert "partition 0: cannot read its watermarks" in str(info.value) and (consumer.closed or not consumer.created)


def test_the_end_of_a_partition_the_tables_have_not_passed_is_its_last_stable_offset_with_no_fetch(broker):
    """ListOffsets (read_committed) answers the end; a fetch would only find records committed since, which the
    next batch reads. The fake's fetch would report a later end: it is never asked, and no consumer is made."""
    consumer = broker(Consumer({0: (0, 10), 1: (5, 7)}, batches=[
        [message(0, 10), message(0, 11, KafkaError._PARTITION_EOF), message(1, 9, KafkaError._PARTITION_EOF)]]))
    state = plan.topic_state({"bootstrap.servers": "127.0.0.1:9"}, TOPIC, starts={0: 10, 1: 6}, timeout=5)
    assert {p: (s.earliest, s.end) for p, s in state.partitions.items()} == {0: (0, 10), 1: (5, 7)}
    assert not consumer.created


def test_a_partition_lost_for_a_moment_while_probing_its_end_is_probed_until_it_answers(broker):
    """The tables stand at 7, past partition 1's last stable offset 6 (a log that grew since ListOffsets
    answered, or a recreated topic): only that partition is fetched, until it answers."""
    consumer = broker(Consumer({0: (0, 10), 1: (5, 6)}, batches=[
        [message(1, 7, KafkaError._UNKNOWN_PARTITION)],
        [message(1, 7, KafkaError._TRANSPORT)],
        [message(1, 7), message(1, 8, KafkaError._PARTITION_EOF)],  # a record written meanwhile
    ]))
    state = plan.topic_state({"bootstrap.servers": "127.0.0.1:9"}, TOPIC, starts={1: 7}, timeout=5)
    assert {p: (s.earliest, s.end) for p, s in state.partitions.items()} == {0: (0, 10), 1: (5, 8)}
    assert consumer.assigned == {1: 7} and consumer.closed


def test_a_partition_past_its_end_that_never_answers_while_probing_is_a_recreated_topic(broker):
    broker(Consumer({0: (0, 10), 1: (5, 7)}, batches=[[message(1, 9, KafkaError._UNKNOWN_PARTITION)]] * 3))
    with pytest.raises(errors.TopicRecreatedError, match=r"partitions \[1\]: the tables hold offsets past the log end"):
        plan.topic_state({"bootstrap.servers": "127.0.0.1:9"}, TOPIC, starts={1: 9}, timeout=0.3)


@pytest.mark.parametrize("code", [KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET])
def test_a_probe_start_beyond_the_log_is_a_recreated_topic(broker, code):
    """The tables stand past the log's end: the broker answers the probe's fetch with OFFSET_OUT_OF_RANGE, which
    librdkafka hands a consumer with auto.offset.reset=error as _AUTO_OFFSET_RESET."""
    broker(Consumer({0: (0, 10), 1: (0, 4)}, batches=[[message(1, 9, code)]]))
    with pytest.raises(errors.TopicRecreatedError, match="partition 1: the committed position 9 is beyond"):
        plan.topic_state({"bootstrap.servers": "127.0.0.1:9"}, TOPIC, starts={1: 9}, timeout=2)


def test_a_running_job_probes_with_one_admin_client_and_a_new_one_after_a_probe_failed(broker, monkeypatch):
    """A job's session (plan.AdminSession) keeps its admin client from batch to batch: no new connections, nor a
    TLS and SASL handshake, per batch. A probe that fails leaves nothing of its client to the next."""
    made = []
    fake = plan.AdminClient
    monkeypatch.setattr(plan, "AdminClient", lambda conf: made.append(fake(conf)) or made[-1])
    conf = {"bootstrap.servers": "127.0.0.1:9"}
    session = plan.AdminSession(conf)
    broker(Consumer({0: (0, 10), 1: (5, 7)}))
    for _ in range(3):
        assert plan.topic_state(conf, TOPIC, timeout=5, session=session).partitions[1].end == 7
    assert len(made) == 1
    broker(Consumer({0: (0, 10), 1: KafkaError._TIMED_OUT}))
    with pytest.raises(errors.BrokerUnavailableError):
        plan.topic_state(conf, TOPIC, timeout=0.2, session=session)
    broker(Consumer({0: (0, 12), 1: (5, 9)}))
    assert plan.topic_state(conf, TOPIC, timeout=5, session=session).partitions[1].end == 9
    assert len(made) == 2
    plan.topic_state(conf, TOPIC, timeout=5)  # without a session: a client of its own
    assert len(made) == 3
