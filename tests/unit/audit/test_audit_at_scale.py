"""The publish gate's audit where the data is: a table's window of at least `publish.spark_audit_rows`
rows (counted from its manifests) is validated by Great Expectations' Spark datasource instead of being
loaded into pandas on the worker, and the audit says the same thing either way: the same verdict, the
same failed expectations and unexpected counts, the same rows and Kafka offsets audited, the same
offending coordinates (all of them while fewer than MAX_OFFENDING rows fail each expectation).

The unit half; the end-to-end half is tests/e2e/test_audit_at_scale_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lakehouse.core.config import REPO_ROOT
from lakehouse.core.spec import PipelineSpec, SpecError, load_spec


# -- the knob ---------------------------------------------------------------------------------------------

def _spec_with(tmp_path: Path, publish: dict) -> PipelineSpec:
    raw = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "orders.yaml").read_text())
    raw["publish"] = {**raw["publish"], **publish}
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


def test_the_spark_threshold_defaults_to_a_million_rows_and_is_set_per_pipeline(tmp_path):
    assert _spec_with(tmp_path, {}).publish.spark_audit_rows == 1_000_000
    assert _spec_with(tmp_path, {"spark_audit_rows": 0}).publish.spark_audit_rows == 0
    assert _spec_with(tmp_path, {"spark_audit_rows": 250_000}).publish.spark_audit_rows == 250_000


@pytest.mark.parametrize("value, why", [
    (-1, "must be >= 0"), (True, "must be an integer"), ("1000000", "must be an integer"), (1.5, "must be an integer"),
    (10 ** 12 + 1, "must be <= 1000000000000"), (None, "must be an integer")])
def test_a_bad_spark_threshold_is_refused_naming_the_field(tmp_path, value, why):
    with pytest.raises(SpecError, match=f"publish.spark_audit_rows.*{why}"):
        _spec_with(tmp_path, {"spark_audit_rows": value})
