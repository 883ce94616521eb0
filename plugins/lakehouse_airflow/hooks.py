"""LakehouseHook: one pipeline's spec, the platform it runs on, its status and its timeline.

Kafka settings come from the environment (`lakehouse.core.config`) and, when it exists, from
the Airflow connection `lakehouse_kafka` (conn_type `kafka`, as the apache-kafka provider
defines it): its extra is librdkafka configuration JSON, e.g.

    {"bootstrap.servers": "broker:9093", "security.protocol": "SASL_SSL",
     "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "lakehouse",
     "sasl.password": "...", "ssl.ca.location": "/etc/kafka/ca.pem"}

(host/port, login and password fields fill bootstrap.servers, sasl.username and
sasl.password when the extra leaves them out). Its settings override and extend the
environment's for the hook's platform (sensors, triggers, operators) and, through
`kafka_environment`, for the Spark jobs the operators submit. A missing connection
means the environment alone is used. Secrets stay out of templated fields, XCom and
logs: Airflow masks the connection's password and password-like extras in task logs.

The schema registry of pipelines in a wire format (Avro, Protobuf, JSON Schema) comes the same
way from the connection `lakehouse_schema_registry` (conn_type `http`): host (with its scheme, or
the connection's schema field as the scheme), port, and login/password as basic auth. It overrides
LAKEHOUSE_SCHEMA_REGISTRY_URL for the hook's platform and reaches submitted jobs through their
process environment (`submit_environment`); only the ingest job's driver uses it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from lakehouse.core import config, events
from lakehouse.core import spec as spec_module
from lakehouse.ops import status as status_module

KAFKA_CONN_ID = "lakehouse_kafka"
SCHEMA_REGISTRY_CONN_ID = "lakehouse_schema_registry"


def _settings(conn) -> dict[str, str]:
    """librdkafka settings of Airflow connection `conn`: its extra, then host/port, login, password."""
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    settings = {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in extra.items()
                if v is not None and not isinstance(v, (dict, list))}
    if conn.host and "bootstrap.servers" not in settings:
        settings["bootstrap.servers"] = ",".join(
            f"{host.strip()}:{conn.port}" if conn.port and ":" not in host else host.strip()
            for host in conn.host.split(","))
    if conn.login and "sasl.username" not in settings:
        settings["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in settings:
        settings["sasl.password"] = conn.password
    return settings


def kafka_connection_settings(conn_id: str | None = KAFKA_CONN_ID) -> dict[str, str]:
    """The librdkafka settings of Kafka connection `conn_id`; {} when it is not defined (or None)."""
    if not conn_id:
        return {}
    try:
        return _settings(BaseHook.get_connection(conn_id))
    except AirflowNotFoundException:
        return {}


async def akafka_connection_settings(conn_id: str | None = KAFKA_CONN_ID) -> dict[str, str]:
    """`kafka_connection_settings` for triggers: asks the triggerer without blocking its event loop."""
    if not conn_id:
        return {}
    try:
        return _settings(await BaseHook.aget_connection(conn_id))
    except AirflowNotFoundException:
        return {}


def schema_registry_url(conn_id: str | None = SCHEMA_REGISTRY_CONN_ID) -> str | None:
    """The schema registry's URL (credentials as its user info, for LAKEHOUSE_SCHEMA_REGISTRY_URL) from
    Airflow connection `conn_id`; None when it is not defined (or None)."""
    if not conn_id:
        return None
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    if not conn.host:
        return None
    parts = urlsplit(conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}")
    netloc = parts.netloc
    if conn.port and not parts.port:
        netloc = f"{netloc}:{conn.port}"
    if conn.login:
        netloc = f"{quote(conn.login, safe='')}:{quote(conn.password or '', safe='')}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def kafka_environment(settings: dict[str, str]) -> dict[str, str]:
    """The LAKEHOUSE_* variables that give a process started from this one (spark-submit) the Kafka
    `settings`: LAKEHOUSE_BOOTSTRAP_SERVERS and LAKEHOUSE_KAFKA_<PROPERTY> (see lakehouse.core.config)."""
    env = {}
    for key, value in settings.items():
        if key == "bootstrap.servers":
            env["LAKEHOUSE_BOOTSTRAP_SERVERS"] = value
        else:
            env[config.KAFKA_PREFIX + key.upper().replace(".", "_")] = value
    return env


def connection_environment(kafka_conn_id: str | None = KAFKA_CONN_ID,
                           schema_registry_conn_id: str | None = SCHEMA_REGISTRY_CONN_ID) -> dict[str, str]:
    """The LAKEHOUSE_* variables that give a submitted job the connections' settings: Kafka's
    (`kafka_environment`) and the schema registry's URL. Secrets included: for a process environment only."""
    env = kafka_environment(kafka_connection_settings(kafka_conn_id))
    url = schema_registry_url(schema_registry_conn_id)
    if url:
        env["LAKEHOUSE_SCHEMA_REGISTRY_URL"] = url
    return env


def openlineage_enabled() -> bool:
    """Whether Airflow's OpenLineage provider emits events from this process (installed, configured and
    not disabled): operators then gather their datasets while they run, since the provider asks for them
    from a forked process with a deadline, where no connection or catalog should be opened."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


class LakehouseHook(BaseHook):
    """Everything an operator or sensor needs to act on pipeline `pipeline`.

    The spec comes from the pipelines folder (`LAKEHOUSE_PIPELINES_DIR`), the platform
    (Kafka, catalog, warehouse, Spark master) from `lakehouse.core.config`, exactly as the
    ingest job reads them, with the Kafka connection `kafka_conn_id` (default
    `lakehouse_kafka`, skipped when it does not exist) laid over its Kafka settings and the
    schema registry connection `schema_registry_conn_id` over LAKEHOUSE_SCHEMA_REGISTRY_URL.
    Raises UnknownPipelineError / SpecError on first use when the pipeline is not declared
    or its spec is invalid.
    """

    hook_name = "Lakehouse pipeline"

    def __init__(self, pipeline: str, kafka_conn_id: str | None = KAFKA_CONN_ID,
                 schema_registry_conn_id: str | None = SCHEMA_REGISTRY_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.schema_registry_conn_id = schema_registry_conn_id

    @cached_property
    def spec(self) -> spec_module.PipelineSpec:
        return spec_module.load_pipeline(self.pipeline)

    @cached_property
    def kafka_settings(self) -> dict[str, str]:
        """The Kafka connection's librdkafka settings ({} without one). Secrets included: never log them."""
        return kafka_connection_settings(self.kafka_conn_id)

    @cached_property
    def schema_registry_url(self) -> str | None:
        """The schema registry connection's URL, credentials included (None without one): never log it."""
        return schema_registry_url(self.schema_registry_conn_id)

    @cached_property
    def platform(self) -> config.PlatformConfig:
        platform = config.load().with_kafka(self.kafka_settings)
        if self.schema_registry_url:
            platform = replace(platform, schema_registry_url=self.schema_registry_url)
        return platform

    @cached_property
    def submit_environment(self) -> dict[str, str]:
        """`connection_environment` of this hook's connections: for the spark-submit process's environment only."""
        return connection_environment(self.kafka_conn_id, self.schema_registry_conn_id)

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
