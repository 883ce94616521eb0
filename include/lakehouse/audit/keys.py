"""Upsert tables, key by key: each Kafka record's table key as ingestion derives it (`TableKeys`,
`key_text`), each key's newest record as the MERGE decides it (`newest_per_key`, `newer`), and the
upsert invariant over them (`check_keys`, pure). lakehouse.audit.verify checks with these;
lakehouse.audit.trace tells with them whether a record was superseded or deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.audit.verify_model import Findings, Problem
from lakehouse.core.newer import SOURCE_ORDER, Coordinates, is_newer
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.newest import COORDINATES, ROW, ranked

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
        from lakehouse.ingest.layout import arrow_type
        from lakehouse.ingest.validator import RecordValidator

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
        from lakehouse.ingest.rejects import Rejected

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
        text: str = key_text([pa.array([v], t) for v, t in zip(found.values, self.types, strict=True)]).to_pylist()[0]
        return text

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
    """The newest record of each key among `records` (KAFKA_RECORDS or NEWEST rows), in key order, as the
    ingest job ranks a batch's records (lakehouse.ingest.newest), a tombstone with the source order it
    inherits. Records without a key are left out. Pure."""
    for name in SOURCE_ORDER:
        if name not in records.column_names:
            records = records.append_column(name, pa.nulls(records.num_rows, NEWEST.field(name).type))
    records = records.filter(pc.is_valid(records.column("key"))).select(NEWEST.names).cast(NEWEST)
    coordinates = {name: records.column({"timestamp": "timestamp_ms"}.get(name, name)) for name in COORDINATES}
    newest = ranked([records.column("key")], coordinates)
    chosen = records.take(newest.column(ROW))
    for name in SOURCE_ORDER:
        chosen = chosen.set_column(chosen.schema.get_field_index(name), name, newest.column(name))
    return chosen


def newer(a: tuple, b: tuple, by_source: bool = False) -> bool:
    """Whether record `a` supersedes record `b` in an upsert MERGE (lakehouse.core.newer: with `by_source`, a
    change stream's rules). Each is (partition, offset, timestamp ms[, position, source_ts])."""
    return is_newer(Coordinates(*a[:3], *(a[3:5] if by_source else ())),
                    Coordinates(*b[:3], *(b[3:5] if by_source else ())), by_source)


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


