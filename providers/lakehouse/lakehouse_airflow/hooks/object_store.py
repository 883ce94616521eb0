"""ObjectStoreHook: the S3-compatible store of an s3:// warehouse, from the Airflow connection
`lakehouse_object_store`.

The connection says what LAKEHOUSE_S3_ENDPOINT, LAKEHOUSE_S3_REGION, LAKEHOUSE_S3_PATH_STYLE_ACCESS and the
AWS credentials say: its host is the endpoint URL (empty: AWS S3), its login and password the access key
id and the secret access key (empty: the AWS credential chain of each process, as without a connection),
its extra fields `region` and `path_style_access`. Submitted jobs get them as those variables, the
credentials as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in spark-submit's environment: executors
on other machines need them from their own environment, as without a connection. The test asks the
warehouse's bucket and prefix (lakehouse.ops.check.check_object_store); the warehouse is the
catalog connection's or LAKEHOUSE_WAREHOUSE.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError
from lakehouse_airflow.connection_types import OBJECT_STORE
from lakehouse_airflow.hooks.base import PartHook, extra_field
from lakehouse_airflow.hooks.catalog import TESTED_CATALOG

OBJECT_STORE_CONN_ID = OBJECT_STORE.default_conn_id


def store_of(conn) -> config.ObjectStoreConfig:
    """The object store of Airflow connection `conn`. Raises ConfigurationError for an endpoint that is not an
    http(s) URL or a path-style flag that is not a boolean."""
    endpoint = (conn.host or "").strip() or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"connection {conn.conn_id!r}: its host {endpoint!r} is not the object store's "
                                     f"endpoint URL; write one such as http://minio:9000, or leave it empty for "
                                     f"AWS S3")
    flag = extra_field(conn, OBJECT_STORE, "path_style_access")
    path_style = config.parse_bool(None if flag is None else str(flag),
                                   f"connection {conn.conn_id!r}: extra path_style_access")
    return config.ObjectStoreConfig(endpoint=endpoint, path_style_access=path_style,
                                    region=str(extra_field(conn, OBJECT_STORE, "region") or "").strip() or None,
                                    access_key_id=conn.login or None, secret_access_key=conn.password or None)


class ObjectStoreHook(PartHook):
    """The object store connection `object_store_conn_id` (default `lakehouse_object_store`)."""

    kind = OBJECT_STORE
    conn_name_attr = "object_store_conn_id"
    default_conn_name = OBJECT_STORE.default_conn_id
    conn_type = OBJECT_STORE.conn_type
    hook_name = OBJECT_STORE.name

    def __init__(self, object_store_conn_id: str | None = OBJECT_STORE_CONN_ID, **kwargs: Any):
        super().__init__(object_store_conn_id, **kwargs)

    @classmethod
    def lay_over(cls, platform: config.PlatformConfig, conn) -> config.PlatformConfig:
        return replace(platform, object_store=store_of(conn))

    @classmethod
    def variables(cls, conn) -> dict[str, str]:
        return store_of(conn).environment()

    def check(self, platform: config.PlatformConfig, timeout: float):
        from lakehouse.core import warehouse
        from lakehouse.ops import check

        if warehouse.location(platform.warehouse) is None:
            raise ConfigurationError(f"the warehouse {platform.warehouse!r} is not in an object store (s3://bucket/"
                                     f"prefix), so this connection is not used; set the catalog connection's "
                                     f"warehouse or LAKEHOUSE_WAREHOUSE to the s3:// location it serves")
        warehouse.forget()  # ask the store now, not what it answered before in this process
        settings = config.CatalogConfig(name=TESTED_CATALOG, type="rest", uri="", warehouse=platform.warehouse,
                                        object_store=platform.object_store)
        return check.check_object_store(settings, timeout)
