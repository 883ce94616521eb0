"""OpenLineage.

The end-to-end half of these tests; what they hold the code to is told in tests/unit/core/test_openlineage.py.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest
from e2e import airflow_dags_test, emitted, pipeline, rows, run_cli, send, table  # noqa: F401 (fixture)

from lakehouse.core import lineage
from lakehouse.ingest.job import IngestJob
from lakehouse.wap import publish, quality


def orders(first: int, count: int) -> list[tuple[bytes, bytes]]:
    """Valid orders o-<first>.. as (key, value)."""
    return [(f"o-{i}".encode(), json.dumps({"order_id": f"o-{i}", "customer_id": "c-1", "amount": 2.0, "currency": "EUR",
                                             "status": "paid", "event_time": datetime.now(timezone.utc).isoformat()}
                                            ).encode()) for i in range(first, first + count)]


@pytest.mark.slow
def test_the_ingest_job_emits_each_committed_batch_with_the_tables_schemas_and_snapshots(
        platform, pipeline, spark, lineage_file):
    spec = pipeline(partitions=2)
    send(platform, spec.source.topic, orders(0, 9) + [(b"bad", b"{not json")] * 3)
    [batch] = IngestJob(spec, platform, spark).run_once()

    [event] = emitted(lineage_file)
    assert event["run"]["runId"] == str(uuid.UUID(hex=batch.batch_id))
    assert event["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 12
    by_table = {o["facets"]["symlinks"]["identifiers"][0]["name"]: o for o in event["outputs"]}
    for name, count in ((spec.target.table, 9), (spec.dead_letter_table, 3)):
        iceberg = table(platform, spec, name)
        output = by_table[name]
        assert (output["namespace"], output["name"]) == lineage.location_name(iceberg.location())
        assert output["outputFacets"]["outputStatistics"]["rowCount"] == count == len(rows(platform, spec, name))
        assert output["facets"]["version"]["datasetVersion"] == str(iceberg.current_snapshot().snapshot_id)
        fields = {f["name"]: f for f in output["facets"]["schema"]["fields"]}
        assert set(fields) == set(iceberg.schema().column_names) & set(fields)  # top-level columns
        assert {f["name"] for f in fields["_kafka"]["fields"]} >= {"topic", "partition", "offset", "timestamp"}
    assert {"order_id", "amount", "event_time"} <= {f["name"] for f in
                                                    by_table[spec.target.table]["facets"]["schema"]["fields"]}


@pytest.mark.slow
def test_a_publish_task_gives_airflows_openlineage_provider_the_tables_in_and_the_view_out(
        platform, pipeline, make_spec, spark, airflow_db, lineage_file):
    spec = pipeline(partitions=1, slo={"freshness": "1d", "lag_seconds": "1d"})
    send(platform, spec.source.topic, orders(0, 3))
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0
    publish.publish(spec, quality.audit(spec, platform, record_event=False).snapshots, platform,
                    spark_factory=lambda: spark, record_event=False)  # the view exists: the task needs no Spark
    send(platform, spec.source.topic, orders(3, 2))
    assert run_cli(spec, "ingest", "--pipeline", spec.name, "--once").returncode == 0  # new rows to publish

    airflow_dags_test(f"{spec.name}_publish", make_spec.directory)

    published = [e for e in emitted(lineage_file)
                 if e["job"]["name"] == f"{spec.name}_publish.publish" and e["eventType"] == "COMPLETE"]
    assert published, [(e["job"]["name"], e["eventType"]) for e in emitted(lineage_file)]
    [inputs], [outputs] = published[-1]["inputs"], published[-1]["outputs"]
    head = table(platform, spec, spec.target.table).refs()[spec.publish.branch].snapshot_id
    assert inputs["facets"]["symlinks"]["identifiers"][0] == {"namespace": platform.warehouse.rstrip("/"),
                                                             "name": spec.target.table, "type": "TABLE"}
    assert inputs["facets"]["version"]["datasetVersion"] == str(head)
    assert outputs["facets"]["symlinks"]["identifiers"][0]["name"] == spec.publish.view
    assert outputs["facets"]["datasetType"]["datasetType"] == "VIEW"
    assert outputs["outputFacets"]["outputStatistics"]["rowCount"] == len(rows(platform, spec, spec.target.table))
    assert "order_id" in {f["name"] for f in outputs["facets"]["schema"]["fields"]}
