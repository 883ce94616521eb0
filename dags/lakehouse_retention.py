"""Retention alignment, daily, one task per pipeline.

Each task checks that the pipeline's topic keeps records (`retention.ms`, read with
DescribeConfigs) at least as long as the worst lag observed in the table's retained
ingest commits plus `retention.outage_budget` plus `retention.replay_window`. A topic that
falls short fails its task with the explanation and the `kafka-configs --alter` command
that fixes it; the other pipelines' tasks are unaffected. Each task reports the
snapshot-expiry window maintenance uses (the replay window, so time travel reaches as far
back as Kafka replay), applies `retention.delete_after` where set, and records a
`retention` event in `ops.pipeline_events`.
"""

from __future__ import annotations

from airflow.sdk import DAG

from lakehouse.core.spec import RETENTION_DAG_ID
from lakehouse_airflow.dag_defaults import START_DATE, default_args, pipelines
from lakehouse_airflow.operators.retention import RetentionAlignmentOperator

_specs = pipelines()

with DAG(
    dag_id=RETENTION_DAG_ID,
    schedule="@daily",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=default_args(),
    tags=["lakehouse", "retention", *(f"pipeline:{name}" for name in _specs)],
    doc_md=__doc__ + "\n" + "".join(
        f"- `{s.name}`: topic `{s.source.topic}`, outage budget {s.retention.outage_budget_s / 3600:g}h, "
        f"replay window {s.retention.replay_window_s / 3600:g}h\n" for s in _specs.values()),
):
    for _spec in _specs.values():
        RetentionAlignmentOperator(task_id=f"align_{_spec.name}", pipeline=_spec.name)
