"""Backfill operators: plan a backfill from the DAG's form, then run it through spark-submit."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from lakehouse.core import errors, events
from lakehouse.core import spec as spec_module
from lakehouse.recovery import backfill
from lakehouse_airflow import locations
from lakehouse_airflow.audit import actor_of, require_authority, require_operator
from lakehouse_airflow.hooks import KAFKA_CONN_ID, LakehouseHook, connection_environment
from lakehouse_airflow.spark import connection_submit_environment


class BackfillPlanOperator(BaseOperator):
    """Validates the run's params (the backfill form) for pipeline `pipeline` and plans the backfill.

    Fails with a message naming the field (unknown partition, start after end, a range past
    the committed position, a bad or live candidate table), and refuses a run triggered by a user
    who is not a lakehouse operator (lakehouse_airflow.audit.require_operator). A refused request, a
    dry run and an empty plan are each a `backfill` event naming the run's actor and the form's
    values; a backfill that runs is recorded by the replay job. Templated fields: none.
    XCom (return value): the plan, `lakehouse.recovery.backfill.BackfillPlan.to_json()`: target_table,
    ranges, offsets, records, dry_run, notes, job_args.
    """

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Any) -> dict:
        hook = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        actor, parameters = actor_of(context), dict(context["params"])
        require_operator(actor, "backfill", parameters, hook)

        def record(status: str, message: str, details: dict | None = None) -> None:
            events.record(events.Event(self.pipeline, "backfill", status, message,
                                       details={**(details or {}), "parameters": parameters}, actor=actor),
                          platform=hook.platform, catalog=hook.spec.catalog)

        try:
            live = backfill.live_tables(spec_module.load_all(locations.pipelines_dir()))
            request = backfill.parse_request(parameters, live)
            planned = backfill.plan(hook.spec, request, hook.platform).to_json()
        except Exception as exc:
            try:
                record("failed", f"backfill refused: {exc}")
            except Exception as unrecorded:  # noqa: BLE001 - the refusal is the error to report
                self.log.warning("could not record the refused backfill: %s", unrecorded)
            raise
        self.log.info("backfill plan: %s", planned)
        if planned["dry_run"]:
            record("skipped", f"dry run: would write {planned['records']} records to {planned['target_table']} "
                              f"({planned['offsets'] or 'no ranges'})", planned)
        elif not planned["job_args"]:
            record("skipped", "nothing to backfill: " + "; ".join(planned["notes"]), planned)
        return planned


class BackfillSparkSubmitOperator(SparkSubmitOperator):
    """Runs the replay job for the plan that task `plan_task_id` pushed, once it is sure of two things at
    the moment the job would start (which can be long after the plan: a cleared task runs again days later):

    - the user who triggered the run may still trigger it (lakehouse_airflow.audit.require_authority:
      LAKEHOUSE_OPERATORS when set, and the auth manager's permission to trigger the DAG; a run nobody
      triggered is refused);
    - the plan in XCom is what the run's request plans (lakehouse.recovery.backfill.confirm: re-planned
      from the run's params, which nobody can change after the trigger, unlike XCom).

    Otherwise fails without retry, writes nothing and records a `failed` `backfill` event naming the
    run's actor and what is missing or different. Skipped for a dry run (the run's `dry_run` param) and
    for an empty plan. The job's arguments are rebuilt from the confirmed plan; it inserts only absent
    rows and records a `backfill` event with what it inserted, naming the DAG run's actor (passed to
    the job in its environment, `Actor.environment()`). Kafka settings: the environment's, overridden by
    the Kafka connection `kafka_conn_id` (default `lakehouse_kafka`, if it exists), given to the job
    through its process environment. Templated fields: those of SparkSubmitOperator. XCom: none.
    """

    def __init__(self, *, pipeline: str, plan_task_id: str = "plan", kafka_conn_id: str | None = KAFKA_CONN_ID,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.plan_task_id = plan_task_id
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Any) -> None:
        hook = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id)
        actor, parameters = actor_of(context), dict(context["params"])
        planned = context["ti"].xcom_pull(task_ids=self.plan_task_id)
        if parameters.get("dry_run", True) is not False:  # the run's request, not what XCom says
            shown = planned if isinstance(planned, dict) else {}
            raise AirflowSkipException(f"dry run: would write {shown.get('records')} records to "
                                       f"{shown.get('target_table')} ({shown.get('offsets') or 'no ranges'})")
        require_authority(actor, "backfill", parameters, hook)
        try:
            live = backfill.live_tables(spec_module.load_all(locations.pipelines_dir()))
            request = backfill.parse_request(parameters, live)
            confirmed = backfill.confirm(hook.spec, request, planned, hook.platform)
        except errors.BackfillError as exc:
            events.record(events.Event(self.pipeline, "backfill", "failed", f"backfill refused: {exc}",
                                       details={"parameters": parameters}, actor=actor),
                          platform=hook.platform, catalog=hook.spec.catalog)
            raise AirflowFailException(f"backfill refused: {exc}") from None
        if not confirmed.ranges:
            raise AirflowSkipException("nothing to backfill: " + "; ".join(confirmed.notes))
        self.log.info("backfill plan confirmed for %s: %s", actor.user, confirmed.to_json())
        self.application_args = [*(self.application_args or []), *confirmed.job_args()]
        self.env_vars = {**(self.env_vars or {}), **actor.environment()}
        with connection_submit_environment(self, connection_environment(self.kafka_conn_id)):
            super().execute(context)
