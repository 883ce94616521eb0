"""Helpers for end-to-end tests: run the CLI as users do, read tables, check exactly-once."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from lakehouse.core import offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.config import PlatformConfig
from lakehouse.core.spec import PipelineSpec

LAKEHOUSE = str(Path(sys.executable).with_name("lakehouse"))


def lakehouse(spec: PipelineSpec | None, *args: str, fault: str | None = None, timeout: float = 300,
              **popen) -> subprocess.CompletedProcess:
    """Run `lakehouse ARGS` in its own process group (so a kill -9 takes its JVM with it)."""
    env = dict(os.environ)
    env.pop("LAKEHOUSE_FAULT", None)
    if spec is not None:
        env["LAKEHOUSE_PIPELINES_DIR"] = str(Path(spec.path).parent)
    if fault:
        env["LAKEHOUSE_FAULT"] = fault
    return subprocess.run([LAKEHOUSE, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True, **popen)


def run_cli(spec: PipelineSpec | None, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """`lakehouse ARGS` run in this process, as `lakehouse.cli.main` (the entry point of the command),
    reusing the test session's Spark session instead of starting a JVM per call; `fault` is its
    LAKEHOUSE_FAULT (one that does not kill the process). Tests of process behaviour (kill -9,
    signals, the installed command) use `lakehouse()` instead."""
    from lakehouse import cli

    out, err = io.StringIO(), io.StringIO()
    settings = {"LAKEHOUSE_FAULT": fault}
    if spec is not None:
        settings["LAKEHOUSE_PIPELINES_DIR"] = str(Path(spec.path).parent)
    saved = {name: os.environ.get(name) for name in settings}
    _set_environment(settings)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse refusing an argument
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        _set_environment(saved)
    return subprocess.CompletedProcess(["lakehouse", *args], code, out.getvalue(), err.getvalue())


def _set_environment(values: dict[str, str | None]) -> None:
    """Set each variable of `values`, removing those whose value is None."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def spawn(spec: PipelineSpec, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `lakehouse ARGS` in its own process group; `env` adds to (or overrides) this environment."""
    base = dict(os.environ, LAKEHOUSE_PIPELINES_DIR=str(Path(spec.path).parent))
    base.pop("LAKEHOUSE_FAULT", None)
    env = {**base, **(env or {})}
    return subprocess.Popen([LAKEHOUSE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def receipts(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def table(platform: PlatformConfig, spec: PipelineSpec, name: str):
    return open_catalog(platform, spec.catalog).load_table(name)


def rows(platform: PlatformConfig, spec: PipelineSpec, name: str) -> list[dict]:
    return table(platform, spec, name).scan().to_arrow().to_pylist()


def coordinates(platform: PlatformConfig, spec: PipelineSpec) -> Counter:
    """How often each (partition, offset) of the topic appears across data and dead-letter tables."""
    seen: Counter = Counter()
    for name in spec.positioned_tables:
        for row in rows(platform, spec, name):
            seen[(row["_kafka"]["partition"], row["_kafka"]["offset"])] += 1
    return seen


def log_ends(platform: PlatformConfig, topic: str) -> dict[int, int]:
    """The end of each partition as the planner finds it (the last stable offset, where a read_committed fetch
    reports end-of-partition)."""
    from lakehouse.ingest.plan import topic_state

    return {p: ps.end for p, ps in topic_state(platform.kafka(), topic).partitions.items()}


def assert_exactly_once(platform: PlatformConfig, spec: PipelineSpec) -> int:
    """Every offset in the topic is in exactly one of the pipeline's tables; returns the count."""
    seen = coordinates(platform, spec)
    duplicates = {c: n for c, n in seen.items() if n > 1}
    assert not duplicates, f"duplicated offsets: {sorted(duplicates)[:10]}"
    expected = {(p, o) for p, end in log_ends(platform, spec.source.topic).items() for o in range(end)}
    missing = expected - set(seen)
    assert not missing, f"{len(missing)} offsets missing, e.g. {sorted(missing)[:10]}"
    assert set(seen) == expected
    return len(expected)


# Where a kill -9 of `lakehouse ingest` can land in a batch (tests/support/faults.py): reading, files written but not
# committed, one table committed but not the other or the group offsets, all committed but the group's.
KILL_POINTS = ("during_read", "after_files", "after_table_commit", "before_group_commit")
# The points where a record's format makes a difference (decoding it, writing files from its rows): the commit
# points run the same code whatever the format, and test_exactly_once and test_cdc_ingest kill at each of them.
FORMAT_KILL_POINTS = KILL_POINTS[:2]


def killed_at_every_point_then_resumed(platform: PlatformConfig, spec: PipelineSpec, in_process: bool = True,
                                       points: Sequence[str] = KILL_POINTS) -> None:
    """`lakehouse ingest --once` killed (kill -9) at each of `points` in turn, each run starting from what
    the one before left, then run to the end (in this process's Spark session, or with `in_process` False as
    a process of its own: a home other than the session's). Each point fires in the first batch that reaches
    it: a spec whose `trigger.max_records_per_batch` is below the backlog leaves records for every run. The
    caller checks the outcome (assert_exactly_once, a change stream's final state)."""
    import signal

    from lakehouse.core.catalog import open_catalog
    from lakehouse.ingest import committer

    # where the catalog commits a batch's tables together, no kill lands between two of them: the last run
    # goes through with that point armed
    together = committer.commits_together(open_catalog(platform, spec.catalog))
    for point in points:
        if together and point == "after_table_commit":
            continue
        crashed = lakehouse(spec, "ingest", "--pipeline", spec.name, "--once", "--json", fault=point)
        assert crashed.returncode == -signal.SIGKILL, (point, crashed.returncode, crashed.stderr[-2000:])
    run = run_cli if in_process else lakehouse
    resumed = run(spec, "ingest", "--pipeline", spec.name, "--once", "--json",
                  fault="after_table_commit" if together else None)
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def airflow_dags_test(dag_id: str, pipelines_dir: Path, timeout: float = 600):
    """`airflow dags test DAG_ID` as users run it, in its own process with this environment (so Airflow's
    OpenLineage provider loads its listener from the OPENLINEAGE_* settings, see the `lineage_file`
    fixture); the finished DagRun."""
    from airflow.models import DagRun

    done = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "test", dag_id],
                          env={**os.environ, "LAKEHOUSE_PIPELINES_DIR": str(pipelines_dir)},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = DagRun.find(dag_id=dag_id)
    return run


def emitted(path: Path) -> list[dict]:
    """The OpenLineage events the file transport wrote to `path`, oldest first."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def committed_group_offsets(platform: PlatformConfig, spec: PipelineSpec) -> dict[int, int]:
    consumer = Consumer(platform.kafka(**{"group.id": spec.consumer_group}))
    try:
        parts = [TopicPartition(spec.source.topic, p) for p in range(spec.source.partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
    finally:
        consumer.close()


def send(platform: PlatformConfig, topic: str, records: list[tuple[bytes | None, bytes | None]],
         partition: int | None = None, **conf) -> None:
    """Produce (key, value) pairs and wait for every delivery."""
    errors = []
    producer = Producer(platform.kafka(**{"linger.ms": 5, **conf}))
    for key, value in records:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, key=key, value=value, on_delivery=lambda e, m: e and errors.append(e), **kwargs)
    producer.flush(30)
    assert not errors, errors


def summaries(platform: PlatformConfig, spec: PipelineSpec, name: str) -> list[dict]:
    """Snapshot summaries of `name`, oldest first."""
    t = table(platform, spec, name)
    return [offsets.summary_properties(s) for s in sorted(t.snapshots(), key=lambda s: s.timestamp_ms)]


def task_states(run) -> dict[str, str]:
    """Each task's state in DAG run `run`, by task id."""
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def xcom(run, task_id: str, key: str = "return_value"):
    """The XCom `key` that task `task_id` pushed in DAG run `run`."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id,
                                                 key=key).one()
        return XComModel.deserialize_value(row)


@pytest.fixture
def pipeline(make_spec, platform):
    """Factory: make_spec(**overrides) with the pipeline's source topic created as `lakehouse topics` does."""
    from lakehouse.core.topics import ensure_topics

    def factory(**overrides) -> PipelineSpec:
        spec = make_spec(**overrides)
        ensure_topics([spec], platform)
        return spec

    return factory


def page_reads(monkeypatch: pytest.MonkeyPatch, pipelines_dir: Path, ui=None) -> None:
    """The pipelines page (the plugin module `ui`, default lakehouse_airflow.ui, in this process) serves
    the cards of `pipelines_dir` as they are now: its background cache replaced by one that read the folder and
    every pipeline once. A test module that imported the plugin earlier passes its own module object: another
    test may have imported the plugin again since, and the app it drives reads its own module's cache."""
    from lakehouse.ops.overview_cache import OverviewCache

    if ui is None:
        from lakehouse_airflow import ui

    cache = OverviewCache(pipelines_dir, refresh_s=3600, rescan_s=3600, autostart=False)
    while cache.step():
        pass
    monkeypatch.setattr(ui, "CACHE", cache)
