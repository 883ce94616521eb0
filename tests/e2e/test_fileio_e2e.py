"""lakehouse.core.fileio: pyiceberg's FileIO writing each small file of an S3 warehouse in one request.

The adapter reaches into pyiceberg's and pyarrow's internals; the first test pins the versions it was
written against, so an upgrade is a decision to look at it again. The others run against the session's
S3 server (the `services` stack: moto's S3 behind the stack's request counter) and count what reaches it.

The end-to-end half; the unit half is tests/unit/core/test_fileio.py.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
from pyiceberg.io import load_file_io

from lakehouse.core import fileio
from lakehouse.core.catalog import open_catalog
from lakehouse_dev import object_store


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
