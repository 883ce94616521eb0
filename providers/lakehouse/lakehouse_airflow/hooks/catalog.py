"""CatalogHook: the Iceberg catalog, from the Airflow connection `lakehouse_catalog`.

The connection says what LAKEHOUSE_CATALOG_URI and LAKEHOUSE_WAREHOUSE say: its host is the catalog's URI
(the http(s) URL of a REST catalog, or the SQLAlchemy URI of a JDBC catalog's database:
postgresql+psycopg2://db:5432/iceberg, sqlite:////var/lib/lakehouse/catalog.db), its login and password
the database's user and password (written into the URI's user info), its extra field `warehouse` the
warehouse location. Catalogs configured by name in pyiceberg's own configuration (.pyiceberg.yaml,
PYICEBERG_CATALOG__<NAME>__*) keep that configuration, as they do over LAKEHOUSE_CATALOG_URI. The test
opens the catalog as the operators do (with the object store connection `lakehouse_object_store` where one
exists: an s3:// warehouse's store must answer) and lists its namespaces (lakehouse.ops.check.check_catalog).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError
from lakehouse_airflow.connection_types import CATALOG
from lakehouse_airflow.hooks.base import PartHook, extra_field

CATALOG_CONN_ID = CATALOG.default_conn_id
# URI schemes of the catalogs LAKEHOUSE_CATALOG_URI takes (lakehouse.core.config.CatalogConfig)
SCHEMES = ("sqlite", "postgresql", "postgres", "http", "https")
TESTED_CATALOG = "lake"  # the name the test opens the connection's catalog under (the specs' default)


def catalog_of(conn) -> tuple[str, str]:
    """(catalog URI with the connection's credentials, warehouse or "") of Airflow connection `conn`.
    Raises ConfigurationError for a host that is not a catalog URI."""
    uri = (conn.host or "").strip()
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"connection {conn.conn_id!r}: its host {config.redact(uri)!r} is not a catalog URI; write the http(s) URL "
            f"of a REST catalog (http://iceberg-rest:8181) or the SQLAlchemy URI of a JDBC catalog's database "
            f"(postgresql+psycopg2://db:5432/iceberg, sqlite:////path/catalog.db)")
    if conn.login:
        parts = urlsplit(uri)
        if not parts.hostname:
            raise ConfigurationError(f"connection {conn.conn_id!r}: a login is given, but the catalog URI "
                                     f"{config.redact(uri)!r} names no server to log into")
        user = quote(conn.login, safe="")
        if conn.password:
            user += ":" + quote(conn.password, safe="")
        uri = urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))
    return uri, str(extra_field(conn, CATALOG, "warehouse") or "").strip()


class CatalogHook(PartHook):
    """The Iceberg catalog connection `catalog_conn_id` (default `lakehouse_catalog`)."""

    kind = CATALOG
    conn_name_attr = "catalog_conn_id"
    default_conn_name = CATALOG.default_conn_id
    conn_type = CATALOG.conn_type
    hook_name = CATALOG.name

    def __init__(self, catalog_conn_id: str | None = CATALOG_CONN_ID, **kwargs: Any):
        super().__init__(catalog_conn_id, **kwargs)

    @classmethod
    def lay_over(cls, platform: config.PlatformConfig, conn) -> config.PlatformConfig:
        uri, warehouse = catalog_of(conn)
        if not warehouse:
            return replace(platform, catalog_uri=uri)
        return replace(platform, catalog_uri=uri, warehouse=warehouse, warehouse_explicit=True)

    @classmethod
    def variables(cls, conn) -> dict[str, str]:
        uri, warehouse = catalog_of(conn)
        return {"LAKEHOUSE_CATALOG_URI": uri, **({"LAKEHOUSE_WAREHOUSE": warehouse} if warehouse else {})}

    def check(self, platform: config.PlatformConfig, timeout: float):
        from lakehouse.ops import check
        from lakehouse_airflow.hooks.object_store import ObjectStoreHook

        # opened as the operators open it: with the object store connection of the default id, where one exists
        # (a catalog opens only once its warehouse's store answers), and as the connection's catalog even where
        # pyiceberg's configuration names a catalog `lake`
        platform = ObjectStoreHook().platform(platform)
        platform = replace(platform, catalog_settings={name: props for name, props in platform.catalog_settings.items()
                                                       if name != TESTED_CATALOG})
        return check.check_catalog(platform, platform.catalog(TESTED_CATALOG), timeout)
