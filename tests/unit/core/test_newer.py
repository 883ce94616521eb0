"""The newer record wins (lakehouse.core.newer): the SQL condition an upsert MERGE and replay's tombstone filter
evaluate and the Python comparison the verifier checks tables with are one rule, so they agree on every pair of
records, unknown values and ties included.

The SQL is evaluated twice: by SQLite (the standard library; the condition uses only CASE, IS NOT NULL,
comparisons and three-valued logic, which SQLite evaluates as Spark SQL does) on many random pairs in the unit
layer, and by Spark itself, on the structs' real types, in the end-to-end layer (tests/e2e/test_newer_e2e.py).
"""

from __future__ import annotations

import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from lakehouse.audit import keys as verify
from lakehouse.core.newer import LATEST_ORDER, SOURCE_ORDER, Coordinates, is_newer, sql

FIELDS = ("partition", "offset", "timestamp", "position", "source_ts")
# small ranges, so that equal partitions, offsets, timestamps and source positions are frequent
small = st.none() | st.integers(0, 3)
coordinates = st.builds(Coordinates, partition=st.integers(0, 2) | st.none(), offset=small, timestamp=small,
                        position=small, source_ts=small)
pairs = st.lists(st.tuples(coordinates, coordinates), min_size=1, max_size=60)


def sqlite_verdicts(found: list[tuple[Coordinates, Coordinates]], by_source: bool) -> list[bool]:
    db = sqlite3.connect(":memory:")
    db.execute(f"CREATE TABLE r (id, side, {', '.join(FIELDS)})")
    db.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [(i, side, *(getattr(c, f) for f in FIELDS))
                    for i, pair in enumerate(found) for side, c in zip("st", pair, strict=True)])
    condition = sql("s", "t", "s", "t") if by_source else sql("s", "t")
    query = (f"SELECT s.id, COALESCE({condition}, 0) FROM r s JOIN r t ON s.id = t.id "
             f"WHERE s.side = 's' AND t.side = 't' ORDER BY s.id")
    return [bool(v) for _, v in db.execute(query).fetchall()]


@given(found=pairs, by_source=st.booleans())
def test_the_sql_condition_and_the_python_comparison_agree_on_any_pair(found, by_source):
    assert sqlite_verdicts(found, by_source) == [is_newer(s, t, by_source) for s, t in found]


@given(found=pairs, by_source=st.booleans())
def test_the_verifier_compares_records_by_the_rule(found, by_source):
    def as_tuple(c: Coordinates) -> tuple:
        return (c.partition, c.offset, c.timestamp, c.position, c.source_ts)

    assert [verify.newer(as_tuple(s), as_tuple(t), by_source) for s, t in found] == \
        [is_newer(s, t, by_source) for s, t in found]


def test_the_rules_decide_as_documented():
    assert is_newer(Coordinates(0, 5, 1), Coordinates(0, 4, 9))  # same partition: the offset, whatever the time
    assert not is_newer(Coordinates(0, 4, 9), Coordinates(0, 4, 9))  # the same record is not newer than itself
    assert is_newer(Coordinates(1, 0, 5), Coordinates(0, 9, 5))  # across partitions a timestamp tie goes to s
    assert not is_newer(Coordinates(1, 0, 4), Coordinates(0, 9, 5))
    # a change stream: the source's position first, then its time, each only when both know it and it differs
    assert is_newer(Coordinates(1, 0, 1, 8, 1), Coordinates(0, 0, 9, 7, 9), by_source=True)
    assert is_newer(Coordinates(1, 0, 1, 7, 9), Coordinates(0, 0, 9, 7, 1), by_source=True)
    assert not is_newer(Coordinates(1, 0, 1, None, 9), Coordinates(0, 0, 9, 7, 1), by_source=False)
    assert not is_newer(Coordinates(1, 0, 1, 8, None), Coordinates(0, 0, 9, None, None), by_source=True)
    assert not is_newer(Coordinates(1, 0, None), Coordinates(0, 0, None))  # unknown decides nothing, as in SQL
    assert SOURCE_ORDER == ("position", "source_ts") and LATEST_ORDER[-2:] == ("timestamp", "partition")
