"""An S3-compatible object store for the development stack: moto's S3 implementation (PyPI `moto`), served by
this module in a process of its own, so that the warehouse can live on s3://<bucket>/... with Spark writing
through Iceberg's S3FileIO and pyiceberg through pyarrow, as against a real object store.

`lakehouse stack up --object-store` starts it the way an operator would by hand:

    python -m lakehouse_dev.object_store serve --port 19000 --data <home>/object-store

    <home>/object-store/                    owner-only (0700)
        credentials.json                    the generated access key and secret (0600): the only pair the
                                            server accepts; made once, kept across restarts
        server.lock                         the running server's pid, locked (flock) while it runs: one
                                            server per folder
        buckets/<bucket>/                   one folder per bucket
        buckets/<bucket>/<sha256(key)>.obj  each object's latest version: one JSON line (key, ETag, last
                                            modified, metadata, size), then its bytes; replaced atomically
    <home>/logs/object-store.log            the server's output (the stack's own spawn helper)

The server is moto's S3 Flask application (only S3: neither moto's other services nor its unauthenticated
/moto-api reset endpoint) behind a WSGI middleware of this module, served by werkzeug's threaded server on
127.0.0.1. moto answers everything Iceberg does on S3: PutObject, multipart uploads (CreateMultipartUpload,
UploadPart, CompleteMultipartUpload, AbortMultipartUpload, the AWS SDK's aws-chunked bodies with trailing
checksums), GetObject with Range, HeadObject, ListObjectsV2 with prefixes and delimiters (orphan-file
removal), DeleteObject and DeleteObjects batches. Clients use path-style addressing
(LAKEHOUSE_S3_PATH_STYLE_ACCESS=true) and region us-east-1.

Persistence. moto itself keeps objects in memory only (objects above ~5 MiB spill to temporary files). The
middleware writes through: after every request that changed an object or a bucket (PutObject, CopyObject,
CompleteMultipartUpload, DeleteObject, DeleteObjects, CreateBucket, DeleteBucket) succeeds, and before the
client gets the answer, the object's current version is written under `buckets/` (or its file removed); at
start the server loads every bucket and object back (same keys, bytes, ETags, last-modified times and
metadata). A stack restart, even a SIGKILL, keeps the warehouse its catalog points at. Not kept: multipart
uploads still in progress, object versions other than the latest (versioning), ACLs, tags and bucket
configurations. Files are not fsynced: a crash of the machine (not of the process) may lose the last writes.
Every object lives in the server's memory as well, so this suits a development warehouse (megabytes to a
few hundred megabytes), not a benchmark's terabyte.

Credentials. The server runs with moto's IAM enforcement on (INITIAL_NO_AUTH_ACTION_COUNT=0): every request
must carry a SigV4 signature by the access key of credentials.json (an IAM user `lakehouse` allowed s3:*);
an unknown key is refused with 403 InvalidAccessKeyId, a wrong secret with 403 SignatureDoesNotMatch.
When LAKEHOUSE_OBJECT_STORE_ACCESS_KEY_ID and LAKEHOUSE_OBJECT_STORE_SECRET_ACCESS_KEY are both set (the
compose stack sets them from .env, to the pair its clients use), `serve` writes that pair to credentials.json
at start, replacing the one it holds; one without the other is refused. The secret is never printed.

Other deployments (docker-compose.yaml runs this module as its S3 server) listen on another interface with
`--host` (the stack keeps 127.0.0.1) and have the server create their buckets at start with `--bucket NAME`
(repeatable; a bucket that exists is kept as it is); the stack creates its own with `create_bucket`.

Request counts. The middleware counts every S3 request it serves, by bucket: by operation (PutObject,
UploadPart, GetObject, ListObjectsV2, DeleteObjects...), by HTTP method, by price class as AWS bills S3
Standard (`put`: PUT, COPY, POST and LIST requests; `get`: GET, HEAD and every other request; `free`:
DELETE and multipart aborts; DeleteObjects, a POST, is counted free like the deletes it batches), refusals
and other errors by status, and bytes in and out. What the clients send differs: pyiceberg's pyarrow FileIO
writes every file as a multipart upload (CreateMultipartUpload, UploadPart, CompleteMultipartUpload: three
`put` requests) and looks at it with HeadObject before reading; Iceberg's S3FileIO (Spark) sends one
PutObject per file below its multipart threshold. The counts are served as JSON on the same port, outside
the S3 namespace (a bucket name cannot start with `_`). With LAKEHOUSE_OBJECT_STORE_TRACE=1 in its environment
the server also logs every request it serves (operation, method, key, status) to its log, one line each: which
requests a batch makes, in order.

    GET    /_lakehouse/health     {"ok": true, "server": "moto", "version", "pid", "objects", "buckets", ...}
    GET    /_lakehouse/requests   the counts since the server started or since the last reset, by bucket and
                                  by table (`tables`: per Iceberg table location s3://bucket/..., the requests
                                  on objects under its data/ and metadata/ folders, listings of them included)
    DELETE /_lakehouse/requests   the same counts, reset to zero in the same step

Importing this module starts nothing and imports neither moto nor boto3: the stack spawns `serve_command`
with its own helpers, waits with `wait_ready`, recognises the process with `is_server_process` and stops it
with SIGTERM (the server finishes the write in progress, then exits).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import signal
import string
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from lakehouse.core.errors import LakehouseError

MODULE = "lakehouse_dev.object_store"
DEFAULT_PORT = 19000
DEFAULT_BUCKET = "lakehouse"
WAREHOUSE_PREFIX = "warehouse"  # the stack's warehouse: s3://<bucket>/warehouse
REGION = "us-east-1"
USER = "lakehouse"
START_TIMEOUT_S = 60.0  # moto's imports take ~1.5 s on two idle cores, several times that on busy ones
CONTROL_PREFIX = "/_lakehouse/"
NO_BUCKET = "(none)"  # requests naming no bucket (ListBuckets); parentheses never occur in a bucket name
OBJECT_SUFFIX = ".obj"
# S3 error codes of refused credentials (moto's, as AWS's): an unknown key, a wrong secret, a bad session token
REFUSED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "AccessDenied")
_ACCESS_KEY_ALPHABET = string.ascii_uppercase + string.digits
# The access key and secret a deployment gives the server (both or neither), instead of a generated pair.
ACCESS_KEY_VARIABLE = "LAKEHOUSE_OBJECT_STORE_ACCESS_KEY_ID"
SECRET_KEY_VARIABLE = "LAKEHOUSE_OBJECT_STORE_SECRET_ACCESS_KEY"
ENVIRONMENT = (ACCESS_KEY_VARIABLE, SECRET_KEY_VARIABLE)
DEFAULT_HOST = "127.0.0.1"  # the stack's: nothing beyond this machine reaches it
# S3 bucket names (AWS's general-purpose rules, without the rarely used dots next to each other)
BUCKET_NAME = re.compile(r"^(?!\d+\.\d+\.\d+\.\d+$)(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
LOG = logging.getLogger("lakehouse.object_store")
# every request served, one line each in the server log (which requests a batch makes, in order)
TRACE = os.environ.get("LAKEHOUSE_OBJECT_STORE_TRACE", "") not in ("", "0")
# Query parameters naming a bucket's configuration (a GET without one of these lists the bucket's objects)
BUCKET_SUBRESOURCES = frozenset({
    "accelerate", "acl", "analytics", "cors", "encryption", "intelligent-tiering", "inventory", "lifecycle",
    "logging", "metrics", "notification", "object-lock", "ownershipControls", "policy", "policyStatus",
    "publicAccessBlock", "replication", "requestPayment", "tagging", "versioning", "website"})


class ObjectStoreError(LakehouseError, RuntimeError):
    """The object store cannot be started, reached or used; the message says why."""


@dataclass(frozen=True)
class Layout:
    """Where one stack's object store keeps its credentials and data."""

    home: Path

    @property
    def folder(self) -> Path:
        return self.home / "object-store"

    @property
    def credentials_file(self) -> Path:
        return self.folder / "credentials.json"

    @property
    def buckets(self) -> Path:
        return self.folder / "buckets"

    @property
    def log(self) -> Path:
        return self.home / "logs" / "object-store.log"


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key='***')"


# ---------------------------------------------------------------------------- client side (the stack)

def _private_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def ensure_credentials(folder: Path) -> Credentials:
    """The access key and secret of the store in `folder` (its credentials.json), generated the first time:
    an AWS-looking key id (AKIA + 16 characters) and a 40-character secret, in a 0600 file of a 0700 folder."""
    path = folder / "credentials.json"
    try:
        found = json.loads(path.read_text())
        return Credentials(str(found["access_key_id"]), str(found["secret_access_key"]))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ObjectStoreError(f"the object store's credentials file {path} cannot be read ({exc}); "
                               f"delete it to have new credentials generated") from None
    _private_folder(folder)
    credentials = Credentials("AKIA" + "".join(secrets.choice(_ACCESS_KEY_ALPHABET) for _ in range(16)),
                              secrets.token_urlsafe(30))
    _write_credentials(path, credentials)
    return credentials


def _write_credentials(path: Path, credentials: Credentials) -> None:
    """credentials.json (0600) holding `credentials`, replaced atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"access_key_id": credentials.access_key_id,
                   "secret_access_key": credentials.secret_access_key}, handle)
    os.replace(tmp, path)


def credentials_from_environment(environ: dict[str, str] | None = None) -> Credentials | None:
    """The pair of LAKEHOUSE_OBJECT_STORE_ACCESS_KEY_ID and LAKEHOUSE_OBJECT_STORE_SECRET_ACCESS_KEY (os.environ by
    default), None when neither is set. ObjectStoreError when only one is, or the key id could not be sent in
    a SigV4 signature (empty, whitespace or '/'); the message never holds the secret."""
    environ = os.environ if environ is None else environ
    key_id, secret = environ.get(ACCESS_KEY_VARIABLE, ""), environ.get(SECRET_KEY_VARIABLE, "")
    if not key_id and not secret:
        return None
    if not key_id or not secret:
        missing = ACCESS_KEY_VARIABLE if not key_id else SECRET_KEY_VARIABLE
        given = SECRET_KEY_VARIABLE if not key_id else ACCESS_KEY_VARIABLE
        raise ObjectStoreError(f"{given} is set but {missing} is not: set both (the access key and secret the "
                               f"server accepts) or neither (a generated pair)")
    if "/" in key_id or any(c.isspace() for c in key_id):
        raise ObjectStoreError(f"{ACCESS_KEY_VARIABLE} {key_id!r}: an access key id holds neither '/' nor spaces")
    return Credentials(key_id, secret)


def install_credentials(folder: Path, environ: dict[str, str] | None = None) -> Credentials:
    """The credentials the server in `folder` accepts: those of the environment (credentials_from_environment),
    written to its credentials.json in place of the pair it held; else ensure_credentials' (kept or generated)."""
    configured = credentials_from_environment(environ)
    if configured is None:
        return ensure_credentials(folder)
    _private_folder(folder)
    path = folder / "credentials.json"
    try:
        found = json.loads(path.read_text())
        kept = Credentials(str(found["access_key_id"]), str(found["secret_access_key"]))
    except (OSError, ValueError, KeyError, TypeError):
        kept = None
    if kept != configured:
        _write_credentials(path, configured)
    return configured


def endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def serve_command(layout: Layout, port: int) -> list[str]:
    """The command line of the server for `layout` on 127.0.0.1:`port` (this interpreter, so the venv's moto)."""
    return [sys.executable, "-m", MODULE, "serve", "--port", str(port), "--data", str(layout.folder)]


def is_server_process(pid: int, layout: Layout) -> bool:
    """Whether `pid` is the object store of this `layout` (guards against signalling a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return MODULE.encode() in cmdline and b"serve" in cmdline and str(layout.folder).encode() in cmdline


def _control(url: str, method: str = "GET", timeout: float = 5.0) -> dict:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def health(endpoint_url: str, timeout: float = 2.0) -> dict | None:
    """The server's /_lakehouse/health answer, None when nothing (or something else) answers there."""
    try:
        found = _control(f"{endpoint_url.rstrip('/')}{CONTROL_PREFIX}health", timeout=timeout)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("ok") else None


def wait_ready(endpoint_url: str, timeout: float = START_TIMEOUT_S, proc: Any = None) -> dict:
    """Wait until the server at `endpoint_url` answers (its health document, which it gives only once its
    data is loaded). Raises ObjectStoreError when `proc` (a Popen, optional) exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise ObjectStoreError(f"the object store exited with code {proc.returncode} while starting")
        found = health(endpoint_url, timeout=1.0)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise ObjectStoreError(f"the object store at {endpoint_url} did not answer within {timeout:.0f}s")
        time.sleep(0.1)


def request_counts(endpoint_url: str, reset: bool = False) -> dict:
    """The server's request counts (see the module's docstring); `reset` returns them and starts them again
    from zero in one step, so that no request falls between two readings."""
    try:
        return _control(f"{endpoint_url.rstrip('/')}{CONTROL_PREFIX}requests", "DELETE" if reset else "GET")
    except (OSError, ValueError) as exc:
        raise ObjectStoreError(f"the object store at {endpoint_url} gave no request counts: {exc}") from None


def s3_client(endpoint_url: str, credentials: Credentials):
    """A boto3 S3 client of the store (path-style, REGION); boto3 is installed with moto."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint_url, region_name=REGION,
                        aws_access_key_id=credentials.access_key_id,
                        aws_secret_access_key=credentials.secret_access_key,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))


def create_bucket(endpoint_url: str, credentials: Credentials, bucket: str = DEFAULT_BUCKET) -> bool:
    """Create `bucket` unless it exists (it does after a restart: buckets are kept); True if created.
    Raises ObjectStoreError when the server refuses (credentials) or fails."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = s3_client(endpoint_url, credentials)
    try:
        try:  # a GET, not a HEAD: a refusal comes with its reason (HEAD answers have no body)
            client.get_bucket_location(Bucket=bucket)
            return False
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
                raise
        client.create_bucket(Bucket=bucket)
        return True
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code in REFUSED_CREDENTIALS:
            raise ObjectStoreError(f"the object store at {endpoint_url} refused access key "
                                   f"{credentials.access_key_id} ({code}): {exc}") from None
        raise ObjectStoreError(f"the object store at {endpoint_url} did not create bucket {bucket!r}: {exc}") from None
    except BotoCoreError as exc:
        raise ObjectStoreError(f"the object store at {endpoint_url} did not create bucket {bucket!r}: {exc}") from None


def client_environment(endpoint_url: str, credentials: Credentials, bucket: str = DEFAULT_BUCKET) -> dict[str, str]:
    """What a client process of the stack needs to use the store as its warehouse: the LAKEHOUSE_* settings
    (lakehouse.core.config) and the standard AWS credential variables both S3FileIO and pyarrow read."""
    return {
        "LAKEHOUSE_WAREHOUSE": f"s3://{bucket}/{WAREHOUSE_PREFIX}",
        "LAKEHOUSE_S3_ENDPOINT": endpoint_url,
        "LAKEHOUSE_S3_PATH_STYLE_ACCESS": "true",
        "LAKEHOUSE_S3_REGION": REGION,
        "AWS_ACCESS_KEY_ID": credentials.access_key_id,
        "AWS_SECRET_ACCESS_KEY": credentials.secret_access_key,
        "AWS_REGION": REGION,
    }


# ---------------------------------------------------------------------------- what a request is

def _bucket_and_key(environ: dict) -> tuple[str | None, str | None]:
    """The bucket and key a request names: path-style (http://host/bucket/key), or virtual-host style
    (http://bucket.host/key) when the Host has a dot and is neither an IPv4 address nor a localhost or
    s3.<region> name (moto's own rule)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "")
    path = unquote((urlsplit(raw).path if "://" in raw else raw.split("?", 1)[0]).lstrip("/"))
    host = environ.get("HTTP_HOST") or ""
    name = "" if host.startswith("[") else host.rsplit(":", 1)[0]  # [::1]: path-style
    if "." in name and not name.replace(".", "").isdigit() and not name.startswith(("localhost", "s3.", "s3-")):
        bucket, key = name.split(".", 1)[0], path
    else:
        bucket, _, key = path.partition("/")
    return (bucket or None), (key or None)


def classify(method: str, bucket: str | None, key: str | None, query: dict, headers: dict) -> tuple[str, str]:
    """The S3 operation of a request and its price class (`put`, `get` or `free`), from its method, the
    bucket and key it names, its query parameters and (lower-case) headers."""
    copy = "x-amz-copy-source" in headers
    if bucket is None:
        return ("ListBuckets", "put") if method == "GET" else (f"{method}Service", "get")
    if key is None:
        if method == "GET":
            if query.get("list-type") == ["2"]:
                return "ListObjectsV2", "put"
            for name, operation in (("uploads", "ListMultipartUploads"), ("versions", "ListObjectVersions")):
                if name in query:
                    return operation, "put"
            if "location" in query:
                return "GetBucketLocation", "get"
            return ("GetBucketConfiguration", "get") if set(query) & BUCKET_SUBRESOURCES else ("ListObjects", "put")
        if method == "HEAD":
            return "HeadBucket", "get"
        if method == "PUT":
            return ("PutBucketConfiguration", "put") if query else ("CreateBucket", "put")
        if method == "DELETE":
            return ("DeleteBucketConfiguration", "free") if query else ("DeleteBucket", "free")
        if method == "POST":
            return ("DeleteObjects", "free") if "delete" in query else ("PostObject", "put")
        return f"{method}Bucket", "get"
    if method == "GET":
        if "uploadId" in query:
            return "ListParts", "put"
        return ("GetObjectConfiguration", "get") if set(query) & {"tagging", "acl", "attributes", "retention",
                                                                 "legal-hold", "torrent"} else ("GetObject", "get")
    if method == "HEAD":
        return "HeadObject", "get"
    if method == "PUT":
        if "partNumber" in query and "uploadId" in query:
            return ("UploadPartCopy" if copy else "UploadPart"), "put"
        if set(query) & {"tagging", "acl", "retention", "legal-hold"}:
            return "PutObjectConfiguration", "put"
        return ("CopyObject" if copy else "PutObject"), "put"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload", "put"
        if "uploadId" in query:
            return "CompleteMultipartUpload", "put"
        if "restore" in query:
            return "RestoreObject", "put"
        return ("SelectObjectContent" if "select" in query else "PostObject"), "get"
    if method == "DELETE":
        return ("AbortMultipartUpload" if "uploadId" in query else "DeleteObject"), "free"
    return f"{method}Object", "get"


def _changes(operation: str) -> str | None:
    """What an operation's success changed: `key` (one object), `bucket` (several objects, the bucket itself)
    or None (nothing the server keeps on disk)."""
    if operation in ("PutObject", "CopyObject", "CompleteMultipartUpload", "DeleteObject"):
        return "key"
    if operation in ("CreateBucket", "DeleteBucket", "DeleteObjects", "PostObject"):
        return "bucket"
    return None


class RequestCounts:
    """Counts of the S3 requests served, by bucket; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.since = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.total = 0
        self.buckets: dict[str, dict] = {}
        self.tables: dict[str, dict] = {}

    def add(self, bucket: str | None, operation: str, price_class: str, method: str, status: int,
            bytes_in: int, table: str | None = None) -> dict:
        """Count one request (also under `table`, the Iceberg table location it concerns, if any); returns its
        bucket's entry (for the bytes out, added as they are sent)."""
        with self._lock:
            if table is not None and bucket:
                counted = self.tables.setdefault(f"s3://{bucket}/{table}", {
                    "requests": 0, "classes": {"put": 0, "get": 0, "free": 0}, "operations": {}})
                counted["requests"] += 1
                counted["classes"][price_class] += 1
                counted["operations"][operation] = counted["operations"].get(operation, 0) + 1
            entry = self.buckets.get(bucket or NO_BUCKET)
            if entry is None:
                entry = self.buckets[bucket or NO_BUCKET] = {
                    "requests": 0, "operations": {}, "methods": {}, "classes": {"put": 0, "get": 0, "free": 0},
                    "errors": {}, "bytes_in": 0, "bytes_out": 0}
            self.total += 1
            entry["requests"] += 1
            entry["operations"][operation] = entry["operations"].get(operation, 0) + 1
            entry["methods"][method] = entry["methods"].get(method, 0) + 1
            entry["classes"][price_class] += 1
            if status >= 300:
                entry["errors"][str(status)] = entry["errors"].get(str(status), 0) + 1
            entry["bytes_in"] += bytes_in
            return entry

    def add_bytes_out(self, entry: dict, count: int) -> None:
        with self._lock:
            entry["bytes_out"] += count

    def snapshot(self, reset: bool = False) -> dict:
        with self._lock:
            classes = {"put": 0, "get": 0, "free": 0}
            for entry in self.buckets.values():
                for name, count in entry["classes"].items():
                    classes[name] += count
            found = {"since": self.since, "until": datetime.now(timezone.utc).isoformat(timespec="milliseconds")
                     .replace("+00:00", "Z"), "total": self.total, "classes": classes,
                     "buckets": json.loads(json.dumps(self.buckets)), "tables": json.loads(json.dumps(self.tables))}
            if reset:
                self._reset()
            return found


# ---------------------------------------------------------------------------- the server (python -m ... serve)

# An Iceberg table's files: <table location>/data/... and <table location>/metadata/...
_TABLE_FILE = re.compile(r"(.+)/(?:data|metadata)(?:/|$)")  # the last such folder: a namespace may be named data


def table_location(key: str | None) -> str | None:
    """The table location (a key prefix) an object key, or a listing's prefix, lies under; None when the key
    is not in an Iceberg table's data or metadata folder."""
    found = _TABLE_FILE.match(key or "")
    return found.group(1) if found else None


def object_file(bucket_folder: Path, key: str) -> Path:
    return bucket_folder / (hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() + OBJECT_SUFFIX)


class DiskMirror:
    """The objects of moto's S3 backend, written through to `<data>/buckets/` and loaded back at start."""

    def __init__(self, folder: Path, backend: Any) -> None:
        self.root = folder / "buckets"
        self.backend = backend
        self.lock = threading.Lock()
        self.stamps: dict[str, dict[str, tuple]] = {}  # bucket -> key -> (etag, last modified) on disk

    @staticmethod
    def _stamp(fake_key: Any) -> tuple:
        return fake_key.etag, fake_key.last_modified.isoformat()

    def load(self) -> tuple[int, int]:
        """Create every bucket and object of the folder in the backend; (buckets, objects) loaded. Unreadable
        or truncated object files are skipped with a warning."""
        self.root.mkdir(parents=True, exist_ok=True)
        buckets = objects = 0
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            self.backend.create_bucket(folder.name, REGION)
            buckets += 1
            stamps = self.stamps.setdefault(folder.name, {})
            for path in folder.iterdir():
                if not path.name.endswith(OBJECT_SUFFIX):
                    path.unlink(missing_ok=True)  # a write the server did not finish
                    continue
                try:
                    with open(path, "rb") as handle:
                        header = json.loads(handle.readline())
                        value = handle.read()
                    if len(value) != header["size"]:
                        raise ValueError(f"{len(value)} bytes instead of {header['size']}")
                    fake_key = self.backend.put_object(folder.name, header["key"], value,
                                                       etag=header["etag"].strip('"'), disable_notification=True)
                except (OSError, ValueError, KeyError) as exc:
                    LOG.warning("object store: skipped %s (%s)", path, exc)
                    continue
                fake_key.last_modified = datetime.fromisoformat(header["last_modified"])
                fake_key.set_metadata(dict(header.get("metadata") or {}))
                stamps[header["key"]] = self._stamp(fake_key)
                objects += 1
        return buckets, objects

    def _write(self, bucket: str, key: str, fake_key: Any) -> None:
        folder = self.root / bucket
        folder.mkdir(exist_ok=True)
        for _ in range(3):
            try:
                value = fake_key.value
                break
            except ValueError:  # replaced (and its buffer closed) while we read it: take the newer one
                fake_key = self._current(bucket, key)
                if fake_key is None:
                    self._remove(bucket, key)
                    return
        else:
            raise OSError(f"object {key!r} of bucket {bucket!r} kept changing while it was written")
        header = {"key": key, "etag": fake_key.etag, "last_modified": fake_key.last_modified.isoformat(),
                  "size": len(value), "metadata": dict(fake_key.metadata)}
        path = object_file(folder, key)
        tmp = path.with_name(f"{path.stem}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            handle.write(value)
        os.replace(tmp, path)
        self.stamps.setdefault(bucket, {})[key] = self._stamp(fake_key)

    def _remove(self, bucket: str, key: str) -> None:
        object_file(self.root / bucket, key).unlink(missing_ok=True)
        self.stamps.get(bucket, {}).pop(key, None)

    def _current(self, bucket: str, key: str) -> Any:
        from moto.s3.models import FakeKey

        found = self.backend.buckets.get(bucket)
        fake_key = found.keys.get(key) if found is not None else None
        return fake_key if isinstance(fake_key, FakeKey) else None  # not a delete marker

    def sync_key(self, bucket: str, key: str) -> None:
        """Write (or remove) the file of `key` as the backend now has it."""
        with self.lock:
            if bucket not in self.backend.buckets:
                return self._sync_bucket(bucket)
            fake_key = self._current(bucket, key)
            if fake_key is None:
                self._remove(bucket, key)
            elif self.stamps.get(bucket, {}).get(key) != self._stamp(fake_key):
                self._write(bucket, key, fake_key)

    def sync_bucket(self, bucket: str | None) -> None:
        """Bring the bucket's folder (every bucket's when None) in line with the backend."""
        with self.lock:
            names = [bucket] if bucket else sorted(set(self.backend.buckets) | set(self.stamps)
                                                   | {p.name for p in self.root.iterdir() if p.is_dir()})
            for name in names:
                self._sync_bucket(name)

    def _sync_bucket(self, bucket: str) -> None:
        from moto.s3.models import FakeKey

        folder = self.root / bucket
        found = self.backend.buckets.get(bucket)
        if found is None:
            if folder.is_dir():
                for path in folder.iterdir():
                    path.unlink()
                folder.rmdir()
            self.stamps.pop(bucket, None)
            return
        folder.mkdir(exist_ok=True)
        stamps = self.stamps.setdefault(bucket, {})
        current = {key: value for key, value in found.keys.items() if isinstance(value, FakeKey)}
        for key in [k for k in stamps if k not in current]:
            self._remove(bucket, key)
        for key, fake_key in current.items():
            if stamps.get(key) != self._stamp(fake_key):
                self._write(bucket, key, fake_key)

    def count(self) -> tuple[int, int]:
        with self.lock:
            return len(self.stamps), sum(len(keys) for keys in self.stamps.values())


def _xml_error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f'</Error>').encode()


class CountingMiddleware:
    """WSGI middleware before moto's S3 application: counts every S3 request, writes changed objects through
    to disk before the answer leaves, and serves /_lakehouse/health and /_lakehouse/requests."""

    def __init__(self, app: Callable, mirror: DiskMirror | None, info: dict) -> None:
        self.app = app
        self.mirror = mirror
        self.info = info
        self.counts = RequestCounts()

    def _json(self, start_response: Callable, status: str, document: dict) -> list[bytes]:
        body = json.dumps(document, indent=1, sort_keys=True).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def _control(self, environ: dict, start_response: Callable) -> list[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == f"{CONTROL_PREFIX}health" and method == "GET":
            buckets, objects = self.mirror.count() if self.mirror else (0, 0)
            return self._json(start_response, "200 OK", {**self.info, "ok": True, "buckets": buckets,
                                                          "objects": objects, "requests": self.counts.total})
        if path == f"{CONTROL_PREFIX}requests" and method in ("GET", "DELETE"):
            return self._json(start_response, "200 OK", self.counts.snapshot(reset=method == "DELETE"))
        return self._json(start_response, "404 Not Found", {"error": f"no {method} {path} here"})

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith(CONTROL_PREFIX):
            return self._control(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        bucket, key = _bucket_and_key(environ)
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items()
                   if name.startswith("HTTP_")}
        operation, price_class = classify(method, bucket, key, query, headers)
        answered: dict = {}

        def remember(status: str, response_headers: list, exc_info: Any = None) -> Callable:
            answered["status"], answered["headers"], answered["exc_info"] = status, response_headers, exc_info
            return lambda data: None  # moto never uses write()

        result = self.app(environ, remember)
        status = int(answered["status"].split(" ", 1)[0])
        changes = _changes(operation) if status < 300 else None
        if changes and self.mirror is not None and bucket:
            try:
                if changes == "key" and key:
                    self.mirror.sync_key(bucket, key)
                else:
                    self.mirror.sync_bucket(bucket)
            except OSError as exc:  # the data would not survive a restart: the client must retry
                LOG.error("object store: could not write %s %s/%s to disk: %s", operation, bucket, key, exc)
                if hasattr(result, "close"):
                    result.close()
                body = _xml_error("InternalError", f"the object store could not keep the change on disk: {exc}")
                answered["status"], answered["headers"] = "500 Internal Server Error", [
                    ("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
                status, result = 500, [body]
        entry = self.counts.add(bucket, operation, price_class, method, status,
                                int(environ.get("CONTENT_LENGTH") or 0),
                                table_location(key if key else (query.get("prefix") or [None])[0]))
        if TRACE:
            LOG.info("object store: %s %s %s/%s%s -> %d", operation, method, bucket, key or "",
                     f"?{environ['QUERY_STRING']}" if environ.get("QUERY_STRING") else "", status)
        start_response(answered["status"], answered["headers"], answered.get("exc_info"))
        return self._counted(result, entry)

    def _counted(self, result: Iterable[bytes], entry: dict) -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in result:
                sent += len(chunk)
                yield chunk
        finally:
            self.counts.add_bytes_out(entry, sent)
            if hasattr(result, "close"):
                result.close()


def _install_credentials(credentials: Credentials) -> None:
    """An IAM user `lakehouse` allowed s3:* with exactly `credentials`, and moto's IAM enforcement on."""
    from moto import settings as moto_settings
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    iam.create_user(REGION, USER)
    iam.put_user_policy(USER, "s3-everything", json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    generated = iam.create_access_key(USER)
    iam.access_keys.pop(generated.physical_resource_id, None)
    generated.access_key_id = credentials.access_key_id
    generated.secret_access_key = credentials.secret_access_key
    iam.access_keys[generated.physical_resource_id] = generated
    moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # every request from now on is authenticated


def ensure_buckets(mirror: DiskMirror, names: Iterable[str]) -> list[str]:
    """Create each bucket of `names` the backend does not have (kept on disk at once); the ones created."""
    created = []
    for name in names:
        if name not in mirror.backend.buckets:
            mirror.backend.create_bucket(name, REGION)
            mirror.sync_bucket(name)
            created.append(name)
    return created


def serve(port: int, data: Path, host: str = DEFAULT_HOST, buckets: Iterable[str] = ()) -> None:
    """Run the server until SIGTERM or SIGINT: load `data`, create the `buckets` it lacks, then answer on
    host:port with the credentials of the environment (install_credentials) or of `data`."""
    started = time.monotonic()
    for name in buckets:
        if not BUCKET_NAME.match(name):
            raise ObjectStoreError(f"{name!r} is not an S3 bucket name (3 to 63 lower-case letters, digits, '-' "
                                   f"and '.')")
    credentials_from_environment()  # refuse a half-given pair before taking the folder
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("werkzeug", "moto", "botocore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    data = data.resolve()
    _private_folder(data)
    lock = open(data / "server.lock", "a+")  # noqa: SIM115 - held (and so locked) until the process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        raise ObjectStoreError(f"another object store (pid {lock.read().strip() or '?'}) serves {data}") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    credentials = install_credentials(data)

    import moto
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from moto.s3.models import s3_backends
    from werkzeug.serving import make_server

    mirror = DiskMirror(data, s3_backends[DEFAULT_ACCOUNT_ID]["aws"])
    loaded, objects = mirror.load()
    created = ensure_buckets(mirror, buckets)
    _install_credentials(credentials)
    info = {"server": "moto", "version": moto.__version__, "pid": os.getpid(), "data": str(data),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    app = CountingMiddleware(create_backend_app("s3"), mirror, info)
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info("object store: moto %s S3 on http://%s:%d, %d buckets and %d objects loaded from %s, buckets "
             "created: %s, access key %s, ready in %.1fs", moto.__version__, host, port, loaded, objects, data,
             ", ".join(created) or "none", credentials.access_key_id, time.monotonic() - started)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        mirror.sync_bucket(None)  # waits for a write in progress; writes anything a request left behind
        LOG.info("object store: stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description="The development stack's S3 server")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve S3 until SIGTERM")
    run.add_argument("--host", default=DEFAULT_HOST, help=f"interface to listen on (default {DEFAULT_HOST})")
    run.add_argument("--port", type=int, default=DEFAULT_PORT)
    run.add_argument("--data", type=Path, required=True, help="folder of the credentials and the buckets")
    run.add_argument("--bucket", action="append", default=[], metavar="NAME",
                     help="a bucket to create at start unless it exists (repeatable)")
    args = parser.parse_args(argv)
    try:
        serve(args.port, args.data, args.host, args.bucket)
    except (OSError, ObjectStoreError) as exc:  # the folder is not ours, another server has it
        print(f"object store: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
