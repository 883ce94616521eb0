"""What one ingest batch read and where it went: its receipt, one line per table commit, and the stages whose
seconds it reports. Plain values with standard-library imports only, so that reading a pipeline's status,
serving /metrics or drawing the Airflow UI page does not load Spark, Arrow, Kafka or the decoders."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

# The stages of a batch, in order; their seconds add up to the batch's (plus recording the event):
#   plan          read the tables' positions, find the log ends, plan the ranges
#   read, decode, the Spark job whose tasks fetch the records, decode them and write the files, split
#   write         by the share of task time in consumer.consume (read), decoding and building Arrow
#                 batches (decode) and routing and writing Parquet (write); plus an upsert's files written by the driver
#   commit        the table commits: manifests, the catalog swap, conflict retries
#   group_commit  the consumer group's offsets (monitoring only)
STAGES = ("plan", "read", "decode", "write", "commit", "group_commit")


@dataclass
class TableCommit:
    table: str
    rows: int
    snapshot_id: int | None
    attempts: int
    skipped: bool = False  # the table already held this batch (a retried or resumed commit)
    files: int = 0  # data files the commit added (snapshot summary `added-data-files`)
    bytes: int = 0  # their size (`added-files-size`)
    seconds: float = 0.0  # writing the files and committing, retries included
    write_seconds: float = 0.0  # of which the Spark jobs that wrote the data files (the last attempt)


@dataclass
class BatchReceipt:
    """What one batch read and where it went."""

    pipeline: str
    batch_id: str
    ranges: dict[int, tuple[int, int]]
    records: int
    rows_by_table: dict[str, int]
    dead_letters: int
    commits: list[TableCommit] = field(default_factory=list)
    max_event_time: datetime | None = None
    gaps: dict[int, tuple[int, int]] = field(default_factory=dict)
    seconds: float = 0.0
    log_ends: dict[int, int] = field(default_factory=dict)  # per partition, the log end the plan saw
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage (STAGES) and task totals
    tasks: int = 0  # Spark tasks that read and wrote the batch

    @property
    def commit_retries(self) -> int:
        return sum(c.attempts - 1 for c in self.commits)

    @property
    def lag_records(self) -> int:
        """Records between the batch's end and the log end the plan saw (0: caught up)."""
        return sum(max(0, end - self.ranges.get(p, (end, end))[1]) for p, end in self.log_ends.items())

    def metrics(self, now: datetime | None = None) -> dict[str, float]:
        """The batch's numbers for the ops timeline (`batch` events) and /metrics."""
        now = now or datetime.now(UTC)
        files = sum(c.files for c in self.commits)
        size = sum(c.bytes for c in self.commits)
        out = {"records": self.records, "rows": sum(self.rows_by_table.values()), "dead_letters": self.dead_letters,
               "commit_retries": self.commit_retries, "files_added": files, "bytes_added": size,
               "mean_file_bytes": size / files if files else 0.0, "lag_records": self.lag_records,
               "seconds": round(self.seconds, 3), "commit_age_s": 0.0, "tasks": self.tasks}
        out.update({f"{stage}_s": round(value, 3) for stage, value in self.timings.items()})
        if self.max_event_time is not None:
            out["freshness_s"] = round((now - self.max_event_time).total_seconds(), 3)
        return out

    def to_json(self) -> dict:
        return {
            "pipeline": self.pipeline, "batch_id": self.batch_id,
            "ranges": {str(p): list(r) for p, r in self.ranges.items()},
            "records": self.records, "rows_by_table": self.rows_by_table, "dead_letters": self.dead_letters,
            "commit_retries": self.commit_retries,
            "max_event_time": self.max_event_time.isoformat() if self.max_event_time else None,
            "gaps": {str(p): list(r) for p, r in self.gaps.items()}, "seconds": round(self.seconds, 3),
        }


def receipt_line(receipt: BatchReceipt) -> str:
    """`receipt` as one line of JSON (the CLI prints one per batch)."""
    return json.dumps(receipt.to_json(), separators=(",", ":"))
