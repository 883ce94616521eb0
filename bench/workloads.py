"""The measurements: load, ceilings, the pipeline's `--once` and continuous runs, the baseline, maintenance.

Each function measures one thing on the scratch stack (see bench.env) and returns plain
numbers; `bench.run` strings them together and `bench.report` renders them.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench import stats
from bench.env import SCHEMA_FILE_SUFFIX, BenchError, BenchStack, stop_process_group, tail
from lakehouse.core import config, events, offsets, topics
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec, read_schema_folder
from lakehouse.core.table_properties import IcebergProperties, SnapshotSummary
from lakehouse.ingest.reader import BatchBuilder
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev import producer_settings, record_formats, synthesis
from lakehouse_dev.record_stream import SyntheticRecord

MB = 1_000_000
YOUNG_PROCESS_S = 1.0  # memory samples skip processes younger than this (see MemorySampler)
STALL_S = 30.0  # no new record for this long while records are expected: the broker is stuck
# The same fetch sizes the pipeline's reader asks for, so the consume ceiling is a fair one.
FETCH = {"fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
         "queued.max.messages.kbytes": 262_144}


# ---------------------------------------------------------------------------------------------- the data

@dataclass
class Backlog:
    """The synthetic records of the run (generated once), reused by every workload."""

    records: list[SyntheticRecord]
    seconds: float

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def value_bytes(self) -> int:
        return sum(len(r.value or b"") for r in self.records)

    @property
    def bad(self) -> int:
        return sum(1 for r in self.records if r.kind is not None)

    def head(self, count: int) -> list[SyntheticRecord]:
        return self.records[:count]


def generate(spec: PipelineSpec, count: int, bad_ratio: float, seed: int) -> Backlog:
    """`count` realistic orders from lakehouse_dev.synthesis (about `bad_ratio` of them broken on purpose)."""
    started = time.monotonic()
    records = list(synthesis.synthesize(spec, count, bad_ratio=bad_ratio, seed=seed))
    return Backlog(records, time.monotonic() - started)


@dataclass
class Delivery:
    """What a producer run delivered: records, the log end per partition, seconds."""

    sent: int
    ends: dict[int, int]
    seconds: float


class DeliveryCounter:
    """librdkafka delivery callback: counts deliveries and failures, tracks each partition's log end."""

    def __init__(self) -> None:
        self.delivered = 0
        self.errors: list[str] = []
        self.ends: dict[int, int] = {}

    def __call__(self, err, msg) -> None:
        if err is not None:
            self.errors.append(err.str())
            return
        self.delivered += 1
        p = msg.partition()
        end = msg.offset() + 1
        if end > self.ends.get(p, 0):
            self.ends[p] = end


def make_producer(spec: PipelineSpec, platform: config.PlatformConfig) -> Producer:
    # the platform's producer settings (murmur2, idempotent, acks=all) with larger batches for bulk loads
    return Producer({**producer_settings.producer_config(spec, platform), "linger.ms": 20,
                     "queue.buffering.max.messages": 1_000_000})


def create_topic(spec: PipelineSpec, platform: config.PlatformConfig, timeout: float = 30) -> None:
    """The spec's topic on the scratch broker, keeping producers' timestamps however far ahead: the synthetic
    records' `bad_kafka_timestamp` defects reach the reader, as on a cluster configured so (Apache Kafka 4
    refuses a whole batch holding one of them by default)."""
    topics.ensure_topics([spec], platform, timeout=timeout)
    producer_settings.accept_any_timestamp(spec.source.topic, platform)


def ensure_topic(platform: config.PlatformConfig, name: str, partitions: int, timeout: float = 30) -> None:
    """Topic `name` with `partitions` on the scratch broker (replication 1), created when missing."""
    admin = AdminClient(platform.kafka())
    if name in admin.list_topics(timeout=timeout).topics:
        return
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=timeout)
    for future in futures.values():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BenchError(f"creating topic {name}: {exc}") from exc


def load_topic(spec: PipelineSpec, platform: config.PlatformConfig,
               records: Sequence[SyntheticRecord]) -> Delivery:
    """Create the spec's topic and produce `records` to it as fast as possible; waits for every ack.

    Raises BenchError when any record is not delivered.
    """
    create_topic(spec, platform)
    producer = make_producer(spec, platform)
    counter = DeliveryCounter()
    started = time.monotonic()
    for rec in records:
        send(producer, spec.source.topic, rec, counter)
    flush(producer, counter, spec.source.topic)
    return Delivery(counter.delivered, dict(sorted(counter.ends.items())), time.monotonic() - started)


def send(producer: Producer, topic: str, rec: SyntheticRecord, counter: DeliveryCounter,
          timestamp_ms: int | None = None) -> None:
    """Send `rec` stamped `timestamp_ms` (default: the producer's clock), unless the record brings its
    own Kafka timestamp (a `bad_kafka_timestamp` defect)."""
    stamp = rec.timestamp if rec.timestamp is not None else timestamp_ms
    stamped = {} if stamp is None else {"timestamp": stamp}
    while True:
        try:
            producer.produce(topic, value=rec.value, key=rec.key, headers=rec.headers, on_delivery=counter,
                             **stamped)
            return
        except BufferError:  # local queue full: serve delivery reports until there is room
            producer.poll(0.05)


def flush(producer: Producer, counter: DeliveryCounter, topic: str) -> None:
    remaining = producer.flush(120)
    if counter.errors or remaining:
        raise BenchError(f"producing to {topic}: {len(counter.errors)} delivery errors, {remaining} unacknowledged; "
                         f"first error: {counter.errors[0] if counter.errors else 'timeout'}")


# ---------------------------------------------------------------------------------------------- ceilings

@dataclass
class Throughput:
    records: int
    value_bytes: int
    seconds: float
    first_record_s: float | None = None  # consume only: from consumer creation to the first records
    first_fetch: int = 0  # consume only: records the first non-empty `consume` call returned
    # the parallel consume ceiling only: CPU seconds of its reader processes (librdkafka's threads included)
    # and of the broker while they read
    cpu_by_role_s: dict[str, float] | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def after_first_rate(self) -> float | None:
        """Records per second after the first records arrived (connection, offset lookup and the first
        fetch excluded, with the records it brought)."""
        if self.first_record_s is None or self.seconds <= self.first_record_s:
            return None
        return (self.records - self.first_fetch) / (self.seconds - self.first_record_s)

    def to_json(self) -> dict[str, float | None]:
        out = {"records": self.records, "value_bytes": self.value_bytes, "seconds": round(self.seconds, 4),
               "records_per_s": round(self.rate, 1), "mb_per_s": round(self.mb_per_s, 3)}
        if self.first_record_s is not None:
            after = self.after_first_rate
            out.update({"first_record_s": round(self.first_record_s, 4),
                        "after_first_records_per_s": None if after is None else round(after, 1),
                        "after_first_mb_per_s": None if after is None else
                        round(after * self.value_bytes / max(1, self.records) / MB, 3)})
        if self.cpu_by_role_s is not None:
            out["cpu_by_role_s"] = {role: round(seconds, 3) for role, seconds in self.cpu_by_role_s.items()}
        return out


def _assigned_consumer(kafka_conf: dict, topic: str, partitions: Sequence[int], group: str) -> Consumer:
    consumer = Consumer({**kafka_conf, "group.id": group, "enable.auto.commit": False,
                         "enable.partition.eof": False, **FETCH})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return consumer


def _touch_values(consumer: Consumer, expected: int, what: str, started: float) -> tuple[int, int, float | None, int]:
    """Consume until `expected` records came, touching every value: (records, value bytes, seconds from
    `started` to the first fetch, records of that fetch). BenchError naming `what` when nothing comes for
    STALL_S seconds."""
    count = size = first_fetch = 0
    first: float | None = None
    last = time.monotonic()
    while count < expected:
        msgs = consumer.consume(num_messages=10_000, timeout=0.1)
        if msgs:
            last = time.monotonic()
            if first is None:
                first, first_fetch = last - started, len(msgs)
        elif time.monotonic() - last > STALL_S:
            raise BenchError(f"{what}: {count} of {expected} records, then nothing for {STALL_S:.0f}s")
        for msg in msgs:
            if msg.error() is None:
                count += 1
                value = msg.value()
                size += len(value) if value is not None else 0
    return count, size, first, first_fetch


def consume_ceiling(kafka_conf: dict, topic: str, partitions: Sequence[int], expected: int) -> Throughput:
    """One confluent-kafka consumer reading the whole topic with `assign`, touching every value, end to
    end (consumer creation to the last record), with the time to the first record on the side.
    Raises BenchError when the records stop coming."""
    started = time.monotonic()
    consumer = _assigned_consumer(kafka_conf, topic, partitions, "bench-consume-ceiling")
    try:
        count, size, first, first_fetch = _touch_values(consumer, expected, f"consume ceiling of {topic}", started)
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return Throughput(count, size, seconds, first_record_s=first, first_fetch=first_fetch)


def _parallel_reader(kafka_conf: dict, topic: str, partitions: list[int], barrier, results) -> None:
    """One process of the parallel ceiling: its partitions from the start to their high watermarks, every
    value touched; (records, bytes, start, end) in wall-clock seconds, timed from the common barrier, and the
    process's CPU seconds from its consumer's creation (librdkafka starts fetching at the assignment)."""
    cpu = time.process_time()
    consumer = _assigned_consumer(kafka_conf, topic, partitions, "bench-parallel-ceiling")
    try:
        expected = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions)
        barrier.wait(60)
        started = time.time()
        count, size, first, first_fetch = _touch_values(consumer, expected, f"parallel reader of {topic}{partitions}",
                                                        time.monotonic())
        results.put(("ok", count, size, started, time.time(), started + (first or 0.0), first_fetch,
                     time.process_time() - cpu))
    except BenchError as exc:
        results.put(("error", str(exc)))
    finally:
        consumer.close()


def task_slots(master: str | None = None) -> int:
    """The Spark task slots of a local master, local[N] (local[*]: the cores); 2 for anything else."""
    master = master if master is not None else config.load().spark_master
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master.strip())
    if not match:
        return 2
    return os.cpu_count() or 2 if match.group(1) == "*" else int(match.group(1))


def parallel_consume_ceiling(kafka_conf: dict, topic: str, partitions: Sequence[int], processes: int,
                             broker_pid: int | None = None) -> Throughput:
    """`processes` consumer processes over disjoint partitions (round robin), started together: the rate
    the machine can read the topic at with as many readers as the pipeline has task slots (records of
    all / from the first start to the last finish; and after the first fetch, from the first process's
    first records), and the CPU seconds the readers and the broker (`broker_pid`, when given) spent on it.
    Raises BenchError when one of them stalls."""
    import multiprocessing

    groups = [list(partitions)[i::processes] for i in range(processes)]
    groups = [g for g in groups if g]
    context = multiprocessing.get_context("spawn")  # no fork of a process holding librdkafka threads
    barrier, results = context.Barrier(len(groups)), context.Queue()
    workers = [context.Process(target=_parallel_reader, args=(kafka_conf, topic, g, barrier, results))
               for g in groups]
    for worker in workers:
        worker.start()
    broker_before = _cpu_seconds(broker_pid)  # the readers connect meanwhile: a little more, not less
    try:
        found = [results.get(timeout=STALL_S * 4) for _ in workers]
        broker_after = _cpu_seconds(broker_pid)
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    errors = [f[1] for f in found if f[0] == "error"]
    if errors:
        raise BenchError(f"parallel consume ceiling: {'; '.join(errors)}")
    start, end = min(f[3] for f in found), max(f[4] for f in found)
    cpu = {"readers": sum(f[7] for f in found)}
    if broker_before is not None and broker_after is not None:
        cpu["broker"] = broker_after - broker_before
    # after the first fetch, as the single consumer's: from the first process's first records to the last end
    return Throughput(sum(f[1] for f in found), sum(f[2] for f in found), end - start,
                      first_record_s=min(f[5] for f in found) - start, first_fetch=sum(f[6] for f in found),
                      cpu_by_role_s=cpu)


@dataclass
class RawRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list


def read_topic(kafka_conf: dict, topic: str, partitions: Sequence[int], expected: int) -> list[RawRecord]:
    """Every record of the topic with its coordinates (untimed: input for the decode and write ceilings)."""
    consumer = _assigned_consumer(kafka_conf, topic, partitions, "bench-read")
    out: list[RawRecord] = []
    last = time.monotonic()
    try:
        while len(out) < expected:
            msgs = consumer.consume(num_messages=10_000, timeout=0.5)
            for msg in msgs:
                if msg.error() is None:
                    out.append(RawRecord(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(),
                                         msg.value(), msg.headers() or []))
            if msgs:
                last = time.monotonic()
            elif time.monotonic() - last > STALL_S:
                raise BenchError(f"reading {topic}: {len(out)} of {expected} records, then nothing for {STALL_S:.0f}s")
    finally:
        consumer.close()
    return out


def decode(spec: PipelineSpec, topic: str, records: Sequence[RawRecord]) -> tuple[pa.Table, float]:
    """The records decoded and validated by the pipeline's own code (RecordValidator + BatchBuilder) in
    this one process; returns (the rows the data table would get, in its columns, and the seconds)."""
    builder = BatchBuilder(spec, RecordValidator(spec), ingested_at_us=int(time.time() * 1_000_000))
    batches = []
    started = time.monotonic()
    for r in records:
        builder.add(topic, r.partition, r.offset, r.timestamp_ms, r.key, r.value, r.headers)
        if builder.size >= 10_000:
            batches.append(builder.flush())
    if builder.size:
        batches.append(builder.flush())
    seconds = time.monotonic() - started
    table = pa.Table.from_batches(batches)
    valid = table.filter(table["_route"].is_valid())
    return valid.select([*spec.contract.names, "_kafka", "_ingested_at"]), seconds


def as_format(spec: PipelineSpec, records: Sequence[RawRecord], folder: Path,
              fmt: str) -> tuple[PipelineSpec, list[RawRecord]]:
    """The same records as a pipeline in wire format `fmt` (avro, protobuf, json_schema) would get them:
    each JSON object value written by `lakehouse produce`'s writer with the contract's schema (schema 1 of
    `folder`), everything else (the broken values) as it was. For the decoder's records/s per format on
    the same traffic."""
    from dataclasses import replace

    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"1.{SCHEMA_FILE_SUFFIX[fmt]}").write_text(record_formats.contract_schema(fmt, spec.contract.fields, spec.name))
    wire_spec = replace(spec, source=replace(spec.source, value_format=fmt, schemas=read_schema_folder(folder)))
    writer = record_formats.value_writer(wire_spec, config.load())
    out = []
    for r in records:
        try:
            value = writer.encode(json.loads(r.value))
        except Exception:  # noqa: BLE001 - a broken record stays broken (it becomes a dead letter either way)
            value = r.value
        out.append(RawRecord(r.partition, r.offset, r.timestamp_ms, r.key, value, r.headers))
    return wire_spec, out


def encode_backlog(spec: PipelineSpec, records: Sequence[SyntheticRecord]) -> list[SyntheticRecord]:
    """`records` as the spec's wire format carries them (`lakehouse produce`'s writer, the spec's schema 1):
    each valid JSON object value re-encoded, the broken values left as they are (they stay broken)."""
    from dataclasses import replace

    writer = record_formats.value_writer(spec, config.load())
    out = []
    for r in records:
        try:
            value = writer.encode(json.loads(r.value)) if r.kind is None else r.value
        except Exception:  # noqa: BLE001 - a value the writer refuses is sent as it was: a dead letter either way
            value = r.value
        out.append(replace(r, value=value))
    return out


def as_change_events(spec: PipelineSpec, records: Sequence[RawRecord], folder: Path,
                     fmt: str) -> tuple[PipelineSpec, list[RawRecord]]:
    """The same records as Debezium change events of a `mode: cdc` pipeline in `fmt` (json: Kafka Connect's
    plain JSON envelope; avro: the AvroConverter's, writer schemas 1 and 2 of `folder`), keyed by a record
    holding `order_id`: each JSON object value becomes the create of its row, everything else (the broken
    values) stays as it was. For the decoder's records/s on change events."""
    import random
    from dataclasses import replace

    from lakehouse_dev import change_streams

    folder.mkdir(parents=True, exist_ok=True)
    key = (spec.contract.field("order_id"),)
    prefix = f"shop.public.{spec.name}"
    if fmt == "avro":
        (folder / "1.avsc").write_text(json.dumps(change_streams.connect_avro(
            change_streams.envelope_connect(spec.contract.fields, prefix, "precise"))))
        (folder / "2.avsc").write_text(json.dumps(change_streams.connect_avro(
            change_streams.key_connect(key, prefix, "precise"))))
    cdc = replace(spec, source=replace(spec.source, topic=prefix, value_format=fmt, key_format=fmt, key_field=None,
                                       key_required=True, envelope="debezium",
                                       schemas=read_schema_folder(folder) if fmt == "avro" else ()),
                  target=replace(spec.target, mode="upsert", key=("order_id",)))
    stream = change_streams.ChangeStream(cdc, random.Random(0), config.load())
    out = []
    for r in records:
        try:
            row = json.loads(r.value)
            event_key, value = stream.encode("c", None, row) if isinstance(row, dict) else (r.key, r.value)
        except Exception:  # noqa: BLE001 - a broken record stays broken (a dead letter either way)
            event_key, value = r.key, r.value
        out.append(RawRecord(r.partition, r.offset, r.timestamp_ms, event_key, value, r.headers))
    return cdc, out


def change_backlog(spec: PipelineSpec, count: int, seed: int, updates: float, deletes: float,
                   bad_ratio: float = 0.0) -> tuple[list[SyntheticRecord], Any]:
    """`count` Debezium change events of the spec's source table (a snapshot, then creates, `updates` and
    `deletes` with their tombstones) and the stream's summary: the rows the table holds once all are in."""
    import random

    from lakehouse_dev import change_streams

    stream = change_streams.ChangeStream(spec, random.Random(seed), config.load(), updates=updates, deletes=deletes)
    records = list(stream.records(count, bad_ratio))
    return records, stream.summary()


def write_ceiling(rows: pa.Table, value_bytes: int, directory: Path) -> Throughput:
    """pyarrow writing the already decoded rows as one zstd Parquet file (the table's codec)."""
    path = directory / "write-ceiling.parquet"
    started = time.monotonic()
    pq.write_table(rows, path, compression="zstd")
    seconds = time.monotonic() - started
    path.unlink()
    return Throughput(rows.num_rows, value_bytes, seconds)


# ---------------------------------------------------------------------------------------------- memory

ROLES = ("driver", "jvm", "python_workers", "other")


def _role(proc: psutil.Process, root_pid: int) -> str:
    """driver (the `lakehouse` process), jvm, python_workers (Spark's daemon and workers) or other (the
    launcher scripts). Asked at every sample: spark-submit's shell scripts exec into the JVM under the
    same pid, so a pid's role can change."""
    if proc.pid == root_pid:
        return "driver"
    try:
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    if name == "java":
        return "jvm"
    if name.startswith("python"):
        return "python_workers"
    return "other"


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of `pid` so far (None when it is not running)."""
    if not pid:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return times.user + times.system


class MemorySampler:
    """Samples the RSS of a process and all its descendants every `interval` seconds in a thread.

    RSS counts pages shared between forked Python workers once per worker, so the total is an
    upper bound of the memory the tree needs. Processes younger than YOUNG_PROCESS_S are skipped: a
    JVM that forks to run a shell command shows, until the exec, a child with the JVM's whole RSS.
    """

    def __init__(self, pid: int, interval: float = 0.2, broker_pid: int | None = None):
        self.pid = pid
        self.interval = interval
        # CPU seconds (user + system) per process, the last seen, with its role: where the cores went
        self._cpu: dict[int, tuple[str, float]] = {}
        self.broker_pid = broker_pid
        self._broker_cpu_start = _cpu_seconds(broker_pid)
        self.broker_cpu_s: float | None = None
        self.cpu_timeline: list[tuple[float, dict[str, float]]] = []  # (wall clock, CPU s by role so far)
        self.peak_mb = 0.0
        self.peak_by_role: dict[str, float] = {r: 0.0 for r in ROLES}
        self.timeline: list[tuple[float, float]] = []  # (seconds since start, total MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        end = _cpu_seconds(self.broker_pid)
        if end is not None and self._broker_cpu_start is not None:
            self.broker_cpu_s = end - self._broker_cpu_start

    @property
    def cpu_by_role_s(self) -> dict[str, float]:
        return self._cpu_now(self.broker_cpu_s)

    def _cpu_now(self, broker_s: float | None) -> dict[str, float]:
        out = {r: 0.0 for r in ROLES}
        for role, seconds in list(self._cpu.values()):
            out[role] += seconds
        if broker_s is not None:
            out["broker"] = broker_s
        return out

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by role spent between two wall-clock times (the nearest samples inside)."""
        inside = [(t, cpu) for t, cpu in self.cpu_timeline if start <= t <= end]
        if len(inside) < 2:
            return {}
        (_, first), (_, last) = inside[0], inside[-1]
        return {role: round(last.get(role, 0.0) - first.get(role, 0.0), 2) for role in last}

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            by_role = {r: 0.0 for r in ROLES}
            now = time.time()
            for proc in procs:
                try:
                    if proc.pid != self.pid and now - proc.create_time() < YOUNG_PROCESS_S:
                        continue
                    rss = proc.memory_info().rss / 2**20
                    times = proc.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                role = _role(proc, self.pid)
                by_role[role] += rss
                self._cpu[proc.pid] = (role, times.user + times.system)
            total = sum(by_role.values())
            self.peak_mb = max(self.peak_mb, total)
            for role, mb in by_role.items():
                self.peak_by_role[role] = max(self.peak_by_role[role], mb)
            self.timeline.append((round(time.monotonic() - self._started, 2), round(total, 1)))
            broker = _cpu_seconds(self.broker_pid)
            self.cpu_timeline.append((time.time(), self._cpu_now(
                broker - self._broker_cpu_start if broker is not None and self._broker_cpu_start is not None
                else None)))
            self._stop.wait(self.interval)

    def to_json(self) -> dict[str, Any]:
        return {"peak_mb": round(self.peak_mb, 1), "peak_by_role_mb": {k: round(v, 1) for k, v in
                                                                       self.peak_by_role.items()},
                "cpu_by_role_s": {k: round(v, 2) for k, v in self.cpu_by_role_s.items()},
                "timeline": self.timeline[:: max(1, len(self.timeline) // 300)]}


# ---------------------------------------------------------------------------------------------- the pipeline

def batch_metrics(pipeline: str, platform: config.PlatformConfig, since: datetime | None = None) -> list[dict]:
    """The pipeline's `batch` events (oldest first): each {ts, metrics, details} from the ops timeline."""
    found = events.recent(pipeline, kind="batch", since=since, limit=100_000, platform=platform)
    return [{"ts": e["ts"].isoformat(), "metrics": e["metrics"], "details": e["details"]} for e in reversed(found)]


@dataclass
class OnceRun:
    pipeline: str
    partitions: int
    backlog: int
    wall_s: float
    batches: list[dict]
    memory: dict
    rate: stats.IngestRate = field(init=False)
    value_bytes_per_record: float = 0.0

    def __post_init__(self) -> None:
        self.rate = stats.ingest_rate([b["metrics"] for b in self.batches], self.wall_s)

    def to_json(self) -> dict[str, Any]:
        r = self.rate
        mb = self.value_bytes_per_record / MB
        return {
            "pipeline": self.pipeline, "partitions": self.partitions, "backlog": self.backlog,
            "wall_s": round(self.wall_s, 2), "records": r.records, "batches": r.batches,
            "steady_records_per_s": r.steady_rate, "steady_mb_per_s": r.steady_rate * mb if r.steady_rate else None,
            "wall_records_per_s": r.wall_rate, "wall_mb_per_s": r.wall_rate * mb if r.wall_rate else None,
            "cold_batch": {"records": r.cold_records, "seconds": r.cold_s, "records_per_s": r.cold_rate},
            "stages_s": stats.stage_breakdown([b["metrics"] for b in self.batches[1:] or self.batches]),
            "memory": self.memory, "batch_metrics": [b["metrics"] for b in self.batches],
        }


def run_once(stack: BenchStack, spec: PipelineSpec, backlog: int, value_bytes_per_record: float,
             timeout: float = 600.0, env: dict[str, str] | None = None) -> OnceRun:
    """`lakehouse ingest --pipeline P --once` over the topic's backlog, its process tree's RSS and the
    CPU seconds of each role (and of the broker) sampled. `env` adds to the job's environment.

    Raises BenchError when the job fails, times out, or did not ingest the whole backlog.
    """
    platform = stack.platform()
    log_name = f"ingest-once-{spec.name}"
    started = time.monotonic()
    proc = stack.spawn("ingest", "--pipeline", spec.name, "--once", "--json", log_name=log_name, env=env)
    with MemorySampler(proc.pid, broker_pid=stack.broker_pid()) as sampler:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process_group(proc, timeout=5)
            raise BenchError(f"`lakehouse ingest --pipeline {spec.name} --once` did not finish within "
                             f"{timeout:.0f}s") from None
        except BaseException:  # interrupted: never leave the job running behind us
            stop_process_group(proc, timeout=5)
            raise
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise BenchError(f"`lakehouse ingest --pipeline {spec.name} --once` exited with {proc.returncode}: "
                         f"{stack.stderr_tail(log_name)}")
    (stack.logs_dir / f"{log_name}.stdout.log").write_text(out)
    batches = batch_metrics(spec.name, platform)
    memory = sampler.to_json()
    if len(batches) > 1:  # where the cores went in the steady batches: from the first batch's end to the last's
        memory["steady_cpu_by_role_s"] = sampler.cpu_between(datetime.fromisoformat(batches[0]["ts"]).timestamp(),
                                                             datetime.fromisoformat(batches[-1]["ts"]).timestamp())
        memory["steady_records"] = int(sum(b["metrics"].get("records", 0) for b in batches[1:]))
    run = OnceRun(spec.name, spec.source.partitions, backlog, wall, batches, memory,
                  value_bytes_per_record=value_bytes_per_record)
    if run.rate.records != backlog:
        raise BenchError(f"{spec.name}: the batch events account for {run.rate.records} records, the backlog "
                         f"has {backlog}")
    return run


# ---------------------------------------------------------------------------------------------- freshness

class _LineReader:
    """Reads a child's stdout lines in a thread, so the job never blocks on a full pipe."""

    def __init__(self, stream) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for_receipt(self, timeout: float, proc: subprocess.Popen) -> bool:
        """Whether the job printed a batch receipt within `timeout` seconds (False as soon as it exits)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (proc.poll() is None or not self.lines.empty()):
            try:
                if self.lines.get(timeout=0.5).startswith("{"):
                    return True
            except queue.Empty:
                continue
        return False


def paced_phase(producer: Producer, topic: str, source: Iterator[SyntheticRecord], rate: int,
                seconds: float, counter: DeliveryCounter, not_before_ms: int) -> stats.Phase:
    """Produce at `rate` msg/s for `seconds`, every record stamped (CreateTime) at its produce call.

    The phase's `produced` leaves out records that bring their own Kafka timestamp (the
    `bad_kafka_timestamp` defect): their time says nothing of when they were sent."""
    start_ms = max(int(time.time() * 1000), not_before_ms)
    started = time.monotonic()
    sent = own_stamps = 0
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        due = min(int(rate * elapsed) + 1, int(rate * seconds))
        while sent < due:
            rec = next(source)
            own_stamps += rec.timestamp is not None
            send(producer, topic, rec, counter, max(int(time.time() * 1000), start_ms))
            sent += 1
        producer.poll(0)
        if sent >= due:
            time.sleep(0.001)
    end_ms = max(int(time.time() * 1000) + 1, start_ms + 1)
    return stats.Phase(rate=rate, start_ms=start_ms, end_ms=end_ms, produced=sent - own_stamps)


def paced_phases(producer: Producer, topic: str, source: Iterator[SyntheticRecord], rates: Sequence[int],
                 phase_s: float, counter: DeliveryCounter, proc: subprocess.Popen, what: str,
                 failure: Callable[[], str], label: str, progress=None) -> list[stats.Phase]:
    """One paced phase per rate, back to back, while `proc` (named `what`) ingests; BenchError with
    `failure()` (its log) when it exits meanwhile."""
    phases: list[stats.Phase] = []
    not_before = 0
    for rate in rates:
        phase = paced_phase(producer, topic, source, rate, phase_s, counter, not_before)
        phases.append(phase)
        not_before = phase.end_ms
        if progress:
            progress(f"  {label}: {rate:,} msg/s phase produced {phase.produced:,} ({phase.achieved_rate:,.0f}/s "
                     f"achieved)")
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with {proc.returncode}: {failure()}")
    return phases


def ingest_snapshots(table, pipeline: str) -> list[stats.Snapshot]:
    """The table's ingest commits of `pipeline`: commit time and offset ranges from the summaries."""
    return [stats.Snapshot(snap.timestamp_ms,
                           offsets.decode_ranges(offsets.summary_properties(snap).get(SnapshotSummary.RANGES)))
            for snap in offsets.ingest_commits(table, pipeline)]


def coordinates(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(partition, offset, Kafka timestamp in ms) of every row, read back from the `_kafka` column."""
    data = table.scan(selected_fields=("_kafka",)).to_arrow()
    kafka = data.column("_kafka").combine_chunks()
    parts = kafka.field("partition").to_numpy(zero_copy_only=False).astype(np.int64)
    offs = kafka.field("offset").to_numpy(zero_copy_only=False).astype(np.int64)
    stamps = kafka.field("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False) // 1000
    return parts, offs, stamps.astype(float)


@dataclass
class FreshnessRun:
    pipeline: str
    trigger_s: float
    phases: list[stats.PhaseFreshness]
    drain_s: float
    drained: bool
    batches: list[dict]
    max_records_per_batch: int  # the spec's batch budget
    files: int = 0  # data files of the data table, before any maintenance
    seconds: float = 0.0  # from the job's start to its stop

    def to_json(self) -> dict[str, Any]:
        metrics = [b["metrics"] for b in self.batches]
        # the first batch is the warm-up one: JVM and Python workers starting, not a batch's cost
        cost = stats.fit_batch_cost(batch_timings(self.batches[1:]))
        return {"pipeline": self.pipeline, "batch_cost": None if cost is None else dict(cost.__dict__),
                "trigger_s": self.trigger_s, "max_records_per_batch": self.max_records_per_batch,
                "drain_s": round(self.drain_s, 1),
                "drained": self.drained, "phases": [p.to_json() for p in self.phases], "files": self.files,
                "files_per_hour": round(self.files / self.seconds * 3600) if self.seconds > 0 else None,
                "batches": len(metrics),
                "median_batch_s": stats.median(m.get("seconds") for m in metrics),
                "largest_batch_records": max((m.get("records", 0) for m in metrics), default=0),
                "stages_s": stats.stage_breakdown(metrics),
                "batch_timeline": [{"ts": b["ts"], "records": b["metrics"].get("records"),
                                    "seconds": b["metrics"].get("seconds")} for b in self.batches]}


def _positions_reached(catalog, spec: PipelineSpec, ends: dict[int, int]) -> bool:
    """Whether the pipeline's committed position reached `ends` (partition -> offset) in every partition."""
    progress = [offsets.read_progress(catalog, t, spec.name) for t in spec.positioned_tables]
    committed = offsets.committed_positions(progress, {p: 0 for p in ends})
    return all(committed[p] >= end for p, end in ends.items())


def run_freshness(stack: BenchStack, spec: PipelineSpec, records: Sequence[SyntheticRecord],
                  rates: Sequence[int], phase_s: float, drain_s: float, progress=None) -> FreshnessRun:
    """A continuous `lakehouse ingest` job with the spec's trigger while a paced producer runs one phase
    per rate; then a drain of at most `drain_s` seconds, the job stopped, and freshness computed per
    record from the tables' snapshots (records not visible by the end of the drain are censored).

    Raises BenchError when the job dies or never commits its warm-up batch.
    """
    platform = stack.platform()
    create_topic(spec, platform)
    producer = make_producer(spec, platform)
    producer.poll(0)
    counter = DeliveryCounter()
    source = itertools.cycle(records)
    log_name = f"ingest-continuous-{spec.name}"
    started = time.monotonic()
    proc = stack.spawn("ingest", "--pipeline", spec.name, "--json", log_name=log_name)
    lines = _LineReader(proc.stdout)
    catalog = open_catalog(platform, spec.catalog)
    try:
        # warm-up: the JVM starts and commits a first small batch before the measured phases
        _feed_batch(stack, spec, proc, lines, producer, source, counter, 100, log_name, "warm-up batch")
        phases = paced_phases(producer, spec.source.topic, source, rates, phase_s, counter, proc,
                              f"the continuous job of {spec.name}", lambda: stack.stderr_tail(log_name),
                              f"trigger {spec.trigger.interval_s:g}s", progress)
        flush(producer, counter, spec.source.topic)
        drain_started = time.monotonic()
        drained = False
        while time.monotonic() - drain_started < drain_s:
            if _positions_reached(catalog, spec, counter.ends):
                drained = True
                break
            if proc.poll() is not None:
                raise BenchError(f"the continuous job of {spec.name} exited with {proc.returncode}: "
                                 f"{stack.stderr_tail(log_name)}")
            time.sleep(0.5)
        deadline_ms = int(time.time() * 1000)
        drain_took = time.monotonic() - drain_started
    finally:
        stop_process_group(proc, timeout=90)
    ran_s = time.monotonic() - started
    parts, offs, stamps, visible = [], [], [], []
    for name in spec.positioned_tables:
        table = catalog.load_table(name)
        p, o, ts = coordinates(table)
        parts.append(p), offs.append(o), stamps.append(ts)
        visible.append(stats.visible_at(ingest_snapshots(table, spec.name), p, o))
    batches = batch_metrics(spec.name, platform)
    timings = batch_timings(batches)
    phases_out = stats.freshness_by_phase(phases, np.concatenate(stamps), np.concatenate(visible), deadline_ms,
                                          batches=timings, trigger_s=spec.trigger.interval_s,
                                          max_batch_records=spec.trigger.max_records_per_batch)
    files = table_totals(catalog.load_table(spec.target.table))[1]
    return FreshnessRun(spec.name, spec.trigger.interval_s, phases_out, drain_took, drained, batches,
                        spec.trigger.max_records_per_batch, files, ran_s)


def _feed_batch(stack: BenchStack, spec: PipelineSpec, proc: subprocess.Popen, lines: _LineReader,
                producer: Producer, source: Iterator[SyntheticRecord], counter: DeliveryCounter, count: int,
                log_name: str, what: str) -> None:
    """Produce `count` records and wait for the continuous job's next receipt; BenchError naming `what`
    when none comes within 180 s or the job exits."""
    for _ in range(count):
        send(producer, spec.source.topic, next(source), counter)
    flush(producer, counter, spec.source.topic)
    if not lines.wait_for_receipt(timeout=180, proc=proc):
        raise BenchError(f"the continuous job of {spec.name} committed no {what} "
                         f"({'exit code ' + str(proc.returncode) if proc.poll() is not None else 'within 180s'}): "
                         f"{stack.stderr_tail(log_name)}")


@dataclass
class SmallBatchRun:
    pipeline: str
    records_per_batch: int
    batches: list[dict]  # batch events after the warm-up

    def to_json(self) -> dict[str, Any]:
        seconds = [float(b["metrics"].get("seconds", 0.0)) for b in self.batches]
        return {"pipeline": self.pipeline, "records_per_batch": self.records_per_batch, "batches": len(seconds),
                "median_s": stats.median(seconds), "max_s": max(seconds, default=None),
                "p95_s": float(np.percentile(seconds, 95)) if seconds else None,
                "stages_s": stats.stage_breakdown([b["metrics"] for b in self.batches]),
                "seconds": [round(x, 3) for x in seconds]}


def run_small_batches(stack: BenchStack, spec: PipelineSpec, records: Sequence[SyntheticRecord],
                      per_batch: int = 10, rounds: int = 8, warm: Callable[[], None] | None = None,
                      done: Callable[[], None] | None = None) -> SmallBatchRun:
    """A warm continuous `lakehouse ingest` job fed `per_batch` records at a time, each round waiting for
    its receipt: what one small batch costs end to end (plan, Spark job, commits, group commit), from
    the batch events. The first batch (JVM and Python workers starting) is left out; `warm` is called
    once it committed, `done` once the last one did (before the job stops and its events are read).

    Raises BenchError when the job dies or a round's batch does not come within a minute.
    """
    platform = stack.platform()
    create_topic(spec, platform)
    producer = make_producer(spec, platform)
    counter = DeliveryCounter()
    source = itertools.cycle(records)
    log_name = f"ingest-small-{spec.name}"
    proc = stack.spawn("ingest", "--pipeline", spec.name, "--json", log_name=log_name)
    lines = _LineReader(proc.stdout)
    try:
        for round_ in range(rounds + 1):
            _feed_batch(stack, spec, proc, lines, producer, source, counter, per_batch, log_name,
                        f"batch of {per_batch} records")
            if round_ == 0 and warm is not None:
                warm()
        if done is not None:
            done()
    finally:
        stop_process_group(proc, timeout=90)
    batches = batch_metrics(spec.name, platform)
    return SmallBatchRun(spec.name, per_batch, batches[1:])


def run_wide_batches(stack: BenchStack, spec: PipelineSpec, records: Sequence[SyntheticRecord],
                     per_partition: int = 20, rounds: int = 3) -> SmallBatchRun:
    """A warm continuous `lakehouse ingest` job over a topic of many partitions, fed `per_partition` records
    to every partition per round (explicit partition numbers), each round in one Kafka transaction so that
    the job (read_committed) sees a round whole or not at all, each round waiting for its receipt: what a
    batch costs when it holds one short range per partition. The warm-up batch is left out.

    Raises BenchError when the job dies or a round's batch does not come within 180 s.
    """
    import uuid

    platform = stack.platform()
    create_topic(spec, platform)
    producer = Producer({**producer_settings.producer_config(spec, platform), "linger.ms": 20,
                         "queue.buffering.max.messages": 1_000_000, "transactional.id": f"bench-{uuid.uuid4()}"})
    producer.init_transactions(60)
    # records that bring their own far-off Kafka timestamp are left out: the broker's acceptance of them
    # (message.timestamp.after.max.ms) reaches a new topic's 1,000 partitions a while after its creation
    source = itertools.cycle([r for r in records if r.timestamp is None])
    log_name = f"ingest-wide-{spec.name}"
    proc = stack.spawn("ingest", "--pipeline", spec.name, "--json", log_name=log_name)
    lines = _LineReader(proc.stdout)
    try:
        for round_ in range(rounds + 1):
            producer.begin_transaction()
            for _ in range(per_partition):
                for partition in range(spec.source.partitions):
                    rec = next(source)
                    while True:
                        try:
                            producer.produce(spec.source.topic, value=rec.value, key=rec.key, headers=rec.headers,
                                             partition=partition)
                            break
                        except BufferError:
                            producer.poll(0.05)
            producer.commit_transaction(120)
            if not lines.wait_for_receipt(timeout=180, proc=proc):
                raise BenchError(f"the continuous job of {spec.name} committed no batch for round {round_} "
                                 f"({'exit code ' + str(proc.returncode) if proc.poll() is not None else 'in 180s'})"
                                 f": {stack.stderr_tail(log_name)}")
    finally:
        stop_process_group(proc, timeout=90)
    return SmallBatchRun(spec.name, per_partition * spec.source.partitions, batch_metrics(spec.name, platform)[1:])


def batch_timings(batches: Sequence[dict]) -> list[stats.BatchTiming]:
    """Commit time (the event's timestamp), seconds and records of each batch event."""
    return [stats.BatchTiming(datetime.fromisoformat(b["ts"]).timestamp() * 1000, float(b["metrics"].get("seconds", 0)),
                              int(b["metrics"].get("records", 0))) for b in batches]


# ---------------------------------------------------------------------------------------------- baseline

def _baseline_schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType, StructType, TimestamptzType

    return Schema(
        NestedField(1, "order_id", StringType(), required=False),
        NestedField(2, "customer_id", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
        NestedField(4, "currency", StringType(), required=False),
        NestedField(5, "status", StringType(), required=False),
        NestedField(6, "event_time", TimestamptzType(), required=False),
        NestedField(7, "_kafka", StructType(
            NestedField(9, "topic", StringType(), required=False),
            NestedField(10, "partition", IntegerType(), required=False),
            NestedField(11, "offset", LongType(), required=False),
            NestedField(12, "timestamp", TimestamptzType(), required=False),
            NestedField(13, "key", StringType(), required=False),
        ), required=False),
        NestedField(8, "_ingested_at", TimestamptzType(), required=False),
    )


_BASELINE_ARROW = pa.schema([
    ("order_id", pa.string()), ("customer_id", pa.string()), ("amount", pa.float64()),
    ("currency", pa.string()), ("status", pa.string()), ("event_time", pa.timestamp("us", tz="UTC")),
    ("_kafka", pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.string())])),
    ("_ingested_at", pa.timestamp("us", tz="UTC")),
])


def create_orders_table(catalog, name: str):
    """An empty table `name` (namespace created when missing) with the orders' columns and a `_kafka` struct
    of each row's coordinates, partitioned by day(event_time), zstd Parquet: what the hand-written loop and
    the peers (bench.peers) write."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
    return catalog.create_table(
        name, schema=_baseline_schema(),
        partition_spec=PartitionSpec(PartitionField(source_id=6, field_id=1000, transform=DayTransform(),
                                                    name="event_time_day")),
        properties={IcebergProperties.FORMAT_VERSION: "2", IcebergProperties.PARQUET_COMPRESSION: "zstd"})


@dataclass
class BaselineRun:
    every: int
    consumed: int
    appended: int
    skipped: int
    commits: int
    seconds: float
    value_bytes: int

    @property
    def rate(self) -> float:
        return self.consumed / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"every": self.every, "consumed": self.consumed, "appended": self.appended, "skipped": self.skipped,
                "commits": self.commits, "seconds": round(self.seconds, 2), "records_per_s": round(self.rate, 1),
                "mb_per_s": round(self.value_bytes / MB / self.seconds, 3) if self.seconds > 0 else None}


def _kafka_time(ms: int) -> datetime | None:
    """A Kafka timestamp as a datetime; None when no datetime holds it (a broker takes any 64-bit value)."""
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None


def hand_written_baseline(platform: config.PlatformConfig, topic: str, partitions: Sequence[int], expected: int,
                          table_name: str, every: int) -> BaselineRun:
    """What a user might write by hand: a confluent-kafka `assign` loop, json.loads, undecodable records
    skipped, a pyarrow table with the same columns (coordinates included) appended with pyiceberg
    every `every` records to a table partitioned by day(event_time) in the same catalog.

    It does less than the pipeline: no contract validation, no dead letters, no offsets in the
    commits (a crash loses or duplicates records). Timed from the first fetch to the last commit.
    """
    table = create_orders_table(open_catalog(platform, "lake"), table_name)
    names = _BASELINE_ARROW.names
    columns: dict[str, list] = {n: [] for n in names}
    consumed = appended = skipped = commits = size = 0

    def append_pending() -> None:
        nonlocal appended, commits
        if not columns["order_id"]:
            return
        now = datetime.now(timezone.utc)
        columns["_ingested_at"] = [now] * len(columns["order_id"])
        table.append(pa.Table.from_pydict(columns, schema=_BASELINE_ARROW))
        appended += len(columns["order_id"])
        commits += 1
        for n in names:
            columns[n] = []

    started = time.monotonic()
    consumer = _assigned_consumer(platform.kafka(), topic, partitions, "bench-baseline")
    last = time.monotonic()
    try:
        while consumed < expected:
            msgs = consumer.consume(num_messages=10_000, timeout=0.5)
            if msgs:
                last = time.monotonic()
            elif time.monotonic() - last > STALL_S:
                raise BenchError(f"baseline: {consumed} of {expected} records of {topic}, then nothing")
            for msg in msgs:
                if msg.error() is not None:
                    continue
                consumed += 1
                value = msg.value()
                size += len(value) if value is not None else 0
                try:
                    obj = json.loads(value)
                    event_time = datetime.fromisoformat(obj["event_time"])
                    if event_time.tzinfo is None:
                        raise ValueError("no UTC offset")
                    event_time = event_time.astimezone(timezone.utc)  # year 0 or 10000 in UTC: OverflowError
                    row = (str(obj["order_id"]), str(obj["customer_id"]), float(obj["amount"]),
                           str(obj["currency"]), str(obj["status"]), event_time)
                    for text in row[:2] + row[3:5]:  # a lone surrogate (JSON "\ud83d") that Arrow refuses
                        text.encode("utf-8")
                except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
                    skipped += 1
                    continue
                for name, v in zip(names[:6], row):
                    columns[name].append(v)
                key = msg.key()
                columns["_kafka"].append({"topic": topic, "partition": msg.partition(), "offset": msg.offset(),
                                          "timestamp": _kafka_time(msg.timestamp()[1]),
                                          "key": key.decode("utf-8", "replace") if key is not None else None})
                if len(columns["order_id"]) >= every:
                    append_pending()
        append_pending()
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return BaselineRun(every, consumed, appended, skipped, commits, seconds, size)


# ---------------------------------------------------------------------------------------------- maintenance

def table_totals(table) -> tuple[int, int]:
    """(rows, data files) of a table, from its current snapshot's summary: nothing read."""
    snap = table.current_snapshot()
    if snap is None:
        return 0, 0
    found = offsets.summary_properties(snap)
    return int(found.get("total-records", 0)), int(found.get("total-data-files", 0))


def scan_seconds(catalog, table_name: str, repeats: int) -> tuple[list[float], int]:
    """Seconds of full pyiceberg scans (`to_arrow`) of the table's current snapshot, and its row count."""
    times, rows = [], 0
    for _ in range(repeats):
        table = catalog.load_table(table_name)
        started = time.monotonic()
        rows = table.scan().to_arrow().num_rows
        times.append(time.monotonic() - started)
    return times, rows


def maintenance_effect(stack: BenchStack, spec: PipelineSpec, repeats: int) -> dict[str, Any]:
    """Data files and full-scan time of the pipeline's table before and after `lakehouse maintain`.

    A maintenance run that fails (exit code != 0) is reported with its error, and the table is
    measured after it anyway: a failure on another table may come after this one was compacted.
    """
    platform = stack.platform()
    catalog = open_catalog(platform, spec.catalog)
    table = spec.target.table
    files_before = table_totals(catalog.load_table(table))[1]
    scan_before, rows_before = scan_seconds(catalog, table, repeats)
    started = time.monotonic()
    done = stack.run_cli("maintain", "--pipeline", spec.name, "--json", log_name=f"maintain-{spec.name}",
                         timeout=900)
    maintain_s = time.monotonic() - started
    receipt: dict[str, Any] = {}
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            receipt = json.loads(line)
            break
    files_after = table_totals(catalog.load_table(table))[1]
    scan_after, rows_after = scan_seconds(catalog, table, repeats)
    data_receipt = next((t for t in receipt.get("tables", []) if t.get("table") == spec.qualified(table)), {})
    return {
        "pipeline": spec.name, "table": spec.qualified(table), "rows_before": rows_before, "rows_after": rows_after,
        "files_before": files_before, "files_after": files_after,
        "scan_s_before": scan_before, "scan_s_after": scan_after,
        "scan_median_before": stats.median(scan_before), "scan_median_after": stats.median(scan_after),
        "maintain_wall_s": round(maintain_s, 2), "maintain_exit_code": done.returncode,
        "maintain_error": tail(done.stderr or done.stdout) if done.returncode != 0 else None,
        "receipt": {k: data_receipt.get(k) for k in ("status", "message", "rewritten_data_files", "added_data_files",
                                                     "data_files_before", "data_files_after", "delete_files_before",
                                                     "delete_files_after", "seconds", "content_unchanged")},
    }


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
