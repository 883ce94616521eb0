"""pyiceberg's pyarrow FileIO, with the requests of a commit on an S3 warehouse cut to what it must send.

The bench counted 72.6 requests per 10-record batch on the S3 warehouse, for three tables committed per
batch (the target, its dead-letter table and the events table). pyiceberg's PyArrowFileIO sends, besides
the PutObject of each file it writes:
- a multipart upload for every file (CreateMultipartUpload, UploadPart, CompleteMultipartUpload: three
  requests for a 2 KB manifest). With pyarrow's `allow_delayed_open` a file smaller than a part is one
  PutObject;
- a HeadObject after each write, for the size of what it has just written (`len()` of a data file for its
  DataFile, of a manifest for the manifest list). The stream counts the bytes instead;
- a HeadObject before each read, for the size, and the GetObject, for metadata files it has already read
  or written in this process: the metadata.json a batch loads to plan, the one the commit loads to check
  its base, the previous manifest list a fast append carries forward. Iceberg never rewrites a metadata
  file in place (each name holds a UUID or a snapshot id), so the bytes of one are the same wherever they
  came from: the files under `metadata/` (metadata.json, manifest lists, manifests) are kept in a small
  per-process cache, filled by the writes and the reads, bounded in bytes;
- a HeadObject and, on its "not found", a ListObjectsV2 (pyarrow's check for a directory of that name)
  before creating a metadata.json with `overwrite=False`. The check is one HeadObject here.
With all of it a 10-record batch makes about 15 requests (`make bench`, section s3).

pyiceberg (0.12) offers no property for any of this, so this is the one adapter to its internals and
pyarrow's: `_initialize_s3_fs` (pyiceberg builds the filesystem there), the pickling form of pyarrow's
S3FileSystem (`__reduce__`: its reconstructor and every option it was built with), and PyArrowFile's
constructor and fields. tests/unit/core/test_fileio.py pins the versions it was written against.

The catalog configuration names it (`py-io-impl`) for every S3 warehouse of the platform
(lakehouse.core.config.ObjectStoreConfig.pyiceberg_properties); a user's own `py-io-impl` wins.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa
from pyarrow.fs import FileSystem
from pyiceberg.io import S3_ENDPOINT
from pyiceberg.io.pyarrow import BUFFER_SIZE, ONE_MEGABYTE, PyArrowFile, PyArrowFileIO

WRITTEN_AGAINST = {"pyiceberg": "0.12.0", "pyarrow": "26.0.1"}

# Iceberg's metadata files, each written once under a name of its own: v<N>/<N>-<uuid>.metadata.json
# (optionally compressed), the manifest list snap-<id>-<attempt>-<uuid>.avro, manifests <uuid>-m<N>.avro.
# version-hint.text (the Hadoop catalog's pointer) is rewritten in place and is not among them.
_IMMUTABLE = re.compile(r"/metadata/[^/]+(\.metadata\.json(\.gz)?|\.avro)$")
CACHE_BYTES = 64 * 1024 * 1024  # the whole cache, per process
CACHE_FILE_BYTES = 4 * 1024 * 1024  # larger files are read and written as they are, never kept


def immutable(location: str) -> bool:
    """Whether `location` names an Iceberg metadata file, written once and never changed."""
    return _IMMUTABLE.search(location) is not None


class MetadataCache:
    """The bytes of immutable metadata files by (endpoint, location), least recently used out first."""

    def __init__(self, limit: int = CACHE_BYTES, file_limit: int = CACHE_FILE_BYTES) -> None:
        self.limit, self.file_limit = limit, file_limit
        self._files: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """Bytes held."""
        return self._size

    def get(self, key: tuple[str, str]) -> bytes | None:
        with self._lock:
            found = self._files.get(key)
            if found is not None:
                self._files.move_to_end(key)
            return found

    def put(self, key: tuple[str, str], data: bytes) -> None:
        if len(data) > self.file_limit:
            return
        with self._lock:
            old = self._files.pop(key, None)
            self._size += len(data) - (len(old) if old is not None else 0)
            self._files[key] = data
            while self._size > self.limit:
                _, dropped = self._files.popitem(last=False)
                self._size -= len(dropped)

    def discard(self, key: tuple[str, str]) -> None:
        with self._lock:
            old = self._files.pop(key, None)
            if old is not None:
                self._size -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._size = 0


CACHE = MetadataCache()


class _Written:
    """An output stream that knows how many bytes it wrote when closed, and keeps them when they are an
    immutable metadata file's. Used with `with` it hands over pyarrow's own stream for a data file (the
    Parquet writer writes to it natively) and itself for a metadata file (its bytes are kept)."""

    def __init__(self, stream: Any, file: CachingFile) -> None:
        self._stream, self._file = stream, file
        self._kept: list[bytes] | None = [] if file.cache_key is not None else None
        self._closed = False

    def write(self, data: Any) -> int:
        if self._kept is not None:
            self._kept.append(bytes(data))
        written: int = self._stream.write(data)
        return written

    def close(self) -> None:
        if self._closed:
            return
        written = self._stream.tell()
        self._stream.close()  # the PutObject: nothing is remembered unless it landed
        self._closed = True
        self._file.written = written
        if self._kept is not None and self._file.cache_key is not None:
            CACHE.put(self._file.cache_key, b"".join(self._kept))

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Any:
        return self if self._kept is not None else self._stream

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:  # a failed write: closed as pyarrow's own stream would be, and nothing remembered
            self._closed = True
            self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class CachingFile(PyArrowFile):
    """PyArrowFile answering its size and existence without a request when it can, and serving immutable
    metadata files from the process's cache."""

    def __init__(self, location: str, path: str, fs: FileSystem, buffer_size: int, endpoint: str) -> None:
        super().__init__(location=location, path=path, fs=fs, buffer_size=buffer_size)
        self.cache_key = (endpoint, location) if immutable(location) else None
        self.written: int | None = None

    def __len__(self) -> int:
        if self.written is not None:
            return self.written
        cached = CACHE.get(self.cache_key) if self.cache_key else None
        return len(cached) if cached is not None else super().__len__()

    def exists(self) -> bool:
        """One HeadObject (pyarrow's get_file_info follows a "not found" with a listing, for directories)."""
        if self.written is not None or (self.cache_key and CACHE.get(self.cache_key) is not None):
            return True
        try:
            self._filesystem.open_input_file(self._path).close()
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == 2 or "Path does not exist" in str(exc):
                return False
            raise
        return True

    def open(self, seekable: bool = True) -> Any:
        if self.cache_key is None:
            return super().open(seekable)
        cached = CACHE.get(self.cache_key)
        if cached is None:
            # the HeadObject gives the size before the GetObject; PyArrowFile.open is typed as pyiceberg's
            # InputStream protocol, and returns a pyarrow NativeFile, which has the size
            stream: pa.NativeFile = super().open(seekable=True)
            if stream.size() > CACHE.file_limit:
                return stream
            with stream:
                cached = stream.read()
            CACHE.put(self.cache_key, cached)
        return pa.BufferReader(cached)

    def create(self, overwrite: bool = False) -> Any:
        return _Written(super().create(overwrite), self)


class DelayedOpenFileIO(PyArrowFileIO):
    """PyArrowFileIO for object stores: small files in one PutObject each, sizes and existence known
    without a request where the file was just written, immutable metadata files read once per process."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        built = super()._initialize_s3_fs(netloc)
        reconstruct, (options,) = built.__reduce__()
        return reconstruct({**options, "allow_delayed_open": True})

    def _file(self, location: str) -> CachingFile:
        scheme, netloc, path = self.parse_location(location, self.properties)
        return CachingFile(location, path, self.fs_by_scheme(scheme, netloc),
                           int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)),
                           str(self.properties.get(S3_ENDPOINT, "")))

    def new_input(self, location: str) -> CachingFile:
        return self._file(location)

    def new_output(self, location: str) -> CachingFile:
        return self._file(location)

    def delete(self, location: Any) -> None:
        super().delete(location)
        where = location if isinstance(location, str) else location.location
        CACHE.discard((str(self.properties.get(S3_ENDPOINT, "")), where))
