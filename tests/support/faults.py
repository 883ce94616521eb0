"""Fault injection for the exactly-once tests, through the product's fault hook (lakehouse.core.hooks;
the suite sets LAKEHOUSE_TEST_HOOKS to this file): `LAKEHOUSE_FAULT=<point>` kills the ingest
process (kill -9, driver and JVM together), fails a task, or makes another writer commit,
at a named point, once.

Points: during_read, between_steps, after_files, after_table_commit, before_group_commit, task_failure,
concurrent_commit, executor_lost (on a cluster: the task's executor JVM is killed half way
through its offset range, as the OOM killer or a lost node would), record_crash (the reader
raises on the record half way through every range it decodes, on every attempt, as a bug
triggered by one record would). Markers under `<LAKEHOUSE_HOME>/faults/<pipeline>` make
each other point fire once, so the retry or the rerun that follows can succeed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lakehouse.core.hooks import FaultHook

POINTS = ("during_read", "between_steps", "after_files", "after_table_commit", "before_group_commit",
          "task_failure", "concurrent_commit", "executor_lost", "record_crash")
TASK_POINTS = ("during_read", "task_failure", "executor_lost", "record_crash")  # reached inside Spark tasks
# Task points that fire where another one is reached: half way through a range.
_SITE = {"executor_lost": "during_read", "record_crash": "during_read"}
EXECUTOR_CLASS = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


def configured() -> str | None:
    point = os.environ.get("LAKEHOUSE_FAULT") or None
    if point is not None and point not in POINTS:
        raise ValueError(f"LAKEHOUSE_FAULT={point!r} is not one of {', '.join(POINTS)}")
    return point


def marker_dir(home: Path, pipeline: str) -> Path:
    path = home / "faults" / pipeline
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fire_once(markers: Path, point: str) -> bool:
    marker = markers / f"fired-{point}"
    if marker.exists():
        return False
    marker.touch()
    return True


def claim(home: Path, pipeline: str, point: str) -> bool:
    """True the first time `point` is reached with LAKEHOUSE_FAULT set to it."""
    return configured() == point and _fire_once(marker_dir(home, pipeline), point)


def kill_process(pid: int | None = None) -> None:
    """SIGKILL the ingest process; its whole process group when it leads one (tests start it so)."""
    pid = pid or os.getpid()
    if os.getpgid(pid) == pid:
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


class TaskFault:
    """The configured task-side fault, shipped to Spark tasks (which may not see the driver's env)."""

    def __init__(self, point: str, markers: Path, driver_pid: int):
        self.point, self.markers, self.driver_pid = point, str(markers), driver_pid

    def __call__(self, site: str) -> None:
        if site != _SITE.get(self.point, self.point):
            return
        if self.point == "record_crash":  # every time: only dead-lettering the record gets past it
            raise RuntimeError("injected reader crash on this record (LAKEHOUSE_FAULT=record_crash)")
        if not _fire_once(Path(self.markers), self.point):
            return
        if self.point == "task_failure":
            raise RuntimeError("injected task failure (LAKEHOUSE_FAULT=task_failure)")
        if self.point == "executor_lost":
            kill_executor()  # does not return
        else:
            kill_process(self.driver_pid)


def kill_executor() -> None:
    """SIGKILL the executor JVM this Python worker serves, then end the worker.

    Raises RuntimeError outside a cluster executor (local mode runs tasks in the driver's JVM).
    """
    pid = os.getppid()
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        if EXECUTOR_CLASS in cmdline:
            os.kill(pid, signal.SIGKILL)
            os._exit(1)
        pid = parent
    raise RuntimeError("LAKEHOUSE_FAULT=executor_lost needs a Spark cluster: this task runs in no executor JVM")


def task_fault(home: Path, pipeline: str) -> TaskFault | None:
    point = configured()
    return TaskFault(point, marker_dir(home, pipeline), os.getpid()) if point in TASK_POINTS else None


def commit_conflicting_change(table, key: str | None) -> None:
    """Another writer's commit to `table` (a pyiceberg Table): it deletes one existing row when there
    is a key and a row, else it sets a table property."""
    from pyiceberg.expressions import EqualTo

    victim = table.scan(selected_fields=(key,), limit=1).to_arrow().to_pylist() if key else []
    if victim:
        table.delete(EqualTo(key, victim[0][key]))
    else:
        with table.transaction() as tx:
            tx.set_properties({"lakehouse.test.concurrent-writer": str(time.time())})


class InjectedFaults(FaultHook):
    """LAKEHOUSE_FAULT's point, at the product's hook points, once (record_crash: every time)."""

    def check(self) -> None:
        configured()  # a misspelt LAKEHOUSE_FAULT fails at start, not silently

    def reached(self, point: str, *, home: Path, pipeline: str, **context) -> None:
        if not claim(home, pipeline, point):
            return
        if point != "concurrent_commit":
            kill_process()
        else:
            commit_conflicting_change(context["table"](), context["key"])

    def task_probe(self, home: Path, pipeline: str):
        return task_fault(home, pipeline)


def fault_hook() -> FaultHook:
    return InjectedFaults()
