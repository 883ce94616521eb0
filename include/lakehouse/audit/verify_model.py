"""What a verification says (lakehouse.audit.verify runs one): the problems it can find, the findings of a
piece or a run, the scope of each table and the result, with the words the `verify` event and the
publish gate read (MODES, CHAIN_MODES, PROBLEMS). Pure: no catalog, no Kafka.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from lakehouse.audit.intervals import Coverage
from lakehouse.core.errors import VerifyError

MODES = ("incremental", "full", "since", "snapshots")
CHAIN_MODES = ("incremental", "full")  # runs that prove a table's whole state at the snapshot they name
PROBLEMS = ("missing", "duplicated", "foreign", "stale")
MAX_PROBLEMS = 100              # problems listed in a result and its event (counts are exact)
HISTORY_EVENTS = 2000           # `verify` events read back to find what was verified
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


