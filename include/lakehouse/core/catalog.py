"""One pyiceberg catalog per process and catalog name, shared by every component of the process."""

from __future__ import annotations

import threading

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    BadRequestError,
    ForbiddenError,
    NoSuchNamespaceError,
    NoSuchTableError,
    UnauthorizedError,
)

from lakehouse.core import warehouse
from lakehouse.core.config import PlatformConfig, redact
from lakehouse.core.errors import CatalogAccessError, CatalogUnavailableError, ConfigurationError, transient_cause

_CATALOGS: dict[tuple, Catalog] = {}
_CATALOGS_LOCK = threading.Lock()


def open_catalog(platform: PlatformConfig, name: str, fresh: bool = False) -> Catalog:
    """The pyiceberg view of catalog `name` as Spark opens it (config.CatalogConfig: the same JDBC database,
    REST server or Glue/Hive catalog, the same warehouse): one per process for each catalog and its
    settings (a JDBC catalog's connection pool is shared), unless `fresh`.

    An s3:// or s3a:// warehouse gets the object store's endpoint, addressing style and region
    (LAKEHOUSE_S3_*); credentials come from the AWS environment, as on the JVM side, or from the
    development stack's object store. A SQLite catalog waits `catalog_busy_timeout_ms` for a lock, like
    Spark's JDBC connection. Raises ConfigurationError for a catalog the platform cannot open, and what
    lakehouse.core.warehouse.check raises for an object store that does not answer, refuses the
    credentials or lacks the warehouse's bucket.
    """
    settings = platform.catalog(name)
    properties = settings.pyiceberg_properties()
    key = (name, tuple(sorted(properties.items())))
    with _CATALOGS_LOCK:
        if not fresh and key in _CATALOGS:
            return _CATALOGS[key]
        try:
            catalog = load_catalog(name, **properties)
        except (UnauthorizedError, ForbiddenError) as exc:
            raise CatalogAccessError(
                f"catalog {name!r} at {redact(settings.uri)} refused this client ({type(exc).__name__}: {exc}); "
                f"check its credentials (credential, token, scope) and grants in the {settings.source}") from None
        except (BadRequestError, NoSuchNamespaceError, NoSuchTableError) as exc:  # /v1/config of another service
            raise ConfigurationError(f"catalog {name!r}: {redact(settings.uri)} does not answer as an Iceberg REST "
                                     f"catalog ({type(exc).__name__}: {exc}); check the URI in the "
                                     f"{settings.source}") from None
        except Exception as exc:
            if transient_cause(exc):
                raise CatalogUnavailableError(f"catalog {name!r} at {redact(settings.uri)} ({settings.source}) is "
                                              f"unavailable ({transient_cause(exc)}); is it running?") from exc
            raise
        warehouse.check(settings)  # the object store of an s3:// warehouse answers, takes the key, has the bucket
        _CATALOGS[key] = catalog
        return catalog
