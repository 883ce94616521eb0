"""SupervisedSparkSubmitOperator: the continuous ingest job, restarted when it dies or hangs."""

from __future__ import annotations

import threading
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from lakehouse.core import errors
from lakehouse.ops import supervision
from lakehouse_airflow.hooks import KAFKA_CONN_ID, LakehouseHook
from lakehouse_airflow.spark import connection_submit_environment
from lakehouse_airflow.spark_provider_internals import submitted_process


class _SubmittedJob:
    """One spark-submit run through the SparkSubmitHook, in its own process group, on a thread.

    `hook.submit` blocks while it relays the job's log, so it runs on a thread and the
    supervisor polls for the exit code.
    """

    def __init__(self, hook: SparkSubmitHook, application: str, lock_fd: int):
        self.hook = hook
        self.failure: AirflowException | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._submit, args=(application, lock_fd), daemon=True,
                                        name=f"spark-submit-{application}")
        self._thread.start()
        # the hook creates its Popen right away; wait for it (or for an early failure) to know the pid
        while submitted_process(hook) is None and self._thread.is_alive():
            self._thread.join(0.05)
        process = submitted_process(hook)
        if process is None:
            raise errors.SupervisionError(f"spark-submit did not start: {self.failure}")
        self.process = process
        self.pid = process.pid

    def _submit(self, application: str, lock_fd: int) -> None:
        try:
            # own process group: a kill reaches the JVM and the Python driver it started, not Airflow;
            # the inherited lock descriptor keeps the pipeline locked while any of them lives
            self.hook.submit(application, start_new_session=True, pass_fds=(lock_fd,))
        except AirflowException as exc:  # a non-zero exit: the supervisor reads the code below
            self.failure = exc

    def poll(self) -> int | None:
        # the process, not the log thread: an orphan holding the log pipe open must not hide the exit
        return self.process.poll()


class SupervisedSparkSubmitOperator(SparkSubmitOperator):
    """Runs pipeline `pipeline`'s continuous ingest job and keeps it alive (lakehouse.ops.supervision).

    A job that exits non-zero or hangs (no commit for `supervision.hung_after_triggers`
    triggers while lag grows) is killed with its process group and restarted after
    `supervision.restart_backoff`, doubled per restart, at most `supervision.max_restarts`
    times; then the task fails and Airflow's retries take over. A job fenced by a newer ingest job
    of the pipeline (exit code 4) fails the task without restarts or retries. Each hang and restart is
    an event on the ops timeline. A graceful stop of the job (SIGTERM to its driver, it
    exits 0) ends the task successfully; `on_kill` stops the job the same way.

    Kafka settings: the environment's, overridden by the Kafka connection `kafka_conn_id`
    (default `lakehouse_kafka`, skipped when it does not exist); the job gets the connection's
    settings through its process environment, never through templated fields.

    Templated fields: those of SparkSubmitOperator (application, application_args, conf, ...).
    XCom (return value): {"restarts", "hangs", "exit_code", "stopped"}.
    """

    def __init__(self, *, pipeline: str, startup_grace_s: float = 300.0, stop_grace_s: float = 60.0,
                 kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.startup_grace_s = startup_grace_s
        self.stop_grace_s = stop_grace_s
        self._supervisor: supervision.Supervisor | None = None

    def execute(self, context: Any) -> dict:  # type: ignore[override]  # SparkSubmitOperator.execute is annotated None; Airflow pushes what execute returns as its XCom
        lakehouse = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        with connection_submit_environment(self, lakehouse.submit_environment):
            self._supervisor = supervision.Supervisor(
                lakehouse.spec, lakehouse.platform, self._launch, driver_marker=self.application,
                startup_grace_s=self.startup_grace_s, stop_grace_s=self.stop_grace_s)
            try:
                return self._supervisor.run().to_json()
            except errors.JobFencedError as exc:  # a retry would fence the job that took over
                raise AirflowFailException(str(exc)) from None

    def _launch(self, lock_fd: int) -> _SubmittedJob:
        # the job runs under this supervisor's lock, so it must not try to take the lock itself
        self.env_vars = {**(self.env_vars or {}), supervision.SUPERVISED_ENV: self.pipeline}
        self._hook = self._get_hook()  # a fresh hook per start: it keeps per-run state (Popen, driver id)
        return _SubmittedJob(self._hook, self.application, lock_fd)

    def on_kill(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()
        if self._hook is not None:
            self._hook.on_kill()  # cluster deploy modes: kill the driver where it runs
