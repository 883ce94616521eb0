"""Verify a range exactly once: every offset Kafka still holds is in exactly one of the pipeline's tables.

`verify(spec)` reads what Kafka holds in a window of offsets and the `_kafka` coordinates of the
rows of every table of the pipeline (its data tables, fan-out included, and the dead-letter table:
`spec.positioned_tables`) in that window, and reports

- **missing**: an offset Kafka holds, below the pipeline's committed position, held by no table;
- **duplicated**: an offset held more than once across the tables (each place named);
- **foreign**: a row no commit of the pipeline accounts for: another topic, no coordinates, a
  partition the topic lacks, at or past its table's committed position, inside a recorded gap,
  below the first offset the table ever ingested, or at an offset where Kafka delivers no record
  (a transaction marker or an aborted record);
- **gaps**: offsets that aged out of Kafka before they were ingested, as the commits recorded them
  (`lakehouse.gaps`): reported as gaps, never as missing.

Offsets below Kafka's earliest offset (aged out after they were ingested) are checked for
duplicates and foreign rows only: nobody can say any more whether Kafka had them.

**Upsert tables** replace and delete rows by key, so "every offset once" does not hold for them.
What holds instead, and is checked: no offset is held twice across the data table, the
dead-letter table and the tombstone ledger; no row is foreign (as above); and, for a pipeline
whose table key is the Kafka key (tombstones delete keys, `spec.tombstones_delete`) and that does
not fan out, for every key with a record in the window, the newest of its records that is not a
dead letter (newest as the MERGE decides it: within a partition the higher offset, across
partitions the later Kafka timestamp) is the key's row, unless a newer record (outside the window)
is; if that newest record is a tombstone the key has no older row and the ledger holds that
tombstone or a newer one. A key whose newest record is neither its row nor a dead letter is
**missing**, a row older than its key's newest record or tombstone is **stale**, and a key whose row
vanished without a tombstone is **missing**. A dead letter superseded by a newer valid record of its
key leaves no trace to check without decoding values; that case is left out.

**What is verified** (the window), one of:

- `incremental` (the default, what the `<pipeline>_verify` DAG runs): per table, the snapshots of
  main's lineage after the newest snapshot an earlier passing incremental or full verification
  verified, up to the head (or the snapshot asked for: the publish gate verifies exactly the
  snapshots it is about to publish). The window is the offsets those snapshots' summaries hold
  (`lakehouse.offsets`, `lakehouse.gaps`) and the coordinate bounds (file metrics) of every data
  file they added or removed, so a row deleted, duplicated or appended by hand is in it (for an
  upsert table also the coordinates of the rows that came or went: MERGE deletes by position,
  and position delete files carry no coordinates). Without
  such an earlier verification, or when a snapshot adds position or equality deletes to an append
  table, the run is `full`: every row of every table, every offset Kafka holds up to the committed
  position. Each passing incremental or full run is a `verify` event naming the snapshot it
  verified per table; the next run starts after it. Together they form a chain: every state it
  names was proven, and the publish gate (lakehouse.wap.publish) checks against it.
- `since`: the snapshots committed in the last DURATION; `snapshots`: the snapshots FROM..TO
  (inclusive) of one table's lineage. These check a range on demand and are recorded, but never
  start or extend the chain.

**Where it runs**: the window is cut into pieces of at most PIECE_OFFSETS offsets of one partition.
A piece reads its offsets from Kafka with the ingest reader's consumer settings
(lakehouse.audit.coordinates.read_kafka: committed records only, as ingestion reads them) and its rows
with pyiceberg, the data files pruned by their `_kafka` bounds, and checks them (`check_piece`; the
checks themselves, `check_rows`, `newest_per_key` and `check_keys`, are pure). Pieces run in this
process, or as the tasks of one Spark job when the window holds more than
SPARK_ABOVE_OFFSETS offsets (`engine="auto"`); only their findings come back. The per-key check of
upsert tables runs on the driver over each key's newest record in the window.

**The modules**: this one runs a verification and records it; `verify_model` holds what it says
(Problem, Findings, TableScope, Verification), `windows` which snapshots and offsets it covers (the
chain and the plan), `checks` one piece (`check_piece`, `check_rows`) and `keys` the upsert tables'
keys (`TableKeys`, `newest_per_key`, `newer`, `check_keys`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import IsNull, Or
from pyiceberg.io.pyarrow import ArrowScan

from lakehouse.audit import windows
from lakehouse.audit.checks import PartitionFacts, Piece, PieceResult, TableRead, check_piece
from lakehouse.audit.coordinates import plan_files
from lakehouse.audit.intervals import Coverage
from lakehouse.audit.keys import NEWEST, check_keys, key_text, newest_per_key
from lakehouse.audit.verify_model import Findings, Problem, Verification
from lakehouse.core import config, events
from lakehouse.core.errors import VerifyError
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.plan import split_for_tasks
from lakehouse.ingest.taskwriter import io_properties, shipped_metadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("lakehouse.verify")

PIECE_OFFSETS = 1_000_000       # offsets of one partition checked by one piece (memory per piece)
SPARK_ABOVE_OFFSETS = 5_000_000  # engine "auto": windows larger than this run as a Spark job
ENGINES = ("auto", "local", "spark")


# ---------------------------------------------------------------------------- running a verification


MAX_SPLIT_OFFSETS = 10 ** 9  # a window interval longer than this (sparse made-up offsets) is one piece


def _pieces(plan: windows.Plan, slots: int = 1) -> list[Piece]:
    """The window cut into pieces of one partition: Kafka's part in at most PIECE_OFFSETS offsets (and
    at least `slots` pieces in all, for a Spark job's task slots), the rest (rows only) likewise unless
    longer than MAX_SPLIT_OFFSETS."""
    spec, state = plan.spec, plan.state
    reads = [(s, shipped_metadata(s.table.metadata), io_properties(s.table.io.properties),
              [(t, windows.file_window(s.table, t.file)) for t in s.tasks])
             for s in plan.tables if s.table is not None and s.tasks]
    floors = {s.name: s.lineage.floor() for s in plan.tables if s.lineage is not None}
    total = plan.kafka.count
    tasks = max(slots, -(-total // PIECE_OFFSETS))
    spans = split_for_tasks(plan.kafka.ranges(spec.source.topic), tasks, 1)
    rest = plan.window.difference(plan.kafka)
    spans += split_for_tasks([r for r in rest.ranges(spec.source.topic) if r.count <= MAX_SPLIT_OFFSETS],
                             max(1, -(-rest.count // PIECE_OFFSETS)), PIECE_OFFSETS)
    spans += [r for r in rest.ranges(spec.source.topic) if r.count > MAX_SPLIT_OFFSETS]
    pieces = []
    for rng in sorted(spans):
        p = rng.partition
        facts = PartitionFacts(
            topic=spec.source.topic, partition=p, in_topic=p in state.partitions, earliest=state.earliest.get(p, 0),
            committed=plan.committed.get(p, 0),
            positions={s.name: s.scope.positions.get(p) for s in plan.tables
                       if s.role != "tombstones" and s.scope.to is not None},
            gaps=plan.gaps.get(p), floors={t: low[p] for t, low in floors.items() if p in low})
        span = Coverage.of({p: [(rng.start, rng.end)]})
        tables = tuple(TableRead(s.name, s.role, metadata, io, tuple(t for t, cov in bounds
                                                                     if cov is None or cov.intersection(span)),
                                 s.columns) for s, metadata, io, bounds in reads)
        pieces.append(Piece(facts, rng.start, rng.end, tuple(plan.kafka.get(p).clip(rng.start, rng.end)),
                            tables, spec.target.mode == "upsert", plan.key_check))
    return pieces


_NO_COORDINATES = Or(IsNull(term="_kafka.partition"), IsNull(term="_kafka.offset"))


def _strays(plan: windows.Plan) -> Findings:
    """Rows without source coordinates (foreign), in the files that may hold them: every live file whose
    metrics count nulls there in a full run, those the verified snapshots added otherwise."""
    found = Findings()
    for s in plan.tables:
        if s.table is None or s.scope.to is None or (plan.mode != "full" and not plan.null_rows.get(s.name)):
            continue
        tasks = [t for t in plan_files(s.table, s.scope.to, _NO_COORDINATES)
                 if plan.mode == "full" or t.file.file_path in plan.null_rows[s.name]]
        if not tasks:
            continue
        scan = s.table.scan(snapshot_id=s.scope.to, selected_fields=("_kafka.topic",), row_filter=_NO_COORDINATES)
        rows = ArrowScan(scan.table_metadata, scan.io, scan.projection(), scan.row_filter).to_table(tasks).num_rows
        found.rows += rows

        def foreign(i: int, name: str = s.name) -> Problem:
            return Problem("foreign", None, None, (name,), "a row without source coordinates (_kafka.partition or "
                                                           "_kafka.offset is null)", topic=None)

        found.add_many("foreign", rows, foreign)
    return found


_KEY_ROWS = pa.schema([("key", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                       ("timestamp_ms", pa.int64()), ("position", pa.decimal128(38, 0)), ("source_ts", pa.int64())])


def _key_rows(s: windows.TableState | None, keys: tuple[str, ...], cdc: bool = False) -> pa.Table:
    """An upsert table's (or the ledger's) rows as key (`key_text`), partition, offset, timestamp_ms and, for
    a change stream's data table (`cdc`), its `_cdc` position and source_ts in ms (_KEY_ROWS)."""
    if s is None or s.table is None or s.scope.to is None:
        return _KEY_ROWS.empty_table()
    order = ("_cdc.position", "_cdc.source_ts") if cdc else ()
    data = s.table.scan(snapshot_id=s.scope.to, selected_fields=(*keys, "_kafka.partition", "_kafka.offset",
                                                                 "_kafka.timestamp", *order)).to_arrow()
    kafka = data.column("_kafka")

    def millis(column) -> pa.Array:
        micros = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        return pc.divide(micros, 1000)

    n = data.num_rows
    position = pc.struct_field(data.column("_cdc"), "position") if cdc else pa.nulls(n, pa.decimal128(38, 0))
    source_ts = millis(pc.struct_field(data.column("_cdc"), "source_ts")) if cdc else pa.nulls(n, pa.int64())
    return pa.table([key_text([data.column(k) for k in keys]), pc.struct_field(kafka, "partition"),
                     pc.struct_field(kafka, "offset"), millis(pc.struct_field(kafka, "timestamp")),
                     pc.cast(position, pa.decimal128(38, 0)), source_ts], schema=_KEY_ROWS)


def _run_pieces(pieces: list[Piece], kafka_conf: dict, spec: PipelineSpec, registry: dict | None, spark,
                progress: Callable[[str], None]) -> list[PieceResult]:
    """Each piece's result: in this process one after the other, or as the tasks of one Spark job."""
    total = sum(p.kafka_offsets for p in pieces)
    if spark is not None:
        from lakehouse.core import sparkenv

        progress(f"running {len(pieces)} pieces as a Spark job ({total} offsets to read from Kafka)")

        def run(items):
            sparkenv.steady_zip_imports()
            for piece in items:
                yield check_piece(piece, kafka_conf, spec, registry)

        with sparkenv.job_group(spark, f"lakehouse-verify-{spec.name}"):
            collected: list[PieceResult] = \
                spark.sparkContext.parallelize(pieces, len(pieces)).mapPartitions(run).collect()
            return collected
    results, done = [], 0
    for i, piece in enumerate(pieces, 1):
        results.append(check_piece(piece, kafka_conf, spec, registry))
        done += piece.kafka_offsets
        progress(f"piece {i}/{len(pieces)} (partition {piece.facts.partition}, offsets [{piece.start}, "
                 f"{piece.end})): {done}/{total} offsets read from Kafka")
    return results


def verify(spec: PipelineSpec, platform: config.PlatformConfig | None = None, *, since_s: float | None = None,
           snapshots: tuple[int, int] | None = None, upto: dict[str, int] | None = None, full: bool = False,
           engine: str = "auto", spark_factory: Callable[[], SparkSession] | None = None, record_event: bool = True,
           progress: Callable[[str], None] | None = None, now: datetime | None = None) -> Verification:
    """Verify the pipeline's tables exactly once over a window (see the module doc); record a `verify`
    event unless `record_event` is False (or nothing was left to verify: then a `skipped` one).

    The mode is `since` with `since_s` (seconds), `snapshots` with `snapshots` (FROM, TO), `full` with
    `full`, else `incremental`. `upto` pins tables (table -> snapshot id) instead of their heads.
    `engine` is auto, local or spark; `spark_factory()` returns the Spark session (default: one in this
    process, started only for a Spark run). `progress` gets a line per step. Raises VerifyError for a
    request that cannot be served, PositionsLostError when a table's positions cannot be found,
    SourceError when Kafka cannot be read.
    """
    if engine not in ENGINES:
        raise VerifyError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    if sum(1 for chosen in (since_s is not None, snapshots is not None, full) if chosen) > 1:
        raise VerifyError("choose at most one of since, snapshots and full")
    platform = platform or config.load()
    now = now or datetime.now(UTC)
    progress = progress or (lambda line: log.info("%s", line))
    mode = "since" if since_s is not None else "snapshots" if snapshots else "full" if full else "incremental"
    started = time.monotonic()
    plan = windows.plan(spec, platform, mode, dict(upto or {}), since_s, snapshots, now)
    offsets_in_window = plan.kafka.count
    chosen = engine if engine != "auto" else "spark" if offsets_in_window > SPARK_ABOVE_OFFSETS else "local"
    spark = (spark_factory or (lambda: _session(spec, platform)))() if chosen == "spark" else None
    pieces = _pieces(plan, spark.sparkContext.defaultParallelism if spark is not None else 1)
    progress(f"{spec.name}: {plan.mode} verification of {plan.window.describe()}: {len(pieces)} pieces, "
             f"{offsets_in_window} offsets to read from Kafka ({chosen})")
    results = _run_pieces(pieces, platform.kafka(), spec, platform.schema_registry(), spark, progress)
    findings = Findings()
    for result in results:
        findings.merge(result.findings)
    findings.merge(_strays(plan))
    keys_checked = 0
    if plan.key_check:
        by_role = {s.role: s for s in plan.tables}
        keys = spec.target.key
        newest = [r.newest for r in results if r.newest is not None]
        found, keys_checked = check_keys(
            spec.source.topic, spec.target.table, spec.tombstone_table,
            newest_per_key(pa.concat_tables(newest)) if newest else NEWEST.empty_table(),
            _key_rows(by_role["data"], keys, spec.is_cdc), _key_rows(by_role.get("tombstones"), keys),
            by_source=spec.is_cdc)
        findings.merge(found)
    verification = Verification(
        pipeline=spec.name, topic=spec.source.topic, mode=plan.mode, engine=chosen,
        tables={s.name: s.scope for s in plan.tables if s.role != "tombstones"}, window=plan.window,
        kafka=plan.kafka, committed=plan.committed, gaps=plan.gaps, findings=findings, keys_checked=keys_checked,
        seconds=time.monotonic() - started, verified_at=now.isoformat())
    progress(verification.summary())
    if record_event:
        record(spec, verification, platform)
    return verification


def record(spec: PipelineSpec, result: Verification, platform: config.PlatformConfig) -> None:
    """The run as a `verify` event on the ops timeline: ok or failed, with its counts, the snapshot verified
    per table (the chain the next incremental run and the publish gate read) and the first problems."""
    f = result.findings
    details = result.to_json()
    details.pop("kafka")  # the window and the committed positions say it
    events.record(events.Event(
        spec.name, "verify", result.status, result.summary(),
        metrics={"offsets": f.offsets, "rows": f.rows, "keys": result.keys_checked, **f.counts,
                 "gaps": result.gaps.count, "seconds": round(result.seconds, 3),
                 "offsets_per_s": round(result.offsets_per_s, 1)},
        details=details), platform=platform, catalog=spec.catalog)


def _session(spec: PipelineSpec, platform: config.PlatformConfig) -> SparkSession:
    from lakehouse.core import sparkenv

    session: SparkSession = sparkenv.session(platform, [spec.catalog], f"lakehouse-verify-{spec.name}")
    return session
