"""Orphan removal deletes only what the table owns: the proof it runs first (lakehouse.upkeep.ownership's
`ownership_refusal`, over what the catalogs say, listed by `take_inventory`).

Unit layer: the proof is a pure function of the table's location and properties, the locations its catalog
assigns and the other tables' places, so every spelling of an overlap can be tried here; the end-to-end
tests (test_maintenance.py) show the same refusals keep another table's files on disk.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core import config
from lakehouse.core.catalog import open_catalog
from lakehouse.upkeep.ownership import Inventory, TableFiles, ownership_refusal, take_inventory
from lakehouse.upkeep.storage_paths import assigned_locations, canonical_path

LAKE = ("jdbc", "sqlite:////srv/catalog.db", "lake")  # catalog_server of catalog `lake`
TWIN = ("jdbc", "sqlite:////srv/catalog.db", "twin")  # another name in the same database: another catalog
REST = ("rest", "https://catalog.example/api", "")
WAREHOUSE = "s3://bucket/warehouse/lake"
HOME = f"{WAREHOUSE}/raw/orders"


def orders(location: str = HOME, **properties: str) -> TableFiles:
    return TableFiles(catalog="lake", server=LAKE, identifier="raw.orders", uuid="u-orders", location=location,
                      properties=properties)


def other(location: str, identifier: str = "raw.other", server: tuple = LAKE, catalog: str = "lake",
          uuid: str = "u-other", **properties: str) -> TableFiles:
    return TableFiles(catalog=catalog, server=server, identifier=identifier, uuid=uuid, location=location,
                      properties=properties, files=(("metadata file", f"{location}/metadata/v1.metadata.json"),))


def refusal(subject: TableFiles, *others: TableFiles, assigned: tuple[str, ...] = (HOME,),
            problems: tuple[str, ...] = ()) -> str | None:
    return ownership_refusal(subject, list(assigned), Inventory(tables=list(others), problems=list(problems)))


def test_a_table_alone_in_its_assigned_folder_owns_it():
    neighbours = [other(f"{WAREHOUSE}/raw/orders_dlq", "raw.orders_dlq"),  # shares a text prefix, not a folder
                  other(f"{WAREHOUSE}/raw/orders2", "raw.orders2"),
                  other(f"{WAREHOUSE}/ops/pipeline_events", "ops.pipeline_events"),
                  other(f"{WAREHOUSE}/raw/ordersx", "raw.ordersx", **{"write.data.path": f"{WAREHOUSE}/raw/ordersx/d"}),
                  orders()]  # itself, as the inventory lists it
    assert refusal(orders(**{"write.data.path": f"{HOME}/data", "gc.enabled": "true"}), *neighbours) is None


def test_the_same_table_under_a_second_name_of_one_rest_server_is_not_another_table():
    subject = TableFiles("lake", REST, "raw.orders", "u-orders", HOME)
    alias = TableFiles("alias", REST, "raw.orders", "u-orders", "s3a://bucket/warehouse/lake/raw/orders/")
    assert refusal(subject, alias) is None


def test_a_table_of_the_same_name_in_another_catalog_sharing_the_warehouse_is_refused():
    twin = other(HOME, identifier="raw.orders", server=TWIN, catalog="twin", uuid="u-twin")
    reason = refusal(orders(), twin)
    assert reason is not None and "twin.raw.orders's location" in reason and "Give each table a folder" in reason
    # a REST alias holding another table (another UUID) under the same name is refused too
    impostor = TableFiles("alias", REST, "raw.orders", "u-impostor", HOME)
    assert "alias.raw.orders" in refusal(TableFiles("lake", REST, "raw.orders", "u-orders", HOME), impostor)


SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)


@st.composite
def spelled_inside(draw, folder: list[str]) -> str:
    """A URI of a place inside s3://bucket/<folder> (or the folder itself), spelled as some client might."""
    extra = draw(st.lists(SEGMENT, max_size=3))
    segments = [*folder, *extra]
    detours = draw(st.lists(st.integers(0, len(segments)), max_size=2))
    for at in sorted(detours, reverse=True):  # a/../ and ./ that a filesystem resolves away
        segments[at:at] = draw(st.sampled_from([["x", ".."], ["."], ["sub", "..", "."]]))
    if draw(st.booleans()):  # a percent-escaped letter some client decodes
        i = draw(st.integers(0, len(segments) - 1))
        if segments[i] not in (".", ".."):
            segments[i] = f"%{ord(segments[i][0]):02X}{segments[i][1:]}"
    joiner = draw(st.sampled_from(["/", "//"]))
    scheme = draw(st.sampled_from(["s3", "s3a", "s3n", "S3A"]))
    bucket = draw(st.sampled_from(["bucket", "BUCKET"]))
    tail = draw(st.sampled_from(["", "/", "?versionId=1", "#frag", "/?x"]))
    return f"{scheme}://{bucket}/" + joiner.join(segments) + tail


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_no_spelling_of_a_place_inside_the_folder_hides_another_table_there(data):
    where = data.draw(spelled_inside(["warehouse", "lake", "raw", "orders"]))
    key = data.draw(st.sampled_from(["location", "write.data.path", "write.metadata.path",
                                     "write.object-storage.path", "write.folder-storage.path"]))
    if key == "location":
        intruder = other(where, "raw.intruder")
    else:
        intruder = other(f"{WAREHOUSE}/raw/intruder", "raw.intruder", **{key: where})
    reason = refusal(orders(), intruder)
    assert reason is not None and "lake.raw.intruder" in reason, where


@settings(max_examples=200, deadline=None)
@given(folder=st.lists(SEGMENT, min_size=1, max_size=4), suffix=SEGMENT, extra=st.lists(SEGMENT, max_size=3),
       scheme=st.sampled_from(["s3", "s3a"]))
def test_a_folder_that_only_shares_a_text_prefix_is_not_inside(folder, suffix, extra, scheme):
    home = "s3://bucket/" + "/".join(folder)
    sibling = f"{scheme}://bucket/" + "/".join([*folder[:-1], folder[-1] + suffix, *extra])
    assert refusal(orders(home), other(sibling), assigned=(home,)) is None


@settings(max_examples=200, deadline=None)
@given(folder=st.lists(SEGMENT, min_size=2, max_size=4), depth=st.integers(1, 2), scheme=st.sampled_from(["s3", "s3a"]))
def test_a_table_inside_another_tables_folder_is_refused(folder, depth, scheme):
    home = "s3://bucket/" + "/".join(folder)
    outer = f"{scheme}://bucket/" + "/".join(folder[:-depth])
    reason = refusal(orders(home), other(outer, "raw.outer"), assigned=(home,))
    assert reason is not None and "it lies inside lake.raw.outer's location" in reason


def test_another_tables_metadata_or_manifest_list_inside_the_folder_is_refused():
    registered = TableFiles("lake", LAKE, "raw.copy", "u-copy", f"{WAREHOUSE}/raw/copy",
                            files=(("metadata file", f"{HOME}/metadata/00003-x.metadata.json"),))
    assert "lake.raw.copy's metadata file" in refusal(orders(), registered)
    moved = TableFiles("lake", LAKE, "raw.moved", "u-moved", f"{WAREHOUSE}/raw/moved",
                       files=(("manifest list of snapshot 7", "s3a://bucket/warehouse/lake/raw/orders/metadata/snap-7.avro"),))
    assert "lake.raw.moved's manifest list of snapshot 7" in refusal(orders(), moved)


@pytest.mark.parametrize("key", ["write.data.path", "write.metadata.path", "write.object-storage.path",
                                 "write.folder-storage.path"])
@pytest.mark.parametrize("value", [f"{WAREHOUSE}/raw/other/data", f"{WAREHOUSE}/raw/orders_dlq/data",
                                   f"{HOME}/../other/data", f"{HOME}/%2E%2E/other", f"{HOME}/data?x", "data",
                                   f"{WAREHOUSE}/raw", "s3://another-bucket/warehouse/lake/raw/orders/data"])
def test_a_path_property_that_is_not_plainly_inside_the_location_is_refused(key, value):
    reason = refusal(orders(**{key: value}))
    assert reason is not None and f"sets {key}={value}" in reason and "UNSET TBLPROPERTIES" in reason


@pytest.mark.parametrize("properties, says", [
    ({"gc.enabled": "false"}, "gc.enabled=false"),
    ({"gc.enabled": " FALSE "}, "gc.enabled=false"),
    ({"write.location-provider.impl": "com.example.Anywhere"}, "location provider of its own"),
    ({"write.py-location-provider.impl": "evil.Provider"}, "location provider of its own"),
])
def test_a_table_whose_files_may_lie_anywhere_or_be_shared_is_refused(properties, says):
    assert says in refusal(orders(**properties))


def test_another_table_that_places_files_anywhere_or_cannot_be_read_is_refused():
    anywhere = other(f"{WAREHOUSE}/raw/anywhere", "raw.anywhere", **{"write.location-provider.impl": "x.Y"})
    assert "lake.raw.anywhere places its files with a location provider" in refusal(orders(), anywhere)
    broken = TableFiles("lake", LAKE, "raw.broken", unreadable="JSONDecodeError: Expecting value")
    reason = refusal(orders(), broken)
    assert "lake.raw.broken could not be read (JSONDecodeError" in reason and "repair or drop it" in reason


def test_a_catalog_that_could_not_be_listed_leaves_nothing_proven():
    reason = refusal(orders(), problems=("catalog 'prod' could not be listed (ConnectionError: refused)",))
    assert reason.startswith("it cannot be proven") and "catalog 'prod' could not be listed" in reason


@pytest.mark.parametrize("location", [
    f"{WAREHOUSE}/raw/../raw/orders", f"{WAREHOUSE}/raw/./orders", f"{HOME}?v=1", f"{HOME}#x",
    f"{WAREHOUSE}/raw/%6Frders", f"{WAREHOUSE}/raw\\orders", "warehouse/lake/raw/orders", "s3://bucket/warehouse//lake/raw/orders",
    f"{HOME}\n", f"{HOME}\x00", "",
])
def test_a_location_clients_may_read_differently_is_refused(location):
    reason = refusal(orders(location))
    assert reason is not None and "not a plain absolute URI" in reason


@pytest.mark.parametrize("location", [f"{WAREHOUSE}/raw/orders_v2", f"{WAREHOUSE}/raw", f"{WAREHOUSE}/serve/orders",
                                      "s3://elsewhere/warehouse/lake/raw/orders", "file:/warehouse/lake/raw/orders"])
def test_a_location_the_catalog_did_not_assign_is_refused(location):
    reason = refusal(orders(location))
    assert reason is not None and f"is not where catalog 'lake' puts the table (it assigns {HOME})" in reason


def test_without_a_warehouse_or_namespace_location_nothing_is_assigned():
    assert assigned_locations("rest", None, ("raw",), "orders", None) == []
    assert "it assigns none" in refusal(orders(), assigned=())


def test_spark_and_pyiceberg_spellings_of_one_folder_are_one_place():
    # Spark's JdbcCatalog writes file:/..., pyiceberg's warehouse says file:///...; S3FileIO s3, Hadoop s3a
    assert canonical_path("file:/srv/wh/lake/raw/orders") == canonical_path("file:///srv/wh/lake/raw/orders/") \
        == canonical_path("/srv/wh/lake/raw/orders") == canonical_path("file://localhost/srv/wh/lake/raw/orders")
    assert canonical_path("s3a://Bucket/wh/t") == canonical_path("s3://bucket/wh/t/")
    assert canonical_path("s3://bucket/wh/t") != canonical_path("gs://bucket/wh/t")
    assert refusal(orders("file:/srv/wh/lake/raw/orders"), assigned=("file:///srv/wh/lake/raw/orders",)) is None


# ---------------------------------------------------------------------------- listing the catalogs

def test_the_inventory_lists_every_table_and_says_what_it_could_not(own_home, monkeypatch):
    """Over a real (SQLite) catalog: every table with its location and metadata file, a table whose metadata
    cannot be read as unreadable, a catalog that cannot be opened and a table budget exceeded as problems
    (and so, through ownership_refusal, nothing proven)."""
    monkeypatch.setenv("PYICEBERG_CATALOG__GONE__TYPE", "rest")  # configured, nobody answers
    monkeypatch.setenv("PYICEBERG_CATALOG__GONE__URI", "http://127.0.0.1:9/catalog")
    platform = config.load(fresh=True)
    catalog = open_catalog(platform, "lake", fresh=True)
    catalog.create_namespace_if_not_exists("raw")
    schema = pa.schema([pa.field("id", pa.int64())])
    good, torn = catalog.create_table("raw.good", schema=schema), catalog.create_table("raw.torn", schema=schema)
    metadata = Path(urlparse(torn.metadata_location).path)
    metadata.write_bytes(metadata.read_bytes()[:20])

    inventory = take_inventory(platform, ["gone", "lake"])
    listed = {t.name: t for t in inventory.tables}
    assert set(listed) == {"lake.raw.good", "lake.raw.torn"}
    assert listed["lake.raw.good"].location == good.location() and listed["lake.raw.good"].unreadable is None
    assert ("metadata file", good.metadata_location) in listed["lake.raw.good"].files
    assert listed["lake.raw.torn"].unreadable
    assert len(inventory.problems) == 1 and inventory.problems[0].startswith("catalog 'gone' could not be opened or listed")
    reason = ownership_refusal(TableFiles.of("lake", listed["lake.raw.good"].server, "raw.good", good),
                               [good.location()], inventory)
    assert reason.startswith("it cannot be proven that no other table keeps files inside its location")

    capped = take_inventory(platform, ["lake"], max_tables=1)
    assert capped.problems == [("the configured catalogs hold more than 1 tables, more than maintenance lists "
                                "to prove it (ownership.INVENTORY_MAX_TABLES)")]
