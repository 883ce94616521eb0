"""Supervision keeps one continuous ingest job per pipeline alive: a dead or hung job is killed and
restarted with backoff (recorded on the ops timeline), a graceful stop ends the run, and scheduled
pipelines run `--once` micro-batches instead."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from polling import wait_until

from e2e import assert_exactly_once, lakehouse, pipeline, rows  # noqa: F401 (fixture)
from lakehouse.core import errors, events
from lakehouse.ops import supervision
from lakehouse_dev import produce

pytestmark = pytest.mark.slow
JOB = "spark_jobs/ingest.py"
WAIT_S = 240.0  # the most a test waits for the supervised job to get somewhere


def job_processes(spec) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The pipeline's running ingest job: (JVMs, Python drivers), found by command line."""
    jvms, drivers = [], []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if JOB not in cmd or spec.name not in cmd or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        (jvms if "org.apache.spark.deploy.SparkSubmit" in cmd else drivers).append(proc)
    return jvms, drivers


def one_driver(spec, exclude: set[int] = frozenset()) -> tuple[psutil.Process, psutil.Process]:
    """Wait until exactly one job of the pipeline runs (other than pids in `exclude`); (JVM, driver)."""
    def found():
        jvms, drivers = job_processes(spec)
        jvms = [p for p in jvms if p.pid not in exclude]
        drivers = [p for p in drivers if p.pid not in exclude]
        return (jvms[0], drivers[0]) if len(jvms) == 1 and len(drivers) == 1 else None
    return wait_until(found, WAIT_S, "one running ingest job")


def row_count(platform, spec) -> int:
    try:
        return len(rows(platform, spec, spec.target.table))
    except Exception:  # noqa: BLE001 - the table does not exist before the job's first start
        return 0


# -- the health-check library, without Airflow -------------------------------------------------


def observation(at: float, commit: int, position: int, end: int) -> supervision.Observation:
    return supervision.Observation(at=at, commits=(commit,), committed_at=None, positions={0: position},
                                   ends={0: end})


def test_a_job_is_hung_only_when_commits_stop_while_lag_grows(make_spec):
    spec = make_spec(trigger={"interval": "2s"}, supervision={"hung_after_triggers": 3})  # a 6s window
    detector = supervision.HangDetector(spec, startup_grace_s=100)
    assert detector.update(observation(0, 1, 10, 10)) is None
    # before the run's first commit, the startup grace applies on top of the window,
    # counted from when records were first seen waiting (t=50)
    assert detector.update(observation(50, 1, 10, 90)) is None
    assert detector.update(observation(150, 1, 10, 90)) is None
    assert "lag grew from 0 to 80" in detector.update(observation(156, 1, 10, 90))
    assert detector.update(observation(157, 2, 90, 95)) is None  # a commit: progress, no verdict
    # quiet topic: no commits for a long time, lag not growing -> healthy
    assert detector.update(observation(300, 2, 90, 95)) is None
    # after progress, the window alone counts; an idle job whose topic wakes up is not hung at once
    detector.update(observation(301, 3, 95, 95))
    assert detector.update(observation(900, 3, 95, 95)) is None
    assert detector.update(observation(905, 3, 95, 120)) is None
    assert detector.update(observation(909, 3, 95, 130)) is None
    assert "no commit for 6s since new records arrived" in detector.update(observation(911, 3, 95, 140))


def test_restart_backoff_doubles_from_the_spec_value(make_spec):
    spec = make_spec(supervision={"restart_backoff": "3s"})
    assert [supervision.backoff_s(spec, n) for n in (1, 2, 3)] == [3.0, 6.0, 12.0]
    assert supervision.backoff_s(spec, 40) == supervision.MAX_BACKOFF_S


def test_observe_reads_lag_from_the_broker_before_any_table_exists(platform, pipeline):
    spec = pipeline(partitions=2)
    produce.produce(spec, 60, seed=1)
    obs = supervision.observe(spec, platform)
    assert obs.lag == 60 and sum(obs.ends.values()) == 60
    assert obs.positions == {0: 0, 1: 0} and obs.committed_at is None


def test_the_job_lock_admits_one_job_and_stays_held_by_the_job_after_the_supervisor_lets_go(platform,
                                                                                             make_spec):
    spec = make_spec()
    lock = supervision.JobLock(platform, spec.name).acquire()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock.fd,),
                             start_new_session=True)
    try:
        lock.holder(child.pid)
        lock.release()
        with pytest.raises(errors.JobAlreadyRunningError, match=f"still running \\(process {child.pid}"):
            supervision.JobLock(platform, spec.name).acquire()
        supervision.kill_group(child.pid, child)
        assert not supervision.group_alive(child.pid)
        supervision.JobLock(platform, spec.name).acquire().release()  # free once the job is gone
    finally:
        if child.poll() is None:
            child.kill()


def test_a_job_that_keeps_failing_is_restarted_with_backoff_then_given_up(platform, make_spec):
    spec = make_spec(supervision={"restart_backoff": "0.2s", "max_restarts": 2})
    started = []

    def launch(lock_fd: int) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], pass_fds=(lock_fd,),
                                start_new_session=True)
        started.append(proc.pid)
        return proc

    sup = supervision.Supervisor(spec, platform, launch, driver_marker="sys.exit")
    with pytest.raises(errors.SupervisionError, match="2 restarts did not keep it alive"):
        sup.run()
    assert len(started) == 3
    restarts = sorted(events.recent(spec.name, "restart", platform=platform), key=lambda e: e["ts"])
    assert [(e["status"], e["details"].get("attempt"), e["details"].get("backoff_s")) for e in restarts] == \
        [("warn", 1, 0.2), ("warn", 2, 0.4), ("failed", None, None)]
    assert all(e["details"]["exit_code"] == 3 for e in restarts)


# -- the supervision DAG against the real stack ------------------------------------------------


def stop_gracefully(spec, runner_done: threading.Event, signalled: set[int]) -> None:
    """SIGTERM each of the pipeline's drivers once until the supervising task has ended (the test's
    way out). Once: a second SIGTERM could land while Python shuts down, after it has put the
    default handlers back, and kill a driver that is stopping gracefully."""
    while not runner_done.wait(2):
        for proc in job_processes(spec)[1]:
            if proc.pid not in signalled:
                signalled.add(proc.pid)
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)


def test_the_continuous_dag_restarts_a_killed_and_a_hung_job_and_ends_on_a_graceful_stop(
        platform, pipeline, run_dag):
    spec = pipeline(partitions=2, trigger={"interval": "1s"},
                    supervision={"restart_backoff": "1s", "max_restarts": 3, "hung_after_triggers": 5})
    seen: dict = {}
    signalled: set[int] = set()
    run_done = threading.Event()

    def operate() -> None:
        """What happens to the job while the DAG runs (dag.test needs the main thread)."""
        try:
            produce.produce(spec, 200, seed=5)
            wait_until(lambda: row_count(platform, spec) == 200, WAIT_S, "the first rows")
            jvm, driver = one_driver(spec)

            # a dead job: kill -9 the Spark driver's JVM; its orphaned Python driver must go too
            jvm.kill()
            jvm2, driver2 = one_driver(spec, exclude={jvm.pid, driver.pid})
            seen["orphan_gone"] = not driver.is_running() or driver.status() == psutil.STATUS_ZOMBIE
            produce.produce(spec, 100, seed=6)
            wait_until(lambda: row_count(platform, spec) == 300, WAIT_S, "rows after the restart")
            seen["restarts_after_kill"] = [(e["details"]["exit_code"], e["details"]["attempt"])
                                           for e in events.recent(spec.name, "restart", platform=platform)]

            # a hung job: the driver stops (SIGSTOP) while records keep arriving, once its batch is over in
            # every table (the watchdog, which checks every trigger interval, then sees this run's commits
            # in the catalog, so the run has progressed and no startup grace delays the verdict)
            wait_until(lambda: supervision.observe(spec, platform).lag == 0, WAIT_S,
                       "the restarted job's commits in every table")
            driver2.send_signal(signal.SIGSTOP)
            stop_producing = threading.Event()

            def trickle() -> None:
                seed = 100
                while not stop_producing.is_set():
                    produce.produce(spec, 10, seed=seed)
                    seed += 1
                    stop_producing.wait(0.5)

            producer = threading.Thread(target=trickle, daemon=True)
            producer.start()
            try:
                seen["hung"] = wait_until(lambda: events.recent(spec.name, "hung", platform=platform), WAIT_S,
                                          "a hung event")
                _, driver3 = one_driver(spec, exclude={jvm2.pid, driver2.pid})
            finally:
                stop_producing.set()
                producer.join()
            seen["stopped_driver_gone"] = not driver2.is_running() or driver2.status() == psutil.STATUS_ZOMBIE
            seen["total"] = sum(supervision.observe(spec, platform).ends.values())
            wait_until(lambda: row_count(platform, spec) == seen["total"], WAIT_S, "every record after the hang")

            # a graceful stop: SIGTERM to the driver, which finishes its batch and exits 0
            signalled.add(driver3.pid)
            driver3.send_signal(signal.SIGTERM)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test after the DAG run ends
            seen["error"] = exc
        finally:
            stop_gracefully(spec, run_done, signalled)

    operator = threading.Thread(target=operate, daemon=True)
    operator.start()
    try:
        dag_run = run_dag(f"{spec.name}_ingest", Path(spec.path).parent)
    finally:
        run_done.set()
        operator.join(60)
    if "error" in seen:
        raise seen["error"]
    assert seen["orphan_gone"] and seen["stopped_driver_gone"]
    assert seen["restarts_after_kill"] == [(-9, 1)]
    assert "while lag grew" in seen["hung"][0]["message"]
    assert dag_run.state == "success"
    ti = dag_run.get_task_instance("ingest_continuous")
    assert ti.state == "success"
    assert ti.xcom_pull(task_ids="ingest_continuous") == {"restarts": 2, "hangs": 1, "exit_code": 0,
                                                           "stopped": False}
    reasons = [e["details"]["reason"] for e in
               sorted(events.recent(spec.name, "restart", platform=platform), key=lambda e: e["ts"])]
    assert reasons[0] == "job exited with code -9" and reasons[1].startswith("hung: no commit")
    assert not any(job_processes(spec)), "the job outlived its supervising task"
    assert assert_exactly_once(platform, spec) == seen["total"]


def test_a_scheduled_pipeline_runs_a_once_micro_batch(platform, pipeline, run_dag):
    spec = pipeline(trigger={"mode": "scheduled", "schedule": "*/2 * * * *"})
    produce.produce(spec, 150, bad_ratio=0.1, seed=9)
    dag_run = run_dag(f"{spec.name}_ingest", Path(spec.path).parent)
    assert dag_run.state == "success"
    assert dag_run.get_task_instance("ingest_once").state == "success"
    assert assert_exactly_once(platform, spec) == 150


def test_a_second_ingest_process_of_a_pipeline_is_refused(platform, pipeline):
    spec = pipeline()
    with supervision.JobLock(platform, spec.name):
        second = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once")
    assert second.returncode == 1
    assert f"an ingest job of pipeline {spec.name!r} is still running (process {os.getpid()}" in second.stderr



def test_the_supervisor_summarises_the_committed_batches_in_the_task_log(platform, make_spec, caplog):
    spec = make_spec()
    batch = {"records": 1000, "rows": 990, "dead_letters": 10, "commit_retries": 1, "lag_records": 0,
             "freshness_s": 6.0, "plan_s": 0.1, "read_s": 1.0, "decode_s": 0.5, "write_s": 0.8, "commit_s": 0.2}
    # a job that commits three batches (their events on the timeline), then lives on for a few periods
    job = (f"import time\nfrom lakehouse.core import events\n"
           f"events.record(*[events.Event({spec.name!r}, 'batch', 'ok', '1000 records', {batch!r})] * 3)\n"
           f"time.sleep(4)\n")

    def launch(lock_fd: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", job], pass_fds=(lock_fd,), start_new_session=True)

    supervisor = supervision.Supervisor(spec, platform, launch, driver_marker="time.sleep", summary_every_s=1.0)
    with caplog.at_level(logging.INFO, logger="lakehouse.supervision"):
        assert supervisor.run().exit_code == 0
    summaries = [r.getMessage() for r in caplog.records if "batches in the last" in r.getMessage()]
    counted = [s for s in summaries if f"{spec.name}: 3 batches in the last" in s]
    assert len(counted) == 1, summaries  # each batch is summarised once, in the period it committed
    assert "3000 records" in counted[0] and "30 dead letters" in counted[0] and "3 commit retries" in counted[0]
    assert "read 1.00s, decode 0.50s, write 0.80s, commit 0.20s" in counted[0]
    assert all(": 3 batches" in s or "no batches committed" in s for s in summaries)
