"""One piece of a verification: offsets `[start, end)` of one partition, read from Kafka and from every
table of the pipeline, and checked (`check_piece`, in this process or a Spark task; `check_rows`, the
exactly-once check itself, is pure). See lakehouse.audit.verify for what is checked and where.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata

from lakehouse.audit.coordinates import KAFKA_RECORDS, read_kafka
from lakehouse.audit.intervals import Coverage, Intervals
from lakehouse.audit.keys import TableKeys, key_text, newest_per_key
from lakehouse.audit.verify_model import Findings, Problem
from lakehouse.core.offsets import OffsetRange
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.reader import reader_consumer

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


