"""The newer record wins (lakehouse.core.newer), in Spark: the SQL condition evaluated by Spark itself on the structs'
real types decides as the Python comparison does (the unit half, tests/unit/core/test_newer.py, evaluates it in
SQLite on many more pairs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core.newer import Coordinates, is_newer, sql
from tests.unit.core.test_newer import coordinates


@settings(max_examples=5, deadline=None)
@given(found=st.lists(st.tuples(coordinates, coordinates), min_size=20, max_size=80), by_source=st.booleans())
def test_spark_evaluates_the_sql_condition_as_the_python_comparison_decides(spark, found, by_source):
    from pyspark.sql import functions as F

    epoch = datetime(2026, 1, 1, tzinfo=UTC)

    def kafka(c: Coordinates) -> tuple:
        return (c.partition, c.offset, None if c.timestamp is None else epoch + timedelta(seconds=c.timestamp))

    def cdc(c: Coordinates) -> tuple:
        return (None if c.source_ts is None else epoch + timedelta(seconds=c.source_ts),
                None if c.position is None else Decimal(c.position))

    kafka_type = "struct<partition:int,offset:bigint,timestamp:timestamp>"
    cdc_type = "struct<source_ts:timestamp,position:decimal(38,0)>"
    df = spark.createDataFrame([(i, kafka(s), cdc(s), kafka(t), cdc(t)) for i, (s, t) in enumerate(found)],
                               f"id int, s_kafka {kafka_type}, s_cdc {cdc_type}, t_kafka {kafka_type}, t_cdc {cdc_type}")
    condition = sql("s_kafka", "t_kafka", "s_cdc", "t_cdc") if by_source else sql("s_kafka", "t_kafka")
    got = df.select("id", F.coalesce(F.expr(condition), F.lit(False)).alias("newer")).orderBy("id").collect()
    assert [r["newer"] for r in got] == [is_newer(s, t, by_source) for s, t in found]
