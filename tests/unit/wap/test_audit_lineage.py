"""The audit covers main's lineage since the published head: rows that replays, backfills and
dead-letter replays add below the published positions are audited like ingested rows, and a
lineage broken by snapshot expiry fails closed. No Spark and no broker: pyiceberg writes the
tables as ingestion and replays commit them, in a private SQLite catalog."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowFailException
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform

from lakehouse.core import config, errors, events, offsets
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse.core.table_properties import SnapshotSummary
from lakehouse.ingest import tables
from lakehouse.ingest.layout import KAFKA_STRUCT, arrow_type
from lakehouse.wap import publish, quality


@pytest.fixture
def platform(tmp_path: Path) -> config.PlatformConfig:
    """A platform whose catalog and warehouse are private to the test; no broker is ever contacted."""
    home = tmp_path / "home"
    home.mkdir()
    return config.PlatformConfig(home=home, bootstrap_servers="127.0.0.1:9", catalog_uri=f"sqlite:///{home}/catalog.db",
                                 warehouse=(home / "warehouse").as_uri())


@pytest.fixture
def spec(make_spec) -> PipelineSpec:
    """The orders pipeline with unique tables and no readers' view (creating one needs Spark)."""
    return make_spec(partitions=2, publish={"view": None})


@pytest.fixture
def orders(platform: config.PlatformConfig, spec: PipelineSpec) -> Table:
    """The pipeline's data table as ingestion creates it: contract columns, `_kafka`, `_ingested_at`."""
    catalog = SqlCatalog(spec.catalog, uri=platform.catalog_uri, warehouse=platform.warehouse)
    catalog.create_namespace_if_not_exists(spec.target.table.split(".")[0])
    table = catalog.create_table(spec.target.table, schema=arrow_schema(spec), properties=tables.table_properties(spec))
    with table.update_spec() as partitioning:
        partitioning.add_field("event_time", DayTransform(), "event_time_day")
    return table


def arrow_schema(spec: PipelineSpec) -> pa.Schema:
    return pa.schema([(f.name, arrow_type(f)) for f in spec.contract.fields]
                     + [("_kafka", KAFKA_STRUCT), ("_ingested_at", pa.timestamp("us", tz="UTC"))])


def batch(spec: PipelineSpec, partition: int, offsets_: list[int], **changes) -> pa.Table:
    """Good orders at `offsets_` of `partition`; `changes` overrides columns of every row."""
    now = datetime.now(timezone.utc)
    rows = [{"order_id": f"ord-{partition}-{o}", "customer_id": "c-1", "amount": 10.0 + o, "currency": "EUR",
             "status": "created", "event_time": now,
             "_kafka": {"topic": spec.source.topic, "partition": partition, "offset": o, "timestamp": now,
                        "key": f"ord-{partition}-{o}"},
             "_ingested_at": now, **changes} for o in offsets_]
    return pa.Table.from_pylist(rows, schema=arrow_schema(spec))


def ingest(table: Table, spec: PipelineSpec, partition: int, start: int, end: int, positions: dict[int, int],
           **changes) -> int:
    """Commit offsets [start, end) of `partition` as an ingest batch does (ranges and positions in the
    summary); returns the snapshot id."""
    table.append(batch(spec, partition, list(range(start, end)), **changes), snapshot_properties={
        SnapshotSummary.PIPELINE: spec.name, SnapshotSummary.KIND: "ingest", SnapshotSummary.TOPIC: spec.source.topic,
        SnapshotSummary.RANGES: offsets.encode_ranges({partition: (start, end)}),
        SnapshotSummary.POSITIONS: offsets.encode_positions(positions)})
    return table.current_snapshot().snapshot_id


def replay(table: Table, spec: PipelineSpec, partition: int, offsets_: list[int], **changes) -> int:
    """Commit rows at `offsets_` as a replay does: its ranges, no positions; returns the snapshot id."""
    table.append(batch(spec, partition, offsets_, **changes), snapshot_properties={
        SnapshotSummary.PIPELINE: spec.name, SnapshotSummary.KIND: "replay", SnapshotSummary.TOPIC: spec.source.topic,
        SnapshotSummary.RANGES: offsets.encode_ranges({partition: (min(offsets_), max(offsets_) + 1)})})
    return table.current_snapshot().snapshot_id


def audit(spec: PipelineSpec, platform: config.PlatformConfig, **kwargs) -> quality.AuditResult:
    return quality.audit(spec, platform, record_event=kwargs.pop("record_event", False), **kwargs)


def published(spec: PipelineSpec, platform: config.PlatformConfig) -> int | None:
    table = open_catalog(platform, spec.catalog).load_table(spec.target.table)
    return publish.published_head(table, spec.publish.branch)


def test_replayed_rows_below_the_published_positions_are_audited_with_the_rows_ingested_since(
        platform, spec, orders):
    # offsets 3 and 4 of partition 0 were dead-lettered at first: the table skips them
    ingest(orders, spec, 0, 0, 3, {0: 3})
    ingest(orders, spec, 0, 5, 10, {0: 10})
    ingest(orders, spec, 1, 0, 4, {0: 10, 1: 4})
    first = audit(spec, platform)
    assert first.success and first.rows == 12, "nothing published yet: every row of main"
    assert first.tables[spec.target.table].lineage == []
    assert first.tables[spec.target.table].offsets == {0: (0, 9), 1: (0, 3)}
    publish.publish(spec, first.snapshots, platform, record_event=False)
    head = first.snapshots[spec.target.table]

    live = ingest(orders, spec, 0, 10, 12, {0: 12, 1: 4})
    replayed = replay(orders, spec, 0, [3, 4])  # dead-letter replay after a contract fix
    result = audit(spec, platform, record_event=True)

    covered = result.tables[spec.target.table]
    assert result.success and result.rows == 4, "the two replayed rows and the two ingested since"
    assert (covered.published_snapshot_id, covered.lineage, covered.snapshot_id) == (head, [live, replayed], replayed)
    assert covered.offsets == {0: (3, 11)}
    event = events.recent(spec.name, kind="quality", platform=platform)[0]
    assert event["details"]["tables"] == {spec.target.table: {"published_snapshot_id": head,
                                                              "lineage": [live, replayed], "offsets": {"0": [3, 11]}}}
    assert json.loads(json.dumps(result.to_dict()))["tables"][spec.target.table]["offsets"] == {"0": [3, 11]}
    publish.publish(spec, result.snapshots, platform, record_event=False)
    assert published(spec, platform) == replayed


def test_a_replayed_row_that_breaks_the_suite_blocks_publication(platform, spec, orders):
    ingest(orders, spec, 0, 0, 3, {0: 3})
    ingest(orders, spec, 0, 4, 8, {0: 8})
    publish.publish(spec, audit(spec, platform).snapshots, platform, record_event=False)
    head = published(spec, platform)

    replay(orders, spec, 0, [3], currency="ZZZ")  # the contract accepts ^[A-Z]{3}$, the suite does not
    result = audit(spec, platform)

    assert not result.success and result.rows == 1
    assert [(o["partition"], o["offset"], o["column"]) for o in result.offending_offsets] == [(0, 3, "currency")]
    assert published(spec, platform) == head, "the publish DAG never publishes a failed audit"


def test_rows_deleted_on_main_after_publication_are_not_audited(platform, spec, orders):
    ingest(orders, spec, 0, 0, 5, {0: 5})
    publish.publish(spec, audit(spec, platform).snapshots, platform, record_event=False)
    ingest(orders, spec, 0, 5, 8, {0: 8}, currency="ZZZ")
    assert not audit(spec, platform).success

    orders.delete(EqualTo("currency", "ZZZ"))  # how an operator fixes a bad batch on main
    result = audit(spec, platform)

    assert result.success and result.rows == 0
    assert len(result.tables[spec.target.table].lineage) == 2, "the bad batch and its deletion"


def test_an_expired_snapshot_after_the_published_head_fails_the_audit_and_the_publication_closed(
        platform, spec, orders):
    ingest(orders, spec, 0, 0, 5, {0: 5})
    head = audit(spec, platform).snapshots[spec.target.table]
    publish.publish(spec, {spec.target.table: head}, platform, record_event=False)
    expired = ingest(orders, spec, 0, 5, 8, {0: 8})
    replayed = replay(orders, spec, 0, [2], currency="ZZZ")
    orders.maintenance.expire_snapshots().by_id(expired).commit()

    with pytest.raises(errors.LineageBrokenError) as failed:
        audit(spec, platform, record_event=True)

    message = str(failed.value)
    assert isinstance(failed.value, errors.TableStateError)
    assert f"{spec.qualified(spec.target.table)}: the lineage of main from the 'published' head {head} to snapshot " \
        f"{replayed} is broken" in message
    assert f"ALTER TABLE {spec.qualified(spec.target.table)} DROP BRANCH `published`" in message
    event = events.recent(spec.name, kind="quality", platform=platform)[0]
    assert event["status"] == "failed" and event["details"]["error"] == "LineageBrokenError"
    with pytest.raises(errors.LineageBrokenError):
        publish.publish(spec, {spec.target.table: replayed}, platform, record_event=False)
    assert published(spec, platform) == head


def test_the_quality_task_fails_without_retry_when_the_lineage_cannot_be_audited(platform, spec, orders,
                                                                                monkeypatch):
    from lakehouse_airflow.operators import quality as operator

    head = ingest(orders, spec, 0, 0, 5, {0: 5})
    publish.publish(spec, {spec.target.table: head}, platform, record_event=False)
    expired = ingest(orders, spec, 0, 5, 8, {0: 8})
    ingest(orders, spec, 0, 8, 9, {0: 9})
    orders.maintenance.expire_snapshots().by_id(expired).commit()
    monkeypatch.setattr(operator, "LakehouseHook", lambda pipeline: SimpleNamespace(spec=spec, platform=platform))
    task = operator.QualityOperator(task_id="quality", pipeline=spec.name)

    with pytest.raises(operator.LineageNotAuditable, match="DROP BRANCH") as failed:
        task.execute({"ti": None})
    assert isinstance(failed.value, AirflowFailException)


def test_a_parent_that_java_expiry_left_dangling_is_named(spec, orders):
    head = ingest(orders, spec, 0, 0, 1, {0: 1})
    expired = ingest(orders, spec, 0, 1, 2, {0: 2})
    current = ingest(orders, spec, 0, 2, 3, {0: 3})
    # Iceberg's Java expiry keeps the child's parent id; pyiceberg's clears it
    metadata = orders.metadata.model_copy(update={
        "snapshots": [s for s in orders.metadata.snapshots if s.snapshot_id != expired]})

    with pytest.raises(errors.LineageBrokenError, match=f"broken at snapshot {current}: its parent {expired} is no "
                                                         f"longer in the table"):
        quality.lineage(spec, SimpleNamespace(metadata=metadata), spec.target.table, head, current)
    assert [s.snapshot_id for s in quality.lineage(spec, orders, spec.target.table, head, current)] == [expired,
                                                                                                        current]
    assert quality.lineage(spec, orders, spec.target.table, current, current) == []
    assert quality.lineage(spec, orders, spec.target.table, current, head) is None


def test_main_rolled_back_below_the_published_head_is_not_audited_or_published(platform, spec, orders):
    older = ingest(orders, spec, 0, 0, 5, {0: 5})
    head = ingest(orders, spec, 0, 5, 8, {0: 8})
    publish.publish(spec, {spec.target.table: head}, platform, record_event=False)
    orders.manage_snapshots().rollback_to_snapshot(older).commit()

    with pytest.raises(errors.LineageDivergedError, match=f"main's snapshot {older} does not descend from the "
                                                           f"'published' head {head}"):
        audit(spec, platform)
    with pytest.raises(errors.NotADescendantError):
        publish.publish(spec, {spec.target.table: older}, platform, record_event=False)
    assert quality.is_ancestor(orders, older, head) and not quality.is_ancestor(orders, head, older)


def test_the_window_mode_audits_the_window_of_main_whatever_was_published(platform, spec, orders):
    ingest(orders, spec, 0, 0, 6, {0: 6})
    ingest(orders, spec, 1, 0, 6, {0: 6, 1: 6})
    publish.publish(spec, audit(spec, platform).snapshots, platform, record_event=False)

    result = audit(spec, platform, window={0: (2, 4), 1: (0, 1)})

    covered = result.tables[spec.target.table]
    assert result.success and result.rows == 3
    assert covered.lineage == [] and covered.offsets == {0: (2, 3), 1: (0, 0)}
