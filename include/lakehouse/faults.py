"""Fault injection for the exactly-once tests: `LAKEHOUSE_FAULT=<point>` kills the ingest
process (kill -9, driver and JVM together), fails a task, or makes another writer commit,
at a named point, once.

Points: during_read, after_files, after_table_commit, before_group_commit, task_failure,
concurrent_commit. Markers under `<LAKEHOUSE_HOME>/faults/<pipeline>` make each fire once,
so the retry or the rerun that follows can succeed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

POINTS = ("during_read", "after_files", "after_table_commit", "before_group_commit", "task_failure",
          "concurrent_commit")
TASK_POINTS = ("during_read", "task_failure")  # reached inside Spark tasks


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

    def __call__(self, point: str) -> None:
        if point != self.point or not _fire_once(Path(self.markers), point):
            return
        if point == "task_failure":
            raise RuntimeError("injected task failure (LAKEHOUSE_FAULT=task_failure)")
        kill_process(self.driver_pid)


def task_fault(home: Path, pipeline: str) -> TaskFault | None:
    point = configured()
    return TaskFault(point, marker_dir(home, pipeline), os.getpid()) if point in TASK_POINTS else None


@contextlib.contextmanager
def kill_when_files_appear(home: Path, pipeline: str, data_dir: Callable[[], Path]) -> Iterator[None]:
    """With LAKEHOUSE_FAULT=after_files: kill -9 once the write's data files exist, before its commit."""
    if configured() != "after_files":
        yield
        return
    directory = data_dir()
    before = set(directory.rglob("*.parquet")) if directory.exists() else set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if directory.exists() and set(directory.rglob("*.parquet")) - before:
                if claim(home, pipeline, "after_files"):
                    kill_process()
                return
            time.sleep(0.002)

    threading.Thread(target=watch, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def commit_concurrently(spark, table, key: str | None) -> None:
    """Another writer commits to `table` (a pyiceberg Table) while this process's write runs.

    Once the write's first Spark stage runs (its snapshot is fixed), it deletes one existing row
    (a conflicting change for an upsert MERGE), or sets a table property when there is no key or row.
    """
    tracker = spark.sparkContext.statusTracker()

    def commit_when_running() -> None:
        deadline = time.monotonic() + 60
        while not tracker.getActiveStageIds() and time.monotonic() < deadline:
            time.sleep(0.01)
        from pyiceberg.expressions import EqualTo

        victim = table.scan(selected_fields=(key,), limit=1).to_arrow().to_pylist() if key else []
        if victim:
            table.delete(EqualTo(key, victim[0][key]))
        else:
            with table.transaction() as tx:
                tx.set_properties({"lakehouse.test.concurrent-writer": str(time.time())})

    threading.Thread(target=commit_when_running, daemon=True).start()
