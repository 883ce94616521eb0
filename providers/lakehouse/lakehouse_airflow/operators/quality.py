"""QualityOperator: the audit step of write-audit-publish."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from lakehouse.core import errors
from lakehouse.wap import quality
from lakehouse_airflow import locations
from lakehouse_airflow.hooks import LakehouseHook


class QualityCheckFailed(AirflowFailException):
    """Expectations failed: the audited rows must not be published. Not retried (same rows, same verdict)."""


class LineageNotAuditable(AirflowFailException):
    """The rows added since the published head cannot be known (a snapshot after it was expired, or main
    was rolled back below it). Not retried: the table stays so until an operator acts."""


class QualityOperator(BaseOperator):
    """Validate the rows added to `main` since the last publication with the pipeline's GE suite
    (`<suite>.json` of the expectations folder, lakehouse_airflow.locations).

    See `lakehouse.wap.quality.audit`: it pins each data table's snapshot, validates the rows
    its lineage added since the published head (ingested, replayed and backfilled alike),
    renders Data Docs under LAKEHOUSE_HOME/quality/<pipeline>/ and records a `quality`
    event. Fails with LineageNotAuditable, naming the table and what to do, when an
    expired snapshot or a rollback of `main` leaves those rows unknowable.

    :param pipeline: the pipeline name. Templated.
    :param fail_on_error: fail the task when an expectation fails (default), blocking
        downstream publication; False returns the result for a branch operator to route.

    XCom: ``result`` (pushed also when the task fails) and ``return_value``: the audit
    result dict: success, rows, snapshots {table: audited snapshot id}, tables {table:
    {snapshot_id, published_snapshot_id, lineage [snapshot ids after the published head,
    oldest first], offsets {"partition": [lowest, highest] offset audited}, rows, success,
    docs_page}}, expectations, offending_offsets [{table, topic, partition, offset,
    expectation, column, value}], offending_total, docs (Data Docs index.html).
    """

    template_fields = ("pipeline",)
    ui_color = "#fff2cc"

    def __init__(self, *, pipeline: str, fail_on_error: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.fail_on_error = fail_on_error

    def execute(self, context) -> dict:
        hook = LakehouseHook(self.pipeline)
        try:
            result = quality.audit(hook.spec, hook.platform, expectations_dir=locations.expectations_dir())
        except errors.LineageError as exc:
            raise LineageNotAuditable(str(exc)) from None
        self.log.info("%s", result.summary())
        self.log.info("Data Docs: %s", result.docs)
        payload = result.to_dict()
        context["ti"].xcom_push(key="result", value=payload)
        if self.fail_on_error and not result.success:
            raise QualityCheckFailed(result.summary())
        return payload
