"""Fault injection for the exactly-once tests: `LAKEHOUSE_FAULT=<point>` kills the ingest
process (kill -9, driver and JVM together) or fails a task at a named point, once.

Points: during_read, after_files, after_table_commit, before_group_commit, task_failure,
concurrent_commit. Markers under `<LAKEHOUSE_HOME>/faults/<pipeline>` make each fire once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINTS = ("during_read", "after_files", "after_table_commit", "before_group_commit", "task_failure",
          "concurrent_commit")


def configured() -> str | None:
    point = os.environ.get("LAKEHOUSE_FAULT") or None
    if point is not None and point not in POINTS:
        raise ValueError(f"LAKEHOUSE_FAULT={point!r} is not one of {', '.join(POINTS)}")
    return point


def marker_dir(home: Path, pipeline: str) -> Path:
    path = home / "faults" / pipeline
    path.mkdir(parents=True, exist_ok=True)
    return path


def claim(home: Path, pipeline: str, point: str) -> bool:
    """True the first time `point` is reached with LAKEHOUSE_FAULT set to it."""
    if configured() != point:
        return False
    marker = marker_dir(home, pipeline) / f"fired-{point}"
    if marker.exists():
        return False
    marker.touch()
    return True


def kill_process(pid: int | None = None) -> None:
    """SIGKILL the ingest process; its whole process group when it leads one (tests start it so)."""
    pid = pid or os.getpid()
    if os.getpgid(pid) == pid:
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
