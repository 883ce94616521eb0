"""The verdict on one record (the table in lakehouse.audit.trace says what each means): from the rows that
hold it (`held_verdict`), or, when none does, from where it stands in Kafka and in the pipeline's
commits (`Whereabouts`, `not_held_verdict`). Pure: lakehouse.audit.trace gathers what they decide on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lakehouse.audit.keys import RecordKey, newer
from lakehouse.core.spec import PipelineSpec

VERDICTS = ("in-table", "dead-letter", "tombstone", "duplicated", "foreign", "superseded", "deleted",
            "not-yet-ingested", "gap", "beyond-log-end", "no-record", "aged-out", "missing", "not-held")
BREACHES = ("duplicated", "missing", "foreign")  # verdicts that break exactly-once: `lakehouse trace` exits 3


@dataclass
class Sighting:
    """A row that holds the record: its table, role, the row itself (JSON-safe) and the commits of the
    pipeline whose ranges hold the offset there, newest first."""

    table: str
    role: str  # data | dead-letter | tombstones
    row: dict
    commits: list[dict] = field(default_factory=list)
    history_complete: bool = True



def held_verdict(spec: PipelineSpec, partition: int, offset: int, sightings: list[Sighting]) -> tuple[str, str]:
    """The verdict and message for a record that rows hold (`sightings`, at least one). Pure."""
    where = f"{spec.source.topic}[{partition}]@{offset}"
    counted = [s for s in sightings if s.role != "tombstones"]
    if len(counted) > 1:
        return "duplicated", (f"{where} is held {len(counted)} times (" + ", ".join(s.table for s in counted)
                              + f"): a breach of exactly-once; `lakehouse verify --pipeline {spec.name}` lists every "
                                f"duplicate")
    first = counted[0] if counted else sightings[0]
    if not first.commits and first.history_complete and first.role != "tombstones":
        return "foreign", (f"a row of {first.table} holds {where}, but no commit of the pipeline covers that offset "
                           f"(past the committed position, or written by something else): a breach of exactly-once; "
                           f"`lakehouse verify --pipeline {spec.name}` lists every foreign row")
    when = (f", committed by snapshot {first.commits[-1]['snapshot_id']} at {first.commits[-1]['at']} "
            f"({first.commits[-1]['kind']})" if first.commits else "")
    if first.role == "dead-letter":
        return "dead-letter", (f"{where} is a dead letter in {first.table}: {first.row.get('error_kind')}: "
                               f"{first.row.get('error_detail')}{when}. Fix the contract or the producer, then "
                               f"`lakehouse replay --pipeline {spec.name} --dead-letters`")
    if first.role == "tombstones":
        return "tombstone", (f"{where} is a tombstone: it deleted key {first.row['_kafka'].get('key')!r}; the ledger "
                             f"{first.table} keeps it so that replays cannot bring the key back")
    return "in-table", f"{where} is a row of {first.table}{when}"


@dataclass(frozen=True)
class Whereabouts:
    """What decides the verdict of a record no row holds: its partition's earliest offset, log end and
    committed position, the commit that recorded a gap holding it (if one did), the Kafka record at the
    offset when it was read (`read`: it was asked for), and for an upsert pipeline keyed by the Kafka key
    the coordinates (partition, offset, timestamp ms) of its key's row and newest tombstone."""

    earliest: int
    end: int
    committed: int
    gap: dict | None = None
    read: bool = False
    record: dict | None = None
    key_row: tuple | None = None        # (partition, offset, timestamp ms[, position, source_ts]): keys.newer
    key_tombstone: tuple | None = None
    table_key: RecordKey | None = None  # the record's table key, derived as ingestion derives it


def not_held_verdict(spec: PipelineSpec, partition: int, offset: int, w: Whereabouts) -> tuple[str, str]:
    """The verdict and message for a record no row holds. Pure."""
    where = f"{spec.source.topic}[{partition}]@{offset}"
    if offset >= w.end:
        return "beyond-log-end", (f"{where} is past the end of the partition (log end {w.end}): Kafka has not "
                                  f"received it")
    if w.gap is not None:
        return "gap", (f"{where} aged out of Kafka before it was ingested: the gap was recorded by snapshot "
                       f"{w.gap['snapshot_id']} of {w.gap['table']} at {w.gap['at']}")
    if offset >= w.committed:
        return "not-yet-ingested", (f"{where} is not ingested yet: the committed position of partition {partition} "
                                    f"is {w.committed}, {w.end - w.committed} records behind the log end {w.end}")
    if offset < w.earliest:
        return "aged-out", (f"no table holds {where}, and Kafka no longer does (its earliest offset is "
                            f"{w.earliest}), so whether it was lost or replaced cannot be told any more")
    if not w.read or w.record is None:
        return "no-record", (f"Kafka delivers no record at {where} (a transaction marker or an aborted record): "
                             f"there is nothing to ingest")
    replay = (f"Replay it with `lakehouse replay --pipeline {spec.name} --offsets {partition}:{offset}-{offset + 1}` "
              f"and run `lakehouse verify --pipeline {spec.name}`")
    missing = ("missing", f"Kafka holds {where} and the pipeline committed past it (position {w.committed}), but "
                          f"no table holds it: a breach of exactly-once. {replay}")
    if spec.target.mode != "upsert":
        return missing
    if not spec.tombstones_delete or spec.target.fanout is not None:
        return "not-held", (f"no row holds {where}: in this upsert table a newer record of its key may have replaced "
                            f"it; `lakehouse verify --pipeline {spec.name}` checks each key's newest record")
    if w.table_key is None:
        return "missing", (f"Kafka holds {where} and the pipeline committed past it (position {w.committed}), but its "
                           f"key does not decode and the dead-letter table does not hold it: a breach of exactly-once. "
                           f"{replay}")
    key = w.record.get("table_key")
    cdc = w.table_key.cdc or {}
    source_ts = cdc.get("source_ts")
    mine = (partition, offset, w.record.get("timestamp_ms"), cdc.get("position"),
            source_ts // 1000 if source_ts is not None else None)
    if w.key_row is not None and newer(w.key_row, mine, by_source=spec.is_cdc):
        return "superseded", (f"{where} was replaced by a newer record of key {key!r} (partition {w.key_row[0]}, "
                              f"offset {w.key_row[1]})")
    if w.key_tombstone is not None and newer(w.key_tombstone, mine):
        return "deleted", (f"key {key!r} of {where} was deleted by the record at partition {w.key_tombstone[0]}, "
                           f"offset {w.key_tombstone[1]}")
    return missing
