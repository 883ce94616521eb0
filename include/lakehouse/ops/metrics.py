"""Prometheus metrics of a running ingest job, served on /metrics with the standard client library.

    lakehouse ingest --pipeline orders --metrics-port 9108     # or LAKEHOUSE_METRICS_PORT=9108

Counters grow with every committed batch; gauges describe the latest one; the two
ages (freshness and time since the last commit) are computed when scraped, so a
stalled job shows them growing. Every series carries the `pipeline` label.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from lakehouse.ingest.receipts import STAGES


class IngestMetrics:
    """The metrics of one pipeline's ingest job, in their own registry."""

    def __init__(self, pipeline: str, registry: CollectorRegistry | None = None):
        self.pipeline = pipeline
        self.registry = registry or CollectorRegistry()

        def counter(name: str, documentation: str) -> Counter:  # a series per pipeline
            return Counter(name, documentation, labelnames=("pipeline",), registry=self.registry)

        def gauge(name: str, documentation: str) -> Gauge:
            return Gauge(name, documentation, labelnames=("pipeline",), registry=self.registry)

        self.records = counter("lakehouse_records", "Kafka records read and committed")
        self.dead_letters = counter("lakehouse_dead_letters", "records routed to the dead-letter table")
        self.batches = counter("lakehouse_batches", "committed micro-batches")
        self.commit_retries = counter("lakehouse_commit_retries", "table commits retried after a conflict")
        self.files = counter("lakehouse_data_files_added", "data files added by ingest commits")
        self.bytes = counter("lakehouse_data_bytes_added", "bytes of data files added by ingest commits")
        self.rows = Counter("lakehouse_rows", "rows committed per table", labelnames=("pipeline", "table"),
                            registry=self.registry)
        self.lag = gauge("lakehouse_lag_records", "records past the last batch at the log end it planned with")
        self.batch_seconds = gauge("lakehouse_batch_seconds", "duration of the last batch")
        self.stage_seconds = Gauge("lakehouse_batch_stage_seconds", "duration of each stage of the last batch",
                                   labelnames=("pipeline", "stage"), registry=self.registry)
        self.end_offset = Gauge("lakehouse_end_offset", "log end per partition as of the last batch",
                                labelnames=("pipeline", "partition"), registry=self.registry)
        self.position = Gauge("lakehouse_committed_offset", "committed position per partition",
                              labelnames=("pipeline", "partition"), registry=self.registry)
        self._newest_event: float | None = None
        self._last_commit: float | None = None
        gauge("lakehouse_freshness_seconds", "now minus the newest committed event time") \
            .labels(pipeline).set_function(lambda: self._age(self._newest_event))
        gauge("lakehouse_seconds_since_commit", "now minus the last batch commit") \
            .labels(pipeline).set_function(lambda: self._age(self._last_commit))

    @staticmethod
    def _age(at: float | None) -> float:
        return float("nan") if at is None else max(0.0, time.time() - at)

    def observe(self, receipt) -> None:
        """Account for one committed batch (an ingest.BatchReceipt)."""
        p = self.pipeline
        self.batches.labels(p).inc()
        self.records.labels(p).inc(receipt.records)
        self.dead_letters.labels(p).inc(receipt.dead_letters)
        self.commit_retries.labels(p).inc(receipt.commit_retries)
        self.files.labels(p).inc(sum(c.files for c in receipt.commits))
        self.bytes.labels(p).inc(sum(c.bytes for c in receipt.commits))
        for table, n in receipt.rows_by_table.items():
            self.rows.labels(p, table).inc(n)
        self.lag.labels(p).set(receipt.lag_records)
        self.batch_seconds.labels(p).set(receipt.seconds)
        for stage in STAGES:
            self.stage_seconds.labels(p, stage).set(receipt.timings.get(stage, 0.0))
        for partition, end in receipt.log_ends.items():
            self.end_offset.labels(p, str(partition)).set(end)
        for partition, (_, end) in receipt.ranges.items():
            self.position.labels(p, str(partition)).set(end)
        self._last_commit = time.time()
        if receipt.max_event_time is not None:
            self._newest_event = max(self._newest_event or 0.0, receipt.max_event_time.timestamp())

    def serve(self, port: int, address: str = "127.0.0.1"):
        """Serve /metrics on `address:port` from a daemon thread; returns (server, thread)."""
        return start_http_server(port, addr=address, registry=self.registry)
