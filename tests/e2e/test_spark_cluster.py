"""On a Spark standalone cluster (`lakehouse stack up --spark-cluster`), Airflow submits the ingest
and maintenance jobs through SparkSubmitOperator and the `spark_default` connection; executors run
in their own JVMs, and exactly-once and the dead letters hold when an executor dies mid-batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from e2e import assert_exactly_once, pipeline, rows, task_states, xcom  # noqa: F401 (fixture)
from lakehouse.core import config
from lakehouse_airflow.spark import spark_connection
from lakehouse_dev import produce, spark_cluster

pytestmark = pytest.mark.slow
LAKEHOUSE = str(Path(sys.executable).with_name("lakehouse"))


@pytest.fixture(scope="module")
def cluster(stack):
    """A master and a worker started with `lakehouse stack up --spark-cluster`, stopped after the module."""
    up = subprocess.run([LAKEHOUSE, "stack", "up", "--spark-cluster", "--spark-port", str(free_port()),
                         "--spark-ui-port", str(free_port()), "--json"],
                        capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield json.loads(up.stdout)["spark_cluster"]
    finally:
        spark_cluster.down()


def applications(cluster: dict) -> dict[str, dict]:
    """The master's finished applications by name (the last one of each name)."""
    info = spark_cluster.master_info(cluster["master_ui"])
    return {app["name"]: app for app in info["completedapps"]}


def executors_launched(cluster: dict, app_id: str) -> int:
    """How many executors the worker launched for `app_id` (one work folder each)."""
    return sum(1 for path in (Path(cluster["work_dir"]) / app_id).iterdir() if path.is_dir())


def test_stack_up_starts_a_master_and_a_worker_that_every_job_of_the_home_uses(cluster):
    assert cluster["running"] and cluster["workers_alive"] == 1 and cluster["cores"] >= 2
    assert cluster["master"].startswith("spark://127.0.0.1:")
    assert config.load().spark_master == cluster["master"]
    status = subprocess.run([LAKEHOUSE, "stack", "status"], capture_output=True, text=True, timeout=60)
    assert f"spark      {cluster['master']} (1 worker(s)" in status.stdout


def test_airflow_runs_ingest_and_maintenance_on_the_cluster_exactly_once_when_an_executor_dies(
        cluster, pipeline, platform, run_dag, monkeypatch):
    spec = pipeline(partition_by=[], maintenance={"min_input_files": 2},
                    trigger={"mode": "scheduled", "schedule": "@daily", "max_records_per_batch": 4000})
    sent = produce.produce(spec, 12_000, bad_ratio=0.05, seed=7)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_connection(cluster["master"]))
    # half way through one task's offset range, that task's executor JVM is SIGKILLed
    monkeypatch.setenv("LAKEHOUSE_FAULT", "executor_lost")

    ingest = run_dag(f"{spec.name}_ingest", Path(spec.path).parent)

    assert ingest.state == "success" and task_states(ingest) == {"ingest_once": "success"}
    assert (platform.home / "faults" / spec.name / "fired-executor_lost").exists()
    app = applications(cluster)[f"lakehouse-ingest-{spec.name}"]
    assert app["state"] == "FINISHED"
    # two executors at a core each, plus the one the master launched to replace the killed one
    assert executors_launched(cluster, app["id"]) >= 3
    # their local files (shuffle blocks, fetched jars) went under the stack's home, where the worker keeps them
    assert (platform.home / "spark" / "local").is_dir()
    assert assert_exactly_once(platform, spec) == 12_000
    assert len(rows(platform, spec, spec.dead_letter_table)) == sent.bad > 0

    monkeypatch.delenv("LAKEHOUSE_FAULT")
    maintain = run_dag(f"{spec.name}_maintenance", Path(spec.path).parent)

    assert maintain.state == "success"
    assert applications(cluster)[f"lakehouse-maintenance-{spec.name}"]["state"] == "FINISHED"
    receipt = xcom(maintain, "maintain_tables")
    data = next(t for t in receipt["tables"] if t["table"] == spec.qualified(spec.target.table))
    assert receipt["ok"] and data["data_files_after"] < data["data_files_before"]
    assert data["content_unchanged"] and data["rows_after"] == 12_000 - sent.bad
    assert assert_exactly_once(platform, spec) == 12_000


def test_spark_submit_of_the_ingest_entry_point_runs_on_the_master_it_was_given(cluster, pipeline, platform):
    """The documented spark-submit path ingests exactly once, and spark-submit's --master (in Airflow:
    the `spark_default` connection) decides where, not the home's cluster."""
    spec = pipeline()
    produce.produce(spec, 300, seed=3)
    before = set(applications(cluster))
    env = dict(os.environ, LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent), PYSPARK_PYTHON=sys.executable)
    run = subprocess.run(
        [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[1]", "--packages",
         ",".join(platform.spark_packages), str(config.REPO_ROOT / "spark_jobs" / "ingest.py"), "--pipeline", spec.name,
         "--once", "--json"], env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert assert_exactly_once(platform, spec) == 300
    assert set(applications(cluster)) == before
