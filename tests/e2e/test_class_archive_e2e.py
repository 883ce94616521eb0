"""The Spark driver's class archive (AppCDS): made once by `make setup` for the installed Java and PySpark, mapped
by every driver started afterwards (the CLI's, and spark-submit's from Airflow), never by an executor, which may run
on another host; named by a digest of the Java runtime and Spark's jars, so another Java or PySpark finds none.

Unit layer: names and JVM flags. Slow layer: a driver started by the platform loads Spark's classes from the
archive (the JVM's own class-loading log says where each class came from).

The end-to-end half; the unit half is tests/unit/core/test_class_archive.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lakehouse.core import sparkenv


@pytest.mark.slow
def test_a_driver_loads_sparks_classes_from_the_archive_setup_made(tmp_path):
    archive = sparkenv.class_archive()
    assert archive is not None and archive.exists(), "make setup makes the archive (scripts/setup.sh)"
    log = tmp_path / "classes.log"
    code = ("from lakehouse.core import config, sparkenv; "
            "spark = sparkenv.session(config.load(), [], 'archive-check'); spark.sql('SELECT 1').collect()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LAKEHOUSE_HOME": str(tmp_path),
                               "LAKEHOUSE_SPARK_JAVA_OPTIONS": f"-Xlog:class+load=info:file={log}"})
    assert done.returncode == 0, done.stderr[-2000:]
    [loaded] = [line for line in log.read_text().splitlines() if " org.apache.spark.SparkContext " in line]
    assert "source: shared objects file (top)" in loaded, loaded
