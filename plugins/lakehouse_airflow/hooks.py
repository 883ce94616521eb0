"""LakehouseHook: one pipeline's spec, the platform it runs on, its status and its timeline."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from lakehouse import config, events, spec as spec_module, status as status_module


class LakehouseHook(BaseHook):
    """Everything an operator or sensor needs to act on pipeline `pipeline`.

    The spec comes from the pipelines folder (`LAKEHOUSE_PIPELINES_DIR`), the platform
    (Kafka, catalog, warehouse, Spark master) from `lakehouse.config`, exactly as the
    ingest job reads them. Raises UnknownPipelineError / SpecError on first use when the
    pipeline is not declared or its spec is invalid.
    """

    hook_name = "Lakehouse pipeline"

    def __init__(self, pipeline: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline

    @cached_property
    def spec(self) -> spec_module.PipelineSpec:
        return spec_module.load_pipeline(self.pipeline)

    @cached_property
    def platform(self) -> config.PlatformConfig:
        return config.load()

    def status(self) -> dict:
        """`lakehouse status` for this pipeline: positions, log ends, lag, freshness, last commit."""
        return status_module.pipeline_status(self.spec, self.platform)

    def spark(self, app_name: str):
        """A Spark session with the pipeline's catalog and the Iceberg extensions (in this process)."""
        from lakehouse import sparkenv

        return sparkenv.session(self.platform, [self.spec.catalog], app_name)

    def record(self, kind: str, status: str = "ok", message: str = "", metrics: dict | None = None,
               details: dict | None = None) -> None:
        """Append one event for this pipeline to the ops timeline (`ops.pipeline_events`)."""
        events.record(events.Event(self.pipeline, kind, status, message, metrics or {}, details or {}),
                      platform=self.platform)
