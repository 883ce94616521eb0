"""Named extension points: where something outside the product may act at a moment of its work.

`faults()` is the one hook there is: the points of an ingest batch where the exactly-once tests
make the process die, a Spark task fail or another writer commit. The product's own hook does
nothing. A process gets another one only when LAKEHOUSE_TEST_HOOKS names a Python file that
defines `fault_hook()` (the test suite's `tests/support/faults.py`); the product never ships one, so a
production job with a stray LAKEHOUSE_FAULT variable injects nothing.

Points (`FaultHook.reached`), each with the context it is given:

    between_steps        a step of a batch written in steps (trigger.write_interval) wrote its files; more
                         steps may follow, nothing is committed (home, pipeline)
    after_files          the batch's files are written, nothing is committed (home, pipeline)
    after_table_commit   the data tables are committed, the dead-letter table is not (home, pipeline); never
                         reached where the catalog commits a batch's tables together (committer.commits_together)
    before_group_commit  every table is committed, the consumer group is not (home, pipeline)
    concurrent_commit    a table commit is about to start (home, pipeline, spark, table: a function
                         returning the pyiceberg Table as the commit was built on, key: its upsert key or
                         None)

`FaultHook.task_probe(home, pipeline)` may return a picklable callable that the Spark tasks call
with a site name ("task_failure" when a range starts, "during_read" half way through it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

VARIABLE = "LAKEHOUSE_TEST_HOOKS"


class FaultHook:
    """The product's fault hook: no point does anything."""

    def check(self) -> None:
        """Called when an ingest job starts; raises on a misconfigured hook."""

    def reached(self, point: str, *, home: Path, pipeline: str, **context: Any) -> None:
        """The ingest job of `pipeline` reached `point`."""

    def task_probe(self, home: Path, pipeline: str) -> Callable[[str], None] | None:
        """A callable the Spark tasks of a batch call at their sites, or None."""
        return None


_NO_FAULTS = FaultHook()
_lock = threading.Lock()
_loaded: dict[str, FaultHook] = {}


def faults() -> FaultHook:
    """The fault hook of this process: the product's no-op one unless LAKEHOUSE_TEST_HOOKS names a file."""
    path = os.environ.get(VARIABLE)
    if not path:
        return _NO_FAULTS
    with _lock:
        if path not in _loaded:
            name = f"lakehouse_test_hooks_{len(_loaded)}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise FileNotFoundError(f"{VARIABLE}={path!r}: no such Python file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            # Spark tasks get the hook's probes by value: executors cannot import a file of the test suite
            from pyspark import cloudpickle

            cloudpickle.register_pickle_by_value(module)
            _loaded[path] = module.fault_hook()
        return _loaded[path]
