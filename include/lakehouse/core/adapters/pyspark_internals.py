"""PySpark's internals the platform relies on, and the only module that touches them (pyspark 3.5.9).

PySpark's Python API has no call for what the platform asks of the JVM directly: Iceberg's CommitMetadata
(a commit's summary properties for a SQL statement), Iceberg's Action API (orphan files, a dry run of
compaction), the driver's status store (a job group's wall time), clearing a job group, Java exception classes
(whether a failure is a conflict or transient). It reaches the JVM the way PySpark itself does: a session's
`_jsparkSession`, a context's `_jvm` and `_jsc`, the class-level `SparkContext._gateway` (None until a JVM runs)
and `SparkContext._ensure_initialized` (joins spark-submit's JVM), and a CapturedException's `_origin` (the
Java exception behind an AnalysisException and its kin). tests/test_adapters.py pins the version and that each
is still there.
"""

from __future__ import annotations

from typing import Any

WRITTEN_AGAINST = ("pyspark", "3.5.9")
INTERNALS = frozenset({"_jvm", "_jsc", "_jsparkSession", "_gateway", "_ensure_initialized", "_origin"})


def jvm(spark: Any) -> Any:
    """The py4j view of the JVM behind the session `spark` (`jvm.org.apache.iceberg...`)."""
    return spark.sparkContext._jvm


def java_session(spark: Any) -> Any:
    """The JVM's SparkSession behind `spark` (what Iceberg's Java APIs take)."""
    return spark._jsparkSession


def java_context(spark: Any) -> Any:
    """The JVM's JavaSparkContext behind `spark`."""
    return spark.sparkContext._jsc


def gateway() -> Any:
    """The py4j gateway of this process's JVM, None when no JVM runs (no session was started)."""
    from pyspark import SparkContext

    return SparkContext._gateway


def join_submitted_jvm() -> None:
    """Connect to the JVM that spark-submit started for this driver (PYSPARK_GATEWAY_PORT), so that a SparkConf
    reads its properties; starts no session."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()


def captured_java_exception(exc: BaseException) -> Any:
    """The Java exception a PySpark CapturedException (AnalysisException, ...) was made from, else None."""
    return getattr(exc, "_origin", None)
