"""The publish gate's audit where the data is: a table's window of at least `publish.spark_audit_rows`
rows (counted from its manifests) is validated by Great Expectations' Spark datasource instead of being
loaded into pandas on the worker, and the audit says the same thing either way: the same verdict, the
same failed expectations and unexpected counts, the same rows and Kafka offsets audited, the same
offending coordinates (all of them while fewer than MAX_OFFENDING rows fail each expectation).

The end-to-end half; the unit half is tests/unit/audit/test_audit_at_scale.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.proof import synthetic_orders, build_table
from lakehouse.core.catalog import open_catalog
from lakehouse.core.spec import PipelineSpec
from lakehouse.wap import quality


NEVER = 10 ** 12  # a threshold no test window reaches: the pandas path


ALWAYS = 0  # every window, the empty one too: the Spark path


def with_threshold(spec: PipelineSpec, rows: int) -> PipelineSpec:
    return dataclasses.replace(spec, publish=dataclasses.replace(spec.publish, spark_audit_rows=rows))


def orders(spec: PipelineSpec, partition: int, start: int, count: int, bad: dict[int, str] = {}) -> pa.Table:
    """`count` good orders of `partition` from offset `start` (recent event times), except the offsets in
    `bad`: "currency" (ZZZ, outside the suite's set), "future" (an event two hours ahead) or "both"."""
    data = synthetic_orders(spec, partition, start, count, datetime.now(timezone.utc) - timedelta(hours=1))
    offsets = data.column("_kafka").combine_chunks().field("offset").to_pylist()
    kinds = [bad.get(o) for o in offsets]
    currency = pa.array(["ZZZ" if k in ("currency", "both") else "EUR" for k in kinds])
    future = datetime.now(timezone.utc) + timedelta(hours=2)
    stamps = pc.if_else(pa.array([k in ("future", "both") for k in kinds]),
                        pa.scalar(future, pa.timestamp("us", tz="UTC")), data.column("event_time"))
    data = data.set_column(data.schema.get_field_index("currency"), "currency", currency)
    return data.set_column(data.schema.get_field_index("event_time"), "event_time", stamps)


def commit(platform, spec: PipelineSpec, data: pa.Table) -> int:
    """Append `data` as one commit, its files with the `_kafka` bounds ingestion records; the new snapshot id."""
    from lakehouse.ingest.taskwriter import write_data_files

    catalog = open_catalog(platform, spec.catalog)
    table = catalog.load_table(spec.target.table)
    files = write_data_files(table.io, table.metadata, data, uuid.uuid4(), itertools.count())
    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
    return catalog.load_table(spec.target.table).current_snapshot().snapshot_id


def publish_at(platform, spec: PipelineSpec, snapshot_id: int) -> None:
    """The readers' branch set to `snapshot_id` (as a publication leaves it)."""
    table = open_catalog(platform, spec.catalog).load_table(spec.target.table)
    table.manage_snapshots().create_branch(snapshot_id, spec.publish.branch).commit()


def new_table(platform, make_spec) -> PipelineSpec:
    spec = make_spec()
    build_table(open_catalog(platform, spec.catalog), spec, 0)  # created the way ingestion leaves it, empty
    return spec


def both_paths(spec: PipelineSpec, platform, spark, **kwargs) -> tuple[quality.AuditResult, quality.AuditResult]:
    """The audit of the same snapshot through pandas and through Spark."""
    def run(rows: int) -> quality.AuditResult:
        return quality.audit(with_threshold(spec, rows), platform, record_event=False,
                             spark_factory=lambda: spark, **kwargs)

    pandas, in_spark = run(NEVER), run(ALWAYS)
    assert {a.engine for a in pandas.tables.values()} <= {"pandas", None}
    assert {a.engine for a in in_spark.tables.values()} <= {"spark", None}
    return pandas, in_spark


def verdict(result: quality.AuditResult) -> dict:
    """What the gate and its readers act on: everything but the wording of examples and where it ran."""
    out = result.to_dict()
    # examples: as many per expectation, not necessarily the same rows' values (nor rendered alike)
    out["expectations"] = [{**{k: v for k, v in e.items() if k != "examples"}, "examples": len(e["examples"])}
                           for e in out["expectations"]]
    out["offending_offsets"] = [{k: v for k, v in o.items() if k != "value"} for o in out["offending_offsets"]]
    out["tables"] = {t: {k: v for k, v in a.items() if k not in ("engine", "docs_page")}
                     for t, a in out["tables"].items()}
    out.pop("audited_at")
    return out


BAD = st.sampled_from(["currency", "future", "both"])


@st.composite
def histories(draw):
    """Commits of 1-3 partitions, some offsets bad; maybe a publication in between, and maybe a late commit
    below the published offsets (a replay of offsets the first commits skipped)."""
    partitions = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.lists(st.integers(0, 40), min_size=partitions, max_size=partitions),
                          min_size=1, max_size=3))
    ends = [sum(s[p] for s in sizes) for p in range(partitions)]
    bad = {p: draw(st.dictionaries(st.integers(0, max(ends[p] - 1, 0)), BAD, max_size=8)) if ends[p] else {}
           for p in range(partitions)}
    published_after = draw(st.none() | st.integers(0, len(sizes) - 1))
    replay = draw(st.lists(st.integers(0, 20), min_size=partitions, max_size=partitions))
    return sizes, bad, published_after, replay


@pytest.mark.slow
@settings(max_examples=6, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=histories())
def test_spark_and_pandas_audit_the_same_window_to_the_same_verdict(platform, make_spec, spark, history):
    sizes, bad, published_after, replay = history
    spec = new_table(platform, make_spec)
    # the first commits start at offset 100, so that a replay can add the offsets below them later
    positions = dict.fromkeys(range(len(bad)), 100)
    audited_from = dict(positions)  # per partition, the lowest offset of the rows not yet published
    shifted = {p: {o + 100: k for o, k in found.items()} for p, found in bad.items()}
    for i, batch in enumerate(sizes):
        data = [orders(spec, p, positions[p], n, shifted[p]) for p, n in enumerate(batch) if n]
        positions = {p: positions[p] + n for p, n in enumerate(batch)}
        if data:
            snapshot = commit(platform, spec, pa.concat_tables(data))
            if published_after == i:
                publish_at(platform, spec, snapshot)
                audited_from = dict(positions)
    late = [orders(spec, p, 100 - n, n, {100 - n: "currency"}) for p, n in enumerate(replay) if n]
    if late:
        commit(platform, spec, pa.concat_tables(late))

    pandas, in_spark = both_paths(spec, platform, spark)

    assert verdict(in_spark) == verdict(pandas)
    audited = pandas.tables[spec.target.table]
    expected_bad = sum(1 for p, found in shifted.items() for o in found if o >= audited_from[p]) + len(late)
    assert pandas.success == (expected_bad == 0)
    assert audited.rows == sum(positions[p] - audited_from[p] + replay[p] for p in positions)
    assert (audited.rows > 0) == bool(audited.offsets)


@pytest.mark.slow
def test_a_failing_and_a_passing_window_get_the_same_counts_through_both_paths(platform, make_spec, spark):
    spec = new_table(platform, make_spec)
    good = commit(platform, spec, pa.concat_tables([orders(spec, 0, 0, 300), orders(spec, 1, 0, 200)]))
    passed_pandas, passed_spark = both_paths(spec, platform, spark)
    assert passed_pandas.success and passed_spark.success
    assert verdict(passed_spark) == verdict(passed_pandas)
    assert passed_spark.tables[spec.target.table].offsets == {0: (0, 299), 1: (0, 199)}
    assert passed_spark.rows == 500 and passed_spark.unexpected_count == 0

    publish_at(platform, spec, good)
    # 150 bad currencies (more than MAX_OFFENDING), 3 future events, 2 of them also a bad currency
    bad = {o: "currency" for o in range(300, 450)} | {450: "future", 300: "both", 301: "both"}
    commit(platform, spec, pa.concat_tables([orders(spec, 0, 300, 200, bad), orders(spec, 1, 200, 10)]))

    failed_pandas, failed_spark = both_paths(spec, platform, spark)

    for result in (failed_pandas, failed_spark):
        assert not result.success and result.rows == 210
        assert result.tables[spec.target.table].offsets == {0: (300, 499), 1: (200, 209)}
        failed = {e["column"]: e["unexpected_count"] for e in result.expectations if not e["success"]}
        assert failed == {"currency": 150, "event_time": 3}
        assert result.offending_total == 153 and len(result.offending_offsets) == quality.MAX_OFFENDING
        assert all(o["topic"] == spec.source.topic for o in result.offending_offsets)
    # more than MAX_OFFENDING failing rows: Spark lists a sample, every one of them really failing
    listed = {(o["partition"], o["offset"], o["column"]) for o in failed_spark.offending_offsets}
    assert listed <= {(0, o, "currency") for o in range(300, 450)} | {(0, o, "event_time") for o in (300, 301, 450)}
    expectations = [{k: v for k, v in e.items() if k != "examples"} for e in failed_spark.expectations]
    assert expectations == [{k: v for k, v in e.items() if k != "examples"} for e in failed_pandas.expectations]
    assert [e["examples"][:1] for e in failed_spark.expectations if e["column"] == "currency"] == [["ZZZ"]]


@pytest.mark.slow
def test_the_window_size_from_the_manifests_picks_the_path_at_the_threshold(platform, make_spec, spark):
    spec = new_table(platform, make_spec)
    commit(platform, spec, pa.concat_tables([orders(spec, 0, 0, 70), orders(spec, 2, 0, 50)]))
    commit(platform, spec, orders(spec, 1, 0, 3))  # 123 rows in 2 commits

    def engine(threshold: int) -> tuple[str, int]:
        result = quality.audit(with_threshold(spec, threshold), platform, record_event=False,
                               spark_factory=lambda: spark)
        audited = result.tables[spec.target.table]
        return audited.engine, audited.rows

    assert engine(123) == ("spark", 123)
    assert engine(124) == ("pandas", 123)
    assert engine(1) == ("spark", 123)


@pytest.mark.slow
def test_a_window_of_zero_rows_passes_on_both_paths(platform, make_spec, spark):
    spec = new_table(platform, make_spec)
    head = commit(platform, spec, orders(spec, 0, 0, 20, {5: "currency"}))
    publish_at(platform, spec, head)  # nothing new since the publication (the bad row was published by hand)

    nothing_new = both_paths(spec, platform, spark)
    beyond = both_paths(spec, platform, spark, window={0: (1000, 2000), 7: (0, 10)})

    for result in (*nothing_new, *beyond):
        audited = result.tables[spec.target.table]
        assert result.success and result.rows == 0 and audited.offsets == {}
        assert result.unexpected_count == 0 and result.offending_total == 0
        assert {e["element_count"] for e in result.expectations} == {0}
    assert verdict(nothing_new[1]) == verdict(nothing_new[0])
    assert verdict(beyond[1]) == verdict(beyond[0])
    # the window mode through Spark: the bad row is found when the window covers it
    covered = both_paths(spec, platform, spark, window={0: (5, 6)})
    assert [(r.rows, r.offending_total) for r in covered] == [(1, 1), (1, 1)]
