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
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, And, EqualTo, GreaterThanOrEqual, IsNull, LessThan, Or
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata

from lakehouse.audit.coordinates import (
    KAFKA_RECORDS,
    Coverage,
    Intervals,
    Lineage,
    integer_bound,
    is_on_main,
    lineage,
    pinned,
    read_kafka,
    window_filter,
)
from lakehouse.core import config, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import VerifyError
from lakehouse.core.offsets import OffsetRange, TableProgress
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.plan import TopicState, split_for_tasks, topic_state_for
from lakehouse.ingest.reader import reader_consumer
from lakehouse.ingest.taskwriter import io_properties, shipped_metadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("lakehouse.verify")

MODES = ("incremental", "full", "since", "snapshots")
CHAIN_MODES = ("incremental", "full")  # runs that prove a table's whole state at the snapshot they name
PROBLEMS = ("missing", "duplicated", "foreign", "stale")
PIECE_OFFSETS = 1_000_000       # offsets of one partition checked by one piece (memory per piece)
SPARK_ABOVE_OFFSETS = 5_000_000  # engine "auto": windows larger than this run as a Spark job
MAX_PROBLEMS = 100              # problems listed in a result and its event (counts are exact)
HISTORY_EVENTS = 2000           # `verify` events read back to find what was verified
ENGINES = ("auto", "local", "spark")
_SNAPSHOT_RANGE = re.compile(r"(-?[0-9]{1,20})\.\.(-?[0-9]{1,20})")


def parse_snapshot_range(text: str) -> tuple[int, int]:
    """`FROM..TO` -> (FROM, TO), two snapshot ids. Raises VerifyError for anything else."""
    match = _SNAPSHOT_RANGE.fullmatch(text.strip()) if isinstance(text, str) else None
    if not match:
        raise VerifyError(f"{text!r} is not a snapshot range: use FROM..TO with two snapshot ids, e.g. "
                          f"4061212263396151215..8791223425634160029 (see `lakehouse status`)")
    return int(match.group(1)), int(match.group(2))


# ---------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class Problem:
    """One thing wrong, with the coordinates it is at and the tables involved."""

    kind: str                      # one of PROBLEMS
    partition: int | None
    offset: int | None
    tables: tuple[str, ...]
    detail: str
    topic: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = f"{self.topic}[{self.partition}]@{self.offset}" if self.partition is not None else "(no coordinates)"
        return f"{self.kind} {where} in {', '.join(self.tables) or 'no table'}: {self.detail}"


@dataclass
class Findings:
    """What a piece (or the whole run) found: exact counts, the first MAX_PROBLEMS problems, and the
    missing offsets as intervals."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROBLEMS, 0))
    problems: list[Problem] = field(default_factory=list)
    missing: Coverage = field(default_factory=Coverage)
    offsets: int = 0     # offsets Kafka delivered in the checked range
    undelivered: int = 0  # offsets of the range Kafka holds no record at: transaction markers, aborted records,
    #                       records compaction removed; never expected in a table, so never missing
    rows: int = 0        # rows read and checked

    def add(self, problem: Problem) -> None:
        self.counts[problem.kind] += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)

    def add_many(self, kind: str, count: int, describe: Callable[[int], Problem]) -> None:
        """Count `count` problems of `kind`; `describe(i)` builds the i-th, called only for those listed."""
        self.counts[kind] += count
        for i in range(min(count, max(0, MAX_PROBLEMS - len(self.problems)))):
            self.problems.append(describe(i))

    def merge(self, other: Findings) -> None:
        for kind, n in other.counts.items():
            self.counts[kind] += n
        self.problems.extend(other.problems[:max(0, MAX_PROBLEMS - len(self.problems))])
        self.missing = self.missing.union(other.missing)
        self.offsets += other.offsets
        self.undelivered += other.undelivered
        self.rows += other.rows

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())


@dataclass(frozen=True)
class TableScope:
    """What one table contributes: the snapshot verified (`to`), the newest snapshot verified before
    (`base`, exclusive; None: from the table's first snapshot), and the snapshots in between."""

    table: str
    to: int | None                 # None: the table has no snapshot (or does not exist) yet
    base: int | None
    snapshots: tuple[int, ...]     # oldest first
    positions: dict[int, int]      # the pipeline's positions in the table as of `to`


@dataclass
class Verification:
    """The result of one run; `ok` when nothing is missing, duplicated, foreign or stale."""

    pipeline: str
    topic: str
    mode: str
    engine: str
    tables: dict[str, TableScope]
    window: Coverage               # offsets whose rows were examined
    kafka: Coverage                # offsets read from Kafka (window within [earliest, committed), gaps left out)
    committed: dict[int, int]
    gaps: Coverage                 # recorded gaps inside the window (or every one, in a full run)
    findings: Findings
    keys_checked: int = 0
    seconds: float = 0.0
    verified_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def ok(self) -> bool:
        return self.findings.ok

    @property
    def nothing_new(self) -> bool:
        """An incremental run that found every table's snapshot verified already."""
        return self.mode == "incremental" and not any(s.snapshots for s in self.tables.values())

    @property
    def status(self) -> str:
        """The `verify` event's status: ok, failed, or skipped when there was nothing new to verify."""
        return "failed" if not self.ok else "skipped" if self.nothing_new else "ok"

    @property
    def snapshots(self) -> dict[str, int]:
        """The snapshot verified per table (tables without one left out)."""
        return {t: s.to for t, s in self.tables.items() if s.to is not None}

    @property
    def offsets_per_s(self) -> float:
        return self.findings.offsets / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One paragraph for people: the verdict, what was covered, the first problems and what to do."""
        f = self.findings
        head = (f"{self.pipeline}: {'verified' if self.ok else 'FAILED'} ({self.mode}, {self.engine}): "
                f"{f.offsets} offsets Kafka holds"
                + (f" (and {f.undelivered} where it delivers no record: transaction markers, aborted or compacted "
                   f"records)" if f.undelivered else "") + f", {f.rows} rows in {len(self.tables)} tables, window "
                f"{self.window.describe()}; snapshots " + (", ".join(f"{t} {s}" for t, s in self.snapshots.items())
                                                            or "none") + f"; {self.seconds:.1f}s")
        if self.gaps:
            head += f". Recorded gaps (aged out before ingestion): {self.gaps.describe()}"
        if self.ok:
            return head
        counts = ", ".join(f"{n} {kind}" for kind, n in f.counts.items() if n)
        listed = "; ".join(str(p) for p in f.problems[:10])
        more = f" (+{sum(f.counts.values()) - 10} more)" if sum(f.counts.values()) > 10 else ""
        missing = f". Missing offsets: {f.missing.describe()}" if f.missing else ""
        return (f"{head}. Problems: {counts}: {listed}{more}{missing}. Delete foreign rows, and every copy of a "
                f"duplicated offset, by their `_kafka` coordinates (each problem names its table); then replay the "
                f"duplicated and missing offsets with `lakehouse replay --pipeline {self.pipeline} --offsets "
                f"P:START-END` (it writes each absent offset once) and verify again.")

    def to_json(self) -> dict:
        f = self.findings
        return {
            "pipeline": self.pipeline, "topic": self.topic, "ok": self.ok, "status": self.status, "mode": self.mode,
            "engine": self.engine,
            "tables": {t: {"to": s.to, "base": s.base, "snapshots": len(s.snapshots),
                           "positions": {str(p): o for p, o in s.positions.items()}} for t, s in self.tables.items()},
            "snapshots": self.snapshots, "window": self.window.to_json(), "kafka": self.kafka.to_json(),
            "committed": {str(p): o for p, o in self.committed.items()}, "gaps": self.gaps.to_json(),
            "offsets": f.offsets, "undelivered": f.undelivered, "rows": f.rows, "keys_checked": self.keys_checked,
            "counts": f.counts,
            "missing": f.missing.head(MAX_PROBLEMS).to_json(), "problems": [asdict(p) for p in f.problems],
            "seconds": round(self.seconds, 3), "offsets_per_s": round(self.offsets_per_s, 1),
            "verified_at": self.verified_at,
        }


# ---------------------------------------------------------------------------- the chain of verifications


def verified_snapshots(spec: PipelineSpec, platform: config.PlatformConfig | None = None) -> dict[str, set[int]]:
    """Per table, the snapshots that passing incremental or full verifications (the chain) verified."""
    found: dict[str, set[int]] = {}
    for event in events.recent(spec.name, kind="verify", limit=HISTORY_EVENTS, platform=platform,
                               catalog=spec.catalog):
        details = event["details"]
        if event["status"] != "ok" or details.get("mode") not in CHAIN_MODES:
            continue
        for table, snapshot in (details.get("snapshots") or {}).items():
            found.setdefault(table, set()).add(int(snapshot))
    return found


# ---------------------------------------------------------------------------- planning: which offsets


@dataclass
class _TableState:
    name: str
    role: str                       # data | dead-letter | tombstones
    table: Table | None
    scope: TableScope
    lineage: Lineage | None
    columns: tuple[str, ...] = ("_kafka.topic", "_kafka.partition", "_kafka.offset")
    tasks: list[FileScanTask] = field(default_factory=list)


@dataclass
class _Plan:
    spec: PipelineSpec
    mode: str
    tables: list[_TableState]
    state: TopicState
    committed: dict[int, int]
    gaps: Coverage
    window: Coverage
    kafka: Coverage
    null_rows: dict[str, set[str]]             # paths of files that may hold rows without coordinates, per table
    key_check: bool


def _field_ids(table: Table) -> tuple[int, int]:
    schema = table.schema()
    return schema.find_field("_kafka.partition").field_id, schema.find_field("_kafka.offset").field_id


def _file_window(table: Table, data_file) -> Coverage | None:
    """The coordinates a data file may hold, from its `_kafka` bounds: [lowest, highest] offset for each
    partition from the lowest to the highest; empty when every row lacks coordinates; None when the file
    carries no bounds (its rows must be read to know)."""
    from pyiceberg.types import IntegerType, LongType

    pid, oid = _field_ids(table)
    lower, upper = data_file.lower_bounds or {}, data_file.upper_bounds or {}
    if all(k in lower and k in upper for k in (pid, oid)):
        p_lo, p_hi = (integer_bound(IntegerType(), b) for b in (lower[pid], upper[pid]))
        o_lo, o_hi = (integer_bound(LongType(), b) for b in (lower[oid], upper[oid]))
        if p_lo is not None and p_hi is not None and o_lo is not None and o_hi is not None:
            return Coverage.of({p: [(o_lo, o_hi + 1)] for p in range(p_lo, p_hi + 1)})
    nulls = data_file.null_value_counts or {}
    if all(nulls.get(k, -1) == data_file.record_count for k in (pid, oid)):
        return Coverage()
    return None


def _has_null_coordinates(table: Table, data_file) -> bool:
    nulls = data_file.null_value_counts or {}
    return any(nulls.get(k, 1) > 0 for k in _field_ids(table))  # unknown counts: read to be sure


def _read_file_window(table: Table, data_file) -> Coverage:
    """The coordinates a data file without bounds holds, read from it: per partition [lowest, highest]."""
    scan = table.scan(selected_fields=("_kafka.partition", "_kafka.offset"))
    data = ArrowScan(table.metadata, table.io, scan.projection(), AlwaysTrue()).to_table([FileScanTask(data_file)])
    kafka = data.column("_kafka")
    part = pa.table({"p": pc.struct_field(kafka, "partition"), "o": pc.struct_field(kafka, "offset")}).drop_null()
    grouped = part.group_by("p").aggregate([("o", "min"), ("o", "max")])
    return Coverage.of({int(p): [(int(lo), int(hi) + 1)] for p, lo, hi in
                        zip(grouped["p"].to_pylist(), grouped["o_min"].to_pylist(), grouped["o_max"].to_pylist(),
                            strict=True)})


def _changed_files(table: Table, snapshot_ids: set[int]) -> tuple[list, bool]:
    """The data files the snapshots `snapshot_ids` added or removed (manifest entries ADDED or DELETED by
    them, read from the manifests each of them wrote), and whether any of them added delete files."""
    changed, deletes = [], False
    for sid in snapshot_ids:
        snapshot = table.metadata.snapshot_by_id(sid)
        if snapshot is None:
            raise VerifyError(f"snapshot {sid} is not in the table's metadata any more (expired while the run "
                              f"planned); run it again")
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != sid:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                if entry.snapshot_id != sid or entry.status == ManifestEntryStatus.EXISTING:
                    continue
                if manifest.content == ManifestContent.DELETES or entry.data_file.content != DataFileContent.DATA:
                    deletes = deletes or entry.status == ManifestEntryStatus.ADDED
                    continue
                changed.append(entry.data_file)
    return changed, deletes


def _scope(name: str, table: Table, pipeline: str, to: int, mode: str, verified: set[int],
           since_ms: int, between: tuple[int, int] | None) -> tuple[TableScope, Lineage]:
    """The TableScope of `table` pinned at `to` in `mode`, and its lineage from `to` back."""
    history = lineage(table, name, pipeline, to)
    progress = offsets.progress_of(pinned(table, to), name, pipeline).require_positions()
    ids = [c.snapshot_id for c in history.commits]  # newest first
    base: int | None = None
    if mode == "incremental":
        base = next((sid for sid in ids if sid in verified), None)
        chosen = ids[:ids.index(base)] if base is not None else ids
    elif mode == "since":
        chosen = [c.snapshot_id for c in history.commits if c.timestamp_ms >= since_ms]
    elif mode == "snapshots" and between is not None:
        first, last = between
        chosen = ids[:ids.index(first) + 1]
    else:  # full, or the tables `--snapshots` does not name
        chosen = ids if mode == "full" else []
    return TableScope(name, to, base, tuple(reversed(chosen)), dict(progress.positions)), history


def _plan(spec: PipelineSpec, platform: config.PlatformConfig, mode: str, upto: dict[str, int],
          since_s: float | None, between: tuple[int, int] | None, now: datetime) -> _Plan:
    """Which snapshots, offsets and files a run covers. Raises VerifyError for snapshots that are not on
    main, PositionsLostError for a table whose positions cannot be found, the planner's SourceErrors."""
    catalog = open_catalog(platform, spec.catalog)
    verified = verified_snapshots(spec, platform) if mode == "incremental" else {}
    named = _named_table(spec, catalog, between) if mode == "snapshots" and between is not None else None
    since_ms = int((now - timedelta(seconds=since_s or 0)).timestamp() * 1000)
    states: list[_TableState] = []
    for name in spec.positioned_tables:
        role = "dead-letter" if name == spec.dead_letter_table else "data"
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            states.append(_TableState(name, role, None, TableScope(name, None, None, (), {}), None))
            continue
        head = table.current_snapshot()
        to = upto.get(name, between[1] if between is not None and named == name
                      else head.snapshot_id if head else None)
        if to is None:
            states.append(_TableState(name, role, table, TableScope(name, None, None, (), {}), None))
            continue
        if not is_on_main(table, to):
            raise VerifyError(f"{spec.qualified(name)}: snapshot {to} is not on main (unknown, expired, or main "
                              f"was rolled back below it)")
        table_mode = mode if mode != "snapshots" or named == name else "none"
        scope, history = _scope(name, table, spec.name, to, table_mode, verified.get(name, set()), since_ms,
                                between if named == name else None)
        states.append(_TableState(name, role, table, scope, history))
    progress = [TableProgress(s.name, s.table is not None, positions=s.scope.positions) for s in states]
    state = topic_state_for(platform.kafka(), spec.source.topic, progress)
    committed = offsets.committed_positions(progress, state.earliest)
    upsert = spec.target.mode == "upsert"
    key_check = upsert and spec.tombstones_delete and spec.target.fanout is None
    full = mode == "full" or (mode == "incremental" and any(
        s.scope.to is not None and s.scope.base is None for s in states))
    ledger = spec.tombstone_table
    if upsert and ledger:
        states.append(_ledger(spec, catalog, ledger))
    spans: dict[int, list[tuple[int, int]]] = {}
    gaps = Coverage()
    null_rows: dict[str, set[str]] = {}

    def cover(found: Coverage) -> None:
        for p, iv in found.partitions.items():
            spans.setdefault(p, []).extend(iv)

    def cover_files(name: str, table: Table, data_files: list) -> None:
        for data_file in data_files:
            found = _file_window(table, data_file)
            cover(found if found is not None else _read_file_window(table, data_file))
            if _has_null_coordinates(table, data_file):
                null_rows.setdefault(name, set()).add(data_file.file_path)

    for s in states:
        present, to = s.table, s.scope.to
        if present is None or to is None:
            continue
        if s.lineage is not None:
            gaps = gaps.union(s.lineage.gaps())
        if upsert and s.role == "data":
            s.columns = (*s.columns, "_kafka.timestamp", *spec.target.key)
        if full:
            if s.lineage is not None:
                every = tuple(c.snapshot_id for c in reversed(s.lineage.commits))
                s.scope = replace(s.scope, base=None, snapshots=every)
            cover_files(s.name, present, [task.file for task in _plan_files(present, to)])
            continue
        if s.lineage is None:
            continue
        commits = {c.snapshot_id: c for c in s.lineage.commits}
        for sid in s.scope.snapshots:
            cover(commits[sid].ranges.union(commits[sid].gaps))
        changed, deletes = _changed_files(present, set(s.scope.snapshots))
        if deletes and not upsert:
            log.warning("%s: position or equality deletes in the snapshots verified; verifying every row",
                        spec.qualified(s.name))
            return _plan(spec, platform, "full", upto, since_s, between, now)
        cover_files(s.name, present, changed)
        if upsert and s.role == "data" and s.scope.base is not None:
            cover(_changed_rows(present, s.scope.base, to))
    if full:
        cover(Coverage.of({p: [(state.earliest[p], c)] for p, c in committed.items()}))
    window = Coverage.of(spans)
    held = Coverage.of({p: [(state.earliest[p], committed[p])] for p in committed})
    kafka = window.intersection(held).difference(gaps)
    for s in states:
        if s.table is not None and s.scope.to is not None and window:
            s.tasks = _plan_files(s.table, s.scope.to, window_filter(_hull(window)))
    return _Plan(spec, "full" if full else mode, states, state, committed,
                 gaps if full else gaps.intersection(window), window, kafka, null_rows, key_check)


def _named_table(spec: PipelineSpec, catalog, between: tuple[int, int]) -> str:
    """The positioned table whose main lineage holds FROM and TO (FROM at or before TO)."""
    first, last = between
    for name in spec.positioned_tables:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            continue
        ids = [s.snapshot_id for s in offsets.main_ancestry(table.metadata)]
        if last in ids:
            if first not in ids[ids.index(last):]:
                raise VerifyError(f"{spec.qualified(name)}: snapshot {first} is not {last} or one of its "
                                  f"ancestors on main: use FROM..TO with FROM the older snapshot")
            return name
    raise VerifyError(f"snapshot {last} is on main of none of {', '.join(spec.positioned_tables)} (unknown or "
                      f"expired); `lakehouse status --pipeline {spec.name}` shows current snapshots")


def _ledger(spec: PipelineSpec, catalog, name: str) -> _TableState:
    """The tombstone ledger `name`, read at its head: its rows are coordinates of tombstones (no positions)."""
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        return _TableState(name, "tombstones", None, TableScope(name, None, None, (), {}), None)
    head = table.current_snapshot()
    return _TableState(name, "tombstones", table, TableScope(name, head.snapshot_id if head else None, None, (), {}),
                       None, columns=("_kafka.topic", "_kafka.partition", "_kafka.offset", "_kafka.timestamp",
                                      *spec.target.key))


def _plan_files(table: Table, snapshot_id: int, row_filter=AlwaysTrue()) -> list[FileScanTask]:
    return list(table.scan(snapshot_id=snapshot_id, row_filter=row_filter).plan_files())


def _hull(window: Coverage, limit: int = 64) -> Coverage:
    """`window`, with the intervals of a partition that has more than `limit` replaced by their hull: a
    row filter of thousands of disjunctions costs more to evaluate than the files it spares."""
    return Coverage({p: iv if len(iv.spans) <= limit else Intervals.of([(iv.spans[0][0], iv.spans[-1][1])])
                     for p, iv in window.partitions.items()})


def _changed_rows(table: Table, base: int, to: int) -> Coverage:
    """The coordinates of the rows an upsert table gained or lost from `base` to `to`: MERGEs delete rows
    with position deletes, whose files carry no coordinates, so the rows of both snapshots are compared."""
    def rows(snapshot_id: int) -> pa.Table:
        data = table.scan(snapshot_id=snapshot_id, selected_fields=("_kafka.partition", "_kafka.offset")).to_arrow()
        kafka = data.column("_kafka")
        return pa.table({"p": pc.struct_field(kafka, "partition"), "o": pc.struct_field(kafka, "offset")}).drop_null()

    before, after = rows(base), rows(to)
    changed = pa.concat_tables([before.join(after, ["p", "o"], join_type="left anti"),
                                after.join(before, ["p", "o"], join_type="left anti")])
    if not changed.num_rows:
        return Coverage()
    parts = changed.column("p").to_numpy()
    offs = changed.column("o").to_numpy()
    return Coverage({int(p): Intervals.from_offsets(offs[parts == p]) for p in np.unique(parts)})


# ---------------------------------------------------------------------------- one piece (pure checks)


@dataclass(frozen=True)
class PartitionFacts:
    """What decides, in one partition, whether a row is accounted for and an offset is expected."""

    topic: str
    partition: int
    in_topic: bool
    earliest: int
    committed: int
    positions: dict[str, int | None]   # table -> its own position (None: none); tables absent: no position rule
    gaps: Intervals
    floors: dict[str, int]             # table -> first offset it ingested, when its history is complete


@dataclass(frozen=True)
class TableRead:
    """One table's share of a piece: where to read it and which columns."""

    name: str
    role: str
    metadata: TableMetadata
    io_properties: dict
    tasks: tuple[FileScanTask, ...]
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Piece:
    """Offsets `[start, end)` of one partition: read `kafka` (sub-intervals) from Kafka and every row
    of `tables` whose coordinates lie in the piece, and check them."""

    facts: PartitionFacts
    start: int
    end: int
    kafka: tuple[tuple[int, int], ...]
    tables: tuple[TableRead, ...]
    upsert: bool
    key_check: bool

    @property
    def kafka_offsets(self) -> int:
        return sum(e - s for s, e in self.kafka)


@dataclass
class PieceResult:
    findings: Findings
    newest: pa.Table | None = None  # upsert key check: the newest non-dead-letter record per key in the piece


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[list, np.ndarray]:
    """A string column as (its distinct values, each row's index into them; -1 for null)."""
    encoded = pa.chunked_array(column).combine_chunks().dictionary_encode() if isinstance(column, pa.ChunkedArray) \
        else column.dictionary_encode()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return encoded.dictionary.to_pylist(), codes


def _code(names: list, value: str) -> int:
    return names.index(value) if value in names else -2


def check_rows(facts: PartitionFacts, rows: pa.Table, kafka: pa.Table, kafka_span: Intervals,
               count_missing: bool) -> Findings:
    """Check the rows of one partition's piece against what Kafka delivered. Pure.

    `rows`: columns `table`, `topic`, `offset` (every row of the pipeline's tables whose coordinates lie
    in the piece, in this partition); `kafka`: the records Kafka delivered (an `offset` column) within
    `kafka_span`, the part of the piece read from Kafka. A row is foreign when another topic's, in a
    partition the topic lacks, at or past its table's position, in a recorded gap, below its table's
    first ingested offset, or inside `kafka_span` where Kafka delivered no record; every other row holds
    its offset. An offset held more than once is duplicated; with `count_missing`, an offset Kafka
    delivered that no row holds is missing.
    """
    found = Findings(offsets=kafka.num_rows, rows=rows.num_rows, undelivered=kafka_span.count - kafka.num_rows)
    p = facts.partition
    table_names, tables = _codes(rows.column("table"))
    topic_names, topics = _codes(rows.column("topic"))
    offs = rows.column("offset").to_numpy(zero_copy_only=False).astype(np.int64)
    delivered = np.unique(kafka.column("offset").to_numpy(zero_copy_only=False).astype(np.int64))
    why = np.full(len(offs), "", dtype=object)

    def mark(where: np.ndarray, reason: str) -> None:
        why[where & (why == "")] = reason

    mark(topics != _code(topic_names, facts.topic),
         "a row of another topic (or of none)")
    if not facts.in_topic:
        mark(np.ones(len(offs), dtype=bool), f"partition {p} is not a partition of topic {facts.topic!r}")
    for table, position in facts.positions.items():
        mark((tables == _code(table_names, table)) & (offs >= (position if position is not None else -1)),
             f"at or past {table}'s committed position {position}: no commit of the pipeline holds it"
             if position is not None else f"{table} holds no committed position in partition {p}")
    for table, floor in facts.floors.items():
        mark((tables == _code(table_names, table)) & (offs < floor),
             f"below {floor}, the first offset {table} ingested: no commit of the pipeline holds it")
    mark(facts.gaps.contains_many(offs), "inside a recorded gap (it aged out of Kafka before ingestion)")
    mark(kafka_span.contains_many(offs) & ~np.isin(offs, delivered),
         "Kafka holds no record at this offset (a transaction marker, an aborted record, or made-up coordinates)")
    foreign = np.nonzero(why != "")[0]
    found.add_many("foreign", len(foreign), lambda i: Problem(
        "foreign", p, int(offs[foreign[i]]), (table_names[tables[foreign[i]]],), str(why[foreign[i]]),
        topic=topic_names[topics[foreign[i]]] if topics[foreign[i]] >= 0 else None))
    accounted = why == ""
    held_offsets, held_tables = offs[accounted], tables[accounted]
    order = np.argsort(held_offsets, kind="stable")
    held_offsets, held_tables = held_offsets[order], held_tables[order]
    unique, first, counts = np.unique(held_offsets, return_index=True, return_counts=True)
    repeated = np.nonzero(counts > 1)[0]

    def duplicate(i: int) -> Problem:
        at = repeated[i]
        places = tuple(table_names[t] for t in held_tables[first[at]:first[at] + counts[at]])
        return Problem("duplicated", p, int(unique[at]), places, f"held {counts[at]} times: " + ", ".join(places),
                       topic=facts.topic)

    found.add_many("duplicated", len(repeated), duplicate)
    if count_missing:
        absent = delivered[~np.isin(delivered, unique)]
        found.add_many("missing", len(absent), lambda i: Problem(
            "missing", p, int(absent[i]), (), f"Kafka holds it, below the committed position {facts.committed}, "
                                              f"but no table of the pipeline does", topic=facts.topic))
        found.missing = Coverage({p: Intervals.from_offsets(absent)})
    return found


def _read_piece_rows(piece: Piece) -> dict[str, pa.Table]:
    """Each table's rows whose coordinates lie in the piece (deleted rows left out), its `columns` as read."""
    from pyiceberg.table import DataScan

    row_filter = And(EqualTo(term="_kafka.partition", value=piece.facts.partition),
                     And(GreaterThanOrEqual(term="_kafka.offset", value=piece.start),
                         LessThan(term="_kafka.offset", value=piece.end)))
    out = {}
    for read in piece.tables:
        if read.tasks:
            io = load_file_io(read.io_properties, read.metadata.location)
            scan = DataScan(read.metadata, io, row_filter=row_filter, selected_fields=read.columns)
            out[read.name] = ArrowScan(read.metadata, io, scan.projection(), scan.row_filter).to_table(list(read.tasks))
    return out


ROWS = pa.schema([("table", pa.string()), ("topic", pa.string()), ("offset", pa.int64())])


def _coordinates(by_table: dict[str, pa.Table]) -> pa.Table:
    """The rows of every table as `table`, `topic`, `offset` (ROWS, the input of check_rows); scans may
    return strings as `large_string` or not, depending on the files read."""
    parts = [pa.table([pa.array([name] * data.num_rows, pa.string()),
                       pc.cast(pc.struct_field(data.column("_kafka"), "topic"), pa.string()),
                       pc.cast(pc.struct_field(data.column("_kafka"), "offset"), pa.int64())], schema=ROWS)
             for name, data in by_table.items()]
    return pa.concat_tables(parts) if parts else ROWS.empty_table()


def check_piece(piece: Piece, kafka_conf: dict, spec: PipelineSpec, registry: dict | None = None) -> PieceResult:
    """Read one piece's records from Kafka and its rows from the tables, and check them (check_rows); for
    a key-checked upsert pipeline also the rows' keys against their records' (derived as ingestion derives
    them, `TableKeys`; `registry` decodes record keys and change events in a wire format), that a record
    whose key does not decode is a dead letter, and each key's newest record that is no dead letter.
    Runs in this process or in a Spark task."""
    facts = piece.facts
    keys = TableKeys(spec, registry) if piece.key_check else None
    parts = []
    for start, end in piece.kafka:  # a consumer per range, as the reader tasks have (see reader_consumer)
        with reader_consumer(kafka_conf, spec.name) as (consumer, _watch):
            parts.append(read_kafka(consumer, OffsetRange(facts.topic, facts.partition, start, end),
                                    on_record=keys.add if keys is not None else None))
    kafka = pa.concat_tables(parts) if parts else KAFKA_RECORDS.empty_table()
    by_table = _read_piece_rows(piece)
    findings = check_rows(facts, _coordinates(by_table), kafka, Intervals.of(piece.kafka),
                          count_missing=not piece.upsert)
    if keys is None:
        return PieceResult(findings)
    kafka = keys.attach(kafka)
    dead_letters = next((by_table[r.name] for r in piece.tables if r.role == "dead-letter" and r.name in by_table),
                        None)
    dead = pc.struct_field(dead_letters.column("_kafka"), "offset") if dead_letters is not None \
        else pa.array([], pa.int64())
    lettered = pc.is_in(kafka.column("offset"), value_set=dead)
    findings.merge(_key_mismatches(piece, spec.target.key, by_table, kafka))
    undecoded = kafka.filter(pc.and_(pc.is_null(kafka.column("key")), pc.invert(lettered)))
    findings.add_many("missing", undecoded.num_rows, lambda i: Problem(
        "missing", facts.partition, undecoded.column("offset")[i].as_py(), (spec.dead_letter_table,),
        "its key gives no table key (it does not decode), so ingestion dead-letters it, but the dead-letter "
        "table does not hold it", topic=facts.topic))
    return PieceResult(findings, newest_per_key(kafka.filter(pc.invert(lettered))))


def _key_mismatches(piece: Piece, key_columns: tuple[str, ...], by_table: dict[str, pa.Table],
                    kafka: pa.Table) -> Findings:
    """Rows of the upsert data table and ledger whose table key differs from the one ingestion derives from
    the Kafka record at their coordinates: they claim a record that is not theirs (foreign)."""
    found = Findings()
    keys = dict(zip(kafka.column("offset").to_pylist(), kafka.column("key").to_pylist(), strict=True))
    for read in piece.tables:
        data = by_table.get(read.name)
        if data is None or read.role == "dead-letter":
            continue
        offs = pc.struct_field(data.column("_kafka"), "offset").to_pylist()
        for offset, key in zip(offs, key_text([data.column(k) for k in key_columns]).to_pylist(), strict=True):
            if offset in keys and keys[offset] != key:
                expected = keys[offset]
                found.add(Problem("foreign", piece.facts.partition, offset, (read.name,),
                                  f"the row's key {key!r} is not the key {expected!r} of the record at its coordinates"
                                  if expected is not None else f"the row's key {key!r} cannot come from the record "
                                  f"at its coordinates, whose key does not decode", topic=piece.facts.topic, key=key))
    return found


# ---------------------------------------------------------------------------- upsert: each key's table key


def key_text(columns: list[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """The table key of each row as one text: its column's value as Arrow casts it to a string, several
    columns as `(a, b)`. Both sides of a comparison (a table's key columns, the values ingestion derives
    from a Kafka record, `TableKeys`) go through here, so one key has one text. Null where a value is."""
    texts = [pc.cast(pa.chunked_array(c).combine_chunks() if isinstance(c, pa.ChunkedArray) else c, pa.string())
             for c in columns]
    if len(texts) == 1:
        return texts[0]
    return pc.binary_join_element_wise("(", pc.binary_join_element_wise(*texts, ", "), ")", "")


@dataclass(frozen=True)
class RecordKey:
    """What ingestion derives from one Kafka record of an upsert table or change stream (`TableKeys.identify`)."""

    text: str | None     # the key as `_kafka.key` shows it
    values: tuple        # the table key's values (target.key; RecordValidator.table_key)
    delete: bool         # whether the record deletes its key (a tombstone, a change event with op d)
    cdc: dict | None     # a change stream's `_cdc` value: op, source_ts (epoch micros), position


class TableKeys:
    """Each Kafka record's table key as ingestion derives it, collected while a piece is read (`add`) and
    attached to the piece's KAFKA_RECORDS rows (`attach`): `key` becomes the table key's text (`key_text`;
    null for a record whose key or change event does not decode: ingestion dead-letters it), `tombstone`
    whether it deletes its key, and `position`/`source_ts` order a change stream's records as the MERGE
    does (NEWEST)."""

    def __init__(self, spec: PipelineSpec, registry: dict | None = None):
        from lakehouse.ingest.reader import arrow_type
        from lakehouse.ingest.records import RecordValidator

        self.cdc = spec.is_cdc
        self.validator = RecordValidator(spec, registry=registry, gated=False)
        self.types = [arrow_type(spec.contract.field(k)) for k in spec.target.key]
        self.values: list[list] = [[] for _ in self.types]
        self.deletes: list[bool] = []
        self.positions: list = []
        self.source_ts: list[int | None] = []

    def identify(self, key: bytes | None, value: bytes | None, with_text: bool = False) -> RecordKey | None:
        """The RecordKey of one record; None when ingestion would dead-letter it for its key or envelope."""
        from lakehouse.core import errors
        from lakehouse.ingest.records import Rejected

        try:
            values = self.validator.table_key(key)
            if values is None:
                return None
            delete, cdc = self.validator.change_of(value) if self.cdc else (value is None, None)
            text = self.validator.check_key(key) if with_text else None
        except Rejected:
            return None
        except (errors.RetryableError, errors.ConfigurationError):
            raise  # a registry outage or refusal says nothing about the record
        except Exception:  # noqa: BLE001 - the reader dead-letters a record whose decoding raises (reader_failure)
            return None
        return RecordKey(text, values, delete, cdc)

    def add(self, key: bytes | None, value: bytes | None) -> None:
        found = self.identify(key, value)
        for i, column in enumerate(self.values):
            column.append(found.values[i] if found is not None else None)
        self.deletes.append(found is not None and found.delete)
        cdc = found.cdc if found is not None and found.cdc else {}
        self.positions.append(cdc.get("position"))
        self.source_ts.append(cdc.get("source_ts"))

    def text(self, found: RecordKey) -> str:
        """The text of `found`'s table key, as the key columns of its row show it (`key_text`)."""
        return key_text([pa.array([v], t) for v, t in zip(found.values, self.types, strict=True)]).to_pylist()[0]

    def attach(self, records: pa.Table) -> pa.Table:
        """`records` (the KAFKA_RECORDS rows `add` saw, in order) with their table keys (NEWEST's columns)."""
        keys = key_text([pa.array(v, t) for v, t in zip(self.values, self.types, strict=True)])
        return pa.table([keys, records.column("partition"), records.column("offset"), records.column("timestamp_ms"),
                         pa.array(self.deletes, pa.bool_()), pa.array(self.positions, NEWEST.field("position").type),
                         pa.array([None if t is None else t // 1000 for t in self.source_ts], pa.int64())],
                        schema=NEWEST)


# ---------------------------------------------------------------------------- upsert: each key's newest record

# A record of a key: where it is, when, whether it deletes the key, and (change streams) its place in the
# source's log: `position` and `source_ts` (ms), which order a key's changes across partitions (NEWER_CDC).
NEWEST = pa.schema([("key", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                    ("timestamp_ms", pa.int64()), ("tombstone", pa.bool_()), ("position", pa.decimal128(38, 0)),
                    ("source_ts", pa.int64())])


def newest_per_key(records: pa.Table) -> pa.Table:
    """The newest record of each key among `records` (KAFKA_RECORDS or NEWEST rows): within a partition the
    highest offset, across partitions the latest source position, then source time (change streams), then
    the latest Kafka timestamp, then the highest partition (the order of the ingest job's
    `latest_per_key`). Records without a key are left out. Pure."""
    for name in ("position", "source_ts"):
        if name not in records.column_names:
            records = records.append_column(name, pa.nulls(records.num_rows, NEWEST.field(name).type))
    records = records.filter(pc.is_valid(records.column("key"))).select(NEWEST.names).cast(NEWEST)
    if not records.num_rows:
        return NEWEST.empty_table()
    records = _inherit_source_order(records.sort_by([("key", "ascending"), ("partition", "ascending"),
                                                     ("offset", "ascending")]))
    per_partition = _first_of_each(records.sort_by([("key", "ascending"), ("partition", "ascending"),
                                                    ("offset", "descending")]), ("key", "partition"))
    return _first_of_each(per_partition.sort_by([("key", "ascending"), ("position", "descending"),
                                                 ("source_ts", "descending"), ("timestamp_ms", "descending"),
                                                 ("partition", "descending")]), ("key",))


def _inherit_source_order(ordered: pa.Table) -> pa.Table:
    """`ordered` (by key, partition, offset) with each record lacking a source position and time (a
    tombstone) given those of the newest earlier record of its key in its partition, as the ingest job's
    `latest_per_key` orders a change stream's tombstone with the delete Debezium writes before it."""
    if not ordered.num_rows:
        return ordered
    starts = np.zeros(ordered.num_rows, dtype=bool)
    starts[0] = True
    for name in ("key", "partition"):
        values = ordered.column(name).to_numpy(zero_copy_only=False)
        starts[1:] |= values[1:] != values[:-1]
    rows = np.arange(ordered.num_rows)
    for name in ("position", "source_ts"):
        column = ordered.column(name)
        # each row's source: itself when it has a value or starts its group, else the last such row before it
        source = np.maximum.accumulate(np.where(pc.is_valid(column).to_numpy(zero_copy_only=False) | starts, rows, 0))
        ordered = ordered.set_column(ordered.schema.get_field_index(name), name, column.take(pa.array(source)))
    return ordered


def _first_of_each(ordered: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """The first row of each run of equal `columns` values in `ordered` (sorted by them first)."""
    first = np.zeros(ordered.num_rows, dtype=bool)
    first[0] = True
    for name in columns:
        values = ordered.column(name).to_numpy(zero_copy_only=False)
        first[1:] |= values[1:] != values[:-1]
    return ordered.filter(pa.array(first))


def newer(a: tuple, b: tuple, by_source: bool = False) -> bool:
    """Whether record `a` supersedes record `b` in an upsert MERGE (the ingest job's NEWER; with `by_source`,
    a change stream's NEWER_CDC). Each is (partition, offset, timestamp ms[, position, source_ts]): a higher
    offset in the same partition; in another, with `by_source` a later source position, else a later
    source time, when both records have one and they differ; else a Kafka timestamp no older."""
    if a[0] == b[0]:
        return a[1] > b[1]
    if by_source:
        for i in (3, 4):
            x, y = (a[i] if len(a) > i else None), (b[i] if len(b) > i else None)
            if x is not None and y is not None and x != y:
                return x > y
    return (a[2] if a[2] is not None else -2 ** 63) >= (b[2] if b[2] is not None else -2 ** 63)


def check_keys(topic: str, table: str, ledger: str | None, newest: pa.Table, rows: pa.Table,
               tombstones: pa.Table, by_source: bool = False) -> tuple[Findings, int]:
    """The upsert invariant for the keys with records in the window. Pure.

    `newest`: each key's newest non-dead-letter record in the window (NEWEST rows); `rows` and
    `tombstones`: the data table's rows and the ledger's entries (key, partition, offset, timestamp_ms and,
    for a change stream's rows, position and source_ts). A key whose newest record is a value must have it
    as its row, or a newer one, or a newer tombstone in the ledger (else missing, or stale when its row is
    older); one whose newest record deletes it must have no older row (stale: a deleted key revived) and
    the ledger must hold that delete or a newer one (missing). `by_source` (a change stream) compares a row
    with a record as its MERGE does (NEWER_CDC); the ledger is kept in Kafka's order (NEWER).
    Returns the findings and how many keys were checked.
    """
    found = Findings()

    def coords(data: pa.Table) -> dict[str, tuple]:
        columns = [c for c in ("partition", "offset", "timestamp_ms", "position", "source_ts")
                   if c in data.column_names]
        return {k: tuple(v) for k, *v in zip(*(data.column(c).to_pylist() for c in ("key", *columns)),
                                             strict=True)}

    def same(kept: tuple | None, record: tuple) -> bool:
        """Whether `kept` (a row's or a ledger entry's coordinates) is `record` itself: its partition and offset."""
        return kept is not None and kept[:2] == record[:2]

    held, ledger_rows = coords(rows), coords(tombstones)
    for key, p, o, ts, dead, position, source_ts in zip(*(newest.column(c).to_pylist() for c in NEWEST.names),
                                                        strict=True):
        record = (p, o, ts, position, source_ts)
        row, tomb = held.get(key), ledger_rows.get(key)
        if dead:
            if row is not None and not newer(row, record, by_source):
                found.add(Problem("stale", p, o, (table,), f"key {key!r} was deleted by the record at offset {o}, "
                                  f"but its row (partition {row[0]}, offset {row[1]}) is older and still there",
                                  topic=topic, key=key))
            if ledger and not same(tomb, record) and (tomb is None or not newer(tomb, record)):
                found.add(Problem("missing", p, o, (ledger,), f"the ledger lacks key {key!r}'s delete at offset "
                                  f"{o}" + (f" (it holds offset {tomb[1]} of partition {tomb[0]})" if tomb else ""),
                                  topic=topic, key=key))
        elif row is None:
            if tomb is None or not newer(tomb, record):
                found.add(Problem("missing", p, o, (table,), f"the newest record of key {key!r} is neither the "
                                  f"key's row (the table has none) nor a dead letter", topic=topic, key=key))
        elif not same(row, record) and not newer(row, record, by_source):
            found.add(Problem("stale", p, o, (table,), f"key {key!r}'s row holds partition {row[0]} offset {row[1]}, "
                              f"older than its newest record (partition {p}, offset {o}), which is no dead letter",
                              topic=topic, key=key))
    return found, newest.num_rows


# ---------------------------------------------------------------------------- running a verification


MAX_SPLIT_OFFSETS = 10 ** 9  # a window interval longer than this (sparse made-up offsets) is one piece


def _pieces(plan: _Plan, slots: int = 1) -> list[Piece]:
    """The window cut into pieces of one partition: Kafka's part in at most PIECE_OFFSETS offsets (and
    at least `slots` pieces in all, for a Spark job's task slots), the rest (rows only) likewise unless
    longer than MAX_SPLIT_OFFSETS."""
    spec, state = plan.spec, plan.state
    reads = [(s, shipped_metadata(s.table.metadata), io_properties(s.table.io.properties),
              [(t, _file_window(s.table, t.file)) for t in s.tasks])
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


def _strays(plan: _Plan) -> Findings:
    """Rows without source coordinates (foreign), in the files that may hold them: every live file whose
    metrics count nulls there in a full run, those the verified snapshots added otherwise."""
    found = Findings()
    for s in plan.tables:
        if s.table is None or s.scope.to is None or (plan.mode != "full" and not plan.null_rows.get(s.name)):
            continue
        tasks = [t for t in _plan_files(s.table, s.scope.to, _NO_COORDINATES)
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


def _key_rows(s: _TableState | None, keys: tuple[str, ...], cdc: bool = False) -> pa.Table:
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
            return spark.sparkContext.parallelize(pieces, len(pieces)).mapPartitions(run).collect()
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
    plan = _plan(spec, platform, mode, dict(upto or {}), since_s, snapshots, now)
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

    return sparkenv.session(platform, [spec.catalog], f"lakehouse-verify-{spec.name}")
