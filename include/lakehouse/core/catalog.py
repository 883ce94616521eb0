"""One pyiceberg catalog per process and catalog name, shared by every component of the process."""

from __future__ import annotations

import threading

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.core.config import PlatformConfig

_CATALOGS: dict[tuple, Catalog] = {}
_CATALOGS_LOCK = threading.Lock()


def open_catalog(platform: PlatformConfig, name: str, fresh: bool = False) -> Catalog:
    """The pyiceberg view of the JDBC catalog Spark writes (same database, same tables): one per
    process for each catalog (its connection pool is shared), unless `fresh`.

    An s3:// or s3a:// warehouse gets the object store's endpoint, addressing style and
    region (LAKEHOUSE_S3_*); credentials come from the AWS environment, as on the JVM side.
    A SQLite catalog waits `catalog_busy_timeout_ms` for a lock, like Spark's JDBC connection.
    """
    io_properties = platform.object_store.pyiceberg_properties() if platform.warehouse_on_s3 else {}
    uri = platform.catalog_uri
    if uri.startswith("sqlite:") and "?" not in uri:  # wait for another process's lock as long as Spark does
        uri += f"?timeout={platform.catalog_busy_timeout_ms / 1000:g}"
    key = (name, uri, platform.warehouse, tuple(sorted(io_properties.items())))
    with _CATALOGS_LOCK:
        if not fresh and key in _CATALOGS:
            return _CATALOGS[key]
        # pool_pre_ping: a pooled connection the server dropped (restart, pg_terminate_backend) is replaced
        # before use instead of failing the next catalog call
        catalog = SqlCatalog(name, uri=uri, warehouse=platform.warehouse, pool_pre_ping="true", **io_properties)
        _CATALOGS[key] = catalog
        return catalog
