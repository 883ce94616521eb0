"""Reading a pipeline's status, serving /metrics or drawing the Airflow UI page reads batch receipts and stage
names (lakehouse.ingest.receipts), never the batch machinery: importing them loads no Spark, Arrow, Kafka client
or record decoder. Checked in a fresh interpreter, since the test session has loaded them all already."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("pyspark", "pyarrow", "confluent_kafka", "lakehouse.ingest.validator", "lakehouse.ingest.job")
LIGHT = ("lakehouse.ingest.receipts", "lakehouse.ops.metrics", "lakehouse.ops.status")


def loaded_by(module: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after importing `module`."""
    probe = (f"import json, sys, {module}\n"
             f"print(json.dumps(sorted(n for n in {HEAVY!r} if n in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", LIGHT)
def test_status_metrics_and_receipts_import_no_spark_arrow_kafka_or_decoder(module):
    assert loaded_by(module) == []


def test_the_probe_sees_a_heavy_import():
    assert set(loaded_by("lakehouse.ingest.job")) >= {"pyarrow", "confluent_kafka", "lakehouse.ingest.validator"}
    assert "pyspark" in loaded_by("pyspark.sql")
