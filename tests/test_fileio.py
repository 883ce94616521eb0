"""lakehouse.core.fileio: pyiceberg's FileIO writing each small file of an S3 warehouse in one request.

The adapter reaches into pyiceberg's and pyarrow's internals; the first test pins the versions it was
written against, so an upgrade is a decision to look at it again. The others run against the session's
S3 server (the `services` stack: moto's S3 behind the stack's request counter) and count what reaches it.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
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
