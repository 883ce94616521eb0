"""SloTrigger: polls a pipeline's status in the triggerer until an SLO holds or a deadline passes.

The trigger is serialisable (classpath + kwargs): the pipeline name, the folder of
specs, the SLO kind and its limits, the poll interval, an absolute deadline
(epoch seconds, so a triggerer restart does not extend it) and the ids of the Kafka, catalog and
object store connections, which the trigger reads in the triggerer (their secrets are never kwargs).
Refused Kafka credentials end the trigger with an error at once. `pipeline_status`
blocks (pyiceberg, Kafka), so it runs in a thread via `asyncio.to_thread`.

Events: `{"status": "ok" | "breached", "check": SloCheck.to_dict()}`; "breached"
carries the last check's message, which says which limit was missed by how much.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from lakehouse.ops import slo

if TYPE_CHECKING:
    from lakehouse.core.config import PlatformConfig


def check_once(kind: str, pipeline: str, pipelines_dir: str | None, limits: dict[str, float],
               overlay: Callable[[PlatformConfig], PlatformConfig] | None = None) -> slo.SloCheck:
    """One blocking SLO check; a status that cannot be read counts as a miss, with the reason.

    `overlay` lays the Airflow connections over the environment's settings (LakehouseHook.lay_over,
    hooks.pipeline.aoverlay); a connection whose settings cannot be used raises its ConfigurationError.
    Raises KafkaAuthError (lakehouse.core.errors) when Kafka refuses the credentials: waiting does not
    mend a wrong password, so the sensor fails at once with the reason.
    """
    from lakehouse.core import config, errors
    from lakehouse.core import spec as spec_module
    from lakehouse.ops import status

    try:
        spec = spec_module.load_pipeline(pipeline, pipelines_dir)
        platform = config.load()
    except Exception as exc:  # noqa: BLE001 - a spec folder briefly unreadable: keep polling, report why
        return slo.unavailable(kind, pipeline, limits, exc)
    if overlay is not None:
        platform = overlay(platform)  # waiting does not mend a connection's settings: raised now
    try:
        return slo.evaluate(kind, status.pipeline_status(spec, platform, with_timeline=False), limits)
    except errors.KafkaAuthError:
        raise
    except Exception as exc:  # noqa: BLE001 - the catalog or Kafka may be briefly unavailable: keep polling, report why
        return slo.unavailable(kind, pipeline, limits, exc)


class SloTrigger(BaseTrigger):
    """Fires "ok" as soon as the `kind` SLO of `pipeline` holds, "breached" once `deadline` passes."""

    def __init__(self, kind: str, pipeline: str, limits: dict[str, float], deadline: float,
                 poll_interval: float = 10.0, pipelines_dir: str | None = None,
                 kafka_conn_id: str | None = None, catalog_conn_id: str | None = None,
                 object_store_conn_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if kind not in slo.KINDS:
            raise ValueError(f"unknown SLO kind {kind!r}; one of {', '.join(slo.KINDS)}")
        self.kind = kind
        self.pipeline = pipeline
        self.limits = dict(limits)
        self.deadline = float(deadline)
        self.poll_interval = float(poll_interval)
        self.pipelines_dir = pipelines_dir
        self.kafka_conn_id = kafka_conn_id
        self.catalog_conn_id = catalog_conn_id
        self.object_store_conn_id = object_store_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # the connections' ids, never their settings: trigger kwargs are stored in the metadata database
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"kind": self.kind, "pipeline": self.pipeline, "limits": self.limits, "deadline": self.deadline,
                 "poll_interval": self.poll_interval, "pipelines_dir": self.pipelines_dir,
                 "kafka_conn_id": self.kafka_conn_id, "catalog_conn_id": self.catalog_conn_id,
                 "object_store_conn_id": self.object_store_conn_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from lakehouse_airflow.hooks.pipeline import aoverlay

        overlay = await aoverlay(self.kafka_conn_id, self.catalog_conn_id, self.object_store_conn_id)
        while True:
            check = await asyncio.to_thread(check_once, self.kind, self.pipeline, self.pipelines_dir, self.limits,
                                            overlay)
            if check.ok:
                yield TriggerEvent({"status": "ok", "check": check.to_dict()})
                return
            remaining = self.deadline - time.time()
            if remaining <= 0:
                yield TriggerEvent({"status": "breached", "check": check.to_dict()})
                return
            self.log.info("%s; checking again in %.0fs", check.message, min(self.poll_interval, remaining))
            await asyncio.sleep(min(self.poll_interval, remaining))
