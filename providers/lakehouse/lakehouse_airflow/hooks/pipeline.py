"""LakehouseHook: one pipeline's spec, the platform it runs on (the environment's settings with the
connections laid over them), its status and its timeline.

The spec comes from the pipelines folder the provider is configured with (lakehouse_airflow.locations:
LAKEHOUSE_PIPELINES_DIR or [lakehouse] pipelines_dir). The platform (Kafka, catalog, warehouse, object
store, schema registry, Spark master) comes from lakehouse.core.config, exactly as the ingest job reads
it, with each part's connection laid over it where one exists (hooks.kafka, hooks.catalog,
hooks.object_store, hooks.schema_registry; default ids lakehouse_kafka, lakehouse_catalog,
lakehouse_object_store, lakehouse_schema_registry; None skips a part). Secrets stay out of templated
fields, XCom and logs: submitted jobs get the connections' settings through their process environment
(`submit_environment`, lakehouse_airflow.spark.connection_submit_environment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from lakehouse.core import config, events
from lakehouse.core import spec as spec_module
from lakehouse.ops import status as status_module
from lakehouse_airflow import locations
from lakehouse_airflow.hooks.base import PartHook, aconnection
from lakehouse_airflow.hooks.catalog import CATALOG_CONN_ID, CatalogHook
from lakehouse_airflow.hooks.kafka import KAFKA_CONN_ID, KafkaHook
from lakehouse_airflow.hooks.object_store import OBJECT_STORE_CONN_ID, ObjectStoreHook
from lakehouse_airflow.hooks.schema_registry import SCHEMA_REGISTRY_CONN_ID, SchemaRegistryHook


def part_hooks(kafka_conn_id: str | None = KAFKA_CONN_ID, catalog_conn_id: str | None = CATALOG_CONN_ID,
               object_store_conn_id: str | None = OBJECT_STORE_CONN_ID,
               schema_registry_conn_id: str | None = SCHEMA_REGISTRY_CONN_ID) -> tuple[PartHook, ...]:
    """The hook of each part's connection, in the order their settings are laid over the environment's."""
    return (KafkaHook(kafka_conn_id), CatalogHook(catalog_conn_id), ObjectStoreHook(object_store_conn_id),
            SchemaRegistryHook(schema_registry_conn_id))


def lay_over(platform: config.PlatformConfig, hooks: Iterable[PartHook]) -> config.PlatformConfig:
    """`platform` with every connection of `hooks` that exists laid over it."""
    for hook in hooks:
        platform = hook.platform(platform)
    return platform


async def aoverlay(kafka_conn_id: str | None = None, catalog_conn_id: str | None = None,
                   object_store_conn_id: str | None = None) -> Callable[[config.PlatformConfig], config.PlatformConfig]:
    """For triggers: the connections read without blocking the event loop, as a function that lays them over
    a platform (their secrets stay in the triggerer's memory, never in the trigger's kwargs)."""
    found = [(kind, await aconnection(conn_id)) for kind, conn_id in
             ((KafkaHook, kafka_conn_id), (CatalogHook, catalog_conn_id), (ObjectStoreHook, object_store_conn_id))]

    def overlay(platform: config.PlatformConfig) -> config.PlatformConfig:
        for kind, conn in found:
            if conn is not None:
                platform = kind.lay_over(platform, conn)
        return platform

    return overlay


def connection_environment(kafka_conn_id: str | None = KAFKA_CONN_ID,
                           schema_registry_conn_id: str | None = SCHEMA_REGISTRY_CONN_ID,
                           catalog_conn_id: str | None = CATALOG_CONN_ID,
                           object_store_conn_id: str | None = OBJECT_STORE_CONN_ID) -> dict[str, str]:
    """The variables that give a submitted job the connections' settings: Kafka's (LAKEHOUSE_BOOTSTRAP_SERVERS,
    LAKEHOUSE_KAFKA_*), the catalog's (LAKEHOUSE_CATALOG_URI, LAKEHOUSE_WAREHOUSE), the object store's
    (LAKEHOUSE_S3_*, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the schema registry's URL. Secrets included:
    for a process environment only."""
    env: dict[str, str] = {}
    for hook in part_hooks(kafka_conn_id, catalog_conn_id, object_store_conn_id, schema_registry_conn_id):
        env.update(hook.environment())
    return env


class LakehouseHook(BaseHook):
    """Everything an operator or sensor needs to act on pipeline `pipeline`; see the module doc.

    Raises UnknownPipelineError / SpecError on first use when the pipeline is not declared or its spec
    is invalid, ConfigurationError when the pipelines folder is not configured or a connection's settings
    cannot be used.
    """

    hook_name = "Lakehouse pipeline"

    def __init__(self, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID,
                 schema_registry_conn_id: str | None = SCHEMA_REGISTRY_CONN_ID,
                 catalog_conn_id: str | None = CATALOG_CONN_ID,
                 object_store_conn_id: str | None = OBJECT_STORE_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.schema_registry_conn_id = schema_registry_conn_id
        self.catalog_conn_id = catalog_conn_id
        self.object_store_conn_id = object_store_conn_id

    @cached_property
    def parts(self) -> tuple[PartHook, ...]:
        return part_hooks(self.kafka_conn_id, self.catalog_conn_id, self.object_store_conn_id,
                          self.schema_registry_conn_id)

    @cached_property
    def spec(self) -> spec_module.PipelineSpec:
        return spec_module.load_pipeline(self.pipeline, locations.pipelines_dir())

    @cached_property
    def kafka_settings(self) -> dict[str, str]:
        """The Kafka connection's librdkafka settings ({} without one). Secrets included: never log them."""
        return KafkaHook(self.kafka_conn_id).settings

    @cached_property
    def schema_registry_url(self) -> str | None:
        """The schema registry connection's URL, credentials included (None without one): never log it."""
        return SchemaRegistryHook(self.schema_registry_conn_id).url

    def lay_over(self, platform: config.PlatformConfig) -> config.PlatformConfig:
        """`platform` with this hook's connections laid over it (sensors apply it to each check's fresh load)."""
        return lay_over(platform, self.parts)

    @cached_property
    def platform(self) -> config.PlatformConfig:
        return self.lay_over(config.load())

    @cached_property
    def submit_environment(self) -> dict[str, str]:
        """The connections' variables (`connection_environment`): for the spark-submit process's environment only."""
        env: dict[str, str] = {}
        for hook in self.parts:
            env.update(hook.environment())
        return env

    def status(self) -> dict:
        """`lakehouse status` for this pipeline: positions, log ends, lag, freshness, last commit."""
        return status_module.pipeline_status(self.spec, self.platform)

    def spark(self, app_name: str):
        """A Spark session with the pipeline's catalog and the Iceberg extensions (in this process)."""
        from lakehouse.core import sparkenv

        return sparkenv.session(self.platform, [self.spec.catalog], app_name)

    def record(self, kind: str, status: str = "ok", message: str = "", metrics: dict | None = None,
               details: dict | None = None) -> None:
        """Append one event for this pipeline to the ops timeline (`ops.pipeline_events`)."""
        events.record(events.Event(self.pipeline, kind, status, message, metrics or {}, details or {}),
                      platform=self.platform, catalog=self.spec.catalog)
