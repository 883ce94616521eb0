"""A Spark task's Python worker is a fork of the lakehouse daemon (lakehouse.core.python_daemon), which imported
the reader's modules and froze their objects before forking: the worker did not import them itself.

The end-to-end half; the unit half is tests/unit/core/test_python_daemon.py.
"""

from __future__ import annotations

import pytest


def _worker_facts(_items):
    import gc

    import __main__

    spec = getattr(__main__, "__spec__", None)
    yield spec.name if spec is not None else None, gc.get_freeze_count()


@pytest.mark.slow
def test_a_tasks_python_worker_is_forked_from_the_daemon_that_imported_the_reader(spark):
    facts = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_worker_facts).collect()
    assert [main for main, _ in facts] == ["lakehouse.core.python_daemon"] * 2
    # objects frozen before the fork: the daemon's imports (PySpark's own daemon freezes nothing)
    assert all(frozen > 10_000 for _, frozen in facts)
