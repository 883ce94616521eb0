"""Change events of a `mode: cdc` pipeline: Debezium's envelope (`op`, `before`, `after`, `source`), read
as RecordValidator.check_change needs it. `change_meta` gives an event's op and its `_cdc` value (the op,
the source's commit time, its position in the source's log, `source_position`), `unwrap` takes Kafka
Connect's JSON with schemas ({"schema": ..., "payload": ...}) off a value or key.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from lakehouse.ingest.checks import MAX_TIMESTAMP_US, MIN_TIMESTAMP_US
from lakehouse.ingest.rejects import Rejected, show


def unwrap(obj: Any) -> Any:
    """Kafka Connect's JSON with schemas ({"schema": ..., "payload": ...}) as its payload; anything else as is."""
    if isinstance(obj, dict) and len(obj) == 2 and "schema" in obj and "payload" in obj:
        return obj["payload"]
    return obj


def epoch_ms_to_us(ms: Any) -> int | None:
    """A source's commit time `ts_ms` (epoch millis) as epoch micros; None for anything else or out of range."""
    if type(ms) is int and MIN_TIMESTAMP_US <= ms * 1000 <= MAX_TIMESTAMP_US:
        return ms * 1000
    return None


MAX_POSITION = 10 ** 38 - 1  # the `_cdc.position` column is a decimal(38,0)
# the fields of an event's `source` its `_cdc` value reads (`change_meta`: the commit time and `source_position`)
SOURCE_FIELDS = ("ts_ms", "lsn", "file", "pos", "row", "change_lsn", "event_serial_no", "scn", "sec", "ord")


def source_position(source: dict) -> Decimal | None:
    """Where a change event stands in its source database's log, as one number that orders the events of
    one connector: PostgreSQL's `lsn`; MySQL's binlog `file` number, `pos` and `row`; SQL Server's
    `change_lsn` and `event_serial_no`; Oracle's `scn`; MongoDB's `sec` and `ord`. None for a source
    without one (ordering then falls back to the commit time and the Kafka timestamp)."""
    try:
        if isinstance(source.get("lsn"), int):
            found = source["lsn"]
        elif isinstance(source.get("file"), str) and isinstance(source.get("pos"), int):
            number = int(re.sub(r"\D", "", source["file"])[-12:] or 0)
            found = (number * 10 ** 12 + source["pos"]) * 10 ** 6 + int(source.get("row") or 0)
        elif isinstance(source.get("change_lsn"), str):
            found = int(source["change_lsn"].replace(":", ""), 16) * 10 ** 6 + int(source.get("event_serial_no") or 0)
        elif isinstance(source.get("scn"), (str, int)):
            found = int(source["scn"])
        elif isinstance(source.get("sec"), int):
            found = source["sec"] * 10 ** 9 + int(source.get("ord") or 0)
        else:
            return None
    except (ValueError, TypeError, OverflowError):
        return None
    return Decimal(found) if 0 <= found <= MAX_POSITION else None



def change_meta(event: Any) -> tuple[str, dict]:
    """(op, `_cdc` value) of a Debezium change event (unwrapped): the op is c, r, u or d; the `_cdc` value
    holds it, the source's commit time (epoch micros) and its position in the source's log. Rejected for
    anything that is no change event, a truncate (t) and a logical decoding message (m)."""
    if not isinstance(event, dict):
        raise Rejected("bad_envelope", f"not a Debezium change event: the payload is {show(event)}")
    op = event.get("op")
    if op in ("t", "m"):
        raise Rejected("unsupported_change", "a truncate (op t) empties the whole source table and is not applied "
                                             "row by row; replay the table's snapshot instead" if op == "t" else
                       "a logical decoding message (op m) carries no row")
    if op is None:
        raise Rejected("bad_envelope", "not a Debezium change event: it has no `op`")
    if op not in ("c", "r", "u", "d"):
        raise Rejected("bad_envelope", f"op {show(op)} is not a Debezium operation (c, r, u, d, t, m)")
    source = event.get("source")
    if not isinstance(source, dict):
        source = {}
    return op, {"op": op, "source_ts": epoch_ms_to_us(source.get("ts_ms", event.get("ts_ms"))),
                "position": source_position(source)}

