"""SloTrigger: polls a pipeline's status in the triggerer until an SLO holds or a deadline passes.

The trigger is serialisable (classpath + kwargs): the pipeline name, the folder of
specs, the SLO kind and its limits, the poll interval, an absolute deadline
(epoch seconds, so a triggerer restart does not extend it) and the id of the Kafka
connection, which the trigger reads in the triggerer (its secrets are never kwargs).
Refused Kafka credentials end the trigger with an error at once. `pipeline_status`
blocks (pyiceberg, Kafka), so it runs in a thread via `asyncio.to_thread`.

Events: `{"status": "ok" | "breached", "check": SloCheck.to_dict()}`; "breached"
carries the last check's message, which says which limit was missed by how much.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from lakehouse.ops import slo


def check_once(kind: str, pipeline: str, pipelines_dir: str | None, limits: dict[str, float],
               kafka_settings: dict[str, str] | None = None) -> slo.SloCheck:
    """One blocking SLO check; a status that cannot be read counts as a miss, with the reason.

    `kafka_settings` (the Kafka connection's librdkafka settings) override the environment's.
    Raises kafka_security.KafkaAuthError when Kafka refuses the credentials: waiting does not
    mend a wrong password, so the sensor fails at once with the reason.
    """
    from lakehouse.core import config, kafka_security
    from lakehouse.core import spec as spec_module
    from lakehouse.ops import status

    try:
        spec = spec_module.load_pipeline(pipeline, pipelines_dir)
        platform = config.load().with_kafka(kafka_settings or {})
        return slo.evaluate(kind, status.pipeline_status(spec, platform, with_timeline=False), limits)
    except kafka_security.KafkaAuthError:
        raise
    except Exception as exc:  # noqa: BLE001 - the catalog or Kafka may be briefly unavailable: keep polling, report why
        return slo.unavailable(kind, pipeline, limits, exc)


class SloTrigger(BaseTrigger):
    """Fires "ok" as soon as the `kind` SLO of `pipeline` holds, "breached" once `deadline` passes."""

    def __init__(self, kind: str, pipeline: str, limits: dict[str, float], deadline: float,
                 poll_interval: float = 10.0, pipelines_dir: str | None = None,
                 kafka_conn_id: str | None = None, **kwargs: Any):
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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # the connection's id, never its settings: trigger kwargs are stored in the metadata database
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"kind": self.kind, "pipeline": self.pipeline, "limits": self.limits, "deadline": self.deadline,
                 "poll_interval": self.poll_interval, "pipelines_dir": self.pipelines_dir,
                 "kafka_conn_id": self.kafka_conn_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from lakehouse_airflow.hooks import akafka_connection_settings

        settings = await akafka_connection_settings(self.kafka_conn_id)
        while True:
            check = await asyncio.to_thread(check_once, self.kind, self.pipeline, self.pipelines_dir, self.limits,
                                            settings)
            if check.ok:
                yield TriggerEvent({"status": "ok", "check": check.to_dict()})
                return
            remaining = self.deadline - time.time()
            if remaining <= 0:
                yield TriggerEvent({"status": "breached", "check": check.to_dict()})
                return
            self.log.info("%s; checking again in %.0fs", check.message, min(self.poll_interval, remaining))
            await asyncio.sleep(min(self.poll_interval, remaining))
