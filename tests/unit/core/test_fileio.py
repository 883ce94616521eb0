"""lakehouse.core.fileio: pyiceberg's FileIO writing each small file of an S3 warehouse in one request.

The adapter reaches into pyiceberg's and pyarrow's internals; the first test pins the versions it was
written against, so an upgrade is a decision to look at it again. The others run against the session's
S3 server (the `services` stack: moto's S3 behind the stack's request counter) and count what reaches it.

The unit half; the end-to-end half is tests/e2e/test_fileio_e2e.py.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakehouse.core import fileio


def test_the_adapter_is_checked_against_the_versions_it_was_written_for():
    found = {name: version(name) for name in fileio.WRITTEN_AGAINST}
    assert found == fileio.WRITTEN_AGAINST, (
        "pyiceberg or pyarrow changed: check that PyArrowFileIO still builds its S3 filesystem in "
        "_initialize_s3_fs and that S3FileSystem.__reduce__ still gives (reconstructor, (options,)), then "
        "update WRITTEN_AGAINST")


@pytest.mark.parametrize("location, kept", [
    ("s3://b/w/db/t/metadata/00003-5f1c0a3e-1b7e-4a4e-9d9b-0a0b0c0d0e0f.metadata.json", True),
    ("s3://b/w/db/t/metadata/00003-5f1c0a3e-1b7e-4a4e-9d9b-0a0b0c0d0e0f.metadata.json.gz", True),
    ("s3://b/w/db/t/metadata/snap-6260029531975800465-0-b0b9425f.avro", True),
    ("s3://b/w/db/t/metadata/b0b9425f-3a96-4f52-88f9-43aa83f1262e-m0.avro", True),
    ("s3://b/w/db/t/metadata/version-hint.text", False),  # the Hadoop catalog's pointer, rewritten in place
    ("s3://b/w/db/t/data/ts_day=2026-11-27/00000-0-b0b9425f.parquet", False),
    ("s3://b/w/db/t/data/metadata/x.parquet", False),
    ("s3://b/w/db/t/metadata/stats/x.puffin", False),
])
def test_only_iceberg_metadata_files_are_taken_as_immutable(location, kept):
    assert fileio.immutable(location) is kept


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 300)), min_size=1, max_size=60))
def test_the_metadata_cache_stays_within_its_bound_and_keeps_the_latest(puts):
    cache = fileio.MetadataCache(limit=1_000, file_limit=250)
    for name, size in puts:
        cache.put(("e", f"f{name}"), bytes([name]) * size)
        assert cache.size <= 1_000
    held = [cache.get(("e", f"f{name}")) for name in {name for name, _ in puts}]
    assert sum(len(data) for data in held if data is not None) == cache.size  # what it counts is what it holds
    name, size = puts[-1]
    if size <= 250:  # larger files are never kept
        assert cache.get(("e", f"f{name}")) == bytes([name]) * size


