"""`target.properties` is an allow-list: a spec tunes Iceberg (file layout, compression, metrics, write
distribution, commits, reads) and nothing else. Where files go, what Iceberg may delete, the format
version and Iceberg's own expiry are refused with the reason; an unknown name is refused naming what
may be set. Pure unit tests: specs are only loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core.config import REPO_ROOT
from lakehouse.core.spec import (
    SPEC_COLUMN_PROPERTIES,
    SPEC_PROPERTIES,
    PipelineSpec,
    SpecError,
    load_spec,
)

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"
TEMPLATE = yaml.safe_load(ORDERS.read_text())
COLUMNS = [f["name"] for f in TEMPLATE["contract"]["fields"]]
EXAMPLES = settings(max_examples=150, deadline=None, database=None)

# What must never reach a table from a spec, written out here (not taken from the module under test):
# a name (lower case) or a family ending in ".", and a word its refusal must say.
DANGEROUS = {
    "location": "location",
    "write.data.path": "location",
    "write.metadata.path": "location",
    "write.folder-storage.path": "location",
    "write.object-storage.": "location",
    "write.location-provider.impl": "location",
    "write.py-location-provider.impl": "pyiceberg imports and runs",
    "gc.enabled": "maintenance decides what may be deleted",
    "format-version": "format version 2",
    "history.expire.": "retention.replay_window",
    "write.wap.enabled": "write-audit-publish staging",
    "lakehouse.": "the platform's",
    "write.target-file-size-bytes": "target.target_file_size_mb",
    "write.merge.mode": "target.mode",
    "write.format.default": "Parquet",
}


def dangerous(key: str) -> str | None:
    lower = key.lower()
    return next((word for name, word in DANGEROUS.items()
                 if lower == name or (name.endswith(".") and lower.startswith(name))), None)


def with_properties(directory: Path, properties: dict) -> Path:
    raw = yaml.safe_load(ORDERS.read_text())
    raw["target"]["properties"] = properties
    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def refusal(directory: Path, properties: dict) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(with_properties(directory, properties))
    return info.value


@pytest.mark.parametrize("key, value, why", [
    ("write.data.path", "s3://warehouse/raw/customers/data", "location its catalog and warehouse assign"),
    ("write.metadata.path", "/tmp/elsewhere", "maintenance deletes what lies there unreferenced"),
    ("write.object-storage.path", "s3://other-bucket", "where and how the table's data files are laid out"),
    ("write.object-storage.enabled", True, "location its catalog and warehouse assign"),
    ("write.location-provider.impl", "com.example.Provider", "names a Java class"),
    ("write.py-location-provider.impl", "os.system", "pyiceberg imports and runs in every writer"),
    ("gc.enabled", False, "needs Iceberg's garbage collection on"),
    ("format-version", 3, "creates its tables at format version 2"),
    ("history.expire.max-ref-age-ms", 1, "would let Iceberg drop the published branch"),
    ("history.expire.min-snapshots-to-keep", 1, "set retention.replay_window instead"),
    ("write.merge.mode", "copy-on-write", "follows target.mode"),
    ("write.format.default", "orc", "its writers write Parquet"),
    ("write.spark.accept-any-schema", True, "the contract and schema_policy decide that"),
    ("Write.Data.Path", "/tmp/x", "location its catalog and warehouse assign"),  # letter case changes nothing
    ("GC.ENABLED", "false", "maintenance decides what may be deleted"),
])
def test_what_decides_where_files_go_or_what_may_be_deleted_is_refused_with_the_reason(tmp_path, key, value, why):
    error = refusal(tmp_path, {key: value})
    assert error.field == f"target.properties.{key}"
    assert why in error.why
    assert error.why.endswith(("remove it", "set retention.replay_window instead"))


def test_an_unknown_property_is_refused_naming_what_may_be_set_and_the_nearest_name(tmp_path):
    error = refusal(tmp_path, {"commit.retry.num-retry": 3})
    assert error.field == "target.properties.commit.retry.num-retry"
    assert "is not a table property a spec may set (did you mean commit.retry.num-retries?)" in error.why
    for family in ("write.parquet.*", "write.metadata.metrics.*", "write.distribution-mode", "commit.retry.*",
                   "commit.manifest.*", "read.split.*"):
        assert family in error.why
    assert "did you mean" not in refusal(tmp_path, {"x.y": 1}).why


@pytest.mark.parametrize("key, value, why", [
    ("write.distribution-mode", "random", "must be one of none, hash, range"),
    ("write.parquet.compression-codec", "lzo", "must be one of zstd, gzip, snappy, lz4, brotli, uncompressed"),
    ("commit.retry.num-retries", -1, "must be a whole number from 0"),
    ("commit.retry.num-retries", "three", "must be a whole number from 0"),
    ("write.parquet.row-group-size-bytes", 0, "must be a whole number from 1"),
    ("read.split.target-size", 1.5, "must be a whole number from 1"),
    ("write.metadata.delete-after-commit.enabled", "yes", "must be true or false"),
    ("write.metadata.metrics.default", "truncate(0)", "must be none, counts, full or truncate(N)"),
    ("write.parquet.bloom-filter-fpp.column.customer_id", 1, "between 0 and 1"),
])
def test_a_value_iceberg_would_fail_on_at_write_time_is_refused_at_load(tmp_path, key, value, why):
    error = refusal(tmp_path, {key: value})
    assert error.field == f"target.properties.{key}"
    assert why in error.why


def test_per_column_properties_name_a_column_of_the_table(tmp_path):
    spec = load_spec(with_properties(tmp_path, {
        "write.parquet.bloom-filter-enabled.column.customer_id": True,
        "write.metadata.metrics.column.currency": "truncate(8)",
        "write.metadata.metrics.column._kafka.offset": "full"}))
    assert spec.target.properties == {"write.parquet.bloom-filter-enabled.column.customer_id": "true",
                                      "write.metadata.metrics.column.currency": "truncate(8)",
                                      "write.metadata.metrics.column._kafka.offset": "full"}
    error = refusal(tmp_path, {"write.parquet.bloom-filter-enabled.column.nope": True})
    assert error.field == "target.properties.write.parquet.bloom-filter-enabled.column.nope"
    assert "'nope' is not a column of the table" in error.why


def test_the_tuning_the_platform_defaults_to_stays_settable_within_its_values(tmp_path):
    """The platform's own defaults (zstd, metadata retention) are what a spec may change, so they are on the
    list, with the values Iceberg takes."""
    spec = load_spec(with_properties(tmp_path, {
        "write.parquet.compression-codec": "gzip", "write.parquet.compression-level": 6,
        "write.metadata.delete-after-commit.enabled": False, "write.metadata.previous-versions-max": 10,
        "write.distribution-mode": "hash", "commit.manifest-merge.enabled": True,
        "commit.manifest.min-count-to-merge": 50, "read.split.target-size": "134217728"}))
    assert spec.target.properties["write.parquet.compression-codec"] == "gzip"
    assert spec.target.properties["write.metadata.delete-after-commit.enabled"] == "false"
    assert len(spec.target.properties) == 8
    error = refusal(tmp_path, {"write.metadata.previous-versions-max": 0})
    assert "must be a whole number from 1" in error.why


# ------------------------------------------------------------------------------- property-based

def valid_value(key: str):
    """A value the property takes, so that only its name decides."""
    values = SPEC_PROPERTIES.get(key) or next((v for p, v in SPEC_COLUMN_PROPERTIES.items() if key.startswith(p)),
                                              None)
    if values is None:
        return "1"
    return {"int": values.low if values.low > 0 else 1, "bool": True, "metrics": "full", "fraction": 0.01,
            "choice": values.choices[0] if values.choices else "x"}[values.kind]


NAME_PART = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
PROPERTY_NAMES = st.one_of(
    st.sampled_from(sorted(SPEC_PROPERTIES)),
    st.builds(lambda prefix, column: prefix + column, st.sampled_from(sorted(SPEC_COLUMN_PROPERTIES)),
              st.one_of(st.sampled_from(COLUMNS + ["_kafka.offset"]), NAME_PART)),
    st.builds(lambda name, part: name + part if name.endswith(".") else name,
              st.sampled_from(sorted(DANGEROUS)), NAME_PART),
    st.builds(lambda name, flip: name.upper() if flip else name.title(),
              st.sampled_from(sorted(n for n in DANGEROUS if not n.endswith("."))), st.booleans()),
    st.builds(lambda name, tail: name + tail, st.sampled_from(sorted(SPEC_PROPERTIES)),
              st.sampled_from([".", "x", "-", ".column.x", "s"])),
    st.from_regex(r"(write|commit|read|gc|history|format)[.-][A-Za-z0-9._-]{1,30}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("properties")


@EXAMPLES
@given(key=PROPERTY_NAMES)
def test_only_allow_listed_names_reach_a_table_and_every_refusal_names_the_property(scratch, key):
    path = with_properties(scratch, {key: valid_value(key)})
    try:
        spec = load_spec(path)
    except SpecError as error:
        assert error.field == f"target.properties.{key}"
        word = dangerous(key)
        if word is not None:
            assert word in error.why
        return
    assert isinstance(spec, PipelineSpec)
    assert dangerous(key) is None
    column_prefix = next((p for p in SPEC_COLUMN_PROPERTIES if key.startswith(p)), None)
    if column_prefix is None:
        assert key in SPEC_PROPERTIES
    else:
        assert key[len(column_prefix):].split(".")[0] in COLUMNS + ["_kafka"]
    assert list(spec.target.properties) == [key]
