"""SchemaRegistryHook: the schema registry of pipelines in a wire format (Avro, Protobuf, JSON Schema), from
the Airflow connection `lakehouse_schema_registry`.

The connection says what LAKEHOUSE_SCHEMA_REGISTRY_URL says: its host is the registry's URL (with its
scheme, or the connection's schema field as the scheme; a path such as /apis/ccompat/v7 kept), its port,
and its login and password as HTTP basic auth. It overrides LAKEHOUSE_SCHEMA_REGISTRY_URL for the hooks'
platform and reaches submitted jobs through their process environment; only the ingest job's driver
uses it. The test asks GET /subjects (lakehouse.ops.check.check_registry).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError
from lakehouse_airflow.connection_types import SCHEMA_REGISTRY
from lakehouse_airflow.hooks.base import PartHook

SCHEMA_REGISTRY_CONN_ID = SCHEMA_REGISTRY.default_conn_id


def url_of(conn) -> str | None:
    """The registry's URL of Airflow connection `conn`, credentials as its user info (as
    LAKEHOUSE_SCHEMA_REGISTRY_URL takes them); None when the connection has no host."""
    if not conn.host:
        return None
    parts = urlsplit(conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"connection {conn.conn_id!r}: its host {conn.host!r} is not the registry's "
                                 f"http(s) URL, e.g. https://registry:8081")
    netloc = parts.netloc
    if conn.port and not parts.port:
        netloc = f"{netloc}:{conn.port}"
    if conn.login:
        netloc = f"{quote(conn.login, safe='')}:{quote(conn.password or '', safe='')}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


class SchemaRegistryHook(PartHook):
    """The schema registry connection `schema_registry_conn_id` (default `lakehouse_schema_registry`)."""

    kind = SCHEMA_REGISTRY
    conn_name_attr = "schema_registry_conn_id"
    default_conn_name = SCHEMA_REGISTRY.default_conn_id
    conn_type = SCHEMA_REGISTRY.conn_type
    hook_name = SCHEMA_REGISTRY.name

    def __init__(self, schema_registry_conn_id: str | None = SCHEMA_REGISTRY_CONN_ID, **kwargs: Any):
        super().__init__(schema_registry_conn_id, **kwargs)

    @property
    def url(self) -> str | None:
        """The connection's URL, credentials included (None without one or without a host): never log it."""
        return None if self.connection is None else url_of(self.connection)

    @classmethod
    def lay_over(cls, platform: config.PlatformConfig, conn) -> config.PlatformConfig:
        url = url_of(conn)
        return replace(platform, schema_registry_url=url) if url else platform

    @classmethod
    def variables(cls, conn) -> dict[str, str]:
        url = url_of(conn)
        return {"LAKEHOUSE_SCHEMA_REGISTRY_URL": url} if url else {}

    def check(self, platform: config.PlatformConfig, timeout: float):
        from lakehouse.ops import check

        if platform.schema_registry() is None:
            raise ConfigurationError(f"connection {self.conn_id!r} has no host: write the registry's URL there")
        return check.check_registry(platform, timeout)
