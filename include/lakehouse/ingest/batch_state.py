"""The state of one ingest batch, as values: what the loop (lakehouse.ingest.job) planned and wrote, handed to
the committer (lakehouse.ingest.batch_commit).

A batch moves through its states by new values, never by changing one: `BatchState.planned` when its plan is
made, `with_tables` when its tables are loaded again (a schema change evolved them), `with_written` once the
tasks wrote its files. The mappings it holds are read-only views.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING

from lakehouse.core.offsets import TableProgress
from lakehouse.core.spec import PipelineSpec

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from lakehouse.ingest.plan import BatchPlan
    from lakehouse.ingest.taskwriter import TaskResult

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc(epoch_us: int) -> datetime:
    """The UTC datetime of `epoch_us` microseconds since the epoch."""
    return _EPOCH + timedelta(microseconds=epoch_us)


@dataclass(frozen=True)
class Written:
    """What the tasks of one batch wrote: files per table and the batch's numbers, summed."""

    files: Mapping[str, list] = field(default_factory=dict)  # table -> pyiceberg DataFiles
    staged: Mapping[str, list[str]] = field(default_factory=dict)  # upsert table -> staging Parquet files
    rows: Mapping[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    max_event_us: int | None = None
    min_kafka_us: int | None = None
    seconds: float = 0.0  # wall time of the Spark job
    read_s: float = 0.0  # task seconds, summed over the tasks
    decode_s: float = 0.0
    write_s: float = 0.0
    tasks: int = 0
    busy_s: float = 0.0  # wall seconds from each task's start to its end, summed over the tasks
    launch_s: float = 0.0  # from the job's start to its first task's start (scheduling, worker hand-off)
    tail_s: float = 0.0  # from the last task's end to the results on the driver

    @classmethod
    def of(cls, results: list[TaskResult], started: float, ended: float) -> Written:
        """The tasks' `results` of a Spark job that ran from `started` to `ended` (time.time)."""
        files: dict[str, list] = {}
        staged: dict[str, list[str]] = {}
        rows: dict[str, int] = {}
        for r in results:
            for table, found in r.files.items():
                files.setdefault(table, []).extend(found)
            for table, paths in r.staged.items():
                staged.setdefault(table, []).extend(paths)
            for table, n in r.rows.items():
                rows[table] = rows.get(table, 0) + n
        event_us = [r.max_event_us for r in results if r.max_event_us is not None]
        kafka_us = [r.min_kafka_us for r in results if r.min_kafka_us is not None]
        return cls(files=files, staged=staged, rows=rows, dead_letters=sum(r.dead_letters for r in results),
                   max_event_us=max(event_us) if event_us else None, min_kafka_us=min(kafka_us) if kafka_us else None,
                   seconds=ended - started, read_s=sum(r.read_s for r in results),
                   decode_s=sum(r.decode_s for r in results), write_s=sum(r.write_s for r in results),
                   tasks=len(results), busy_s=sum(r.ended - r.started for r in results),
                   launch_s=max(0.0, min(r.started for r in results) - started) if results else 0.0,
                   tail_s=max(0.0, ended - max(r.ended for r in results)) if results else 0.0)

    def plus(self, later: Written) -> Written:
        """What this write and a `later` one of the same batch wrote together (a batch written in steps)."""
        def joined(mine: Mapping[str, list], theirs: Mapping[str, list]) -> dict[str, list]:
            return {t: [*mine.get(t, []), *theirs.get(t, [])] for t in {**mine, **theirs}}

        def extreme(pick, *values: int | None) -> int | None:
            present = [v for v in values if v is not None]
            return pick(present) if present else None

        return Written(
            files=joined(self.files, later.files), staged=joined(self.staged, later.staged),
            rows={t: self.rows.get(t, 0) + later.rows.get(t, 0) for t in {**self.rows, **later.rows}},
            dead_letters=self.dead_letters + later.dead_letters,
            max_event_us=extreme(max, self.max_event_us, later.max_event_us),
            min_kafka_us=extreme(min, self.min_kafka_us, later.min_kafka_us),
            seconds=self.seconds + later.seconds, read_s=self.read_s + later.read_s,
            decode_s=self.decode_s + later.decode_s, write_s=self.write_s + later.write_s,
            tasks=self.tasks + later.tasks, busy_s=self.busy_s + later.busy_s,
            launch_s=self.launch_s + later.launch_s, tail_s=self.tail_s + later.tail_s)

    @property
    def max_event_time(self) -> datetime | None:
        return utc(self.max_event_us) if self.max_event_us is not None else None

    @property
    def min_kafka_time(self) -> datetime | None:
        return utc(self.min_kafka_us) if self.min_kafka_us is not None else None


@dataclass(frozen=True)
class BatchState:
    """One batch of `spec`'s pipeline: its `plan` and id, its tables as last `loaded`, each table's progress
    when the plan was made (`planned_from`; a table missing there is not checked) and, once the tasks ran,
    what they `written`."""

    spec: PipelineSpec
    plan: BatchPlan
    batch_id: str
    loaded: Mapping[str, Table]
    planned_from: Mapping[str, TableProgress] = field(default_factory=dict)
    written: Written = field(default_factory=Written)

    def __post_init__(self) -> None:
        for name in ("loaded", "planned_from"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    @classmethod
    def planned(cls, spec: PipelineSpec, plan: BatchPlan, batch_id: str, loaded: Mapping[str, Table],
                progress: list[TableProgress]) -> BatchState:
        """A batch as planned from the tables' `progress`, nothing written yet."""
        return cls(spec, plan, batch_id, loaded, {tp.table: tp for tp in progress})

    def with_tables(self, loaded: Mapping[str, Table], spec: PipelineSpec | None = None) -> BatchState:
        """This batch with its tables as loaded again (after they followed `spec`, an evolved contract)."""
        return replace(self, loaded={**self.loaded, **loaded}, spec=spec or self.spec)

    def with_written(self, written: Written) -> BatchState:
        """This batch once its tasks wrote `written`."""
        return replace(self, written=written)

    def followed_by(self, step: BatchState) -> BatchState:
        """This batch grown by `step`, a written state planned from where this one's plan ends: the plans
        joined, the writes summed, the tables (and spec) as `step` last loaded them. Its tables' progress
        stays as this batch planned from, which the commit checks."""
        return replace(self, plan=self.plan.followed_by(step.plan), written=self.written.plus(step.written),
                       loaded={**self.loaded, **step.loaded}, spec=step.spec)

    @property
    def tables(self) -> list[str]:
        """The tables the batch writes, in commit order: the data tables, then the dead-letter table."""
        return [*self.spec.target.tables, self.spec.dead_letter_table]

    def rows(self, table: str) -> int:
        """The rows (dead letters, for the dead-letter table) the batch wrote to `table`."""
        return self.written.dead_letters if table == self.spec.dead_letter_table else self.written.rows.get(table, 0)

    def progress(self, table: str) -> TableProgress:
        """`table`'s progress when the batch was planned (none held yet, when not known)."""
        return self.planned_from.get(table) or TableProgress(table, True)
