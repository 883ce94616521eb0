"""OpenLineage: every committed ingest batch is one COMPLETE event (the Kafka topic in, the data and
dead-letter tables out, with schema and row-count facets) from the continuous job's openlineage-python
client; publishing and maintenance tasks give Airflow's OpenLineage provider their datasets. Transport
from OpenLineage's own configuration, nothing (and no client) when none is set, and a lineage backend
that is down never fails a batch. The tests read what the file transport wrote.

(tests/unit/wap/test_audit_lineage.py is about the lineage of snapshots that write-audit-publish audits.)

The unit half; the end-to-end half is tests/e2e/test_openlineage_e2e.py.
"""

from __future__ import annotations

import json
import logging
import uuid

import pyarrow as pa
import pytest
from e2e import airflow_dags_test, emitted, pipeline, rows, run_cli, send, table  # noqa: F401 (fixture)
from openlineage.client.serde import Serde
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType

from lakehouse.core import config, lineage
from lakehouse.core.catalog import open_catalog
from lakehouse.ingest.receipts import BatchReceipt, TableCommit
from lakehouse.wap import publish


def receipt(spec) -> BatchReceipt:
    """A batch of 12 records: 10 rows in the data table, 2 dead letters."""
    done = BatchReceipt(pipeline=spec.name, batch_id=uuid.uuid4().hex, ranges={0: (0, 12)}, records=12,
                        rows_by_table={spec.target.table: 10}, dead_letters=2)
    done.commits = [TableCommit(spec.target.table, 10, 11, 1, files=1, bytes=2048),
                    TableCommit(spec.dead_letter_table, 2, 22, 1, files=1, bytes=512)]
    return done


# ---------------------------------------------------------------------------- unit

def test_lineage_is_off_unless_configured_and_then_no_client_is_made(make_spec, no_lineage_settings, monkeypatch,
                                                                        tmp_path):
    spec = make_spec()
    assert not lineage.configured() and lineage.client() is None
    lineage.ingest_batch(spec, config.load(), receipt(spec))  # nothing to do, nothing printed
    monkeypatch.setenv("OPENLINEAGE_URL", "http://lineage.example:5000")
    assert lineage.configured()
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert not lineage.configured() and lineage.client() is None


@pytest.mark.parametrize(("location", "named"), [
    ("file:///var/lake/warehouse/raw/orders", ("file", "/var/lake/warehouse/raw/orders")),
    ("s3://lake/warehouse/raw/orders", ("s3://lake", "warehouse/raw/orders")),
    ("s3a://key:secret@lake/warehouse/raw/orders", ("s3://lake", "warehouse/raw/orders")),
    ("hdfs://namenode:8020/warehouse/raw/orders", ("hdfs://namenode:8020", "/warehouse/raw/orders")),
])
def test_iceberg_tables_are_named_by_where_they_live_without_credentials(location, named):
    assert lineage.location_name(location) == named


@pytest.mark.parametrize(("servers", "namespace"), [
    ("127.0.0.1:9092", "kafka://127.0.0.1:9092"),
    ("SASL_SSL://broker-1:9093,broker-2:9093", "kafka://broker-1:9093"),
    ("broker", "kafka://broker:9092"),
])
def test_kafka_topics_are_named_by_their_first_bootstrap_server(servers, namespace):
    assert lineage.kafka_namespace(servers) == namespace


def test_a_batch_is_one_complete_event_in_the_configured_file(make_spec, lineage_file):
    spec, platform = make_spec(), config.load()
    batch = receipt(spec)
    lineage.ingest_batch(spec, platform, batch)

    [event] = emitted(lineage_file)
    assert (event["eventType"], event["run"]["runId"]) == ("COMPLETE", str(uuid.UUID(hex=batch.batch_id)))
    assert event["job"] | {"facets": None} == {"namespace": "lakehouse-tests", "name": f"lakehouse-ingest-{spec.name}",
                                               "facets": None}
    assert event["job"]["facets"]["jobType"]["processingType"] == "STREAMING"
    [topic] = event["inputs"]
    assert (topic["namespace"], topic["name"]) == (lineage.kafka_namespace(platform.bootstrap_servers),
                                                   spec.source.topic)
    assert topic["inputFacets"]["inputStatistics"]["rowCount"] == 12
    assert [f["name"] for f in topic["facets"]["schema"]["fields"]] == list(spec.contract.names)
    warehouse = platform.warehouse.rstrip("/")
    by_table = {o["facets"]["symlinks"]["identifiers"][0]["name"]: o for o in event["outputs"]}
    assert set(by_table) == {spec.target.table, spec.dead_letter_table}
    data = by_table[spec.target.table]
    assert (data["namespace"], data["name"]) == lineage.location_name(f"{warehouse}/{spec.target.table.replace('.', '/')}")
    assert data["outputFacets"]["outputStatistics"] | {"_producer": None, "_schemaURL": None} == \
        {"rowCount": 10, "fileCount": 1, "size": 2048, "_producer": None, "_schemaURL": None}
    assert data["facets"]["version"]["datasetVersion"] == "11"
    assert data["facets"]["catalog"]["framework"] == "iceberg" and data["facets"]["catalog"]["name"] == spec.catalog
    assert by_table[spec.dead_letter_table]["outputFacets"]["outputStatistics"]["rowCount"] == 2


def test_a_lineage_backend_that_is_down_is_logged_and_never_fails_the_batch(make_spec, no_lineage_settings,
                                                                              monkeypatch, free_tcp_port, caplog):
    spec = make_spec()
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT", json.dumps(
        {"type": "http", "url": f"http://127.0.0.1:{free_tcp_port}", "timeout": 1, "retry": {"total": 0}}))
    with caplog.at_level(logging.WARNING, logger="lakehouse.lineage"):
        lineage.ingest_batch(spec, config.load(), receipt(spec))
    assert "could not emit the OpenLineage event of batch" in caplog.text


def test_a_maintenance_task_names_each_table_it_maintained_in_and_out_with_its_state_after(make_spec, own_home):
    from lakehouse_airflow.operators.maintenance import MaintenanceOperator

    spec, platform = make_spec(), config.load()
    catalog = open_catalog(platform, spec.catalog)
    catalog.create_namespace("raw")
    data = catalog.create_table(spec.target.table, schema=Schema(NestedField(1, "order_id", StringType())))
    data.append(pa.table({"order_id": ["o-1", "o-2"]}))
    receipts = [{"table": spec.qualified(spec.target.table), "status": "ok", "rows_after": 2, "data_files_after": 1,
                 "bytes_after": 900},
                {"table": spec.qualified(spec.dead_letter_table), "status": "skipped", "rows_after": 0,
                 "data_files_after": 0, "bytes_after": 0}]  # no dead-letter table yet: nothing maintained

    inputs, outputs = (list(map(Serde.to_dict, found)) for found in MaintenanceOperator.datasets(spec, platform,
                                                                                                   receipts))

    assert [(d["namespace"], d["name"]) for d in inputs] == [(d["namespace"], d["name"]) for d in outputs] == \
        [lineage.location_name(data.location())]
    [after] = outputs
    assert after["outputFacets"]["outputStatistics"] | {"_producer": None, "_schemaURL": None} == \
        {"rowCount": 2, "fileCount": 1, "size": 900, "_producer": None, "_schemaURL": None}
    assert after["facets"]["version"]["datasetVersion"] == str(data.refresh().current_snapshot().snapshot_id)
    assert [f["name"] for f in after["facets"]["schema"]["fields"]] == ["order_id"]


def test_a_publication_without_a_view_gives_the_table_at_the_published_branch_as_its_output(make_spec, own_home):
    from lakehouse_airflow.operators.publish import PublishOperator

    spec, platform = make_spec(publish={"view": None, "branch": "readers"}), config.load()  # e.g. a candidate
    catalog = open_catalog(platform, spec.catalog)
    catalog.create_namespace("raw")
    data = catalog.create_table(spec.target.table, schema=Schema(NestedField(1, "order_id", StringType())))
    data.append(pa.table({"order_id": ["o-1", "o-2", "o-3"]}))
    head = data.refresh().current_snapshot().snapshot_id
    done = [publish.PublishedTable(spec.target.table, head, None, None)]

    inputs, outputs = (list(map(Serde.to_dict, found)) for found in PublishOperator.datasets(spec, platform, done))

    [read], [written] = inputs, outputs
    assert (written["namespace"], written["name"]) == (read["namespace"], read["name"]) == \
        lineage.location_name(data.location())
    warehouse = platform.warehouse.rstrip("/")
    assert written["facets"]["symlinks"]["identifiers"] == [
        {"namespace": warehouse, "name": spec.target.table, "type": "TABLE"},
        {"namespace": warehouse, "name": f"{spec.target.table}.branch_readers", "type": "BRANCH"}]
    assert written["facets"]["datasetType"]["datasetType"] == "TABLE"
    assert written["facets"]["version"]["datasetVersion"] == read["facets"]["version"]["datasetVersion"] == str(head)
    assert written["outputFacets"]["outputStatistics"]["rowCount"] == 3
    assert [f["name"] for f in written["facets"]["schema"]["fields"]] == ["order_id"]

    # with a readers' view, the view is the output and the table keeps its one name
    view = "serve.orders_view"
    [read], [written] = (list(map(Serde.to_dict, found)) for found in PublishOperator.datasets(
        spec, platform, [publish.PublishedTable(spec.target.table, head, None, view)]))
    assert written["facets"]["symlinks"]["identifiers"] == [{"namespace": warehouse, "name": view, "type": "VIEW"}]
    assert (written["namespace"], written["name"]) == lineage.location_name(f"{warehouse}/serve/orders_view")
    assert written["outputFacets"]["outputStatistics"]["rowCount"] == 3
    assert [i["type"] for i in read["facets"]["symlinks"]["identifiers"]] == ["TABLE"]


# ---------------------------------------------------------------------------- end to end


