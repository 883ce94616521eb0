"""Where a URI points (lakehouse.upkeep.storage_paths): the plain form a table's own location must have, every
reading some client may take of another table's paths, and where each catalog type puts a table.

The refusals these readings lead to are in test_ownership.py.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from lakehouse.upkeep.storage_paths import assigned_locations, canonical_path, readings


def test_each_catalog_type_assigns_its_own_layout():
    assert assigned_locations("jdbc", "file:///srv/wh/lake/", ("raw",), "orders", None) == ["file:///srv/wh/lake/raw/orders"]
    assert assigned_locations("rest", "s3://b/wh", ("a", "b"), "t", "s3://b/rest/a/b/") == \
        ["s3://b/rest/a/b/t", "s3://b/wh/a/b/t"]
    assert assigned_locations("hive", "s3://b/wh", ("raw",), "orders", None) == ["s3://b/wh/raw.db/orders"]
    assert assigned_locations("glue", "s3://b/wh", ("raw",), "orders", "s3://b/glue/raw") == \
        ["s3://b/glue/raw/orders", "s3://b/wh/raw.db/orders"]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
@example(text="A0:0")  # an opaque path: no plain form (it was the root to canonical_path, a folder to readings)
def test_any_text_is_read_without_error_and_a_canonical_path_is_among_its_readings(text):
    place = canonical_path(text)
    found = readings(text)
    if place is not None:
        assert place in found
