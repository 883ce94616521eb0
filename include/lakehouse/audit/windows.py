"""Which snapshots and offsets a verification covers (its window), per table, and the chain of earlier
verifications it continues (see lakehouse.audit.verify for the modes and what each covers).

`plan(...)` reads each positioned table's lineage on main, the snapshots the mode chooses, the
offsets their summaries hold and the `_kafka` bounds of every data file they added or removed
(`file_window`, `changed_files`; an upsert table's changed rows too), and returns the `Plan`: the
window, the part of it Kafka still holds, the recorded gaps and each table's files to read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table

from lakehouse.audit.coordinates import (
    Lineage,
    integer_bound,
    is_on_main,
    lineage,
    pinned,
    plan_files,
    window_filter,
)
from lakehouse.audit.intervals import Coverage, Intervals
from lakehouse.audit.verify_model import CHAIN_MODES, HISTORY_EVENTS, TableScope
from lakehouse.core import config, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import VerifyError
from lakehouse.core.offsets import TableProgress
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.plan import TopicState, topic_state_for

log = logging.getLogger("lakehouse.verify")

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
class TableState:
    """One table of a run: its role, the table (None: it does not exist), its scope and lineage, the columns
    a piece reads from it and the files that may hold rows of the window."""

    name: str
    role: str                       # data | dead-letter | tombstones
    table: Table | None
    scope: TableScope
    lineage: Lineage | None
    columns: tuple[str, ...] = ("_kafka.topic", "_kafka.partition", "_kafka.offset")
    tasks: list[FileScanTask] = field(default_factory=list)


@dataclass
class Plan:
    """What a run covers: its tables, the topic's state, the committed positions, the recorded gaps, the
    window, the part of it Kafka holds, the files that may hold rows without coordinates, and whether each
    key's newest record is checked (upsert keyed by the Kafka key, no fan-out)."""

    spec: PipelineSpec
    mode: str
    tables: list[TableState]
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


def file_window(table: Table, data_file) -> Coverage | None:
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


def changed_files(table: Table, snapshot_ids: set[int]) -> tuple[list, bool]:
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


def plan(spec: PipelineSpec, platform: config.PlatformConfig, mode: str, upto: dict[str, int],
         since_s: float | None, between: tuple[int, int] | None, now: datetime) -> Plan:
    """Which snapshots, offsets and files a run covers. Raises VerifyError for snapshots that are not on
    main, PositionsLostError for a table whose positions cannot be found, the planner's SourceErrors."""
    catalog = open_catalog(platform, spec.catalog)
    verified = verified_snapshots(spec, platform) if mode == "incremental" else {}
    named = _named_table(spec, catalog, between) if mode == "snapshots" and between is not None else None
    since_ms = int((now - timedelta(seconds=since_s or 0)).timestamp() * 1000)
    states: list[TableState] = []
    for name in spec.positioned_tables:
        role = "dead-letter" if name == spec.dead_letter_table else "data"
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            states.append(TableState(name, role, None, TableScope(name, None, None, (), {}), None))
            continue
        head = table.current_snapshot()
        to = upto.get(name, between[1] if between is not None and named == name
                      else head.snapshot_id if head else None)
        if to is None:
            states.append(TableState(name, role, table, TableScope(name, None, None, (), {}), None))
            continue
        if not is_on_main(table, to):
            raise VerifyError(f"{spec.qualified(name)}: snapshot {to} is not on main (unknown, expired, or main "
                              f"was rolled back below it)")
        table_mode = mode if mode != "snapshots" or named == name else "none"
        scope, history = _scope(name, table, spec.name, to, table_mode, verified.get(name, set()), since_ms,
                                between if named == name else None)
        states.append(TableState(name, role, table, scope, history))
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
            found = file_window(table, data_file)
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
            cover_files(s.name, present, [task.file for task in plan_files(present, to)])
            continue
        if s.lineage is None:
            continue
        commits = {c.snapshot_id: c for c in s.lineage.commits}
        for sid in s.scope.snapshots:
            cover(commits[sid].ranges.union(commits[sid].gaps))
        changed, deletes = changed_files(present, set(s.scope.snapshots))
        if deletes and not upsert:
            log.warning("%s: position or equality deletes in the snapshots verified; verifying every row",
                        spec.qualified(s.name))
            return plan(spec, platform, "full", upto, since_s, between, now)
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
            s.tasks = plan_files(s.table, s.scope.to, window_filter(_hull(window)))
    return Plan(spec, "full" if full else mode, states, state, committed,
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


def _ledger(spec: PipelineSpec, catalog, name: str) -> TableState:
    """The tombstone ledger `name`, read at its head: its rows are coordinates of tombstones (no positions)."""
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        return TableState(name, "tombstones", None, TableScope(name, None, None, (), {}), None)
    head = table.current_snapshot()
    return TableState(name, "tombstones", table, TableScope(name, head.snapshot_id if head else None, None, (), {}),
                      None, columns=("_kafka.topic", "_kafka.partition", "_kafka.offset", "_kafka.timestamp",
                                     *spec.target.key))


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


