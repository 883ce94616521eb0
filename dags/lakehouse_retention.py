"""Retention alignment, daily, and the retention guard, every five minutes; one task per pipeline in each.

`retention_alignment` checks that each pipeline's topic keeps records (`retention.ms`, read with
DescribeConfigs) at least as long as the worst lag observed in the table's retained
ingest commits plus `retention.outage_budget` plus `retention.replay_window`. A topic that
falls short fails its task with the explanation and the `kafka-configs --alter` command
that fixes it; the other pipelines' tasks are unaffected. Each task reports the
snapshot-expiry window maintenance uses (the replay window, so time travel reaches as far
back as Kafka replay), applies `retention.delete_after` where set, and records a
`retention` event in `ops.pipeline_events`.

`retention_guard` watches the lag now: when the oldest record not yet ingested gets within
`retention.guard_threshold` (default half the declared retention) of the topic's retention
horizon, it raises the topic's `retention.ms` (IncrementalAlterConfigs) to keep a full declared
retention ahead of that record, at most `retention.max_retention`, and restores the declared value
once the writer has caught up. Each change is a `retention_guard` event (status `warn` while
raised). A task fails, as an alert, when records will age out and the guard could not prevent it:
no `max_retention`, the cap reached, or the broker refused (the message names the missing
permission, ALTER_CONFIGS on the topic).

Trigger either with `dry_run` on to preview: alignment then counts the rows data retention would delete
per table, the guard says which retention.ms it would set, and nothing is deleted, altered or recorded.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from lakehouse.core.spec import RETENTION_DAG_ID, RETENTION_GUARD_DAG_ID
from lakehouse_airflow.dag_defaults import START_DATE, default_args, pipelines
from lakehouse_airflow.operators.retention import RetentionAlignmentOperator, RetentionGuardOperator

GUARD_SCHEDULE = "*/5 * * * *"  # the guard must act well within any threshold; a run reads metadata only


def _dry_run_param(what: str) -> dict:
    return {"dry_run": Param(False, type="boolean", description=f"only say {what}; change nothing")}


_specs = pipelines()


def _guard_line(spec) -> str:
    threshold = (f"{spec.retention.guard_threshold_s / 3600:g}h" if spec.retention.guard_threshold_s is not None
                 else f"{spec.retention.guard_threshold_share:.0%} of the declared retention")
    cap = (f"at most {spec.retention.max_retention_ms / 3_600_000:g}h" if spec.retention.max_retention_ms
           else "alerts only (no `retention.max_retention`)")
    return f"- `{spec.name}`: topic `{spec.source.topic}`, threshold {threshold}, {cap}\n"


with DAG(
    dag_id=RETENTION_DAG_ID,
    schedule="@daily",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=default_args(),
    tags=["lakehouse", "retention", *(f"pipeline:{name}" for name in _specs)],
    params=_dry_run_param("how many rows data retention would delete per table"),
    doc_md=__doc__ + "\n" + "".join(
        f"- `{s.name}`: topic `{s.source.topic}`, outage budget {s.retention.outage_budget_s / 3600:g}h, "
        f"replay window {s.retention.replay_window_s / 3600:g}h\n" for s in _specs.values()),
):
    for _spec in _specs.values():
        RetentionAlignmentOperator(task_id=f"align_{_spec.name}", pipeline=_spec.name)

with DAG(
    dag_id=RETENTION_GUARD_DAG_ID,
    schedule=GUARD_SCHEDULE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=10),
    default_args=default_args(retries=0),  # the next run, five minutes later, is the retry
    tags=["lakehouse", "retention", *(f"pipeline:{name}" for name in _specs)],
    params=_dry_run_param("which retention.ms the guard would set"),
    doc_md=__doc__ + "\n" + "".join(_guard_line(s) for s in _specs.values()),
):
    for _spec in _specs.values():
        RetentionGuardOperator(task_id=f"guard_{_spec.name}", pipeline=_spec.name)
