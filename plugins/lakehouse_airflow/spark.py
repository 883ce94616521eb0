"""How Airflow submits the lakehouse Spark jobs: one place builds SparkSubmitOperator arguments.

The master comes from the `spark_default` connection (any master: local[N],
spark://host:7077, yarn, k8s); `spark_connection()` returns the connection that
points at the local master the embedded stack uses, for `AIRFLOW_CONN_SPARK_DEFAULT`.
Arguments are passed as a list (never through a shell), and identifiers in them
come from validated specs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lakehouse import config
from lakehouse.spec import PipelineSpec

SPARK_JOBS = config.REPO_ROOT / "spark_jobs"
CONN_ID = "spark_default"
# LAKEHOUSE_* settings the job needs to find the same Kafka, catalog and warehouse as the DAG.
FORWARDED_ENV_PREFIXES = ("LAKEHOUSE_", "PYSPARK_")


def spark_connection(master: str | None = None) -> str:
    """The JSON of a `spark` connection to `master` (default: LAKEHOUSE_SPARK_MASTER or local[2])."""
    # provider 5.x refuses a `spark-home` extra: spark-submit is found on PATH (see submit_kwargs)
    return json.dumps({"conn_type": "spark", "host": master or config.load().spark_master})


def submit_kwargs(spec: PipelineSpec, job: str, *args: str, conn_id: str = CONN_ID) -> dict:
    """Keyword arguments for SparkSubmitOperator running `spark_jobs/<job>.py --pipeline <name> ARGS`."""
    python = sys.executable
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    # spark-submit ships with pyspark next to this interpreter; the hook looks it up on this PATH
    env.update(PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
               PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", python),
               PYSPARK_DRIVER_PYTHON=env.get("PYSPARK_DRIVER_PYTHON", python),
               LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent))
    return dict(
        conn_id=conn_id,
        application=str(SPARK_JOBS / f"{job}.py"),
        application_args=["--pipeline", spec.name, *args],
        jars=",".join(config.load().jars),
        name=f"lakehouse-{job}-{spec.name}",
        env_vars=env,
        conf={"spark.pyspark.python": env["PYSPARK_PYTHON"],
              "spark.pyspark.driver.python": env["PYSPARK_DRIVER_PYTHON"]},
    )
