"""One timeline: every committed batch (and every replay) is an event in ops.pipeline_events, and a
continuous job serves the same numbers on a Prometheus /metrics endpoint."""

import signal
import urllib.request

import pytest
from e2e import pipeline, run_cli, spawn, summaries  # noqa: F401 (fixture)
from polling import wait_until, while_running
from prometheus_client.parser import text_string_to_metric_families

from lakehouse.core import events, offsets
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest import receipts as ingest
from lakehouse_dev import produce

pytestmark = pytest.mark.slow


def test_every_batch_is_an_event_with_its_counts_stages_files_and_lag(platform, pipeline):
    spec = pipeline(partitions=2, trigger={"max_records_per_batch": 150})
    report = produce.produce(spec, 300, bad_ratio=0.1, seed=3)
    done = run_cli(spec, "ingest", "--pipeline", spec.name, "--once")
    assert done.returncode == 0, done.stderr[-3000:]

    batches = list(reversed(events.recent(spec.name, kind="batch", platform=platform)))
    assert len(batches) >= 2, "a 150-record budget splits 300 records into batches"
    metrics = [b["metrics"] for b in batches]
    assert sum(m["records"] for m in metrics) == 300
    assert sum(m["dead_letters"] for m in metrics) == report.bad
    assert sum(m["rows"] for m in metrics) == 300 - report.bad
    assert metrics[-1]["lag_records"] == 0
    for m in metrics:
        assert {f"{stage}_s" for stage in ingest.STAGES} | {"seconds"} <= set(m)
        # the stages split the batch's time: tasks did read and decode, Spark jobs wrote files, and
        # together they account for no more than the batch took
        assert m["read_task_s"] > 0 and m["decode_task_s"] > 0 and m["write_s"] > 0 and m["commit_s"] > 0
        assert sum(m[f"{stage}_s"] for stage in ingest.STAGES) <= m["seconds"] + 0.01
        assert m["files_added"] >= 1 and m["bytes_added"] > 0
        assert m["mean_file_bytes"] == pytest.approx(m["bytes_added"] / m["files_added"])
        assert m["freshness_s"] >= 0
    committed = {s[SnapshotSummary.BATCH]: offsets.decode_ranges(s[SnapshotSummary.RANGES])
                 for s in summaries(platform, spec, spec.target.table) if SnapshotSummary.BATCH in s}
    for batch in batches:
        ranges = {int(p): tuple(r) for p, r in batch["details"]["ranges"].items()}
        assert committed[batch["details"]["batch_id"]] == ranges, "the event names the offsets its commit holds"

    replayed = run_cli(spec, "replay", "--pipeline", spec.name, "--offsets", "0:0-10")
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    replay = events.recent(spec.name, kind="replay", platform=platform)[0]
    assert replay["metrics"]["records"] == 10 and replay["metrics"]["inserted"] == 0


def scrape(port: int) -> dict:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def test_a_continuous_job_serves_its_metrics_for_prometheus(platform, pipeline, free_tcp_port):
    spec = pipeline(partitions=1)
    job = spawn(spec, "ingest", "--pipeline", spec.name, "--trigger-interval", "1s",
                "--metrics-port", str(free_tcp_port))
    try:
        report = produce.produce(spec, 120, bad_ratio=0.1, seed=4)
        label = (("pipeline", spec.name),)
        seen: dict = {}

        def counted_every_record() -> dict | None:
            nonlocal seen
            try:
                seen = scrape(free_tcp_port)
            except OSError:  # the endpoint is not up yet
                seen = {}
            return seen if seen.get(("lakehouse_records_total", label)) == 120 else None

        wait_until(while_running(job, counted_every_record), 180,
                   lambda: f"/metrics to count 120 records (last scrape: {seen})", interval=1)
        assert seen.get(("lakehouse_records_total", label)) == 120, seen
        assert seen[("lakehouse_dead_letters_total", label)] == report.bad
        assert seen[("lakehouse_rows_total", (("pipeline", spec.name), ("table", spec.target.table)))] \
            == 120 - report.bad
        assert seen[("lakehouse_lag_records", label)] == 0
        assert seen[("lakehouse_committed_offset", (("partition", "0"), ("pipeline", spec.name)))] == 120
        assert 0 <= seen[("lakehouse_freshness_seconds", label)] < 600
        assert seen[("lakehouse_batch_stage_seconds", (("pipeline", spec.name), ("stage", "decode")))] > 0
    finally:
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=120) == 0
