"""The Spark entry point runs under spark-submit as documented (the path Airflow's SparkSubmitOperator takes)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import pipeline, assert_exactly_once  # noqa: F401 (fixture)
from lakehouse import config, produce

pytestmark = pytest.mark.slow
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))


def test_spark_submit_of_the_ingest_entry_point_ingests_exactly_once(platform, pipeline):
    spec = pipeline()
    produce.produce(spec, 500, bad_ratio=0.1, seed=21)
    env = dict(os.environ, LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent), PYSPARK_PYTHON=sys.executable)
    run = subprocess.run(
        [SPARK_SUBMIT, "--master", "local[2]", "--jars", ",".join(platform.jars),
         str(config.REPO_ROOT / "spark_jobs" / "ingest.py"), "--pipeline", spec.name, "--once", "--json"],
        env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert '"records":500' in run.stdout
    assert assert_exactly_once(platform, spec) == 500
