"""The Airflow Spark provider's internals the supervised ingest operator relies on, and the only module that
touches them (apache-airflow-providers-apache-spark 5.6.0).

`SparkSubmitHook.submit` blocks while it relays the job's log and keeps the `spark-submit` process it started
in the private `_submit_sp` (None until it has started). The supervisor runs `submit` on a thread and needs
that process's pid to signal the job's process group, so it reads the attribute here.
tests/unit/house/test_adapters.py pins the version and that a new hook has the attribute.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

WRITTEN_AGAINST = ("apache-airflow-providers-apache-spark", "5.6.0")
INTERNALS = frozenset({"_submit_sp"})


def submitted_process(hook: SparkSubmitHook) -> subprocess.Popen | None:
    """The `spark-submit` process `hook.submit` started, or None while it has not started one."""
    return hook._submit_sp
