"""lakehouse.core.fileio: pyiceberg's FileIO writing each small file of an S3 warehouse in one request.

The adapter reaches into pyiceberg's and pyarrow's internals; the first test pins the versions it was
written against, so an upgrade is a decision to look at it again. The others run against the session's
S3 server (the `services` stack: moto's S3 behind the stack's request counter) and count what reaches it.
"""

from __future__ import annotations

import itertools
import uuid
from importlib.metadata import version

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.io import load_file_io

from lakehouse.core import fileio
from lakehouse.core.catalog import open_catalog
from lakehouse_dev import object_store


def test_the_adapter_is_checked_against_the_versions_it_was_written_for():
    found = {name: version(name) for name in fileio.WRITTEN_AGAINST}
    assert found == fileio.WRITTEN_AGAINST, (
        "pyiceberg or pyarrow changed: check that PyArrowFileIO still builds its S3 filesystem in "
        "_initialize_s3_fs and that S3FileSystem.__reduce__ still gives (reconstructor, (options,)), then "
        "update WRITTEN_AGAINST")


def operations(endpoint: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for bucket in object_store.request_counts(endpoint)["buckets"].values():
        for name, count in bucket["operations"].items():
            found[name] = found.get(name, 0) + count
    return found


@pytest.mark.slow
def test_a_small_file_is_one_put_and_a_large_one_still_lands_whole(on_services):
    catalog = open_catalog(on_services, "lake")
    warehouse = on_services.catalog("lake").warehouse.rstrip("/")
    assert catalog.properties["py-io-impl"] == "lakehouse.core.fileio.DelayedOpenFileIO"
    io = load_file_io(catalog.properties, warehouse)
    assert isinstance(io, fileio.DelayedOpenFileIO)
    endpoint = on_services.object_store.endpoint
    small, large = b'{"format-version": 2}' * 50, bytes(range(256)) * (24 * 4096 + 7)  # 1 KB; 24 MB, two+ parts
    object_store.request_counts(endpoint, reset=True)
    for i in range(3):
        with io.new_output(f"{warehouse}/fileio-test/small-{i}.json").create(overwrite=True) as out:
            out.write(small)
    assert operations(endpoint) == {"PutObject": 3}  # no CreateMultipartUpload, UploadPart, Complete...
    with io.new_output(f"{warehouse}/fileio-test/large.bin").create(overwrite=True) as out:
        out.write(large)
    for i in range(3):
        assert io.new_input(f"{warehouse}/fileio-test/small-{i}.json").open().read() == small
    assert io.new_input(f"{warehouse}/fileio-test/large.bin").open().read() == large


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


def _jdbc_on_s3(on_services, tmp_path, name: str):
    """A JDBC (SQLite) catalog over the services' S3 warehouse: the committing client writes every file,
    metadata.json included, so what reaches the object store is this FileIO's alone."""
    from pyiceberg.catalog.sql import SqlCatalog

    lake = on_services.catalog("lake")
    props = {key: value for key, value in lake.pyiceberg_properties().items() if key.startswith(("s3.", "py-io"))}
    return SqlCatalog(name, uri=f"sqlite:///{tmp_path}/{name}.db",
                      warehouse=f"{lake.warehouse.rstrip('/')}/fileio-{tmp_path.name}", **props)


@pytest.mark.slow
def test_an_append_reads_no_metadata_file_twice_and_lists_nothing(on_services, tmp_path):
    import pyarrow as pa

    catalog = _jdbc_on_s3(on_services, tmp_path, "appends")
    catalog.create_namespace("db")
    rows = pa.table({"id": pa.array(range(10), pa.int64()), "name": pa.array([f"n{i}" for i in range(10)])})
    table = catalog.create_table("db.t", schema=rows.schema)
    endpoint = on_services.object_store.endpoint
    per_append = []
    for _ in range(3):
        object_store.request_counts(endpoint, reset=True)
        table = catalog.load_table("db.t")  # as each batch plans: the pointer from the catalog, then the file
        table.append(rows)
        per_append.append(operations(endpoint))
    # the data file, the manifest, the manifest list and metadata.json: one PutObject each; one HeadObject,
    # the check that no metadata.json of that name exists; nothing read back of what this process wrote
    assert per_append[-1] == {"PutObject": 4, "HeadObject": 1}, per_append

    # a task's data files: one PutObject each, their size and bounds known without reading them back
    from lakehouse.ingest.taskwriter import write_data_files

    object_store.request_counts(endpoint, reset=True)
    [written] = write_data_files(table.io, table.metadata, rows, uuid.uuid4(), itertools.count())
    assert operations(endpoint) == {"PutObject": 1} and written.record_count == 10

    fileio.CACHE.clear()  # another process: every file read from the object store, the same rows
    fresh = _jdbc_on_s3(on_services, tmp_path, "appends").load_table("db.t")
    assert sorted(fresh.scan().to_arrow()["id"].to_pylist()) == sorted(list(range(10)) * 3)
    assert len(fresh.snapshots()) == 3
