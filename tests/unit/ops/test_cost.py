"""`lakehouse cost`: what a pipeline used per day, from Kafka, the tables and the ops timeline, priced
only when unit prices are set. The end-to-end test ingests and maintains a pipeline on the real
broker, Spark and catalog, then checks every figure against one computed here independently:
record bytes read back from Kafka, file sizes and manifests read from the tables, receipts of the
runs.

The unit half; the end-to-end half is tests/e2e/test_cost_e2e.py.
"""

from __future__ import annotations


import pytest

from e2e import pipeline, run_cli, send, table  # noqa: F401 - pipeline is a fixture
from lakehouse.core import config
from lakehouse.core.errors import ConfigurationError
from lakehouse.ops import cost


# ---------------------------------------------------------------------------- unit

def test_a_commit_writes_its_files_manifests_a_manifest_list_and_a_metadata_file():
    fast_append = {"added-data-files": "3", "added-files-size": "3000", "added-records": "30"}
    assert cost.commit_requests(fast_append) == {"files": 3, "bytes": 3000, "manifests": 1, "put": 6, "get": 2}
    assert cost.commit_requests({}) == {"files": 0, "bytes": 0, "manifests": 0, "put": 2, "get": 2}  # positions only
    # compaction: the new file's manifest, and each manifest that listed a replaced file written again
    compaction = {"added-data-files": "1", "deleted-data-files": "3", "added-files-size": "9"}
    assert cost.commit_requests(compaction)["manifests"] == 4 and cost.commit_requests(compaction)["put"] == 7
    manifest_rewrite = {"manifests-created": "1", "manifests-replaced": "4"}  # Java records what it wrote
    assert cost.commit_requests(manifest_rewrite)["manifests"] == 1
    merge_on_read = {"added-delete-files": "2", "added-data-files": "1"}
    assert cost.commit_requests(merge_on_read)["files"] == 3 and cost.commit_requests(merge_on_read)["manifests"] == 2


def test_prices_are_read_from_the_platform_settings_and_refused_when_not_numbers():
    prices = cost.UnitPrices.from_settings({"LAKEHOUSE_PRICE_PUT_PER_1000": "0.005",
                                            "LAKEHOUSE_PRICE_COMPUTE_HOUR": "2", "LAKEHOUSE_PRICE_CURRENCY": "EUR"})
    assert prices.configured and prices.put_per_1000 == 0.005 and prices.get_per_1000 is None
    assert prices.currency == "EUR"
    assert not cost.UnitPrices.from_settings({}).configured
    for bad in ("cheap", "-1", "nan", "inf"):
        with pytest.raises(ConfigurationError, match="LAKEHOUSE_PRICE_KAFKA_GB_MONTH"):
            cost.UnitPrices.from_settings({"LAKEHOUSE_PRICE_KAFKA_GB_MONTH": bad})
    with pytest.raises(ConfigurationError, match="is not a currency"):
        cost.UnitPrices.from_settings({"LAKEHOUSE_PRICE_CURRENCY": "<script>"})


def test_config_keeps_the_price_variables_as_given(monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_PRICE_GET_PER_1000", "0.0004")
    monkeypatch.setenv("LAKEHOUSE_PRICE_PUT_PER_1000", "not a price")  # checked by `lakehouse cost`, not here
    assert config.load().prices == {"LAKEHOUSE_PRICE_GET_PER_1000": "0.0004",
                                    "LAKEHOUSE_PRICE_PUT_PER_1000": "not a price"}


def test_a_day_is_priced_item_by_item_only_where_a_price_is_set():
    day = cost.DayCost(day="2026-11-20", table_bytes=3 * cost.GIB, kafka_retained_bytes=cost.GIB,
                       put_requests=2000, get_requests=500, ingest_seconds=1800.0, maintenance_seconds=1800.0)
    assert cost.price_day(day, cost.UnitPrices()) is None
    priced = cost.price_day(day, cost.UnitPrices(object_store_gb_month=30.0, put_per_1000=0.5, compute_hour=2.0))
    assert priced == {"object_store": 3.0, "put_requests": 1.0, "compute": 2.0, "total": 6.0}
    unknown = cost.DayCost(day="2026-11-20", table_bytes=None)  # snapshots expired: not priced, not zero
    assert "object_store" not in cost.price_day(unknown, cost.UnitPrices(object_store_gb_month=30.0))


# ---------------------------------------------------------------------------- end to end


