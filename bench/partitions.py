"""`python -m bench.partitions`: what one batch costs the driver at 3, 100 and 1,000 partitions.

The main benchmark (`bench.run`) measures throughput at 3 and 12 partitions. This script
measures what grows with the partition count instead, on the real code (IngestJob in this
process, one local[2] Spark session for every run) against a scratch embedded stack:

- topic creation and topic metadata (describe, watermarks and end probe of every partition);
- per batch, from the receipts (the same numbers as the `batch` events): plan, read+decode,
  write and commit seconds, the batch's total, the Spark read tasks it needed, files added;
- per commit, the bytes of the offset summary properties (`lakehouse.offsets`, which holds
  every partition the batch read, and `lakehouse.positions`, which holds every partition the
  table ever saw), the snapshot's entry in metadata.json, and the size of the table's current
  metadata.json after each commit (so the growth per retained snapshot can be extrapolated).

Each batch is preceded by a produce round of `--per-partition` records to every partition
(about 1 % broken, so the dead-letter table commits rows too). The run's first batch is a
warm-up (the JVM and Spark's Python workers start) and is reported apart.

It also probes the commit path alone (BatchCommitter.commit_table of an empty batch, whose snapshot
summary holds one position per partition) at growing partition counts, times a
pyiceberg load and write of a synthetic metadata.json holding a long history of such commits, and a
no-op stage of Python tasks shaped like the reader's (Spark's own cost per task, the reference for
the read stage). A batch that fails is a finding: it is recorded with its error and the run goes on.

Writes reports/bench/partitions.json and prints a table. About 10 minutes on 2 shared cores, most
of it the 1,000 read tasks of each batch at 1,000 partitions.
The stack (default /tmp/lakehouse-sizing-home, broker on a free port) is stopped and purged
at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit

from confluent_kafka import Producer

from bench import stats
from bench.env import BenchError, BenchStack
from lakehouse.core import config, offsets, sparkenv, topics
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest.batch_state import BatchState
from lakehouse.ingest.job import IngestJob
from lakehouse.ingest.plan import BatchPlan, task_groups, topic_state
from lakehouse_dev import producer_settings, synthesis
from lakehouse_dev.record_stream import SyntheticRecord

DEFAULT_PARTITIONS = (3, 100, 1000)
DEFAULT_HOME = Path("/tmp/lakehouse-sizing-home")
SECONDS_PER_DAY = 86_400


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default=",".join(map(str, DEFAULT_PARTITIONS)),
                        type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                        help="partition counts, comma-separated (default %(default)s)")
    parser.add_argument("--per-partition", type=int, default=20, help="records produced per partition per batch")
    parser.add_argument("--batches", type=int, default=2,
                        help="measured batches per partition count (the run starts with one warm-up batch)")
    parser.add_argument("--filter-probe", default="100,300,500,700,1000",
                        type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                        help="partition counts of the commit-path probe (an empty batch's commit "
                             "with one position per partition); empty skips it")
    parser.add_argument("--metadata-snapshots", default="1440,4320",
                        type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                        help="snapshot counts of the synthetic metadata.json load/write probe; empty skips it")
    parser.add_argument("--overhead-tasks", type=int, default=100,
                        help="tasks of the no-op reference stage (Spark's own cost per Python task); 0 skips it")
    parser.add_argument("--home", type=Path, default=DEFAULT_HOME, help="scratch LAKEHOUSE_HOME (wiped)")
    parser.add_argument("--port", type=int, default=0, help="scratch broker port (default: a free one)")
    parser.add_argument("--out", type=Path, default=config.REPO_ROOT / "reports" / "bench" / "partitions.json")
    args = parser.parse_args(argv)
    if args.per_partition < 1 or args.batches < 1 or not args.partitions or min(args.partitions) < 1:
        parser.error("--per-partition, --batches and every partition count must be at least 1")
    return args


# ---------------------------------------------------------------------------------------------- producing

class _Acks:
    def __init__(self) -> None:
        self.delivered = 0
        self.errors: list[str] = []

    def __call__(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(err.str())
        else:
            self.delivered += 1


def produce_round(producer: Producer, topic: str, source: Iterator[SyntheticRecord], partitions: int,
                  per_partition: int) -> int:
    """`per_partition` records to every partition (explicit partition numbers); waits for every ack.

    Returns the records delivered. Raises BenchError when any is not delivered.
    """
    acks = _Acks()
    for _ in range(per_partition):
        for p in range(partitions):
            rec = next(source)
            while True:
                try:
                    stamped = {} if rec.timestamp is None else {"timestamp": rec.timestamp}
                    producer.produce(topic, value=rec.value, key=rec.key, headers=rec.headers, partition=p,
                                     on_delivery=acks, **stamped)
                    break
                except BufferError:
                    producer.poll(0.05)
    remaining = producer.flush(120)
    if acks.errors or remaining:
        raise BenchError(f"producing to {topic}: {len(acks.errors)} delivery errors, {remaining} unacknowledged; "
                         f"first error: {acks.errors[0] if acks.errors else 'timeout'}")
    return acks.delivered


def endless(spec: PipelineSpec, seed: int) -> Iterator[SyntheticRecord]:
    """Synthetic orders (about 1 % broken), generated in chunks, forever."""
    round_ = 0
    while True:
        yield from synthesis.synthesize(spec, 50_000, bad_ratio=0.01, seed=seed + round_)
        round_ += 1


# ---------------------------------------------------------------------------------------------- metadata

def metadata_facts(table, snapshot_id: int | None) -> dict[str, Any]:
    """Size of the table's current metadata.json, its snapshot count, and the size of one snapshot's
    entry in it (compact JSON, as Iceberg writes it) with its summary."""
    location = table.metadata_location
    path = Path(unquote(urlsplit(location).path)) if location.startswith("file:") else Path(location)
    raw = path.read_bytes()
    doc = json.loads(raw)
    entry = next((s for s in doc.get("snapshots", []) if s.get("snapshot-id") == snapshot_id), None)
    return {"metadata_json_bytes": len(raw), "snapshots": len(doc.get("snapshots", [])),
            "metadata_log_entries": len(doc.get("metadata-log", [])),
            "snapshot_entry_bytes": len(json.dumps(entry, separators=(",", ":"))) if entry else None,
            "summary_bytes": len(json.dumps(entry.get("summary", {}), separators=(",", ":"))) if entry else None}


def offset_property_bytes(table, snapshot_id: int | None) -> dict[str, int]:
    """Bytes of the offset-carrying summary properties of one commit."""
    snap = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    props = offsets.summary_properties(snap) if snap is not None else {}
    return {"offsets_prop_bytes": len(props.get(SnapshotSummary.RANGES, "")),
            "positions_prop_bytes": len(props.get(SnapshotSummary.POSITIONS, ""))}


def realistic_ranges(partitions: int, offset: int = 12_345_678_901, batch: int = 1_000) -> tuple[str, str]:
    """The two offset properties of a commit touching every partition, with 11-digit offsets (a topic
    that has run for a while)."""
    return (offsets.encode_ranges({p: (offset, offset + batch) for p in range(partitions)}),
            offsets.encode_positions({p: offset + batch for p in range(partitions)}))


def realistic_offset_bytes(partitions: int) -> dict[str, int]:
    """Computed, not measured: the sizes of `realistic_ranges`."""
    ranges, positions = realistic_ranges(partitions)
    return {"offsets_prop_bytes": len(ranges), "positions_prop_bytes": len(positions)}


# ---------------------------------------------------------------------------------------------- one partition count

def short_error(exc: BaseException) -> str:
    """The exception's type and the first two lines of its message, then the same for each cause
    (`raise ... from`): py4j errors carry whole JVM stacks, IngestError wraps them."""
    parts = []
    while exc is not None and len(parts) < 3:
        lines = str(exc).strip().splitlines()
        parts.append(f"{type(exc).__name__}: {' '.join(line.strip() for line in lines[:2])[:250]}")
        exc = exc.__cause__
    return " <- ".join(parts)


def measure(stack: BenchStack, spark, platform: config.PlatformConfig, partitions: int, per_partition: int,
            batches: int, say, warm_up: bool = False, jobs: dict[int, IngestJob] | None = None) -> dict[str, Any]:
    """Topic creation and metadata, then `batches` measured batches at `partitions` (after one warm-up
    batch when `warm_up`: the run's first batch starts Spark's Python workers). A batch that fails
    ends this partition count: the result keeps the batches before it and the error."""
    per_batch = partitions * per_partition
    spec = stack.write_spec(f"sizing_p{partitions}", f"sizing-p{partitions}", partitions,
                            max_records_per_batch=max(100_000, 2 * per_batch), trigger_interval="5s")
    started = time.monotonic()
    topics.ensure_topics([spec], platform, timeout=60)
    producer_settings.accept_any_timestamp(spec.source.topic, platform)  # as workloads.create_topic
    create_s = time.monotonic() - started
    producer = Producer({**producer_settings.producer_config(spec, platform), "linger.ms": 20,
                         "queue.buffering.max.messages": 1_000_000})
    source = endless(spec, seed=partitions)
    started = time.monotonic()
    job = IngestJob(spec, platform, spark=spark)
    job_init_s = time.monotonic() - started
    if jobs is not None:
        jobs[partitions] = job
    catalog = open_catalog(platform, spec.catalog)
    slots = spark.sparkContext.defaultParallelism * 2  # the task slots IngestJob plans a batch for
    rows: list[dict[str, Any]] = []
    metadata_s = None
    error = None
    for index in range(batches + int(warm_up)):
        produce_started = time.monotonic()
        sent = produce_round(producer, spec.source.topic, source, partitions, per_partition)
        produce_s = time.monotonic() - produce_started
        if index == 0:
            started = time.monotonic()
            topic_state(platform.kafka(), spec.source.topic, timeout=60)
            metadata_s = time.monotonic() - started
        try:
            receipt = job.run_batch()
        except Exception as exc:  # noqa: BLE001 - a limit found is a result: keep what was measured
            error = {"batch": index, "error": short_error(exc)}
            say(f"  p{partitions} batch {index} FAILED: {error['error']}")
            break
        if receipt is None:
            raise BenchError(f"{spec.name}: batch {index} found nothing to ingest after {sent} records were produced")
        pieces = task_groups([offsets.OffsetRange(spec.source.topic, p, s, e)
                                      for p, (s, e) in receipt.ranges.items()], slots)
        t = receipt.timings
        row: dict[str, Any] = {
            "batch": index, "warm_up": warm_up and index == 0, "produced": sent, "produce_s": round(produce_s, 3),
            "records": receipt.records, "partitions_read": len(receipt.ranges), "read_tasks": len(pieces),
            "dead_letters": receipt.dead_letters, "seconds": round(receipt.seconds, 3),
            **{f"{k}_s": round(v, 3) for k, v in t.items()},
            "files_added": sum(c.files for c in receipt.commits),
        }
        for commit in receipt.commits:
            role = "dlq" if commit.table == spec.dead_letter_table else "data"
            table = catalog.load_table(commit.table)
            row[role] = {"table": commit.table, "files": commit.files, "commit_s": round(commit.seconds, 3),
                         "write_s": round(commit.write_seconds, 3),
                         **offset_property_bytes(table, commit.snapshot_id),
                         **metadata_facts(table, commit.snapshot_id)}
        rows.append(row)
        d = row["data"]
        say(f"  p{partitions} batch {index}{' (warm-up)' if row['warm_up'] else ''}: {row['records']:,} records, "
            f"{row['read_tasks']} read tasks, {row['seconds']:.2f}s (plan {t.get('plan', 0):.2f}, "
            f"read+decode {t.get('read', 0) + t.get('decode', 0):.2f}, write {t.get('write', 0):.2f}, "
            f"commit {t.get('commit', 0):.2f}), {row['files_added']} files; offsets {d['offsets_prop_bytes']:,} B, "
            f"positions {d['positions_prop_bytes']:,} B, metadata.json {d['metadata_json_bytes']:,} B")
    if not rows:
        raise BenchError(f"{spec.name}: no batch committed; {error['error'] if error else ''}")
    steady = [r for r in rows if not r["warm_up"]] or rows
    growth = None
    if len(steady) >= 2:  # metadata.json bytes added per commit, over the measured commits
        first, last = steady[0]["data"], steady[-1]["data"]
        growth = (last["metadata_json_bytes"] - first["metadata_json_bytes"]) / (len(steady) - 1)

    def med(key: str) -> float | None:
        return stats.median(r.get(key) for r in steady)

    return {
        "partitions": partitions, "per_partition": per_partition, "records_per_batch": per_batch,
        "topic_create_s": round(create_s, 3), "topic_state_s": round(metadata_s or 0.0, 3),
        "job_init_s": round(job_init_s, 3),
        "median": {"seconds": med("seconds"), "plan_s": med("plan_s"),
                   "read_decode_s": stats.median(r.get("read_s", 0) + r.get("decode_s", 0) for r in steady),
                   "write_s": med("write_s"), "commit_s": med("commit_s"), "group_commit_s": med("group_commit_s"),
                   "read_tasks": med("read_tasks"), "files_added": med("files_added"),
                   "records_per_s": stats.median(r["records"] / r["seconds"] for r in steady if r["seconds"])},
        "data_table_last": steady[-1]["data"], "error": error,
        "metadata_growth_bytes_per_commit": growth,
        "realistic_offsets": realistic_offset_bytes(partitions),
        "batches": rows,
    }


def extrapolate(result: dict[str, Any]) -> dict[str, Any]:
    """Computed: metadata.json size with a 5 s trigger and a 3-day replay window (51,840 retained
    snapshots per table), from the measured bytes per snapshot entry, and from the same entry with
    11-digit offsets."""
    entry = result["data_table_last"]["snapshot_entry_bytes"] or 0
    measured_props = (result["data_table_last"]["offsets_prop_bytes"]
                      + result["data_table_last"]["positions_prop_bytes"])
    realistic_props = sum(result["realistic_offsets"].values())
    realistic_entry = entry - measured_props + realistic_props
    out = {}
    for trigger_s, window_s in ((5, 3 * SECONDS_PER_DAY), (60, 3 * SECONDS_PER_DAY), (60, SECONDS_PER_DAY)):
        snapshots = window_s // trigger_s
        out[f"trigger_{trigger_s}s_window_{window_s // 3600}h"] = {
            "snapshots": snapshots, "metadata_mb_measured_entry": round(snapshots * entry / 1e6, 1),
            "metadata_mb_11_digit_offsets": round(snapshots * realistic_entry / 1e6, 1)}
    return {"snapshot_entry_bytes": entry, "snapshot_entry_bytes_11_digit_offsets": realistic_entry, **out}


def offset_filter_probe(stack: BenchStack, spark, platform: config.PlatformConfig, counts: list[int],
                        say) -> list[dict[str, Any]]:
    """The commit path alone at growing partition counts, no Kafka reads: for each count, a pipeline
    of its own commits an empty batch covering every partition twice with BatchCommitter.commit_table
    (the data table's commit of a batch). The first commit finds no positions; the second finds and
    rewrites one per partition. Returns both commits' seconds; stops at the first count that fails (a
    larger one fails too)."""
    out = []
    for count in counts:
        spec = stack.write_spec(f"sizing_probe_p{count}", f"sizing-probe-p{count}", count, 100_000)
        job = IngestJob(spec, platform, spark=spark)
        # claimed first, as a batch does: the commit checks the claim on the table it loaded
        commits = job.batch_committer()
        entry: dict[str, Any] = {"partitions": count}
        for step, start in (("first", 0), ("second", 10)):
            plan = BatchPlan(spec.source.topic, None, tuple(
                offsets.OffsetRange(spec.source.topic, p, start, start + 10) for p in range(count)), {})
            started = time.monotonic()
            try:
                commits.commit_table(BatchState(spec, plan, f"probe-{step}",
                                                {spec.target.table: job.catalog.load_table(spec.target.table)}),
                                     spec.target.table)
            except Exception as exc:  # noqa: BLE001 - the failure is the finding
                entry.update({"failed_commit": step, "failed_after_s": round(time.monotonic() - started, 3),
                              "error": short_error(exc)})
                break
            entry[f"{step}_commit_s"] = round(time.monotonic() - started, 3)
        out.append(entry)
        if "error" in entry:
            say(f"  {count} partitions: {entry['failed_commit']} commit FAILED after {entry['failed_after_s']:.2f}s: "
                f"{entry['error'][:200]}")
            break
        say(f"  {count} partitions: commit without positions {entry['first_commit_s']:.2f}s, "
            f"with {count} positions {entry['second_commit_s']:.2f}s")
    return out


def metadata_probe(table, home: Path, snapshot_counts: list[int], partitions: int = 1000) -> list[dict[str, Any]]:
    """What a long snapshot history costs one metadata.json load and write with pyiceberg (the
    library `read_progress` loads tables with). The table's real last snapshot entry, its two offset
    properties replaced by `partitions` partitions of 11-digit offsets, is repeated
    `snapshot_counts` times into a metadata.json of the table's own format (a synthetic file, in
    `home`); returns its size and the seconds to load (read + parse) and to write it."""
    import copy

    from pyiceberg.io import load_file_io
    from pyiceberg.serializers import FromInputFile, ToOutputFile

    location = table.metadata_location
    doc = json.loads(Path(unquote(urlsplit(location).path)).read_bytes())
    entry = copy.deepcopy(doc["snapshots"][-1])
    big = realistic_ranges(partitions)
    entry["summary"][SnapshotSummary.RANGES], entry["summary"][SnapshotSummary.POSITIONS] = big
    io = load_file_io(location=str(home))
    out = []
    for count in snapshot_counts:
        synthetic = copy.deepcopy(doc)
        first = 10**15
        snaps = []
        for i in range(count):
            snap = dict(entry, **{"snapshot-id": first + i, "sequence-number": i + 1})
            snap.pop("parent-snapshot-id", None)
            if i:
                snap["parent-snapshot-id"] = first + i - 1
            snaps.append(snap)
        synthetic.update({"snapshots": snaps, "current-snapshot-id": first + count - 1,
                          "last-sequence-number": count,
                          "snapshot-log": [{"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]}
                                           for s in snaps],
                          "refs": {"main": {"snapshot-id": first + count - 1, "type": "branch"}}})
        path = home / f"synthetic-{count}.metadata.json"
        path.write_text(json.dumps(synthetic, separators=(",", ":")))
        started = time.monotonic()
        metadata = FromInputFile.table_metadata(io.new_input(str(path)))
        load_s = time.monotonic() - started
        started = time.monotonic()
        ToOutputFile.table_metadata(metadata, io.new_output(str(path) + ".out"), overwrite=True)
        write_s = time.monotonic() - started
        out.append({"snapshots": count, "partitions": partitions, "bytes": path.stat().st_size,
                    "load_s": round(load_s, 3), "write_s": round(write_s, 3)})
        path.unlink()
        Path(str(path) + ".out").unlink()
    return out


def python_task_overhead(spark, tasks: int) -> dict[str, float]:
    """Spark's own cost of the reader's stage shape with no work in it: a plan DataFrame from
    `parallelize(rows, tasks)` (as IngestJob.read_plan builds it) through a no-op mapInArrow,
    collected. Returns the wall seconds and seconds per task; the reference for the read stage."""
    import pyarrow as pa

    schema = pa.schema([("n", pa.int64())])

    def noop(batches):
        rows = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pylist([{"n": rows}], schema=schema)

    plan = spark.createDataFrame(spark.sparkContext.parallelize([(i,) for i in range(tasks)], tasks), "i int")
    started = time.monotonic()
    plan.mapInArrow(noop, "n long").collect()
    seconds = time.monotonic() - started
    return {"tasks": tasks, "seconds": round(seconds, 3), "seconds_per_task": round(seconds / tasks, 4)}


# ---------------------------------------------------------------------------------------------- report

def render(results: list[dict[str, Any]]) -> str:
    head = ("| P | topic create s | topic state s | read tasks | records/batch | plan s | read+decode s | write s "
            "| commit s | batch s | files/batch | offsets B | positions B | snapshot entry B | metadata.json B "
            "| growth B/commit |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        m, d = r["median"], r["data_table_last"]
        lines.append(
            f"| {r['partitions']} | {r['topic_create_s']:.2f} | {r['topic_state_s']:.2f} | {m['read_tasks']:.0f} "
            f"| {r['records_per_batch']:,} | {m['plan_s']:.2f} | {m['read_decode_s']:.2f} | {m['write_s']:.2f} "
            f"| {m['commit_s']:.2f} | {m['seconds']:.2f} | {m['files_added']:.0f} | {d['offsets_prop_bytes']:,} "
            f"| {d['positions_prop_bytes']:,} | {d['snapshot_entry_bytes']:,} | {d['metadata_json_bytes']:,} "
            f"| {_fmt(r['metadata_growth_bytes_per_commit'])} |")
    for r in results:
        if r.get("error"):
            lines.append(f"\np{r['partitions']}: batch {r['error']['batch']} failed: {r['error']['error'][:200]}")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - began:6.1f}s] {message}", flush=True)

    stack = BenchStack(args.home, args.port or free_port())
    out: dict[str, Any] = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.partitions", *(argv if argv is not None else sys.argv[1:])]),
        "config": {"partitions": args.partitions, "per_partition": args.per_partition, "batches": args.batches,
                   "home": str(args.home), "broker_port": stack.port, "cores": os.cpu_count()},
        "load_average_start": os.getloadavg(), "results": [], "errors": {},
    }
    spark = None
    exit_code = 0
    try:
        status = stack.up()
        stack.activate()
        platform = stack.platform()
        say(f"scratch stack up: broker {status['bootstrap_servers']}, home {args.home}, Spark {platform.spark_master}")
        started = time.monotonic()
        spark = sparkenv.session(platform, ["lake"], "bench-partitions")
        out["spark_session_s"] = round(time.monotonic() - started, 2)
        out["spark_master"] = platform.spark_master
        jobs: dict[int, IngestJob] = {}
        for number, partitions in enumerate(args.partitions):
            say(f"== {partitions} partitions")
            try:
                result = measure(stack, spark, platform, partitions, args.per_partition, args.batches, say,
                                 warm_up=number == 0, jobs=jobs)
                result["extrapolated"] = extrapolate(result)
                out["results"].append(result)
            except Exception as exc:  # noqa: BLE001 - one partition count failing must not lose the others
                out["errors"][str(partitions)] = short_error(exc)
                say(f"!! {partitions} partitions failed: {short_error(exc)}")
                exit_code = 1
        if args.filter_probe:
            say("== offset filter probe")
            out["offset_filter_probe"] = offset_filter_probe(stack, spark, platform, args.filter_probe, say)
        if args.metadata_snapshots and jobs:
            job = jobs[max(jobs)]
            out["metadata_probe"] = metadata_probe(job.catalog.load_table(job.spec.target.table), args.home,
                                                   args.metadata_snapshots)
            for m in out["metadata_probe"]:
                say(f"  metadata.json of {m['snapshots']:,} snapshots x {m['partitions']} partitions: "
                    f"{m['bytes'] / 1e6:,.1f} MB, pyiceberg load {m['load_s']:.2f}s, write {m['write_s']:.2f}s")
        if args.overhead_tasks:
            out["python_task_overhead"] = python_task_overhead(spark, args.overhead_tasks)
            say(f"reference: a no-op stage of {args.overhead_tasks} Python tasks took "
                f"{out['python_task_overhead']['seconds']:.2f}s "
                f"({out['python_task_overhead']['seconds_per_task'] * 1000:.0f} ms per task on "
                f"{spark.sparkContext.defaultParallelism} slots)")
    finally:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()
        try:
            stack.cli("stack", "down", "--purge", timeout=120)
        except BenchError as exc:
            say(f"!! stopping the scratch stack: {exc}")
            exit_code = 1
    out["load_average_end"] = os.getloadavg()
    out["wall_s"] = round(time.monotonic() - began, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    if out["results"]:
        print()
        print(render(out["results"]))
        for r in out["results"]:
            x = r["extrapolated"]
            say(f"p{r['partitions']}: snapshot entry {x['snapshot_entry_bytes']:,} B "
                f"({x['snapshot_entry_bytes_11_digit_offsets']:,} B with 11-digit offsets); 5 s trigger x 3 d = "
                f"{x['trigger_5s_window_72h']['snapshots']:,} snapshots -> metadata.json "
                f"~{x['trigger_5s_window_72h']['metadata_mb_measured_entry']:,} MB "
                f"(~{x['trigger_5s_window_72h']['metadata_mb_11_digit_offsets']:,} MB)")
    say(f"wrote {args.out} (wall {out['wall_s']}s)")
    return exit_code


if __name__ == "__main__":
    raise SystemExit(main())
