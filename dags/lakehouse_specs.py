"""Spec check: broken pipeline specs show in Airflow as the import error of this DAG file.

This file defines no DAG. It imports cleanly while every spec in the pipelines folder
(the provider's configuration: LAKEHOUSE_PIPELINES_DIR, else [lakehouse] pipelines_dir; the
development stack sets the repository's include/pipelines/) loads; otherwise its import error
says that the folder is not configured, or lists each broken spec file with the field and why, e.g.
`orders.yaml: target.mode: 'sideways' is not one of append, upsert`, including specs that
claim a table, view or pipeline name another spec claims. The other DAG files keep
generating the DAGs of the valid pipelines, so one broken file stops only its own pipeline.
"""

from __future__ import annotations

from lakehouse_airflow.dag_defaults import check_specs

check_specs()
