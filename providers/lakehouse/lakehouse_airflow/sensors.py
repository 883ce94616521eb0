"""Sensors that gate publication on a pipeline's freshness and lag SLOs (spec `slo`).

Both check once in `execute`; when the SLO does not hold yet they defer to
`SloTrigger` (default) or, with `deferrable=False`, poke like any sensor. When
`timeout` seconds pass without the SLO holding they fail with
AirflowSensorTimeout whose message says which limit was missed and by how much.
Kafka and catalog settings: the environment's, overridden by the connections `kafka_conn_id`,
`catalog_conn_id` and `object_store_conn_id` (defaults `lakehouse_kafka`, `lakehouse_catalog`,
`lakehouse_object_store`, each where it exists); refused Kafka credentials, and a connection whose
settings cannot be used, fail the sensor at once (lakehouse.core.errors.KafkaAuthError naming broker,
mechanism and user; ConfigurationError naming the connection's field), without waiting.
XCom: the passing check (`SloCheck.to_dict()`: kind, measured, limits, message).

A forced publication skips the gates: with `force_param` set, a run whose param of that name is
true (the publish DAG's `force`) measures once, logs the result and passes at once, pushing the
check with `"forced": true`; the publish step records the publication as forced.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowSensorTimeout

from lakehouse.ops import slo
from lakehouse_airflow import locations
from lakehouse_airflow.hooks import CATALOG_CONN_ID, KAFKA_CONN_ID, OBJECT_STORE_CONN_ID, LakehouseHook
from lakehouse_airflow.triggers import SloTrigger, check_once


def forced(context: Any, force_param: str | None) -> bool:
    """Whether the run's param `force_param` (None: the operator takes none) asks to force publication."""
    return bool(force_param) and context["params"].get(force_param) is True


class _SloSensor(BaseSensorOperator):
    """Shared machinery; subclasses set `kind` and `limits()`."""

    kind = ""
    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, deferrable: bool = True, poke_interval: float = 30,
                 timeout: float = 600, kafka_conn_id: str | None = KAFKA_CONN_ID,
                 catalog_conn_id: str | None = CATALOG_CONN_ID, object_store_conn_id: str | None = OBJECT_STORE_CONN_ID,
                 force_param: str | None = None, **kwargs: Any):
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.pipeline = pipeline
        self.deferrable = deferrable
        self.kafka_conn_id = kafka_conn_id
        self.catalog_conn_id = catalog_conn_id
        self.object_store_conn_id = object_store_conn_id
        self.force_param = force_param
        self._last: slo.SloCheck | None = None

    def limits(self, hook: LakehouseHook) -> dict[str, float]:
        raise NotImplementedError

    def _check(self) -> slo.SloCheck:
        hook = LakehouseHook(self.pipeline, kafka_conn_id=self.kafka_conn_id, catalog_conn_id=self.catalog_conn_id,
                             object_store_conn_id=self.object_store_conn_id)
        self._last = check_once(self.kind, self.pipeline, str(locations.pipelines_dir()), self.limits(hook),
                                hook.lay_over)
        self.log.info("%s", self._last.message)
        return self._last

    def poke(self, context: Any) -> bool:
        return self._check().ok

    def execute(self, context: Any) -> dict:
        if forced(context, self.force_param):
            check = self._check()
            self.log.warning("publication forced past the %s gate (%s)", self.kind,
                             "it holds" if check.ok else "it does not hold")
            return {**check.to_dict(), "forced": True}
        if not self.deferrable:
            try:
                super().execute(context)
            except AirflowSensorTimeout:
                raise AirflowSensorTimeout(self._last.message if self._last else "no check completed") from None
            if self._last is None:  # cannot be: the sensor returns after a poke that held, which records its check
                raise AirflowSensorTimeout("no check completed")
            return self._last.to_dict()
        check = self._check()
        if check.ok:
            return check.to_dict()
        self.defer(trigger=SloTrigger(kind=self.kind, pipeline=self.pipeline, limits=check.limits,
                                      deadline=time.time() + self.timeout, poll_interval=self.poke_interval,
                                      pipelines_dir=str(locations.pipelines_dir()), kafka_conn_id=self.kafka_conn_id,
                                      catalog_conn_id=self.catalog_conn_id,
                                      object_store_conn_id=self.object_store_conn_id),
                   method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict) -> dict:
        """Resumes after the trigger: the check when the SLO holds, else AirflowSensorTimeout."""
        if event["status"] != "ok":
            raise AirflowSensorTimeout(event["check"]["message"])
        self.log.info("%s", event["check"]["message"])
        check: dict = event["check"]
        return check


class FreshnessSensor(_SloSensor):
    """Waits until the newest committed event and the last commit are recent enough.

    Templated: `pipeline`. Limits default to the spec's `slo.freshness`; override with
    `max_event_age_s` / `max_commit_age_s`. XCom: the passing SloCheck as a dict.
    """

    kind = "freshness"

    def __init__(self, *, max_event_age_s: float | None = None, max_commit_age_s: float | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.max_event_age_s = max_event_age_s
        self.max_commit_age_s = max_commit_age_s

    def limits(self, hook: LakehouseHook) -> dict[str, float]:
        default = hook.spec.slo.freshness_s
        return {"event_age_s": default if self.max_event_age_s is None else self.max_event_age_s,
                "commit_age_s": default if self.max_commit_age_s is None else self.max_commit_age_s}


class LagSensor(_SloSensor):
    """Waits until the pipeline's Kafka lag is within its SLO, in records and in seconds.

    Templated: `pipeline`. Limits default to the spec's `slo.lag_records` / `slo.lag_seconds`;
    override with `max_records` / `max_seconds`. XCom: the passing SloCheck as a dict.
    """

    kind = "lag"

    def __init__(self, *, max_records: int | None = None, max_seconds: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_records = max_records
        self.max_seconds = max_seconds

    def limits(self, hook: LakehouseHook) -> dict[str, float]:
        spec = hook.spec
        return {"lag_records": spec.slo.lag_records if self.max_records is None else self.max_records,
                "lag_s": spec.slo.lag_s if self.max_seconds is None else self.max_seconds}
