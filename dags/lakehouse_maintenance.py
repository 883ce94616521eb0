"""Table maintenance, one DAG per pipeline, on `maintenance.schedule`.

For every table of the pipeline (data tables and the dead-letter table), while ingestion
keeps committing: compaction where a file group has `maintenance.min_input_files` small
files (and, for upsert tables, data files with deletes and the delete files), a manifest
rewrite, snapshot expiry after `retention.replay_window` (never the snapshot ingestion
resumes from, nor branch heads such as `published`) and removal of orphan files older than
`maintenance.orphan_safety_window`, only once the table is proven to own its folder (its
catalog's assigned location, no other table of any configured catalog inside it; otherwise
refused, nothing deleted). A table that fails does not stop the others; the task then fails.
Each table's receipt (files, bytes, snapshots expired, orphans removed, row count and content
checksum before and after) is a `maintenance` event in `ops.pipeline_events` and the task's XCom.

Trigger with `dry_run` on to preview: the receipts then list the data files compaction would
rewrite, the snapshots that would expire and the orphan files that would be deleted, and
nothing is rewritten, expired or deleted.
"""

from __future__ import annotations

from airflow.sdk import Param

from lakehouse_airflow.dag_defaults import pipeline_dag, pipelines
from lakehouse_airflow.operators.maintenance import MaintenanceOperator
from lakehouse_airflow.spark import submit_kwargs

for _spec in pipelines().values():
    with pipeline_dag(  # one run at a time: two runs on one table would only fight over the same files
        _spec, "maintenance",
        schedule=_spec.maintenance.schedule,
        doc=__doc__ + (
            f"\n- compaction from {_spec.maintenance.min_input_files} small files, target "
            f"{_spec.target.target_file_size_bytes // (1024 * 1024)} MB; snapshots kept "
            f"{_spec.retention.replay_window_s / 3600:g}h; orphans older than "
            f"{_spec.maintenance.orphan_safety_window_s / 3600:g}h removed\n"),
        params={"dry_run": Param(False, type="boolean",
                                 description="only list what maintenance would rewrite, expire and delete; "
                                             "change nothing")},
    ):
        # the Param reaches the job as `--dry-run=True|False` (application_args are templated)
        MaintenanceOperator(task_id="maintain_tables", pipeline=_spec.name,
                            **submit_kwargs(_spec, "maintenance", "--dry-run={{ params.dry_run }}"))
