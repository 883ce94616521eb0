"""bench.formats: the decoder's records/s per value format, measured on the same records."""

from __future__ import annotations

import pytest

from bench import workloads
from bench.formats import FORMATS, decode_rates
from lakehouse.core.spec import load_pipeline
from lakehouse_dev.synthesis import synthesize


def test_every_format_decodes_the_same_valid_records_into_as_many_rows():
    spec = load_pipeline("orders")
    records = [workloads.RawRecord(0, i, 1_795_778_000_000, r.key, r.value, r.headers or [])
               for i, r in enumerate(synthesize(spec, 300, bad_ratio=0.0, seed=3))]
    rates = decode_rates(spec, records, repeats=2)
    assert set(rates) == set(FORMATS)
    assert {fmt: rate["rows"] for fmt, rate in rates.items()} == {fmt: 300 for fmt in FORMATS}
    assert all(rate["records_per_s"] > 0 for rate in rates.values())
    assert rates["json"]["of_json"] == 1
    assert rates["avro"]["of_json"] == rates["avro"]["records_per_s"] / rates["json"]["records_per_s"]


def test_no_records_is_refused():
    with pytest.raises(ValueError, match="needs records"):
        decode_rates(load_pipeline("orders"), [], repeats=3)
