"""The peers, run beside the pipeline on the same Apache Kafka, the same records and the same catalog.

Users choose between this platform and two other ways of landing a topic in Iceberg; each runs here
as its users run it, one after another on the quiet machine:

- **Kafka Connect**: the Apache Iceberg Kafka Connect sink (`iceberg-kafka-connect`, Maven Central) in a
  Kafka Connect 4.1.1 standalone worker (the broker's own distribution, devstack/jvm/kafka), JSON
  converter without schemas, `errors.tolerance=all` with a dead-letter topic, exactly-once through the
  sink's control topic and transactional offset commits. Its commit interval is the trigger compared;
  the worker's `offset.flush.interval.ms` is set to it too, because the worker answers a commit request
  only when it flushes (with the default 60 s a 1 s interval commits once a minute).
- **Structured Streaming**: a PySpark job (bench/sss_job.py) reading the topic with Spark's Kafka source
  (`spark-sql-kafka-0-10_2.12`) and writing the table with Iceberg's streaming writer, `from_json` with
  the table's schema, a processing-time trigger (or availableNow over a backlog), a checkpoint.
- **hand-written**: the confluent-kafka + pyiceberg loop of bench.workloads.hand_written_baseline.
- **this pipeline**: `lakehouse ingest`.

Every peer writes the same table: the orders' columns, partitioned by day(event_time), plus a `_kafka`
struct with each row's partition, offset and Kafka timestamp (the Connect sink adds it with Iceberg's
own KafkaMetadataTransform, the Structured Streaming job selects it), so that one reading of the
table's files says, per record, whether it landed once and when it became visible (the commit time of
the snapshot that added its file). Measured per system: records/s and MB/s over a backlog (end to end
from process start, and between its first and last commit), CPU seconds per 100,000 records by
process, peak memory, data files written, freshness at paced rates per trigger, files per hour before
maintenance, exactly once after one kill -9 mid-stream, and what it does with broken records.
"""

from __future__ import annotations

import itertools
import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq

from bench import stats, workloads
from bench.env import BenchError, BenchStack, stop_process_group, tail
from bench.partitions import free_port
from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse_dev import jvm

BENCH_JVM = config.REPO_ROOT / "bench" / "jvm"
SSS_JOB = config.REPO_ROOT / "bench" / "sss_job.py"
NAMESPACE = "peers"
LABELS = {"pipeline": "this pipeline", "connect": "Kafka Connect sink", "sss": "Structured Streaming",
          "baseline": "hand-written"}
# The process that is each system's root, named for the report (MemorySampler calls it `driver`)
ROOT_ROLE = {"pipeline": "driver", "connect": "connect_jvm", "sss": "driver", "baseline": "bench_process"}
POLL_S = 0.25
CONNECT_LOG4J = """status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %-5p [%t] %c{{1}} - %m%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.worker.name = org.apache.kafka.connect.runtime
logger.worker.level = INFO
"""


# the group session timeout of the Connect sink's consumers and of the Iceberg committers' control-topic
# consumers in the kill -9 runs: the broker's smallest by default (group.min.session.timeout.ms), so that the
# worker started again waits 6 s, not 45, for its partitions, and its coordinator for the committers' answers
KILL_SESSION_TIMEOUT_MS = 6_000


def plugin_lib(part: str) -> Path:
    """A peer's jars (bench/jvm/<part>/lib); BenchError naming the set-up command when missing."""
    lib = BENCH_JVM / part / "lib"
    if not lib.is_dir() or not any(lib.glob("*.jar")):
        raise BenchError(f"the {part} jars are missing from {lib}: run `bash scripts/setup.sh --bench` (`make bench` "
                         f"does) to resolve {BENCH_JVM / part / 'pom.xml'} from Maven Central once")
    return lib


# ---------------------------------------------------------------------------------------------- the table

def create_table(catalog, name: str):
    """An empty peer table `peers.<name>`: the baseline's columns (orders plus `_kafka`), by day(event_time)."""
    return workloads.create_orders_table(catalog, f"{NAMESPACE}.{name}")


def _row_count(table) -> int:
    return workloads.table_totals(table)[0]


@dataclass
class Landed:
    """Every row of a table with the commit time of the snapshot that added its file."""

    partitions: np.ndarray
    offsets: np.ndarray
    kafka_ms: np.ndarray
    visible_ms: np.ndarray
    files: int

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def exactly_once(self, expected: dict[int, int]) -> dict[str, Any]:
        """Duplicates and losses against `expected` (partition -> log end; offsets from 0 are expected;
        a transactional topic's control records are never rows: pass ends of non-transactional topics)."""
        unique = np.unique(self.partitions * (1 << 40) + self.offsets)
        wanted = sum(expected.values())
        inside = distinct_inside = 0
        for partition, end in expected.items():
            offsets = self.offsets[self.partitions == partition]
            offsets = offsets[(offsets >= 0) & (offsets < end)]
            inside += len(offsets)
            distinct_inside += int(np.unique(offsets).size)
        return {"rows": self.rows, "expected": wanted, "duplicates": int(self.rows - unique.size),
                "missing": int(wanted - distinct_inside), "outside": int(self.rows - inside),
                "exactly_once": bool(self.rows == unique.size == distinct_inside == wanted)}


def landed(table) -> Landed:
    """Read the `_kafka` coordinates of every live data file of `table`, tagging each row with its file's
    snapshot commit time (an EXISTING manifest entry keeps the id of the snapshot that added it)."""
    table = table.refresh()
    stamps = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    entries = table.inspect.entries() if table.current_snapshot() else None
    parts, offs, kafka, visible = [], [], [], []
    files = 0
    if entries is not None:
        for status, snapshot_id, data_file in zip(entries.column("status").to_pylist(),
                                                  entries.column("snapshot_id").to_pylist(),
                                                  entries.column("data_file").to_pylist()):
            if status == 2 or data_file["content"] != 0:  # deleted entries; delete files
                continue
            files += 1
            with table.io.new_input(data_file["file_path"]).open() as handle:
                coordinates = pq.read_table(handle, columns=["_kafka"]).column("_kafka").combine_chunks()
            parts.append(coordinates.field("partition").to_numpy(zero_copy_only=False).astype(np.int64))
            offs.append(coordinates.field("offset").to_numpy(zero_copy_only=False).astype(np.int64))
            kafka.append(coordinates.field("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False) // 1000)
            visible.append(np.full(len(coordinates), float(stamps[snapshot_id])))
    cat = (lambda xs, dtype: np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype))
    return Landed(cat(parts, np.int64), cat(offs, np.int64), cat(kafka, float), cat(visible, float), files)


def commit_rate(table, value_bytes_per_record: float) -> dict[str, Any]:
    """Records per second between a table's first and last commit (the records of every commit after the
    first, over the time between them): the steady rate, without process start-up. None with one commit."""
    snaps = sorted((s for s in table.refresh().snapshots()
                    if int(s.summary.additional_properties.get("added-records", 0)) > 0), key=lambda s: s.timestamp_ms)
    out: dict[str, Any] = {"commits": len(snaps), "first_commit_ms": snaps[0].timestamp_ms if snaps else None,
                           "last_commit_ms": snaps[-1].timestamp_ms if snaps else None,
                           "steady_records": None, "steady_records_per_s": None, "steady_mb_per_s": None}
    if len(snaps) >= 2:
        seconds = (snaps[-1].timestamp_ms - snaps[0].timestamp_ms) / 1000
        records = sum(int(s.summary.additional_properties.get("added-records", 0)) for s in snaps[1:])
        if seconds > 0:
            out.update(steady_records=records, steady_records_per_s=round(records / seconds, 1),
                       steady_mb_per_s=round(records * value_bytes_per_record / workloads.MB / seconds, 3))
    return out


# ---------------------------------------------------------------------------------------------- the peers

@dataclass
class Peer:
    """How to start one peer over a topic into a table, continuously or over the backlog it finds."""

    system: str
    stack: BenchStack
    workdir: Path

    def start(self, topic: str, table: str, trigger_s: float, run: str, backlog: bool) -> subprocess.Popen:
        raise NotImplementedError

    def log(self, run: str) -> Path:
        return self.workdir / f"{run}.log"

    def log_tail(self, run: str) -> str:
        try:
            return tail(self.log(run).read_text(errors="replace"))
        except OSError:
            return "(no log)"


class ConnectPeer(Peer):
    """A Kafka Connect standalone worker running the Iceberg sink; one connector (name, groups, control
    topic, offsets file) per run, so runs never share state unless a run is resumed on purpose. The
    worker always runs until stopped (`backlog` changes nothing): the caller stops it once the rows are in."""

    def _write(self, path: Path, props: dict[str, str]) -> Path:
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def start(self, topic: str, table: str, trigger_s: float, run: str, backlog: bool,
              session_timeout_ms: int = 0) -> subprocess.Popen:
        """`session_timeout_ms`: the group session timeout of the sink's consumers and of the Iceberg committers'
        control-topic consumers (Kafka's default, 45 s, when 0). A worker started again after kill -9 gets its
        partitions, and its coordinator the committers' answers, only once the dead members' sessions expired."""
        platform = self.stack.platform()
        folder = self.workdir / run
        folder.mkdir(parents=True, exist_ok=True)
        # for the sink's consumers and the Iceberg committers' own (the control topic's)
        session = {"session.timeout.ms": str(session_timeout_ms),
                   "heartbeat.interval.ms": str(max(1_000, session_timeout_ms // 3))} if session_timeout_ms else {}
        plugins = folder / "plugins"
        plugins.mkdir(exist_ok=True)
        link = plugins / "iceberg"
        if not link.exists():
            link.symlink_to(plugin_lib("connect-iceberg"), target_is_directory=True)
        control = f"control-{run}"
        workloads.ensure_topic(platform, control, 1)
        interval_ms = str(max(100, int(trigger_s * 1000)))
        bootstrap = platform.bootstrap_servers
        worker = self._write(folder / "worker.properties", {
            "bootstrap.servers": bootstrap,
            "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "offset.storage.file.filename": str(folder / "connect.offsets"),
            "plugin.path": str(plugins),
            # the Iceberg sink's jars carry ServiceLoader manifests: without this, the worker scans every
            # class of its 49 jars (100 MB) by reflection at each start: 13 s here, and its log advises this
            "plugin.discovery": "service_load",
            "listeners": f"http://127.0.0.1:{free_port()}",
            "consumer.isolation.level": "read_committed",
            "consumer.auto.offset.reset": "earliest",
            "offset.flush.interval.ms": interval_ms,
            **{f"consumer.{k}": v for k, v in session.items()},
        })
        catalog_props = {k: v for k, v in platform.catalog("lake").spark_properties().items()
                         if k and k != "cache-enabled"}
        sink = self._write(folder / "sink.properties", {
            "name": f"iceberg-{run}", "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
            "tasks.max": "1", "topics": topic, "iceberg.tables": f"{NAMESPACE}.{table}",
            "iceberg.catalog": "lake", **{f"iceberg.catalog.{k}": v for k, v in catalog_props.items()},
            "iceberg.control.topic": control, "iceberg.control.commit.interval-ms": interval_ms,
            "iceberg.control.commit.timeout-ms": "30000", "iceberg.kafka.bootstrap.servers": bootstrap,
            **{f"iceberg.kafka.{k}": v for k, v in session.items()},
            "transforms": "kafka",
            "transforms.kafka.type": "org.apache.iceberg.connect.transforms.KafkaMetadataTransform",
            "transforms.kafka.nested": "true", "transforms.kafka.field_name": "_kafka",
            "errors.tolerance": "all", "errors.deadletterqueue.topic.name": f"{topic}-{run}-dlq",
            "errors.deadletterqueue.topic.replication.factor": "1",
            "errors.deadletterqueue.context.headers.enable": "true", "errors.log.enable": "true",
        })
        log4j = folder / "log4j2.properties"
        log4j.write_text(CONNECT_LOG4J.format(log=self.log(run)))
        cmd = [jvm.java(), "-Xmx1g", f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", jvm.classpath("kafka"),
               "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(sink)]
        out = open(folder / "stdout.log", "a")
        try:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=folder)
        finally:
            out.close()

    def task_killed(self, run: str) -> str | None:
        """The sink task's fatal error, when Connect killed it (it does not recover without a restart)."""
        text = self.log(run).read_text(errors="replace") if self.log(run).exists() else ""
        if "Task is being killed and will not recover" not in text:
            return None
        for line in text.splitlines():
            if "An error occurred converting record" in line or "DataException" in line:
                return line.split(" - ", 1)[-1][:300]
        return "task killed (see the log)"


_EXCEPTION = re.compile(r"^(?:Caused by: )?([\w.$]+(?:Exception|Error)(?:: .*)?)$")


def first_exception(text: str) -> str | None:
    """The first Java exception in a log, with the frame that says where: the first naming Kafka, else the
    first outside java.*."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        found = _EXCEPTION.match(line.strip())
        if not found:
            continue
        frames = [f.strip()[3:] for f in lines[i + 1:i + 20] if f.strip().startswith("at ")]
        frame = next((f for f in frames if "kafka" in f.lower()),
                     next((f for f in frames if not f.startswith("java.")), frames[0] if frames else ""))
        return f"{found.group(1)[:200]}" + (f" (at {frame.split(' ~[')[0]})" if frame else "")
    return None


class StructuredStreamingPeer(Peer):
    """bench/sss_job.py under this venv's Python: a Spark driver like the pipeline's, Spark's Kafka source
    added as local jars."""

    def start(self, topic: str, table: str, trigger_s: float, run: str, backlog: bool,
              max_offsets: int = 0) -> subprocess.Popen:
        jars = ",".join(str(j) for j in sorted(plugin_lib("spark-kafka").glob("*.jar")))
        env = {**self.stack.environ(), "LAKEHOUSE_JARS": jars}
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(SSS_JOB), "--topic", topic, "--table", f"lake.{NAMESPACE}.{table}",
               "--checkpoint", str(self.workdir / run / "checkpoint"), "--trigger-s", f"{trigger_s:g}",
               "--app", f"sss-{run}"]
        if backlog:
            cmd.append("--available-now")
        if max_offsets:
            cmd += ["--max-offsets-per-trigger", str(max_offsets)]
        out = open(self.log(run), "a")
        try:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    cwd=config.REPO_ROOT)
        finally:
            out.close()


# ---------------------------------------------------------------------------------------------- measuring

@dataclass
class BacklogRun:
    """One system over the backlog: how long, how much CPU by process, how much memory, how many files."""

    system: str
    records: int
    rows: int
    wall_s: float
    value_bytes: int
    cpu_by_role_s: dict[str, float]
    steady_cpu_by_role_s: dict[str, float]
    peak_mb: float
    peak_by_role_mb: dict[str, float]
    files: int
    rate: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        cpu = sum(self.cpu_by_role_s.values())
        steady_cpu = sum(self.steady_cpu_by_role_s.values())
        steady_records = self.rate.get("steady_records") or 0
        return {
            "system": self.system, "label": LABELS[self.system], "records": self.records, "rows": self.rows,
            "wall_s": round(self.wall_s, 2),
            "wall_records_per_s": round(self.records / self.wall_s, 1) if self.wall_s > 0 else None,
            "wall_mb_per_s": round(self.value_bytes / workloads.MB / self.wall_s, 3) if self.wall_s > 0 else None,
            **self.rate,
            "cpu_s": round(cpu, 2), "cpu_by_role_s": _rename(self.system, self.cpu_by_role_s),
            "cpu_s_per_100k": round(cpu / self.records * 100_000, 2) if self.records else None,
            "records_per_cpu_s": round(self.records / cpu, 1) if cpu > 0 else None,
            "steady_cpu_by_role_s": _rename(self.system, self.steady_cpu_by_role_s),
            "steady_cpu_s_per_100k": round(steady_cpu / steady_records * 100_000, 2)
            if steady_records and steady_cpu > 0 else None,
            "steady_records_per_cpu_s": round(steady_records / steady_cpu, 1)
            if steady_records and steady_cpu > 0 else None,
            "peak_mb": round(self.peak_mb, 1), "peak_by_role_mb": _rename(self.system, self.peak_by_role_mb),
            "files": self.files, "settings": self.settings,
        }


def _rename(system: str, by_role: dict[str, float]) -> dict[str, float]:
    """MemorySampler's roles named for the system: its root process is not always a Python driver."""
    out = {}
    for role, value in by_role.items():
        name = ROOT_ROLE[system] if role == "driver" else ("spark_jvm" if role == "jvm" else role)
        if value:
            out[name] = round(out.get(name, 0.0) + value, 2)
    return out


def load_or_none(catalog, name: str):
    """Table `name`, or None while it does not exist (a job that creates it has not started yet)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        return None


def rows_of(table) -> int:
    """Rows of `table` (a table, or a callable returning the table or None) as of now."""
    if callable(table):
        table = table()
    return _row_count(table.refresh()) if table is not None else 0


def wait_rows(table, expected: int, proc: subprocess.Popen | None, timeout: float, what: str,
              stall_s: float = 90.0) -> float:
    """Poll until `table` (see rows_of) holds `expected` rows; returns the time.monotonic() it did.
    BenchError when the process exits first, or no row lands for `stall_s` (after the first), or
    `timeout` passes."""
    started = last_change = time.monotonic()
    rows = -1
    while True:
        now = time.monotonic()
        exited = proc is not None and proc.poll() is not None  # asked before the rows: a job that ends after
        current = rows_of(table)                                 # its last commit is seen with all of them
        if current != rows:
            rows, last_change = current, now
        if rows >= expected:
            return now
        if exited:
            raise BenchError(f"{what} exited with {proc.returncode} at {rows:,} of {expected:,} rows")
        if now - started > timeout or (rows > 0 and now - last_change > stall_s):
            raise BenchError(f"{what}: {rows:,} of {expected:,} rows after {now - started:.0f}s "
                             f"({'no new rows for ' + str(int(now - last_change)) + 's' if rows > 0 else 'none yet'})")
        time.sleep(POLL_S)


def measure_process(system: str, proc: subprocess.Popen, table, expected: int, value_bytes: int,
                    broker_pid: int | None, timeout: float, what: str, settings: dict[str, Any],
                    value_bytes_per_record: float, on_fail: Callable[[], str]) -> BacklogRun:
    """A started peer over the backlog, sampled until the table holds `expected` rows, then stopped."""
    started = time.monotonic()
    try:
        with workloads.MemorySampler(proc.pid, broker_pid=broker_pid) as sampler:
            try:
                done = wait_rows(table, expected, proc, timeout, what)
            except BenchError as exc:
                raise BenchError(f"{exc}: {on_fail()}") from None
    finally:
        stop_process_group(proc, timeout=30)
    rate = commit_rate(table, value_bytes_per_record)
    steady = {}
    if rate["steady_records"]:
        steady = sampler.cpu_between(rate["first_commit_ms"] / 1000, rate["last_commit_ms"] / 1000 + POLL_S)
    rows, files = workloads.table_totals(table.refresh())
    return BacklogRun(system, expected, rows, done - started, value_bytes, sampler.cpu_by_role_s, steady,
                      sampler.peak_mb, sampler.peak_by_role, files, rate, settings)


def baseline_backlog(stack: BenchStack, topic: str, partitions: int, expected: int, value_bytes: int, every: int,
                     value_bytes_per_record: float) -> BacklogRun:
    """The hand-written loop in this process, sampled like a peer's process tree (this process only)."""
    platform = stack.platform()
    name = f"baseline_backlog_{int(time.time())}"
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    with workloads.MemorySampler(os.getpid(), broker_pid=stack.broker_pid()) as sampler:
        run = workloads.hand_written_baseline(platform, topic, range(partitions), expected,
                                              f"{NAMESPACE}.{name}", every)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    table = open_catalog(platform, "lake").load_table(f"{NAMESPACE}.{name}")
    rate = commit_rate(table, value_bytes_per_record)
    # this process's own CPU from getrusage (the sampler's total counts the bench process since it started)
    cpu = {"driver": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
           "broker": sampler.cpu_by_role_s.get("broker", 0.0)}
    steady = {}
    if rate["steady_records"]:
        steady = sampler.cpu_between(rate["first_commit_ms"] / 1000, rate["last_commit_ms"] / 1000 + POLL_S)
    return BacklogRun("baseline", expected, run.appended, wall, value_bytes, cpu, steady, sampler.peak_mb,
                      sampler.peak_by_role, workloads.table_totals(table)[1], rate,
                      {"commit_every_records": every, "skipped": run.skipped})


# ---------------------------------------------------------------------------------------------- freshness

@dataclass
class PeerFreshness:
    system: str
    trigger_s: float
    phases: list[stats.PhaseFreshness]
    files: int
    seconds: float  # from the first phase's start to the end of the drain
    drained: bool

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "label": LABELS[self.system], "trigger_s": self.trigger_s,
                "phases": [p.to_json() for p in self.phases], "files": self.files,
                "seconds": round(self.seconds, 1), "drained": self.drained,
                "files_per_hour": round(self.files / self.seconds * 3600) if self.seconds > 0 else None}


def peer_freshness(peer: Peer, stack: BenchStack, spec: PipelineSpec, records: Sequence, trigger_s: float,
                   rates: Sequence[int], phase_s: float, drain_s: float, progress=None) -> PeerFreshness:
    """A peer running continuously with `trigger_s` on a fresh topic while the paced producer runs one
    phase per rate (as bench.workloads.run_freshness does for the pipeline); freshness per record from
    the commit time of the snapshot that added its file; records not visible by the drain's end censored."""
    platform = stack.platform()
    run = f"{peer.system}_fresh_t{trigger_s:g}".replace(".", "_")
    topic = run.replace("_", "-")
    workloads.ensure_topic(platform, topic, spec.source.partitions)
    catalog = open_catalog(platform, "lake")
    table = create_table(catalog, run)
    producer = workloads.make_producer(spec, platform)
    counter = workloads.DeliveryCounter()
    source = itertools.cycle(records)
    proc = peer.start(topic, run, trigger_s, run, backlog=False)
    try:
        for _ in range(100):  # warm-up: the JVM starts and commits a first small batch
            workloads.send(producer, topic, next(source), counter)
        workloads.flush(producer, counter, topic)
        try:
            wait_rows(table, 100, proc, 240, f"{LABELS[peer.system]} warm-up")
        except BenchError as exc:
            raise BenchError(f"{exc}: {peer.log_tail(run)}") from None
        first_start = time.monotonic()
        phases = workloads.paced_phases(producer, topic, source, rates, phase_s, counter, proc, LABELS[peer.system],
                                        lambda: peer.log_tail(run), f"{LABELS[peer.system]}, trigger {trigger_s:g}s",
                                        progress)
        workloads.flush(producer, counter, topic)
        total = counter.delivered
        drained = False
        drain_started = time.monotonic()
        while time.monotonic() - drain_started < drain_s:
            if _row_count(table.refresh()) >= total:
                drained = True
                break
            time.sleep(POLL_S)
        deadline_ms = int(time.time() * 1000)
        seconds = time.monotonic() - first_start
    finally:
        stop_process_group(proc, timeout=30)
    found = landed(table)
    out = stats.freshness_by_phase(phases, found.kafka_ms, found.visible_ms, deadline_ms, trigger_s=trigger_s)
    return PeerFreshness(peer.system, trigger_s, out, found.files, seconds, drained)


# ---------------------------------------------------------------------------------------------- kill -9

def kill_and_resume(start: Callable[[], subprocess.Popen], table: Callable[[], Any], ends: dict[int, int],
                    what: str, log_tail: Callable[[], str], timeout: float = 300.0) -> dict[str, Any]:
    """Start, kill -9 (the whole process group) once the first commit landed and before the last, start
    again, wait for the rest (or give up after `timeout`, or 60 s without a new row; `resumed_s`: from
    the second start until every row was in), then count each offset's rows. `table` returns the table
    (None until it exists). A peer that loses or duplicates is a finding, not a failure of the run."""
    expected = sum(ends.values())
    proc = start()
    killed_at = None
    try:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            rows = rows_of(table)
            if 0 < rows < expected:
                os.killpg(proc.pid, signal.SIGKILL)
                killed_at = rows
                break
            if rows >= expected:
                break
            if proc.poll() is not None:
                raise BenchError(f"{what} exited with {proc.returncode} before its first commit: {log_tail()}")
            time.sleep(0.05)
    finally:
        stop_process_group(proc, timeout=10)
    outcome: dict[str, Any] = {"killed_after_rows": killed_at}
    if killed_at is None:
        outcome["note"] = "not killed: the backlog landed in one commit"
    restarted = time.monotonic()
    resumed = start()
    try:
        wait_rows(table, expected, resumed, timeout, f"{what} (resumed)", stall_s=60)
        outcome["resumed_s"] = round(time.monotonic() - restarted, 1)
    except BenchError as exc:
        outcome["resume_error"] = str(exc)
    finally:
        stop_process_group(resumed, timeout=30)
    final = table()
    if final is None:
        return {**outcome, "exactly_once": False, "rows": 0, "expected": expected, "missing": expected}
    return {**outcome, **landed(final).exactly_once(ends)}


# ---------------------------------------------------------------------------------------------- bad input

def _topic_records(platform: config.PlatformConfig, topic: str) -> int:
    """Records in `topic` (high minus low watermarks; 0 when it does not exist)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**platform.kafka(), "group.id": "bench-count", "enable.auto.commit": False})
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        total = 0
        for p in found.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


def broken_records(running: dict[str, Peer], stack: BenchStack, catalog, spec: PipelineSpec, backlog,
                   baseline: dict | None, progress=None, wait_s: float = 90.0) -> dict[str, Any]:
    """What each system does with the topic holding the broken records (`spec`'s, about 1 % broken): rows
    landed, records set aside (dead-letter topic or table, skipped) and whether it stopped."""
    platform = stack.platform()
    topic = spec.source.topic
    out: dict[str, Any] = {"topic": topic, "records": backlog.count, "broken": backlog.bad}
    connect = running["connect"]
    name = "connect_broken"
    table = create_table(catalog, name)
    proc = connect.start(topic, name, 1.0, name, backlog=True)
    started = time.monotonic()
    try:
        while time.monotonic() - started < wait_s and connect.task_killed(name) is None:
            if _row_count(table.refresh()) >= backlog.count - backlog.bad:
                break
            time.sleep(1)
        time.sleep(3)  # the last commit in flight
    finally:
        stop_process_group(proc, timeout=30)
    out["connect"] = {"rows": _row_count(table.refresh()), "stopped": connect.task_killed(name),
                      "dead_letter_topic_records": _topic_records(platform, f"{topic}-{name}-dlq")}
    sss = running["sss"]
    name = "sss_broken"
    table = create_table(catalog, name)
    proc = sss.start(topic, name, 1.0, name, backlog=True)
    try:
        code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_process_group(proc, timeout=30)
    data = table.refresh().scan(selected_fields=("order_id", "event_time")).to_arrow()
    out["sss"] = {"rows": data.num_rows, "exit_code": code,
                  "rows_all_null": int(pa.compute.sum(pa.compute.and_(
                      pa.compute.is_null(data.column("order_id")),
                      pa.compute.is_null(data.column("event_time")))).as_py() or 0) if data.num_rows else 0,
                  "rows_null_event_time": int(data.column("event_time").null_count),
                  "stopped": None if code == 0 else
                  first_exception(sss.log(name).read_text(errors="replace")) or sss.log_tail(name)}
    if baseline:
        first = next(iter(baseline.values()))["runs"][0]
        out["baseline"] = {"rows": first["appended"], "skipped": first["skipped"]}
    if progress:
        progress(f"broken records: {out}")
    return out

