"""The Python daemon of Spark's executors (`spark.python.daemon.module`): PySpark's own, with the modules a
reader task needs imported once, before it forks a worker per task slot.

PySpark's daemon forks every Python worker from itself. Imported here, pyarrow, pyiceberg and the reader
are in each forked worker already (shared, copy-on-write) instead of being imported again by every worker:
one import per executor rather than one per task slot (about 1.5 s of CPU each here). The objects they
created are frozen out of the cyclic GC's way (`gc.freeze`): a worker's collections do not walk them, nor
dirty their shared pages. A module that fails to import is left to the task that needs it, which then says why.
The zip archives on `sys.path` are read once here too (`sparkenv.steady_zip_imports`), not again at each task.
"""

from __future__ import annotations

import contextlib
import gc
import importlib

from lakehouse.core import sparkenv

# what a reader task imports (lakehouse.ingest.taskwriter's task function, pyiceberg's Parquet writer)
PRELOADED = ("lakehouse.ingest.taskwriter", "pyiceberg.io.pyarrow")


def preload(modules: tuple[str, ...] = PRELOADED) -> None:
    """Import `modules` (those that import at all) and make the zip importers steady, then freeze every object
    alive out of the cyclic GC."""
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    sparkenv.steady_zip_imports()
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    preload()
    from pyspark import daemon

    daemon.manager()
