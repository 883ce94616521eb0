"""Whether an s3:// warehouse can be used, asked once per process before anything is read or written there.

Without this check, a wrong endpoint, key or bucket surfaces late and far from its cause: a pyarrow
OSError in a Spark task after the batch was read, an AWS SDK stack trace from the JVM, a REST catalog's
HTTP 500. `check(settings)` asks the store itself, with the clients' own settings (LAKEHOUSE_S3_*, the
AWS credential chain), in two requests that fail within seconds: the bucket (HeadBucket) and the
warehouse prefix (a one-key listing). It raises

- ObjectStoreUnavailableError when nothing answers at the endpoint (transient: a continuous job retries
  it within its retry budget), naming LAKEHOUSE_S3_ENDPOINT;
- ObjectStoreAccessError when the store refuses the credentials or the bucket does not exist (waiting
  does not fix either), naming AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the AWS credential chain)
  and the warehouse setting.

A store that answered is not asked again by the same process (`forget` starts over). A local warehouse
needs no check.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from lakehouse.core.config import S3_SCHEMES, CatalogConfig, redact
from lakehouse.core.errors import ObjectStoreAccessError, ObjectStoreUnavailableError

CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 10.0
# Words of the AWS SDK's (pyarrow's) error text for each kind of failure
_UNREACHABLE = ("NETWORK_CONNECTION", "curlCode: 7", "curlCode: 28", "Couldn't connect", "Connection refused",
                "Could not resolve", "Timeout was reached", "Operation timed out")
_REFUSED = ("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "HTTP response code: 403",
            "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH")
_NO_BUCKET = ("NoSuchBucket", "NO_SUCH_BUCKET")

_checked: set[tuple] = set()
_lock = threading.Lock()


def location(warehouse: str) -> tuple[str, str] | None:
    """(bucket, key prefix) of an s3:// or s3a:// warehouse; None for any other."""
    parts = urlsplit(warehouse)
    if parts.scheme not in S3_SCHEMES:
        return None
    return parts.netloc, parts.path.strip("/")


def _filesystem(settings: CatalogConfig):
    from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

    store = settings.object_store
    options = {"connect_timeout": CONNECT_TIMEOUT_S, "request_timeout": REQUEST_TIMEOUT_S,
               "retry_strategy": AwsStandardS3RetryStrategy(max_attempts=1)}
    if store.endpoint:
        parts = urlsplit(store.endpoint)
        options["endpoint_override"] = parts.netloc
        options["scheme"] = parts.scheme
    if store.region:
        options["region"] = store.region
    if store.path_style_access is not None:
        options["force_virtual_addressing"] = not store.path_style_access
    if store.access_key_id and store.secret_access_key:
        options["access_key"] = store.access_key_id
        options["secret_key"] = store.secret_access_key
    return S3FileSystem(**options)


def check(settings: CatalogConfig) -> None:
    """Raise ObjectStoreUnavailableError or ObjectStoreAccessError (see the module's docstring) unless the
    bucket of `settings.warehouse` exists and the store lets these credentials list the warehouse prefix."""
    where = location(settings.warehouse)
    if where is None:
        return
    store = settings.object_store
    key = (where, store.endpoint, store.region, store.path_style_access, store.access_key_id)
    with _lock:
        if key in _checked:
            return
    bucket, prefix = where
    endpoint = redact(store.endpoint) if store.endpoint else "the AWS S3 endpoint (no LAKEHOUSE_S3_ENDPOINT)"
    credentials = ("the object store's generated key (the development stack's)" if store.access_key_id
                   else "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS credential chain")
    warehouse = f"warehouse {settings.warehouse} of catalog {settings.name!r}"
    from pyarrow.fs import FileSelector, FileType

    try:
        fs = _filesystem(settings)
        if fs.get_file_info(bucket).type == FileType.NotFound:
            raise ObjectStoreAccessError(f"{warehouse}: the object store at {endpoint} has no bucket {bucket!r}; "
                                         f"create it, or correct LAKEHOUSE_WAREHOUSE")
        fs.get_file_info(FileSelector(f"{bucket}/{prefix}" if prefix else bucket, allow_not_found=True,
                                      recursive=False))
    except OSError as exc:
        text = str(exc)
        if any(word in text for word in _NO_BUCKET):
            raise ObjectStoreAccessError(f"{warehouse}: the object store at {endpoint} has no bucket {bucket!r}; "
                                         f"create it, or correct LAKEHOUSE_WAREHOUSE") from None
        if any(word in text for word in _REFUSED):
            raise ObjectStoreAccessError(f"{warehouse}: the object store at {endpoint} refused {credentials} "
                                         f"({_first_line(text)}); check them and the bucket's grants") from None
        if any(word in text for word in _UNREACHABLE):
            raise ObjectStoreUnavailableError(f"{warehouse}: nothing answers at {endpoint} "
                                              f"({_first_line(text)}); is the object store running? "
                                              f"Check LAKEHOUSE_S3_ENDPOINT") from None
        raise ObjectStoreUnavailableError(f"{warehouse}: the object store at {endpoint} failed "
                                          f"({_first_line(text)})") from None
    with _lock:
        _checked.add(key)


def forget() -> None:
    """Check every store again (tests; a process that changed its settings)."""
    with _lock:
        _checked.clear()


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no detail"
    return line if len(line) <= 300 else line[:297] + "..."
