"""The publish gate's audit at scale: how much memory and time `lakehouse.wap.quality.audit` takes on a large
window, where it validates the rows (Great Expectations' Spark datasource once a table's window reaches
`publish.spark_audit_rows`, pandas on the worker below that).

One table is built cheaply, the way ingestion leaves it but without Kafka (`bench.proof.build_table`:
pyiceberg appends of generated orders, 100,000 rows a commit). Each audit then runs in its own process, as
the publish DAG's `quality` task runs it on an Airflow worker, and `bench.workloads.MemorySampler` samples
the RSS of that process and all its descendants (Spark's JVM, Python workers) the whole time. The window
of each run is chosen with the readers' branch: without it the audit covers every row of the table; with
it at the snapshot that held `rows - window` rows, the last `window` rows (the lineage mode of a publish
gate between publications).

The runs: the whole table on the Spark path; a smaller window on both paths (the pandas path forced with a
threshold above it); and half of it on the pandas path. Memory on the pandas path grows with the window;
on the Spark path it does not (the driver process gets aggregates and at most MAX_OFFENDING failing rows
per expectation; the JVM's heap is capped by spark.driver.memory).

    python -m bench.audit --pipeline NAME --spark-audit-rows N   (the child: prints one JSON line)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from bench.env import BenchError, BenchStack, tail
from bench.proof import ROWS_PER_COMMIT, build_table
from bench.workloads import MemorySampler
from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec, load_spec

PANDAS_ROWS = 1_000_000  # the comparison window (pandas and Spark)
AUDIT_TIMEOUT_S = 3600.0


def audit_at_scale(stack: BenchStack, spec: PipelineSpec, rows: int, pandas_rows: int = PANDAS_ROWS,
                   progress=lambda line: None, built: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build `spec`'s table with `rows` orders (unless `built`: build_table's numbers of it, built already
    with `rows`) and audit it in a child process per run; the run over all
    `rows` (the Spark path at the spec's threshold, or pandas if `rows` is below it) as
    {"rows", "path", "seconds", "peak_rss_mb", "peak_by_role_mb", "success"}, plus "runs": that run and the
    comparison runs (a window of `pandas_rows` on both paths, half of it on pandas), and "build": the
    table's numbers. Raises BenchError when a run fails or its window is not the one asked for."""
    stack.activate()
    platform = stack.platform()
    catalog = open_catalog(platform, spec.catalog)
    # windows are whole commits: the readers' branch is set at a commit's snapshot
    pandas_rows = max(ROWS_PER_COMMIT, min(pandas_rows, rows) // ROWS_PER_COMMIT * ROWS_PER_COMMIT)
    half = max(ROWS_PER_COMMIT, pandas_rows // 2 // ROWS_PER_COMMIT * ROWS_PER_COMMIT)
    if built is None:
        built = build_table(catalog, spec, rows, progress)
    plan = [(rows, spec.publish.spark_audit_rows), (pandas_rows, 0), (pandas_rows, rows + 1), (half, rows + 1)]
    runs = []
    for window, threshold in plan:
        _window(platform, spec, rows, window)
        progress(f"  audit: {window:,} rows, threshold {threshold:,}")
        runs.append(_run(stack, spec, window, threshold))
    return {**runs[0], "runs": runs, "build": built}


def _window(platform: config.PlatformConfig, spec: PipelineSpec, rows: int, window: int) -> None:
    """Set the readers' branch so that the audit covers the table's last `window` rows (no branch: all)."""
    table = open_catalog(platform, spec.catalog).load_table(spec.target.table)
    if spec.publish.branch in table.metadata.refs:
        table.manage_snapshots().remove_branch(spec.publish.branch).commit()
        table = open_catalog(platform, spec.catalog).load_table(spec.target.table)
    if window >= rows:
        return
    head = next((s for s in table.snapshots() if int((s.summary or {}).get("total-records", -1)) == rows - window),
                None)
    if head is None:
        raise BenchError(f"{spec.target.table}: no snapshot holds exactly {rows - window:,} rows to publish")
    table.manage_snapshots().create_branch(head.snapshot_id, spec.publish.branch).commit()


def _run(stack: BenchStack, spec: PipelineSpec, window: int, threshold: int) -> dict[str, Any]:
    """One audit in a child process (`main`), its process tree's memory sampled throughout."""
    # build_table's orders are one second apart per offset from 30 days ago: a large table's run months ahead,
    # so the audit is told it runs after the last of them (every expectation of the suite then holds)
    now = datetime.now(timezone.utc) + timedelta(seconds=_rows(spec))
    cmd = [sys.executable, "-m", "bench.audit", "--spec", spec.path, "--spark-audit-rows", str(threshold),
           "--now", now.isoformat()]
    stack.logs_dir.mkdir(parents=True, exist_ok=True)
    log = stack.logs_dir / f"audit-{window}-{threshold}.stderr.log"
    started = time.monotonic()
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, env=stack.environ(), stdout=subprocess.PIPE, stderr=stderr, text=True,
                                cwd=config.REPO_ROOT, start_new_session=True)
    with MemorySampler(proc.pid) as memory:
        try:
            out, _ = proc.communicate(timeout=AUDIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise BenchError(f"the audit of {window:,} rows did not finish within {AUDIT_TIMEOUT_S:.0f}s") from None
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise BenchError(f"the audit of {window:,} rows exited with {proc.returncode}: "
                         f"{tail(log.read_text(errors='replace'))}")
    found = json.loads(out.strip().splitlines()[-1])
    if found["rows"] != window:
        raise BenchError(f"the audit covered {found['rows']:,} rows, not the {window:,} of its window")
    return {**found, "threshold": threshold, "process_wall_s": round(wall, 2),
            "peak_rss_mb": round(memory.peak_mb, 1),
            "peak_by_role_mb": {role: round(mb, 1) for role, mb in memory.peak_by_role.items()}}


def _rows(spec: PipelineSpec) -> int:
    """The rows of `spec`'s table (its current snapshot's summary)."""
    table = open_catalog(config.load(), spec.catalog).load_table(spec.target.table)
    return int((table.current_snapshot().summary or {}).get("total-records", 0))


def main(argv: list[str] | None = None) -> None:
    """The child: audit the spec's tables at the given threshold; one JSON line with the rows audited, the
    path they were validated on, the seconds of the audit (Spark's start included) and the verdict."""
    from lakehouse.wap import quality

    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--spec", required=True)
    args.add_argument("--spark-audit-rows", type=int, required=True)
    args.add_argument("--now", type=datetime.fromisoformat, default=None)
    parsed = args.parse_args(argv)
    spec = load_spec(parsed.spec)
    spec = dataclasses.replace(spec, publish=dataclasses.replace(spec.publish,
                                                                 spark_audit_rows=parsed.spark_audit_rows))
    started = time.monotonic()
    result = quality.audit(spec, config.load(), now=parsed.now, record_event=False)
    seconds = time.monotonic() - started
    audited = result.tables[spec.target.table]
    print(json.dumps({"rows": result.rows, "path": audited.engine, "seconds": round(seconds, 2),
                      "success": result.success, "failed_expectations": result.failed_expectations}), flush=True)


if __name__ == "__main__":
    main()
