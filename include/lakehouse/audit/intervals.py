"""Offsets as disjoint half-open intervals: `Intervals` (one partition) and `Coverage` (a topic, per
partition). Pure arithmetic: union, intersection, difference, membership of many offsets at once.
Verification windows, recorded gaps, what Kafka and the rows hold (lakehouse.audit.coordinates) are
all of these.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from lakehouse.core.offsets import OffsetRange


class Intervals:
    """Offsets of one partition as sorted, disjoint, non-adjacent half-open intervals `[start, end)`.

    Immutable; every operation returns a new value. `Intervals.of([(5, 9), (0, 5)])` is `[0, 9)`.
    """

    __slots__ = ("spans", "_starts")

    def __init__(self, spans: tuple[tuple[int, int], ...] = ()):
        self.spans = spans
        self._starts = [s for s, _ in spans]

    @classmethod
    def of(cls, spans: Iterable[tuple[int, int]]) -> Intervals:
        """The union of `spans` ((start, end) pairs; empty and reversed pairs hold nothing)."""
        merged: list[list[int]] = []
        for start, end in sorted((int(s), int(e)) for s, e in spans if e > s):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return cls(tuple((s, e) for s, e in merged))

    @classmethod
    def from_offsets(cls, values: np.ndarray) -> Intervals:
        """The intervals holding exactly the offsets of the int64 array `values` (any order, repeats allowed)."""
        values = np.unique(np.asarray(values, dtype=np.int64))
        if not len(values):
            return cls()
        breaks = np.nonzero(np.diff(values) != 1)[0]
        starts = np.concatenate(([values[0]], values[breaks + 1]))
        ends = np.concatenate((values[breaks], [values[-1]])) + 1
        return cls(tuple(zip(starts.tolist(), ends.tolist(), strict=True)))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Intervals) and self.spans == other.spans

    def __hash__(self) -> int:
        return hash(self.spans)

    def __repr__(self) -> str:
        return "Intervals(" + ", ".join(f"[{s},{e})" for s, e in self.spans) + ")"

    def __contains__(self, offset: int) -> bool:
        at = bisect.bisect_right(self._starts, offset) - 1
        return at >= 0 and offset < self.spans[at][1]

    @property
    def count(self) -> int:
        """How many offsets the intervals hold."""
        return sum(e - s for s, e in self.spans)

    def union(self, other: Intervals) -> Intervals:
        return Intervals.of([*self.spans, *other.spans])

    def intersection(self, other: Intervals) -> Intervals:
        out, i, j = [], 0, 0
        while i < len(self.spans) and j < len(other.spans):
            (a, b), (c, d) = self.spans[i], other.spans[j]
            if max(a, c) < min(b, d):
                out.append((max(a, c), min(b, d)))
            if b <= d:
                i += 1
            else:
                j += 1
        return Intervals(tuple(out))

    def difference(self, other: Intervals) -> Intervals:
        out = []
        for start, end in self.spans:
            at = start
            for s, e in other.intersection(Intervals(((start, end),))).spans:
                if s > at:
                    out.append((at, s))
                at = e
            if at < end:
                out.append((at, end))
        return Intervals(tuple(out))

    def clip(self, start: int, end: int) -> Intervals:
        """The offsets of these intervals in `[start, end)`."""
        return self.intersection(Intervals.of([(start, end)]))

    def contains_many(self, values: np.ndarray) -> np.ndarray:
        """A boolean array: whether each offset of the int64 array `values` is in the intervals."""
        if not self.spans:
            return np.zeros(len(values), dtype=bool)
        starts = np.fromiter((s for s, _ in self.spans), dtype=np.int64, count=len(self.spans))
        ends = np.fromiter((e for _, e in self.spans), dtype=np.int64, count=len(self.spans))
        at = np.searchsorted(starts, values, side="right") - 1
        inside = at >= 0
        inside[inside] = values[inside] < ends[at[inside]]
        return inside


class Coverage:
    """Offsets of a topic: partition -> Intervals (partitions holding nothing are left out). Immutable."""

    __slots__ = ("partitions",)

    def __init__(self, partitions: Mapping[int, Intervals] | None = None):
        self.partitions = {int(p): iv for p, iv in sorted((partitions or {}).items()) if iv}

    @classmethod
    def of(cls, ranges: Mapping[int, Iterable[tuple[int, int]]]) -> Coverage:
        """From partition -> (start, end) pairs."""
        return cls({p: Intervals.of(spans) for p, spans in ranges.items()})

    @classmethod
    def of_ranges(cls, ranges: Mapping[int, tuple[int, int]]) -> Coverage:
        """From a summary's ranges: partition -> one (start, end) pair (lakehouse.core.offsets.decode_ranges)."""
        return cls.of({p: [r] for p, r in ranges.items()})

    def __bool__(self) -> bool:
        return bool(self.partitions)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Coverage) and self.partitions == other.partitions

    def __repr__(self) -> str:
        return f"Coverage({self.partitions})"

    def __contains__(self, coordinate: tuple[int, int]) -> bool:
        partition, offset = coordinate
        return offset in self.get(partition)

    def get(self, partition: int) -> Intervals:
        return self.partitions.get(partition, Intervals())

    @property
    def count(self) -> int:
        return sum(iv.count for iv in self.partitions.values())

    def union(self, other: Coverage) -> Coverage:
        return Coverage({p: self.get(p).union(other.get(p)) for p in {*self.partitions, *other.partitions}})

    def intersection(self, other: Coverage) -> Coverage:
        return Coverage({p: iv.intersection(other.get(p)) for p, iv in self.partitions.items()})

    def difference(self, other: Coverage) -> Coverage:
        return Coverage({p: iv.difference(other.get(p)) for p, iv in self.partitions.items()})

    def ranges(self, topic: str) -> list[OffsetRange]:
        """One OffsetRange per interval, in partition and offset order."""
        return [OffsetRange(topic, p, s, e) for p, iv in self.partitions.items() for s, e in iv]

    def head(self, intervals: int) -> Coverage:
        """The first `intervals` intervals (in partition and offset order), for listings that must stay short."""
        kept: dict[int, list[tuple[int, int]]] = {}
        for p, iv in self.partitions.items():
            room = intervals - sum(len(v) for v in kept.values())
            if room <= 0:
                break
            kept[p] = list(iv)[:room]
        return Coverage.of(kept)

    def to_json(self) -> dict[str, list[list[int]]]:
        """{"partition": [[start, end], ...]}."""
        return {str(p): [[s, e] for s, e in iv] for p, iv in self.partitions.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Iterable[Iterable[int]]]) -> Coverage:
        return cls.of({int(p): [(int(s), int(e)) for s, e in spans] for p, spans in data.items()})

    def describe(self, limit: int = 8) -> str:
        """`p0:[0,100) p2:[5,9),[12,20)` (the first `limit` intervals), for people."""
        parts, shown = [], 0
        for p, iv in self.partitions.items():
            spans = list(iv)[:max(0, limit - shown)]
            shown += len(spans)
            if spans:
                parts.append(f"p{p}:" + ",".join(f"[{s},{e})" for s, e in spans))
        more = sum(len(iv.spans) for iv in self.partitions.values()) - shown
        return " ".join(parts) + (f" (+{more} more)" if more > 0 else "") if parts else "nothing"
