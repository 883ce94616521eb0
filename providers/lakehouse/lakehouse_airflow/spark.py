"""How Airflow submits the lakehouse Spark jobs: one place builds SparkSubmitOperator arguments.

The master comes from the `spark_default` connection (any master: local[N],
spark://host:7077, yarn, k8s); `spark_connection()` returns the connection that
points at the local master the embedded stack uses, for `AIRFLOW_CONN_SPARK_DEFAULT`.
Arguments are passed as a list (never through a shell), and identifiers in them
come from validated specs.

Secrets never go through `env_vars`: it is a templated field, so Airflow renders it,
stores it with the task instance and shows it in the UI. `submit_kwargs` therefore
forwards an allow-list, not everything minus known secrets (`forwardable`): the
settings the jobs read (`config.ENVIRONMENT`, `config.JOB_ENVIRONMENT`) and the
LAKEHOUSE_KAFKA_<PROP> variables of the non-secret librdkafka properties in
`config.PUBLIC_KAFKA_PROPERTIES`, each only when its value holds no password
(`config.holds_password`: a catalog URI with one stays out). Everything else,
LAKEHOUSE_KAFKA_SASL_PASSWORD and any variable the lists do not name among it, reaches
the job from the worker's own environment: SparkSubmitHook.submit
(apache-airflow-providers-apache-spark 5.x) starts spark-submit with `os.environ.copy()`
updated with `env_vars` (on Kubernetes with the worker's environment as it is), and in
client deploy mode the driver runs in that process. A driver in cluster deploy mode
(YARN, Kubernetes) runs elsewhere and must get its secrets from the cluster (e.g. a
Kubernetes secret).

The connections' settings (Kafka, catalog, object store, schema registry: lakehouse_airflow.hooks)
reach the job the same way:
`connection_submit_environment` puts them into the worker process's environment only while
the operator's `execute` runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from lakehouse.core import config, sparkenv
from lakehouse.core.spec import PipelineSpec
from lakehouse_airflow import locations

CONN_ID = "spark_default"


def spark_connection(master: str | None = None) -> str:
    """The JSON of a `spark` connection to `master` (default: LAKEHOUSE_SPARK_MASTER or local[2])."""
    # provider 5.x refuses a `spark-home` extra: spark-submit is found on PATH (see submit_kwargs)
    return json.dumps({"conn_type": "spark", "host": master or config.load().spark_master})


def forwardable(name: str, value: str) -> bool:
    """Whether variable `name`=`value` may be written into templated `env_vars`: a setting the Spark
    jobs read (the allow-lists of lakehouse.core.config) whose value holds no password."""
    if name.startswith(config.KAFKA_PREFIX):
        known = config.kafka_property(name) in config.PUBLIC_KAFKA_PROPERTIES
    else:
        known = name in config.ENVIRONMENT or name in config.JOB_ENVIRONMENT
    return known and not config.holds_password(value)


def forwarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that `forwardable` lets into templated `env_vars`."""
    return {name: value for name, value in environ.items() if forwardable(name, value)}


def submit_kwargs(spec: PipelineSpec, job: str, *args: str, conn_id: str = CONN_ID) -> dict:
    """Keyword arguments for SparkSubmitOperator running `<job>.py --pipeline <name> ARGS` from the Spark jobs
    folder the provider is configured with (lakehouse_airflow.locations.spark_job).

    `env_vars` holds the allowed settings of this environment (`forwarded_environment`), the
    interpreter's PATH and the spec's folder; spark-submit inherits everything else, secrets
    among it, from the worker's environment.
    """
    python = sys.executable
    env = forwarded_environment(os.environ)
    # spark-submit ships with pyspark next to this interpreter; the hook looks it up on this PATH
    env.update(PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
               PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", python),
               PYSPARK_DRIVER_PYTHON=env.get("PYSPARK_DRIVER_PYTHON", python),
               LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent))
    platform = config.load()
    name = f"lakehouse-{job}-{spec.name}"
    # spark-submit starts the driver's JVM (in client mode, on this worker) with the flags the CLI's jobs get:
    # logging, LAKEHOUSE_SPARK_JAVA_OPTIONS, the class archive, an S3-compatible store's checksum settings
    jvm = sparkenv.spark_conf(platform, [spec.catalog], name)
    return dict(
        conn_id=conn_id,
        application=locations.spark_job(job),
        application_args=["--pipeline", spec.name, *args],
        packages=",".join(platform.spark_packages),
        jars=",".join(platform.jars) or None,
        name=name,
        env_vars=env,
        conf={"spark.pyspark.python": env["PYSPARK_PYTHON"],
              "spark.pyspark.driver.python": env["PYSPARK_DRIVER_PYTHON"],
              **{f"spark.{side}.extraJavaOptions": jvm[f"spark.{side}.extraJavaOptions"]
                 for side in ("driver", "executor")},
              **platform.spark_conf},
    )


@contextlib.contextmanager
def connection_submit_environment(operator, env: dict[str, str]) -> Iterator[None]:
    """While the block runs, the connections' settings `env` (LakehouseHook.submit_environment: Kafka as
    LAKEHOUSE_BOOTSTRAP_SERVERS / LAKEHOUSE_KAFKA_*, the catalog as LAKEHOUSE_CATALOG_URI / LAKEHOUSE_WAREHOUSE,
    the object store as LAKEHOUSE_S3_* and AWS_*, the schema registry as LAKEHOUSE_SCHEMA_REGISTRY_URL)
    are in this process's environment, where spark-submit, started from it, inherits them; the
    operator's `env_vars` lose the keys the connections set, so the connections win over what the DAG
    file's environment forwarded. Restored afterwards.

    Nothing is written into templated fields or XCom; Airflow has already stored the rendered
    `env_vars` before `execute` runs, and they never held these values.
    """
    if not env:
        yield
        return
    saved = {key: os.environ.get(key) for key in env}
    forwarded = operator.env_vars
    operator.env_vars = {k: v for k, v in (forwarded or {}).items() if k not in env}
    os.environ.update(env)
    try:
        yield
    finally:
        operator.env_vars = forwarded
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
