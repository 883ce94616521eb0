"""Writer schemas come from producers (a schema registry, a schema folder): a semantic type name in one
(Kafka Connect's `connect.name`, a JSON Schema `title`) may be any JSON value, and a value that is not
a name is ignored, never a crash of the translation (found by the type check: the name was used as a
dictionary key, and a list or an object is not hashable)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from lakehouse.core import schemas

NOT_A_NAME = st.one_of(
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.integers(), st.booleans(), st.floats(allow_nan=False),
)


@given(NOT_A_NAME)
def test_an_avro_field_whose_connect_name_is_not_a_name_keeps_its_avro_type(name):
    schema = {"type": "record", "name": "r",
              "fields": [{"name": "at", "type": {"type": "long", "connect.name": name}}]}
    (field,) = schemas.derive("AVRO", json.dumps(schema))
    assert (field.name, field.type, field.unit) == ("at", "long", None)


@given(NOT_A_NAME, st.sampled_from(["connect.name", "title"]))
def test_a_json_schema_property_whose_semantic_name_is_not_a_name_keeps_its_json_type(name, key):
    schema = {"type": "object", "properties": {"at": {"type": "integer", key: name}}}
    (field,) = schemas.derive("JSON", json.dumps(schema))
    assert (field.name, field.type, field.unit) == ("at", "long", None)


def test_a_debezium_name_still_makes_a_timestamp_with_its_unit_and_doc():
    avro = {"type": "record", "name": "r", "fields": [
        {"name": "at", "doc": "when", "type": {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}}]}
    (field,) = schemas.derive("AVRO", json.dumps(avro))
    assert (field.type, field.unit, field.doc) == ("timestamp", "us", "when")
    json_schema = {"type": "object", "properties": {
        "day": {"type": "integer", "title": "io.debezium.time.Date", "description": "d"}}}
    (field,) = schemas.derive("JSON", json.dumps(json_schema))
    assert (field.type, field.unit) == ("date", "days")


def test_json_schema_bounds_are_numbers_only():
    schema = {"type": "object", "properties": {
        "n": {"type": "number", "minimum": 1.5, "maximum": 9},
        "k": {"type": "integer", "minimum": True, "maximum": "9"}}}
    fields = {f.name: f for f in schemas.derive("JSON", json.dumps(schema))}
    assert (fields["n"].min, fields["n"].max) == (1.5, 9)
    assert (fields["k"].min, fields["k"].max) == (None, None)
