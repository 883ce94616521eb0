"""`python -m bench.run` (`make bench`): the whole benchmark, unattended, then the report.

Order of work, all on the same synthetic records:
  1. a scratch stack (reports/bench/stack, wiped) on its own broker port;
  2. generate the records once; load them into topics of 3 and 12 partitions, and the first
     `batch size` of them into a third topic for the memory check;
  3. ceilings: raw consume (per topic: one consumer, and as many consumer processes as task slots),
     the pipeline's decoder on one core, raw Parquet write;
  4. the pipeline: `lakehouse ingest --once` over each topic, repeated, plus the 1x-backlog run;
  5. scaling: the same `--once` run on the 3-partition topic under local[1], beside local[2], with the
     CPU seconds each part of the machine used (driver, JVM, Python workers, broker);
  6. small batches: a warm continuous job fed 10 records at a time, what one small batch costs;
  7. the hand-written baseline with N = 10,000 and 50,000;
  8. freshness: one continuous job per trigger while a paced producer runs each rate;
  9. maintenance on the table the 1 s-trigger job left;
 10. proof: `lakehouse trace` latency on a table of BENCH_TRACE_ROWS rows, `lakehouse verify`
     throughput (offsets proven exactly once per second) on a pipeline `--once` filled;
 11. peers: the Iceberg Kafka Connect sink, Spark Structured Streaming, the hand-written loop and
     `lakehouse ingest` over the same clean backlog, then each peer's freshness per trigger, one
     kill -9 each, and what each does with the broken records (bench/peers.py);
 12. stop the stack; write results.json, the PNG plots and report.md.

A section that fails is reported (with its error) and the others still run; the exit code
is then 1. Targets that do not hold do not change the exit code: they are findings.

Knobs (flags, or environment variables for `make bench`):
  --records N / BENCH_RECORDS        records in the backlog (default 300,000 x BENCH_SCALE);
                                     the pipelines' max_records_per_batch is a third of it
  BENCH_SCALE                        multiplies the default record count (default 1)
  --repeats / BENCH_REPEATS          repeats of ceilings, baseline and scans (default 3)
  --pipeline-repeats / BENCH_PIPELINE_REPEATS   `--once` runs per topic (default 2)
  --phase-seconds / BENCH_PHASE_SECONDS          seconds per produce rate (default 15)
  --drain-seconds / BENCH_DRAIN_SECONDS          bound on the drain after the last phase (default 30)
  --trace-rows / BENCH_TRACE_ROWS    rows of the table the trace latency is measured on (default 10,000,000)
  --cdc-records / BENCH_CDC_RECORDS  change events per envelope format of the cdc section, in batches of the
                                     append runs' size (default: two batches, the first one cold)
  --audit-rows / BENCH_AUDIT_ROWS    rows of the publish audit's window in the audit section (default 10,000,000)
  --rates, --triggers, --port, --out, --sections   (e.g. --sections ceilings,pipeline skips the peers)
  --peer-triggers, --peer-rates      the peers' freshness runs (default 1,10 s and 10k,50k msg/s)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from bench import audit, machine, peers, proof, report, stats, workloads
from bench.env import DEFAULT_BROKER_PORT, SCHEMA_FILE_SUFFIX, BenchError, BenchStack
from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec, load_spec

DEFAULT_RECORDS = 300_000
SECTIONS = ("ceilings", "pipeline", "formats", "cdc", "scaling", "small_batches", "baseline", "freshness", "maintenance",
            "proof", "audit", "s3", "partitions", "peers")
WIDE_PARTITIONS, WIDE_PER_PARTITION = 1_000, 20  # the partitions section: 1,000 partitions, 20 records each
WIRE_FORMATS = ("avro", "protobuf")  # end to end beside JSON (the formats section)
CDC_UPDATES, CDC_DELETES = 0.20, 0.05  # the change streams' shares of updates and deletes (the rest: creates)
TRACE_ROWS = 10_000_000
AUDIT_ROWS = 10_000_000  # the publish gate's audit window of the audit section
TRACE_LOOKUPS = 20
BASELINE_EVERY = (10_000, 50_000)
FRESHNESS_BATCH = 200_000  # the orders spec's max_records_per_batch, for the continuous jobs
SMALL_BATCH = 10  # records per batch of the small-batch section


class Progress:
    """Prints progress lines with the elapsed time since the run started."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed:6.1f}s] {message}", flush=True)


def batch_size(records: int) -> int:
    """The pipelines' max_records_per_batch for a backlog of `records`: a third of it."""
    return max(1_000, records // 3)


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"bench: {name}={raw!r} is not a number") from None


def _int_list(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part.strip()]


def _float_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    scale = _env_number("BENCH_SCALE", 1.0)
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=int(_env_number("BENCH_RECORDS", DEFAULT_RECORDS * scale)),
                        help="records in the backlog (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=int(_env_number("BENCH_REPEATS", 3)),
                        help="repeats of ceilings, baseline runs and scans; medians are reported")
    parser.add_argument("--pipeline-repeats", type=int, default=int(_env_number("BENCH_PIPELINE_REPEATS", 2)),
                        help="`lakehouse ingest --once` runs per topic; medians are reported")
    parser.add_argument("--rates", type=_int_list, default=[10_000, 50_000],
                        help="produce rates of the freshness phases, msg/s, comma-separated")
    parser.add_argument("--triggers", type=_float_list, default=[1.0, 10.0],
                        help="trigger intervals of the continuous jobs, seconds, comma-separated")
    parser.add_argument("--write-interval", type=float, default=1.0,
                        help="trigger.write_interval (seconds) of the continuous jobs whose trigger is longer; 0: none")
    parser.add_argument("--peer-triggers", type=_float_list, default=[1.0, 10.0],
                        help="trigger (commit interval) of the peers' freshness runs, seconds, comma-separated")
    parser.add_argument("--peer-rates", type=_int_list, default=[10_000, 50_000],
                        help="produce rates of the peers' freshness phases, msg/s, comma-separated")
    parser.add_argument("--phase-seconds", type=float, default=_env_number("BENCH_PHASE_SECONDS", 15.0))
    parser.add_argument("--drain-seconds", type=float, default=_env_number("BENCH_DRAIN_SECONDS", 30.0))
    parser.add_argument("--bad-ratio", type=float, default=0.01, help="share of records broken on purpose")
    parser.add_argument("--trace-rows", type=int, default=int(_env_number("BENCH_TRACE_ROWS", TRACE_ROWS)),
                        help="rows of the table trace latency is measured on (default %(default)s)")
    parser.add_argument("--audit-rows", type=int, default=int(_env_number("BENCH_AUDIT_ROWS", AUDIT_ROWS)),
                        help="rows of the publish audit's window in the audit section (default %(default)s)")
    parser.add_argument("--cdc-records", type=int, default=None,
                        help="change events per envelope format of the cdc section (default: two batches)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--port", type=int, default=int(_env_number("BENCH_BROKER_PORT", DEFAULT_BROKER_PORT)),
                        help="the scratch broker's port")
    parser.add_argument("--out", type=Path, default=config.REPO_ROOT / "reports" / "bench",
                        help="where report.md, the PNGs and results.json go (the stack lives in OUT/stack)")
    parser.add_argument("--sections", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                        default=list(SECTIONS), help=f"subset of {','.join(SECTIONS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.records < 3_000:
        parser.error("--records must be at least 3000 (three batches of at least 1000)")
    if args.audit_rows < 200_000:
        parser.error("--audit-rows must be at least 200000 (two of the table builder's commits)")
    if args.cdc_records is None:
        args.cdc_records = int(_env_number("BENCH_CDC_RECORDS", 2 * batch_size(args.records)))
    if args.cdc_records < 3_000:
        parser.error("--cdc-records must be at least 3000")
    if args.trace_rows < 3_000:
        parser.error("--trace-rows must be at least 3000")
    if args.repeats < 1 or args.pipeline_repeats < 1:
        parser.error("repeats must be at least 1")
    return args


class Bench:
    """One benchmark run: holds the stack, the data and the results as they come in."""

    def __init__(self, args: argparse.Namespace, progress: Progress):
        self.args = args
        self.say = progress
        self.out: Path = args.out
        self.stack = BenchStack(self.out / "stack", args.port)
        self.batch_size = batch_size(args.records)
        self.large_table: tuple[PipelineSpec, dict[str, Any]] | None = None  # the proof section's, and its numbers
        self.results: dict[str, Any] = {
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": {
                "command": "make bench" if os.environ.get("MAKELEVEL")
                else " ".join(["python -m bench.run", *sys.argv[1:]]),
                "records": args.records, "batch_size": self.batch_size, "repeats": args.repeats,
                "pipeline_repeats": args.pipeline_repeats, "rates": args.rates, "triggers": args.triggers,
                "phase_s": args.phase_seconds, "drain_s": args.drain_seconds, "bad_ratio": args.bad_ratio,
                "seed": args.seed, "broker_port": args.port, "cores": os.cpu_count(), "trace_rows": args.trace_rows,
                "sections": args.sections},
            "errors": {},
        }
        self.backlog: workloads.Backlog | None = None
        self.specs: dict[str, Any] = {}

    # -- helpers -------------------------------------------------------------------------------

    def section(self, name: str, fn: Callable[[], None]) -> None:
        """Run one section; a failure is recorded in results['errors'] and the run goes on."""
        self.say(f"== {name}")
        started = time.monotonic()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one failed measurement must not lose the others
            message = f"{type(exc).__name__}: {exc}"
            self.results["errors"][name] = message
            self.say(f"!! {name} failed: {message}")
            (self.out / f"error-{name}.txt").write_text(traceback.format_exc())
        finally:  # where the run's time goes, against its budget (report.BUDGET_S)
            self.results.setdefault("section_seconds", {})[name] = round(time.monotonic() - started, 1)

    @property
    def value_bytes_per_record(self) -> float:
        assert self.backlog is not None
        return self.backlog.value_bytes / max(1, self.backlog.count)

    # -- sections ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Fresh stack, the records, the topics."""
        status = self.stack.up()
        self.stack.activate()
        self.say(f"scratch stack up: broker {status['bootstrap_servers']}, home {status['home']}")
        self.results["machine"] = machine.facts()
        n, b = self.args.records, self.batch_size
        self.specs = {
            "p3": self.stack.write_spec("bench_p3", "bench-p3", 3, b),
            "p12": self.stack.write_spec("bench_p12", "bench-p12", 12, b),
            "mem": self.stack.write_spec("bench_mem", "bench-mem", 3, b),
        }
        self.backlog = workloads.generate(self.specs["p3"], n, self.args.bad_ratio, self.args.seed)
        self.say(f"generated {n:,} records ({self.backlog.bad:,} broken, {self.backlog.value_bytes / 1e6:.1f} MB of "
                 f"values) in {self.backlog.seconds:.1f}s")
        platform = self.stack.platform()
        loaded = {}
        for key, count in (("p3", n), ("p12", n), ("mem", b)):
            spec = self.specs[key]
            delivery = workloads.load_topic(spec, platform, self.backlog.head(count))
            loaded[spec.source.topic] = {"sent": delivery.sent, "seconds": round(delivery.seconds, 2),
                                         "partitions": spec.source.partitions}
            self.say(f"loaded {delivery.sent:,} records into {spec.source.topic} ({spec.source.partitions} partitions) "
                     f"in {delivery.seconds:.1f}s")
        self.results["data"] = {"records": n, "bad": self.backlog.bad, "value_bytes": self.backlog.value_bytes,
                                "mean_value_bytes": self.value_bytes_per_record,
                                "generate_s": round(self.backlog.seconds, 2), "topics": loaded}

    def ceilings(self) -> None:
        platform = self.stack.platform()
        kafka = platform.kafka()
        consume: dict[str, Any] = {}
        for key in ("p3", "p12"):
            spec = self.specs[key]
            runs = [workloads.consume_ceiling(kafka, spec.source.topic, range(spec.source.partitions),
                                              self.args.records) for _ in range(self.args.repeats)]
            consume[key] = _medians(runs)
            self.say(f"consume ceiling {key}: {consume[key]['median_records_per_s']:,.0f} records/s end to end, "
                     f"{_fmt(consume[key].get('median_after_first_records_per_s'))} records/s after the first fetch "
                     f"({consume[key]['median_mb_per_s']:.1f} MB/s end to end)")
        self.results.setdefault("ceilings", {})["consume"] = consume
        # the true ceiling: as many reader processes as the pipeline has task slots, disjoint partitions
        slots = workloads.task_slots()
        parallel: dict[str, Any] = {"processes": slots}
        for key in ("p3", "p12"):
            spec = self.specs[key]
            runs = [workloads.parallel_consume_ceiling(kafka, spec.source.topic, range(spec.source.partitions), slots,
                                                       self.stack.broker_pid())
                    for _ in range(self.args.repeats)]
            parallel[key] = _medians(runs)
            self.say(f"parallel consume ceiling {key} ({slots} processes): "
                     f"{parallel[key]['median_records_per_s']:,.0f} records/s "
                     f"({parallel[key]['median_mb_per_s']:.1f} MB/s)")
        self.results["ceilings"]["parallel_consume"] = parallel

        spec = self.specs["p3"]
        raw = workloads.read_topic(kafka, spec.source.topic, range(spec.source.partitions), self.args.records)
        sample = raw[: min(len(raw), 100_000)]
        sample_bytes = sum(len(r.value or b"") for r in sample)
        decode_runs = []
        for _ in range(self.args.repeats):
            _, seconds = workloads.decode(spec, spec.source.topic, sample)
            decode_runs.append(workloads.Throughput(len(sample), sample_bytes, seconds))
        decode = {**_medians(decode_runs), "sample": len(sample)}
        self.results["ceilings"]["decode"] = decode
        self.say(f"pipeline decoder on one core: {decode['median_records_per_s']:,.0f} records/s")
        by_format: dict[str, Any] = {"json": decode}
        directory = workloads.scratch_dir()
        try:  # the same records in each value format the platform reads
            for fmt in SCHEMA_FILE_SUFFIX:
                wire_spec, wire_sample = workloads.as_format(spec, sample, directory / fmt, fmt)
                wire_bytes = sum(len(r.value or b"") for r in wire_sample)
                runs = [workloads.Throughput(len(wire_sample), wire_bytes,
                                             workloads.decode(wire_spec, spec.source.topic, wire_sample)[1])
                        for _ in range(self.args.repeats)]
                by_format[fmt] = {**_medians(runs), "sample": len(wire_sample)}
                self.say(f"pipeline decoder on one core, {fmt}: {by_format[fmt]['median_records_per_s']:,.0f} "
                         f"records/s ({by_format[fmt]['median_mb_per_s']:.1f} MB/s)")
            for fmt in ("json", "avro"):  # Debezium change events of the same rows
                # a third of the sample: change events decode several times slower than rows
                cdc_spec, cdc_sample = workloads.as_change_events(spec, sample[:len(sample) // 3],
                                                                  directory / f"debezium_{fmt}", fmt)
                cdc_bytes = sum(len(r.value or b"") for r in cdc_sample)
                runs = [workloads.Throughput(len(cdc_sample), cdc_bytes,
                                             workloads.decode(cdc_spec, cdc_spec.source.topic, cdc_sample)[1])
                        for _ in range(self.args.repeats)]
                name = f"debezium_{fmt}"
                by_format[name] = {**_medians(runs), "sample": len(cdc_sample)}
                self.say(f"pipeline decoder on one core, Debezium {fmt} change events: "
                         f"{by_format[name]['median_records_per_s']:,.0f} records/s "
                         f"({by_format[name]['median_mb_per_s']:.1f} MB/s)")
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self.results["ceilings"]["decode_by_format"] = by_format

        rows, _ = workloads.decode(spec, spec.source.topic, raw)
        offsets = set(zip(rows.column("_kafka").combine_chunks().field("partition").to_pylist(),
                          rows.column("_kafka").combine_chunks().field("offset").to_pylist()))
        valid_bytes = sum(len(r.value or b"") for r in raw if (r.partition, r.offset) in offsets)
        directory = workloads.scratch_dir()
        try:
            write_runs = [workloads.write_ceiling(rows, valid_bytes, directory) for _ in range(self.args.repeats)]
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self.results["ceilings"]["write"] = _medians(write_runs)
        self.say(f"write ceiling: {self.results['ceilings']['write']['median_records_per_s']:,.0f} rows/s")

    def pipeline(self) -> None:
        runs: dict[str, list[workloads.OnceRun]] = {"p3": [], "p12": []}
        for repeat in range(1, self.args.pipeline_repeats + 1):
            for key in ("p3", "p12"):  # interleaved, so a noisy minute hurts both alike
                base = self.specs[key]
                spec = self.stack.write_spec(f"{base.name}_r{repeat}", base.source.topic, base.source.partitions,
                                             self.batch_size)
                run = workloads.run_once(self.stack, spec, self.args.records, self.value_bytes_per_record)
                runs[key].append(run)
                r = run.rate
                self.say(f"{spec.name}: {r.records:,} records in {r.batches} batches, steady "
                         f"{_fmt(r.steady_rate)} rec/s, end to end {_fmt(r.wall_rate)} rec/s "
                         f"(wall {run.wall_s:.1f}s), peak RSS {run.memory['peak_mb']:,.0f} MB")
        pipeline = {}
        for key, found in runs.items():
            pipeline[key] = _pipeline_summary(found)
        self.results["pipeline"] = pipeline

        mem = workloads.run_once(self.stack, self.specs["mem"], self.batch_size, self.value_bytes_per_record)
        self.say(f"{mem.pipeline}: 1x backlog ({self.batch_size:,} records), peak RSS {mem.memory['peak_mb']:,.0f} MB")
        large = _median_run(runs["p3"], key=lambda r: r.memory["peak_mb"])
        self.results["memory"] = {
            "batch_size": self.batch_size,
            "small": {"backlog": self.batch_size, "pipeline": mem.pipeline, **mem.memory},
            "large": {"backlog": self.args.records, "pipeline": large.pipeline, **large.memory,
                      "peak_mb": stats.median(r.memory["peak_mb"] for r in runs["p3"])},
        }

    def formats(self) -> None:
        """`lakehouse ingest --once` over the same records in each wire format (Confluent framing, the
        contract's writer schema from the spec's schema folder; the broken values as they are), beside
        the pipeline section's JSON runs of the 3-partition topic."""
        assert self.backlog is not None
        platform = self.stack.platform()
        out: dict[str, Any] = {}
        for fmt in WIRE_FORMATS:
            topic = f"bench-{fmt.replace('_', '-')}"
            runs = []
            for repeat in range(1, self.args.pipeline_repeats + 1):
                spec = self.stack.write_spec(f"bench_{fmt}_r{repeat}", topic, 3, self.batch_size, value_format=fmt)
                if repeat == 1:
                    wire = workloads.encode_backlog(spec, self.backlog.records)
                    loaded = workloads.load_topic(spec, platform, wire)
                    per_record = sum(len(r.value or b"") for r in wire) / len(wire)
                    self.say(f"loaded {loaded.sent:,} {fmt} records into {topic} in {loaded.seconds:.1f}s "
                             f"({per_record:.0f} bytes per value)")
                run = workloads.run_once(self.stack, spec, self.args.records, per_record)
                runs.append(run)
                self.say(f"{spec.name}: steady {_fmt(run.rate.steady_rate)} rec/s, end to end "
                         f"{_fmt(run.rate.wall_rate)} rec/s, CPU s by role {run.memory.get('steady_cpu_by_role_s')}")
            out[fmt] = {**_pipeline_summary(runs), "value_bytes_per_record": per_record}
        self.results["formats"] = out

    def cdc(self) -> None:
        """A Debezium change stream (JSON and Avro envelopes, a snapshot then 20 % updates and 5 % deletes over
        a table keyed by product_id) through `lakehouse ingest --once` into a merge-on-read table: its rate
        beside the append runs, whether the table holds exactly the source's rows, and (the JSON envelopes'
        table) a full scan before and after maintenance folds the delete files back."""
        platform = self.stack.platform()
        catalog = open_catalog(platform, "lake")
        out: dict[str, Any] = {"updates": CDC_UPDATES, "deletes": CDC_DELETES}
        for fmt in ("json", "avro"):
            count = self.args.cdc_records
            # the append runs' batch size: a batch's fixed costs (its MERGE) weigh the same on both sides
            spec = self.stack.write_cdc_spec(f"bench_cdc_{fmt}", f"bench-cdc-{fmt}", 3, self.batch_size, fmt)
            records, summary = workloads.change_backlog(spec, count, self.args.seed, CDC_UPDATES, CDC_DELETES)
            loaded = workloads.load_topic(spec, platform, records)
            per_record = sum(len(r.value or b"") for r in records) / len(records)
            self.say(f"loaded {loaded.sent:,} Debezium {fmt} change events into {spec.source.topic} "
                     f"({dict(sorted(summary.by_op.items()))})")
            run = workloads.run_once(self.stack, spec, len(records), per_record)
            rows = catalog.load_table(spec.target.table).scan(selected_fields=tuple(spec.target.key)).to_arrow()
            keys = set(rows.column(spec.target.key[0]).to_pylist())
            expected = {pk[0] if isinstance(pk, tuple) else pk for pk in summary.final_rows}
            out[fmt] = {**run.to_json(), "by_op": summary.by_op, "rows": rows.num_rows, "expected_rows": len(expected),
                        "table_matches_source": rows.num_rows == len(keys) and keys == expected}
            out[fmt].pop("batch_metrics", None)
            matches = "= the source" if out[fmt]["table_matches_source"] else f"NOT the source: {len(expected)}"
            self.say(f"{spec.name}: steady {_fmt(run.rate.steady_rate)} rec/s, {rows.num_rows:,} rows ({matches})")
            if fmt == "json":  # the Avro table holds the same rows from the same batches: the same files to read
                maintained = out[fmt]["maintenance"] = workloads.maintenance_effect(self.stack, spec, self.args.repeats)
                self.say(f"{spec.name}: scan {_fmt(maintained['scan_median_before'], 3)}s -> "
                         f"{_fmt(maintained['scan_median_after'], 3)}s after maintenance")
        self.results["cdc"] = out

    def scaling(self) -> None:
        """The p3 `--once` run again on one core (local[1]); the pipeline section's local[2] runs are the
        other half of the ratio. CPU seconds per role say where the second core went."""
        base = self.specs["p3"]
        runs = []
        for repeat in range(1, self.args.pipeline_repeats + 1):
            spec = self.stack.write_spec(f"{base.name}_one_core_r{repeat}", base.source.topic, base.source.partitions,
                                         self.batch_size)
            run = workloads.run_once(self.stack, spec, self.args.records, self.value_bytes_per_record,
                                     env={"LAKEHOUSE_SPARK_MASTER": "local[1]"})
            runs.append(run)
            self.say(f"{spec.name} (local[1]): steady {_fmt(run.rate.steady_rate)} rec/s, CPU s by role "
                     f"{run.memory.get('cpu_by_role_s')}")
        self.results["scaling"] = {"local[1]": _pipeline_summary(runs)}

    def small_batches(self) -> None:
        assert self.backlog is not None
        spec = self.stack.write_spec("bench_small", "bench-small", 3, FRESHNESS_BATCH, trigger_interval="1s")
        run = workloads.run_small_batches(self.stack, spec, self.backlog.records, per_batch=SMALL_BATCH)
        self.results["small_batches"] = run.to_json()
        self.say(f"{SMALL_BATCH}-record batches: median {_fmt(run.to_json()['median_s'], 3)}s, "
                 f"max {_fmt(run.to_json()['max_s'], 3)}s over {len(run.batches)} batches")

    def audit(self) -> None:
        """The publish gate's Great Expectations audit of a window of --audit-rows rows (Spark's datasource at
        the spec's `publish.spark_audit_rows`), beside 1,000,000 rows on both paths and 500,000 on pandas:
        each in its own process, as an Airflow worker runs it, its process tree's memory sampled."""
        # the proof section's table when it holds as many rows (the same builder's orders): built once
        large = self.large_table
        if large is not None and large[1]["rows"] == self.args.audit_rows:
            spec, built = large
        else:  # a table of its own (a spec's table is created once: another row count needs another table)
            spec, built = self.stack.write_spec("bench_audit", "bench-audit", 3, self.batch_size), None
        found = self.results["audit"] = audit.audit_at_scale(self.stack, spec, self.args.audit_rows,
                                                              progress=self.say, built=built)
        for run in found["runs"]:
            self.say(f"audit of {run['rows']:,} rows on {run.get('path')}: {_fmt(run.get('seconds'), 1)}s, worker "
                     f"peak {_fmt(run['peak_by_role_mb'].get('driver'))} MB, whole tree {_fmt(run['peak_rss_mb'])} MB")

    def s3(self) -> None:
        """The small-batch measurement again on a second scratch stack whose warehouse is on the stack's S3
        server (`lakehouse stack up --object-store`): what a batch costs when every file and metadata
        write is an object-store request, and how many requests of each kind a batch makes (the server's
        own counts, reset after the warm-up batch)."""
        assert self.backlog is not None
        from lakehouse_dev import object_store

        stack = BenchStack(self.out / "stack-s3", self.args.port + 11)
        try:
            status = stack.up("--object-store")
            stack.activate()
            endpoint = ((status.get("services") or {}).get("object_store") or {}).get("endpoint")
            if not endpoint:
                raise BenchError(f"`lakehouse stack up --object-store` named no object-store endpoint: {status}")
            spec = stack.write_spec("bench_s3", "bench-s3", 3, FRESHNESS_BATCH, trigger_interval="1s")
            counts: dict[str, Any] = {}  # the batches' requests only, not those of reading their events after
            run = workloads.run_small_batches(stack, spec, self.backlog.records, per_batch=SMALL_BATCH,
                                              warm=lambda: object_store.request_counts(endpoint, reset=True),
                                              done=lambda: counts.update(object_store.request_counts(endpoint)))
        finally:
            with contextlib.suppress(Exception):
                stack.down()
            self.stack.activate()
        found = run.to_json()
        batches = max(1, found["batches"])
        per_batch = {"all": round(counts.get("total", 0) / batches, 1),
                     **{key: round(value / batches, 1) for key, value in (counts.get("classes") or {}).items()}}
        operations: dict[str, int] = {}
        for bucket in (counts.get("buckets") or {}).values():
            for operation, count in (bucket.get("operations") or {}).items():
                operations[operation] = operations.get(operation, 0) + count
        by_operation = {key: round(value / batches, 1) for key, value in sorted(operations.items())}
        self.results["s3"] = {**found, "warehouse": status.get("warehouse"), "requests_per_batch": per_batch,
                              "requests_per_batch_by_operation": by_operation, "request_counts": counts}
        self.say(f"S3 warehouse, {SMALL_BATCH}-record batches: median {_fmt(found['median_s'], 3)}s, "
                 f"max {_fmt(found['max_s'], 3)}s over {found['batches']} batches; requests per batch {per_batch}")

    def partitions(self) -> None:
        """A continuous job over 1,000 partitions, each batch 20 records from every partition: the batch's
        cost when it holds 1,000 short ranges (bench/partitions.py measures where such a batch's time goes)."""
        assert self.backlog is not None
        spec = self.stack.write_spec("bench_wide", "bench-wide", WIDE_PARTITIONS, FRESHNESS_BATCH,
                                     trigger_interval="1s")
        run = workloads.run_wide_batches(self.stack, spec, self.backlog.records, per_partition=WIDE_PER_PARTITION)
        found = self.results["partitions"] = {**run.to_json(), "partitions": WIDE_PARTITIONS,
                                              "per_partition": WIDE_PER_PARTITION}
        self.say(f"{WIDE_PARTITIONS:,} partitions x {WIDE_PER_PARTITION} records: median batch "
                 f"{_fmt(found['median_s'], 2)}s, max {_fmt(found['max_s'], 2)}s over {found['batches']} batches "
                 f"({found['stages_s']})")

    def baseline(self) -> None:
        platform = self.stack.platform()
        spec = self.specs["p3"]
        out = {}
        for every in BASELINE_EVERY:
            runs = []
            for repeat in range(1, self.args.repeats + 1):
                run = workloads.hand_written_baseline(platform, spec.source.topic, range(spec.source.partitions),
                                                      self.args.records, f"bench.baseline_n{every}_r{repeat}", every)
                runs.append(run)
                self.say(f"baseline N={every:,} run {repeat}: {run.rate:,.0f} records/s ({run.commits} commits, "
                         f"{run.skipped:,} skipped)")
            rates = [r.rate for r in runs]
            out[str(every)] = {"runs": [r.to_json() for r in runs], "median_records_per_s": stats.median(rates),
                               "median_mb_per_s": stats.median(r.to_json()["mb_per_s"] for r in runs)}
        self.results["baseline"] = out

    def freshness(self) -> None:
        assert self.backlog is not None
        runs = []
        for trigger in self.args.triggers:
            name = f"bench_fresh_t{trigger:g}".replace(".", "_")
            # a batch holds what a trigger brings at the highest rate, twice over: capped below it, the job
            # falls behind by construction and the phase measures the cap, not the job
            cap = max(FRESHNESS_BATCH, 2 * max(self.args.rates) * math.ceil(trigger))
            # a trigger longer than a write interval commits files written in steps, as the Connect sink does
            write_s = self.args.write_interval
            steps = f"{write_s:g}s" if write_s and trigger > write_s else None
            spec = self.stack.write_spec(name, name.replace("_", "-"), 3, cap, trigger_interval=f"{trigger:g}s",
                                         write_interval=steps)
            self.specs[f"fresh_{trigger:g}"] = spec
            rates = ", ".join(f"{r:,}/s" for r in self.args.rates)
            self.say(f"continuous job {name}, trigger {trigger:g}s" + (f", files written every {steps}" if steps else "")
                     + f": phases {rates}")
            run = workloads.run_freshness(self.stack, spec, self.backlog.records, self.args.rates,
                                          self.args.phase_seconds, self.args.drain_seconds, progress=self.say)
            for p in run.phases:
                self.say(f"  {p.rate:,}/s: p50 {_fmt(p.p50, 2)}s p95 {_fmt(p.p95, 2)}s p99 {_fmt(p.p99, 2)}s, "
                         f"censored {p.censored:,}, kept up: {p.kept_up}")
            found = {**run.to_json(), "write_interval_s": write_s if steps else None}
            if steps:  # a batch written in steps lasts a trigger, its waits included: no batch cost to fit
                found["batch_cost"] = None
            runs.append(found)
        self.results["freshness"] = runs

    def maintenance(self) -> None:
        spec = self.specs.get(f"fresh_{min(self.args.triggers):g}")
        if spec is None:
            raise BenchError("maintenance measures the table a freshness run left; the freshness section did not run")
        m = workloads.maintenance_effect(self.stack, spec, self.args.repeats)
        self.results["maintenance"] = m
        self.say(f"maintenance of {m['table']}: files {m['files_before']} -> {m['files_after']}, scan "
                 f"{_fmt(m['scan_median_before'], 3)}s -> {_fmt(m['scan_median_after'], 3)}s")

    def proof(self) -> None:
        """Trace latency on a large table, verification throughput on an ingested pipeline."""
        spec = self.stack.write_spec("bench_trace", "bench-trace", proof.PARTITIONS, self.batch_size)
        platform = self.stack.platform()
        built = proof.build_table(open_catalog(platform, spec.catalog), spec, self.args.trace_rows, progress=self.say)
        self.large_table = (spec, built)
        self.say(f"trace table {built['table']}: {built['rows']:,} rows, {built['files']:,} files in "
                 f"{built['commits']} commits, built in {built['build_s']:.0f}s")
        latency = proof.trace_latency(platform, spec, built["rows"], TRACE_LOOKUPS, self.args.seed)
        self.say(f"trace: median {_fmt(latency['median_s'], 3)}s, p95 {_fmt(latency['p95_s'], 3)}s over "
                 f"{latency['lookups']} lookups; {_fmt(latency['files_planned_median'])} of "
                 f"{latency['files_total']:,} files read per lookup")
        ingested = self.stack.pipelines_dir / f"{self.specs['p3'].name}_r1.yaml"
        if ingested.exists():  # the pipeline section's first `--once` run over the whole backlog
            target = load_spec(ingested)
        else:
            base = self.specs["p3"]
            target = self.stack.write_spec("bench_verify", base.source.topic, base.source.partitions, self.batch_size)
            workloads.run_once(self.stack, target, self.args.records, self.value_bytes_per_record)
        throughput = proof.verify_throughput(self.stack, target, self.args.repeats)
        self.say(f"verify {target.name}: {throughput['offsets']:,} offsets, "
                 f"{_fmt(throughput['local_median_offsets_per_s'])} offsets/s in process, "
                 f"{_fmt(throughput['spark']['offsets_per_s'])} offsets/s as a Spark job")
        self.results["proof"] = {"trace_table": built, "trace": latency, "verify": throughput}

    def peers(self) -> None:
        """The Kafka Connect sink, Structured Streaming, the hand-written loop and this pipeline, one after
        another over the same clean backlog (the Connect sink's task dies on the first broken record, so
        broken records are a finding apart), then freshness per trigger, one kill -9 each, broken records."""
        assert self.backlog is not None
        platform = self.stack.platform()
        catalog = open_catalog(platform, "lake")
        n = self.args.records
        clean = workloads.generate(self.specs["p3"], n, 0.0, self.args.seed)
        spec = self.stack.write_spec("bench_clean", "bench-clean", 3, self.batch_size)
        delivery = workloads.load_topic(spec, platform, clean.records)
        self.say(f"loaded {delivery.sent:,} clean records into {spec.source.topic}")
        per_record = clean.value_bytes / n
        work = self.stack.home / "peers"
        running = {"connect": peers.ConnectPeer("connect", self.stack, work / "connect"),
                   "sss": peers.StructuredStreamingPeer("sss", self.stack, work / "sss")}
        out: dict[str, Any] = {"records": n, "topic": spec.source.topic, "value_bytes": clean.value_bytes,
                               "backlog": {}, "freshness": [], "kill": {}, "broken": {}}
        self.results["peers"] = out

        def record(run: peers.BacklogRun) -> None:
            found = out["backlog"][run.system] = run.to_json()
            self.say(f"{found['label']}: {n:,} records in {found['wall_s']:.1f}s from start "
                     f"({_fmt(found['wall_records_per_s'])} rec/s), steady {_fmt(found['steady_records_per_s'])} "
                     f"rec/s over {found['commits']} commits, {_fmt(found['cpu_s_per_100k'], 1)} CPU s per 100k, "
                     f"peak {found['peak_mb']:,.0f} MB, {found['files']} files")

        once = workloads.run_once(self.stack, spec, n, per_record)
        table = catalog.load_table(spec.target.table)
        rows, files = workloads.table_totals(table)
        record(peers.BacklogRun("pipeline", n, rows, once.wall_s, clean.value_bytes,
                                once.memory["cpu_by_role_s"], once.memory.get("steady_cpu_by_role_s", {}),
                                once.memory["peak_mb"], once.memory["peak_by_role_mb"], files,
                                peers.commit_rate(table, per_record),
                                {"max_records_per_batch": self.batch_size, "mode": "--once"}))
        for system, peer in running.items():
            name = f"{system}_backlog"
            target = peers.create_table(catalog, name)
            extra = {"max_offsets": self.batch_size} if system == "sss" else {}
            proc = peer.start(spec.source.topic, name, 1.0, name, backlog=True, **extra)
            record(peers.measure_process(
                system, proc, target, n, clean.value_bytes, self.stack.broker_pid(), 600, peers.LABELS[system],
                {"trigger_s": 1.0, **({"available_now": True, "max_offsets_per_trigger": self.batch_size}
                                      if system == "sss" else {"commit_interval_s": 1.0})},
                per_record, lambda: peer.log_tail(name)))
        record(peers.baseline_backlog(self.stack, spec.source.topic, 3, n, clean.value_bytes, self.batch_size,
                                      per_record))

        for trigger in self.args.peer_triggers:
            for system, peer in running.items():
                run = peers.peer_freshness(peer, self.stack, spec, clean.records, trigger, self.args.peer_rates,
                                           self.args.phase_seconds, self.args.drain_seconds, progress=self.say)
                out["freshness"].append(run.to_json())
                for p in run.phases:
                    self.say(f"  {peers.LABELS[system]}, trigger {trigger:g}s, {p.rate:,}/s: p50 {_fmt(p.p50, 2)}s "
                             f"p95 {_fmt(p.p95, 2)}s, censored {p.censored:,}, kept up: {p.kept_up}; "
                             f"{run.files} files")

        # kill -9: a backlog of one batch size on its own topic is enough to be killed mid-stream
        kill_spec = self.stack.write_spec("bench_kill", "bench-kill", 3, max(1_000, self.batch_size // 4))
        ends = workloads.load_topic(kill_spec, platform, clean.head(self.batch_size)).ends
        out["kill"]["pipeline"] = peers.kill_and_resume(
            lambda: self.stack.spawn("ingest", "--pipeline", kill_spec.name, "--once", log_name="ingest-kill"),
            lambda: peers.load_or_none(catalog, kill_spec.target.table), ends, "lakehouse ingest --once",
            lambda: self.stack.stderr_tail("ingest-kill"))
        for system, peer in running.items():
            name = f"{system}_kill"
            peers.create_table(catalog, name)
            # the Connect worker started again gets its partitions, and its coordinator the committers' answers,
            # once the killed members' group sessions expired (peers.KILL_SESSION_TIMEOUT_MS)
            extra = {"max_offsets": kill_spec.trigger.max_records_per_batch} if system == "sss" else \
                {"session_timeout_ms": peers.KILL_SESSION_TIMEOUT_MS}
            out["kill"][system] = peers.kill_and_resume(
                lambda: peer.start(kill_spec.source.topic, name, 1.0, name, backlog=True, **extra),
                lambda: peers.load_or_none(catalog, f"{peers.NAMESPACE}.{name}"), ends, peers.LABELS[system],
                lambda: peer.log_tail(name))
            out["kill"][system]["settings"] = extra
        out["kill"]["baseline"] = {"exactly_once": None, "note": "keeps no position: a restart reads its "
                                   "assignment from the start again (every committed record duplicated)"}
        for system, found in out["kill"].items():
            self.say(f"kill -9 {peers.LABELS[system]}: {found}")

        out["broken"] = peers.broken_records(running, self.stack, catalog, self.specs["p3"], self.backlog,
                                             self.results.get("baseline"), progress=self.say)
        ingested = self.stack.pipelines_dir / f"{self.specs['p3'].name}_r1.yaml"
        if ingested.exists():  # the pipeline section's run over the same topic
            first = load_spec(ingested)
            out["broken"]["pipeline"] = {
                "rows": peers.rows_of(catalog.load_table(first.target.table)),
                "dead_letters": peers.rows_of(catalog.load_table(first.dead_letter_table))}

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        for old in [*self.out.glob("*.png"), *self.out.glob("error-*.txt"), self.out / "report.md",
                    self.out / "results.json"]:
            old.unlink(missing_ok=True)
        try:
            self.section("prepare", self.prepare)
            if "prepare" not in self.results["errors"]:
                for name in SECTIONS:
                    if name in self.args.sections:
                        self.section(name, getattr(self, name))
        except KeyboardInterrupt:
            self.results["errors"]["interrupted"] = "KeyboardInterrupt"
            self.say("interrupted; stopping the stack and writing what was measured")
        finally:
            with contextlib.suppress(Exception):
                self.stack.down()
                self.say("scratch stack stopped")
        return self.finish()

    def finish(self) -> int:
        self.results["wall_s"] = round(self.say.elapsed, 1)
        if "machine" in self.results:
            self.results["machine"]["load average at end"] = machine.load_average()
        self.results["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.results["targets"] = [t.to_json() for t in stats.evaluate_targets(report.target_inputs(self.results))]
        (self.out / "results.json").write_text(json.dumps(self.results, indent=2, default=str) + "\n")
        plots: list[str] = []
        try:
            plots = report.plot(self.results, self.out)
        except Exception as exc:  # noqa: BLE001 - the Markdown report is still worth writing
            self.results["errors"]["plots"] = f"{type(exc).__name__}: {exc}"
        (self.out / "report.md").write_text(report.render(self.results, plots))
        self.say(f"report: {self.out / 'report.md'} ({len(plots)} plots); results: {self.out / 'results.json'}")
        for t in self.results["targets"]:
            verdict = "not measured" if t["passed"] is None else ("pass" if t["passed"] else "FAIL")
            self.say(f"target {t['name']}: {t['measured']} -> {verdict}")
        if self.results["errors"]:
            self.say(f"sections failed: {', '.join(self.results['errors'])}")
            return 1
        return 0


def _fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _medians(runs: list[workloads.Throughput]) -> dict[str, Any]:
    as_json = [r.to_json() for r in runs]
    out = {"runs": as_json, "median_records_per_s": stats.median(r.rate for r in runs),
           "median_mb_per_s": stats.median(r.mb_per_s for r in runs)}
    if any("after_first_records_per_s" in j for j in as_json):
        out["median_after_first_records_per_s"] = stats.median(j.get("after_first_records_per_s") for j in as_json)
        out["median_after_first_mb_per_s"] = stats.median(j.get("after_first_mb_per_s") for j in as_json)
        out["median_first_record_s"] = stats.median(j.get("first_record_s") for j in as_json)
    return out


def _median_run(runs: list[workloads.OnceRun], key: Callable[[workloads.OnceRun], float]) -> workloads.OnceRun:
    """The run whose `key` is the median (the lower middle one for an even count)."""
    ordered = sorted(runs, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _per_cpu_second(run: dict[str, Any]) -> float | None:
    """Steady records per CPU second of every process of a `--once` run (broker included)."""
    memory = run.get("memory") or {}
    cpu = sum((memory.get("steady_cpu_by_role_s") or {}).values())
    return round(memory["steady_records"] / cpu, 1) if cpu > 0 and memory.get("steady_records") else None


def _pipeline_summary(runs: list[workloads.OnceRun]) -> dict[str, Any]:
    as_json = [r.to_json() for r in runs]
    typical = _median_run(runs, key=lambda r: r.rate.steady_rate or 0.0)
    steady = typical.batches[1:] or typical.batches
    return {
        "median_steady_records_per_cpu_s": stats.median(_per_cpu_second(j) for j in as_json),
        "runs": as_json,
        "median_steady_records_per_s": stats.median(j["steady_records_per_s"] for j in as_json),
        "median_steady_mb_per_s": stats.median(j["steady_mb_per_s"] for j in as_json),
        "median_wall_records_per_s": stats.median(j["wall_records_per_s"] for j in as_json),
        "median_wall_mb_per_s": stats.median(j["wall_mb_per_s"] for j in as_json),
        "stages_s": stats.stage_breakdown([b["metrics"] for b in steady]),
        "task_s": stats.task_seconds([b["metrics"] for b in steady]),
        "stage_records": int(sum(b["metrics"].get("records", 0) for b in steady)),
        "stage_batches": len(steady),
        "stage_run": typical.pipeline,
    }


def _interrupt_on_sigterm() -> None:
    """SIGTERM (a CI timeout, `kill`) becomes KeyboardInterrupt, so the scratch stack and any running
    ingest job are still stopped and what was measured is still reported."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _interrupt_on_sigterm()
    progress = Progress()
    progress(f"bench: {args.records:,} records, batch size {max(1_000, args.records // 3):,}, repeats "
             f"{args.repeats} (pipeline {args.pipeline_repeats}), sections {', '.join(args.sections)}; "
             f"output {args.out}")
    return Bench(args, progress).run()


if __name__ == "__main__":
    sys.exit(main())
