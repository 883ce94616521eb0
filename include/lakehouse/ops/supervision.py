"""Keeping one continuous ingest job alive: health checks, hang detection, restarts with backoff.

Two jobs of one pipeline must never commit at once. Across hosts the catalog fences them
(lakehouse.ingest.committer: the newest job's writer claim wins, an older job's commits fail and
it exits with code 4, which is never restarted). On one host `JobLock` also refuses a
second job before it starts: an exclusive lock file per pipeline that the supervisor holds
and hands to the job's processes (an inherited descriptor), so the lock is held while any
of them lives, even when the supervisor itself dies.

Health comes from the tables and Kafka, not from the job's own word: `observe()`
reads the newest commits carrying the pipeline's positions and the true log ends;
`HangDetector` calls a job hung when no such commit arrived within
`supervision.hung_after_triggers` trigger intervals while its lag grew (new records
arrive, nothing is committed). `Supervisor.run()` starts the job, watches for exit
or hang, kills what is left of its process group, and restarts it with exponential
backoff up to `supervision.max_restarts` times, recording `hung` and `restart`
events on the ops timeline.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

import psutil

from lakehouse.core import config, errors, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.errors import JobAlreadyRunningError, JobFencedError, SupervisionError
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.plan import topic_state_for
from lakehouse.ops import status

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 600.0
# Set (to the pipeline name) in the environment of a job the Supervisor started under its lock.
SUPERVISED_ENV = "LAKEHOUSE_SUPERVISED_PIPELINE"


class RunningJob(Protocol):
    """What the supervisor needs of a started job: its process (group leader) id and exit code."""

    pid: int

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class Observation:
    """One look at a pipeline: its newest positioned commits and Kafka's log ends."""

    at: float                   # monotonic seconds
    commits: tuple              # per table, the id of its newest snapshot carrying positions
    committed_at: datetime | None
    positions: dict[int, int]   # per partition, the pipeline's committed position (offsets.committed_positions)
    ends: dict[int, int]        # per partition, the log end

    @property
    def lag(self) -> int:
        """Records in Kafka that are not in every table yet."""
        return sum(max(0, end - self.positions.get(p, 0)) for p, end in self.ends.items())


def observe(spec: PipelineSpec, platform: config.PlatformConfig, clock: Callable[[], float] = time.monotonic,
            ) -> Observation:
    """Read the pipeline's progress from its tables and the log ends from Kafka.

    Raises SourceError when Kafka cannot be read, pyiceberg errors when the catalog cannot.
    """
    catalog = open_catalog(platform, spec.catalog)
    progress = [offsets.read_progress(catalog, t, spec.name) for t in spec.positioned_tables]
    state = topic_state_for(platform.kafka(), spec.source.topic, progress, timeout=10.0)
    positions = offsets.committed_positions(progress, state.earliest)
    committed = [tp.committed_at for tp in progress if tp.committed_at]
    return Observation(at=clock(), commits=tuple(tp.snapshot_id for tp in progress),
                       committed_at=max(committed) if committed else None, positions=positions,
                       ends={p: ps.end for p, ps in state.partitions.items()})


# how much earlier than its commit a batch event can be stamped (see Supervisor._summarise)
SUMMARY_LOOKBACK = timedelta(minutes=2)


class HangDetector:
    """Decides from successive observations of one job run whether the job is hung.

    A job is hung when records have been waiting (lag above its level at the last
    positioned commit) for `hung_after_triggers x interval` seconds without a new
    positioned commit, while the lag kept growing. The clock starts when new records
    are first seen waiting, not at the last commit: an idle job on a quiet topic commits
    nothing and is healthy. Until the run's first commit the job gets `startup_grace_s`
    more: starting Spark and catching up take longer than a trigger.
    """

    def __init__(self, spec: PipelineSpec, startup_grace_s: float):
        self.window_s = spec.supervision.hung_after_triggers * spec.trigger.interval_s
        self.startup_grace_s = startup_grace_s
        self.baseline: Observation | None = None  # the observation where the last progress was seen
        self.waiting_since: float | None = None  # when records past the baseline's lag were first seen
        self.progressed = False

    def update(self, obs: Observation) -> str | None:
        """Feed the next observation; returns why the job is hung, or None while it is healthy."""
        if self.baseline is None or obs.commits != self.baseline.commits:
            self.progressed = self.baseline is not None
            self.baseline, self.waiting_since = obs, None
            return None
        if obs.lag <= self.baseline.lag:
            self.waiting_since = None  # nothing new waits for a commit
            return None
        if self.waiting_since is None:
            self.waiting_since = obs.at
        stalled = obs.at - self.waiting_since
        allowed = self.window_s + (0.0 if self.progressed else self.startup_grace_s)
        if stalled >= allowed:
            return (f"no commit for {stalled:.0f}s since new records arrived (limit {allowed:.0f}s) while lag grew "
                    f"from {self.baseline.lag} to {obs.lag} records")
        return None


def backoff_s(spec: PipelineSpec, restart: int) -> float:
    """Delay before restart number `restart` (1-based): the spec's backoff, doubled per restart."""
    doubled: float = spec.supervision.restart_backoff_s * 2 ** (restart - 1)
    return min(MAX_BACKOFF_S, doubled)


class JobLock:
    """An exclusive per-pipeline lock file under LAKEHOUSE_HOME/locks; its `fd` is handed to the job.

    `acquire()` raises JobAlreadyRunningError naming the holder when a job (or its
    supervisor) of the pipeline still holds it.
    """

    def __init__(self, platform: config.PlatformConfig, pipeline: str):
        self.path = Path(platform.home) / "locks" / f"{pipeline}.ingest.lock"
        self.pipeline = pipeline
        self.fd: int | None = None

    def acquire(self) -> JobLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise JobAlreadyRunningError(
                f"an ingest job of pipeline {self.pipeline!r} is still running (process {holder}, lock "
                f"{self.path}); stop it before starting another: two jobs would write the same offsets") from None
        os.set_inheritable(fd, True)
        self.fd = fd
        self.holder(os.getpid())
        return self

    @property
    def held_fd(self) -> int:
        """The lock file's descriptor, while the lock is held (between `acquire` and `release`)."""
        if self.fd is None:
            raise RuntimeError(f"the ingest lock of pipeline {self.pipeline!r} is not held: acquire it first")
        return self.fd

    def holder(self, pid: int) -> None:
        """Note which process holds the lock (for the error message of the next one)."""
        os.ftruncate(self.held_fd, 0)
        os.pwrite(self.held_fd, str(pid).encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @classmethod
    def unless_supervised(cls, platform: config.PlatformConfig, pipeline: str) -> JobLock | contextlib.nullcontext:
        """The lock an ingest process takes for itself; a job the Supervisor started runs under the
        supervisor's lock already (SUPERVISED_ENV is set), so it takes none."""
        if os.environ.get(SUPERVISED_ENV) == pipeline:
            return contextlib.nullcontext()
        return cls(platform, pipeline)

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def stop_locked_jobs(platform: config.PlatformConfig, grace_s: float = 60.0) -> dict[str, int]:
    """Stop every ingest job that holds a pipeline lock under platform.home: SIGTERM to its process
    group (the driver finishes its batch), SIGKILL after `grace_s`. Returns {pipeline: pgid stopped}.

    For shutting the embedded stack down: supervised jobs run in their own process
    groups, so stopping Airflow's components alone would leave them running.
    """
    stopped = {}
    for path in sorted((Path(platform.home) / "locks").glob("*.ingest.lock")):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            continue  # nobody holds it
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
        if not holder.isdigit():
            continue
        pgid = int(holder)
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_alive(pgid):
            kill_group(pgid)
        stopped[path.name.removesuffix(".ingest.lock")] = pgid
    return stopped


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still exists (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, job: RunningJob | None = None, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of group `pgid` and wait until they are gone.

    Raises SupervisionError when processes remain after `timeout_s`: a second job
    must not start while any of the first lives.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job is not None:
            job.poll()  # reap the leader, or it lingers as a zombie of this process
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError:
            pass  # only zombies left (macOS reports EPERM for them); keep reaping
        time.sleep(0.1)
        if not group_alive(pgid):
            return
    raise SupervisionError(f"processes of group {pgid} survived SIGKILL for {timeout_s:.0f}s")


def driver_processes(pid: int, marker: str) -> list[psutil.Process]:
    """The job's driver program: the innermost processes of `pid`'s tree whose command line has `marker`.

    Under spark-submit both the JVM and the Python driver it starts carry the
    application path; the Python one, which handles SIGTERM by finishing its batch,
    is the innermost.
    """
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []

    def marked(proc: psutil.Process) -> bool:
        try:
            return marker in " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    candidates = [p for p in tree if marked(p)]
    inner = []
    for proc in candidates:
        try:
            below = proc.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        if not any(marked(child) for child in below):
            inner.append(proc)
    return inner


@dataclass
class SupervisionReport:
    """How a supervised run ended: restarts and hangs seen, the last exit code."""

    restarts: int = 0
    hangs: int = 0
    exit_code: int | None = None
    stopped: bool = False  # stopped on request (on_kill) rather than by the job's own exit

    def to_json(self) -> dict:
        return {"restarts": self.restarts, "hangs": self.hangs, "exit_code": self.exit_code,
                "stopped": self.stopped}


class Supervisor:
    """Runs `launch(lock_fd)` and keeps the job alive until it exits 0 or `stop()` is called.

    `launch` must start the job in its own process group (its `pid` is the group id)
    and pass `lock_fd` on to it. `driver_marker` (e.g. the application path) finds the
    driver process that `stop()` sends SIGTERM to. Health is checked every
    `check_every_s` (default: the trigger interval, at least 1s).
    """

    def __init__(self, spec: PipelineSpec, platform: config.PlatformConfig,
                 launch: Callable[[int], RunningJob], driver_marker: str, *, poll_s: float = 0.5,
                 check_every_s: float | None = None, startup_grace_s: float = 300.0, stop_grace_s: float = 60.0,
                 record: Callable[[events.Event], None] | None = None, summary_every_s: float = 60.0):
        self.spec = spec
        self.platform = platform
        self.launch = launch
        self.driver_marker = driver_marker
        self.poll_s = poll_s
        self.check_every_s = check_every_s or max(1.0, spec.trigger.interval_s)
        self.startup_grace_s = startup_grace_s
        self.stop_grace_s = stop_grace_s
        self.summary_every_s = summary_every_s
        self._record = record or (lambda event: events.record(event, platform=platform, catalog=spec.catalog))
        self._stop = threading.Event()
        self._job: RunningJob | None = None

    def run(self) -> SupervisionReport:
        """Supervise until the job exits 0 or stop() is called; the report says what happened.

        Raises JobAlreadyRunningError when another job of the pipeline runs, and
        SupervisionError once `max_restarts` restarts did not keep it alive.
        """
        report = SupervisionReport()
        with JobLock(self.platform, self.spec.name) as lock:
            while True:
                self._job = job = self.launch(lock.held_fd)
                lock.holder(job.pid)
                code, hung = self._watch(job)
                if self._stop.is_set():
                    kill_group(job.pid, job)
                    report.exit_code, report.stopped = code, True
                    return report
                if code == 0:
                    report.exit_code = 0
                    return report
                if code == errors.EXIT_FENCED:
                    report.exit_code = code
                    message = ("the job was fenced: another ingest job of the pipeline claimed its tables; not "
                               "restarting it (it would fence the other job in turn)")
                    self._event("restart", "failed", message, {"exit_code": code}, {"exit_code": code})
                    raise JobFencedError(f"pipeline {self.spec.name}: {message}")
                if hung:
                    report.hangs += 1
                    self._event("hung", "warn", f"job hung: {hung}; killing it",
                                {"attempt": report.restarts + 1}, {"reason": hung, "pid": job.pid})
                kill_group(job.pid, job)  # the job, or what is left of it (a driver orphaned by its JVM)
                code = job.poll() if code is None else code
                report.exit_code = code
                reason = f"hung: {hung}" if hung else f"job exited with code {code}"
                if report.restarts >= self.spec.supervision.max_restarts:
                    self._event("restart", "failed", f"{reason}; giving up after {report.restarts} restarts",
                                {"attempt": report.restarts}, {"reason": reason, "exit_code": code})
                    raise SupervisionError(f"pipeline {self.spec.name}: {reason}; "
                                           f"{report.restarts} restarts did not keep it alive")
                report.restarts += 1
                delay = backoff_s(self.spec, report.restarts)
                self._event("restart", "warn", f"{reason}; restart {report.restarts} in {delay:g}s",
                            {"attempt": report.restarts, "backoff_s": delay,
                             **({"exit_code": code} if code is not None else {})},
                            {"reason": reason, "exit_code": code, "attempt": report.restarts, "backoff_s": delay,
                             "pid": job.pid})
                if self._stop.wait(delay):
                    report.stopped = True
                    return report

    def _summarise(self, since: datetime, until: datetime, summarised: set[str]) -> set[str]:
        """Log the batches that reached the timeline since the last summary (the Airflow task log's
        running account of the ops timeline); returns the ids of the batch events now summarised.

        An event is stamped before its commit lands, so the scan looks SUMMARY_LOOKBACK further
        back than `since` and skips the events the last summary already counted (`summarised`)."""
        try:
            batches = events.recent(self.spec.name, "batch", since=since - SUMMARY_LOOKBACK, limit=100_000,
                                    platform=self.platform, catalog=self.spec.catalog)
        except Exception as exc:  # noqa: BLE001 - a timeline outage must not stop supervision
            log.warning("could not read the batch events of %s: %s", self.spec.name, exc)
            return summarised
        new = [b for b in batches if b["event_id"] not in summarised]
        log.info("%s: %s", self.spec.name, status.batch_summary(new, (until - since).total_seconds()))
        return {b["event_id"] for b in batches}

    def _watch(self, job: RunningJob) -> tuple[int | None, str | None]:
        """Wait for the job to exit (its code, None) or to hang (None, why); returns early on stop().
        Every `summary_every_s` the task log gets a summary of the batches committed meanwhile."""
        detector = HangDetector(self.spec, self.startup_grace_s)
        next_check = time.monotonic() + self.check_every_s
        next_summary, summary_since = time.monotonic() + self.summary_every_s, datetime.now(UTC)
        summarised: set[str] = set()
        while not self._stop.is_set():
            code = job.poll()
            if code is not None:
                return code, None
            if time.monotonic() >= next_summary:
                until = datetime.now(UTC)
                summarised = self._summarise(summary_since, until, summarised)
                next_summary, summary_since = time.monotonic() + self.summary_every_s, until
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.check_every_s
                try:
                    hung = detector.update(observe(self.spec, self.platform))
                except Exception as exc:  # noqa: BLE001 - the watchdog not seeing is no reason to kill the job
                    log.warning("health check of %s failed: %s", self.spec.name, exc)
                    continue
                if hung:
                    return None, hung
            self._stop.wait(self.poll_s)
        return job.poll(), None

    def stop(self) -> None:
        """Stop gracefully: SIGTERM the driver (it finishes its batch), SIGKILL the group after the grace."""
        self._stop.set()
        job = self._job
        if job is None or job.poll() is not None:
            return
        for proc in driver_processes(job.pid, self.driver_marker):
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + self.stop_grace_s
        while job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_group(job.pid, job)

    def _event(self, kind: str, status: str, message: str, metrics: dict, details: dict) -> None:
        log.warning("%s: %s", self.spec.name, message)
        try:
            self._record(events.Event(self.spec.name, kind, status, message, metrics, details))
        except Exception as exc:  # noqa: BLE001 - a timeline outage must not stop supervision
            log.warning("could not record %s event of %s: %s", kind, self.spec.name, exc)
