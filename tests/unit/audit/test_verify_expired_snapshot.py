"""An incremental verify reads the files each snapshot it covers added. A snapshot that is no longer in
the table's metadata (expired by maintenance between the run's planning and its reading) is a
VerifyError that names it and says to run again, not an AttributeError on None (found by the type
check: the snapshot looked up by id was used unchecked). Unit layer: a SQLite catalog, no Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.audit import windows
from lakehouse.core.errors import VerifyError


@pytest.fixture
def table(tmp_path):
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("raw")
    created = catalog.create_table("raw.orders", schema=pa.schema([("id", pa.int64())]))
    created.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    return catalog.load_table("raw.orders")


def test_a_snapshot_gone_from_the_metadata_is_a_verify_error_saying_to_run_again(table):
    gone = max(s.snapshot_id for s in table.snapshots()) + 1
    with pytest.raises(VerifyError, match=rf"snapshot {gone} is not in the table's metadata any more.*run it again"):
        windows.changed_files(table, {gone})


def test_the_files_a_present_snapshot_added_are_found(table):
    head = table.current_snapshot()
    changed, deletes = windows.changed_files(table, {head.snapshot_id})
    assert (len(changed), deletes) == (1, False)
    assert changed[0].record_count == 2
