"""pyiceberg's pyarrow FileIO, with every small file written to S3 in one request.

pyarrow's S3 output stream starts a multipart upload when a file is opened: CreateMultipartUpload,
UploadPart, CompleteMultipartUpload, three requests for a 2 KB manifest. With `allow_delayed_open` it
waits for the first part to fill and writes a file smaller than a part with one PutObject. A commit
writes several small files per table (manifests, the manifest list, metadata.json, a batch's data files),
so on an object store the batch's fixed cost is mostly these requests: the bench measured 11 files, 33
requests, per 10-record batch of the S3 warehouse; with this FileIO they are 11.

pyiceberg (0.12) offers no property for the option, so this is the one adapter to its internals and
pyarrow's: `_initialize_s3_fs` (pyiceberg builds the filesystem there) and the pickling form of
pyarrow's S3FileSystem (`__reduce__`: its reconstructor and every option it was built with), rebuilt with
the one option changed. tests/test_fileio.py pins the versions it was written against.

The catalog configuration names it (`py-io-impl`) for every S3 warehouse of the platform
(lakehouse.core.config.ObjectStoreConfig.pyiceberg_properties); a user's own `py-io-impl` wins.
"""

from __future__ import annotations

from pyarrow.fs import FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

WRITTEN_AGAINST = {"pyiceberg": "0.12.0", "pyarrow": "26.0.1"}


class DelayedOpenFileIO(PyArrowFileIO):
    """PyArrowFileIO whose S3 filesystems open files lazily (small files: one PutObject each)."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        built = super()._initialize_s3_fs(netloc)
        reconstruct, (options,) = built.__reduce__()
        return reconstruct({**options, "allow_delayed_open": True})
