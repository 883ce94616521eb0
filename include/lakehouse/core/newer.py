"""The newer record wins: which of two records of one key an upsert keeps, defined once.

A record's coordinates are Kafka's (partition, offset, timestamp) and, in a change stream, the source's
(`position` in its log and commit time `source_ts`). Record `s` (incoming) is newer than record `t` (held)
by the first of these rules that applies (RULES):

1. in the same partition: the higher offset;
2. across partitions, in a change stream only: the later source position, then the later source time,
   each when both records carry one and they differ;
3. across partitions: a Kafka timestamp no older (a tie goes to the incoming record).

A comparison with an unknown value (SQL NULL, Python None) decides nothing, as in SQL: `s` is then not
newer. From the rules come the Spark SQL condition of an upsert MERGE and of replay's tombstone filter
(`sql`), the comparison lakehouse.audit.keys checks a table with (`is_newer`), and the order a batch picks
each key's newest record by (`LATEST_ORDER`). Pure; standard library only.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Coordinates:
    """Where and when a record is: Kafka's coordinates, and a change event's place in its source."""

    partition: int | None
    offset: int | None
    timestamp: int | None  # Kafka's timestamp (both records in the same unit)
    position: int | None = None  # the change's position in the source's log (change streams)
    source_ts: int | None = None  # the change's commit time in the source (change streams)


@dataclass(frozen=True)
class Rule:
    """`field` of `s` against `t` by `op`, when `partitions` ("same" or "across") relate them; a `source` rule
    (a change stream's) decides only when both values are known and differ, else the next rule does."""

    partitions: str
    field: str
    op: str  # ">" or ">="
    source: bool = False


# The rules, in order (see the module's docstring).
RULES = (Rule("same", "offset", ">"),
         Rule("across", "position", ">", source=True),
         Rule("across", "source_ts", ">", source=True),
         Rule("across", "timestamp", ">="))
# The fields a change stream orders a key's changes by across partitions (a tombstone, which has none,
# takes those of the change before it in its partition).
SOURCE_ORDER = tuple(r.field for r in RULES if r.source)
# Each key's newest record among many (a batch, a verifier's window): within a partition the highest offset,
# across partitions the highest of these, in order, descending, unknown values last (SOURCE_ORDER for a
# change stream only), then the highest partition.
LATEST_ORDER = (*SOURCE_ORDER, "timestamp", "partition")
KAFKA_FIELDS = ("partition", "offset", "timestamp")

_OPS: dict[str, Callable[[Any, Any], bool]] = {">": operator.gt, ">=": operator.ge}


def sql(s: str = "s._kafka", t: str = "t._kafka", s_source: str | None = None, t_source: str | None = None) -> str:
    """The rules as a SQL boolean expression: `s` and `t` are the Kafka coordinates' structs (or table
    aliases) of the incoming and the held record, with fields partition, offset, timestamp;
    `s_source`/`t_source` those of the change events (fields position, source_ts), given for a change
    stream only. Spark SQL (and any dialect with CASE and `<>`)."""
    def side(rule: Rule, which: str) -> str:
        if rule.field in KAFKA_FIELDS:
            return f"{s if which == 's' else t}.{rule.field}"
        return f"{s_source if which == 's' else t_source}.{rule.field}"

    same = " AND ".join(f"{side(r, 's')} {r.op} {side(r, 't')}" for r in RULES if r.partitions == "same")
    whens = [f"WHEN {a} IS NOT NULL AND {b} IS NOT NULL AND {a} <> {b} THEN {a} {r.op} {b}"
             for r in RULES if r.source and s_source is not None
             for a, b in [(side(r, "s"), side(r, "t"))]]
    last = [f"{side(r, 's')} {r.op} {side(r, 't')}" for r in RULES if r.partitions == "across" and not r.source]
    across = f"CASE {' '.join(whens)} ELSE {last[0]} END" if whens else last[0]
    return (f"(({s}.partition = {t}.partition AND {same}) OR "
            f"({s}.partition <> {t}.partition AND {across}))")


def is_newer(s: Coordinates, t: Coordinates, by_source: bool = False) -> bool:
    """Whether `s` is newer than `t` by the rules (`by_source`: a change stream's, with its source rules);
    exactly what `sql` evaluates to, NULL read as false."""
    def compare(rule: Rule) -> bool | None:
        a, b = getattr(s, rule.field), getattr(t, rule.field)
        return None if a is None or b is None else _OPS[rule.op](a, b)

    def both(*values: bool | None) -> bool | None:  # SQL's AND
        return False if False in values else None if None in values else True

    same_partition = None if s.partition is None or t.partition is None else s.partition == t.partition
    same = both(same_partition, *(compare(r) for r in RULES if r.partitions == "same"))
    across: bool | None = None
    for rule in (r for r in RULES if r.partitions == "across"):
        if rule.source:
            a, b = getattr(s, rule.field), getattr(t, rule.field)
            if by_source and a is not None and b is not None and a != b:
                across = compare(rule)
                break
        else:
            across = compare(rule)
            break
    other = both(None if same_partition is None else not same_partition, across)
    return same is True or other is True
