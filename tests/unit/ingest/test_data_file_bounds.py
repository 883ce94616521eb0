"""The task writer's data files carry bounds for the `_kafka` coordinates nested in a struct.

pyiceberg's writer leaves fields nested in structs at counts only; Iceberg's Java writer keeps their bounds,
and a lookup by coordinates (`lakehouse trace`, replay, verify) prunes files by them. `write_data_files`
takes them from the footer pyiceberg's writer holds when it closes each file, never from a second read.
"""

from __future__ import annotations

import itertools
import uuid

import pyarrow as pa
import pyiceberg.io.pyarrow as pyiceberg_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import from_bytes

from lakehouse.ingest.taskwriter import write_data_files

KAFKA = pa.struct([("partition", pa.int32()), ("offset", pa.int64()), ("topic", pa.string())])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2**40)), min_size=1, max_size=200))
def test_each_file_has_the_bounds_of_its_kafka_coordinates(tmp_path_factory, coordinates):
    where = tmp_path_factory.mktemp("bounds")
    catalog = SqlCatalog("t", uri=f"sqlite:///{where}/c.db", warehouse=f"file://{where}")
    catalog.create_namespace("db")
    rows = pa.table({"id": pa.array(range(len(coordinates)), pa.int64()),
                     "_kafka": pa.array([{"partition": p, "offset": o, "topic": "orders"} for p, o in coordinates],
                                        KAFKA)})
    table = catalog.create_table("db.t", schema=rows.schema)
    original = pyiceberg_writer.compute_statistics_plan

    files = write_data_files(table.io, table.metadata, rows, uuid.uuid4(), itertools.count())

    assert pyiceberg_writer.compute_statistics_plan is original  # pyiceberg's own plan again afterwards
    schema = table.schema()
    for name, values in (("_kafka.partition", [p for p, _ in coordinates]), ("_kafka.offset", [o for _, o in coordinates])):
        field = schema.find_field(name)
        [data_file] = files
        assert from_bytes(field.field_type, data_file.lower_bounds[field.field_id]) == min(values)
        assert from_bytes(field.field_type, data_file.upper_bounds[field.field_id]) == max(values)
    topic = schema.find_field("_kafka.topic")
    assert from_bytes(topic.field_type, files[0].upper_bounds[topic.field_id]) == "orders"
