"""The contract's types beyond the scalars: how a spec declares them, how values are checked, and how
writer schemas (Avro, JSON Schema, Protobuf) translate into them and differ from a contract."""

from __future__ import annotations

import json
from decimal import Context, Decimal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lakehouse.core import schemas
from lakehouse.core.errors import SchemaTranslationError
from lakehouse.core.spec import FieldSpec, SpecError
from lakehouse.ingest.checks import field_checker
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.validator import RecordValidator

NESTED = [
    {"name": "order_id", "type": "string", "required": True},
    {"name": "amount", "type": "decimal(10,2)", "required": True},
    {"name": "address", "type": "struct", "fields": [{"name": "zip", "type": "string", "required": True},
                                                      {"name": "geo", "type": "struct", "fields": [
                                                          {"name": "lat", "type": "double"}]}]},
    {"name": "tags", "type": "list", "items": {"type": "string", "required": True}},
    {"name": "attrs", "type": "map", "values": {"type": "long"}},
]


def checker(**spec) -> callable:
    spec.setdefault("name", "v")
    return field_checker(FieldSpec(**spec))


def rejected(check, value) -> str:
    with pytest.raises(Rejected) as info:
        check(value)
    return info.value.kind


# ------------------------------------------------------------------------------------------- the spec

def test_a_spec_declares_nested_types_and_spark_gets_their_full_type(make_spec):
    spec = make_spec(fields=NESTED, partition_by=None)
    address = spec.contract.field("address")
    assert address.spark_type == "struct<`zip`:string,`geo`:struct<`lat`:double>>"
    assert spec.contract.field("tags").spark_type == "array<string>"
    assert spec.contract.field("attrs").spark_type == "map<string,bigint>"
    assert spec.contract.field("amount").spark_type == "decimal(10,2)"
    assert [path for path, _ in spec.contract.walk()] == [
        "order_id", "amount", "address", "address.zip", "address.geo", "address.geo.lat", "tags", "tags.element",
        "attrs", "attrs.value"]


@pytest.mark.parametrize("field, where, why", [
    ({"name": "a", "type": "decimal(39,2)"}, "contract.fields[a].type", "precision from 1 to 38"),
    ({"name": "a", "type": "decimal(5,6)"}, "contract.fields[a].type", "scale from 0 to the precision"),
    ({"name": "a", "type": "decimal"}, "contract.fields[a].type", "needs its precision and scale"),
    ({"name": "a", "type": "string", "items": {"type": "string"}}, "contract.fields[a].items", "only a list"),
    ({"name": "a", "type": "list"}, "contract.fields[a].items", "is required"),
    ({"name": "a", "type": "struct", "fields": []}, "contract.fields[a].fields", "non-empty list"),
    ({"name": "a", "type": "string", "unit": "ms"}, "contract.fields[a].unit", "timestamp and date"),
    ({"name": "a", "type": "timestamp", "unit": "minutes"}, "contract.fields[a].unit", "not one of s, ms, us"),
    ({"name": "a", "type": "struct", "fields": [{"name": "b", "type": "int"}, {"name": "B", "type": "int"}]},
     "contract.fields[a].fields[B]", "only in case"),
    ({"name": "a b", "type": "int"}, "contract.fields[1].name", "letters, digits and underscores"),
    ({"name": "a", "type": "map", "values": {"type": "int", "name": "x"}}, "contract.fields[a].values.name",
     "unknown field"),
])
def test_bad_nested_declarations_are_refused_with_their_path(make_spec, field, where, why):
    with pytest.raises(SpecError) as info:
        make_spec(fields=[{"name": "order_id", "type": "string", "required": True}, field], partition_by=None)
    assert info.value.field == where and why in info.value.why


@pytest.mark.parametrize("overrides, where, why", [
    ({"table_key": ["address"], "mode": "upsert"}, "target.key[0]", "a key column is one of"),
    ({"partition_by": ["bucket(4, address)"]}, "target.partition_by[0]", "cannot partition 'address'"),
    ({"key": {"field": "tags"}}, "source.key.field", "the Kafka key is text"),
])
def test_nested_columns_cannot_key_or_partition_a_table(make_spec, overrides, where, why):
    fields = [{**f, "required": True} if f["name"] == "address" else f for f in NESTED]
    with pytest.raises(SpecError) as info:
        make_spec(fields=fields, **{"partition_by": None, **overrides})
    assert info.value.field == where and why in info.value.why


# ---------------------------------------------------------------------------------------- the values

@given(st.decimals(min_value=Decimal("-99999999.99"), max_value=Decimal("99999999.99"), places=2))
def test_a_decimal_that_fits_is_kept_exactly_whatever_form_it_comes_in(value):
    check = checker(type="decimal", precision=10, scale=2)
    assert check(value) == value
    assert check(str(value)) == value
    assert check(float(str(value))) == value  # a JSON number: its shortest text is what was sent


@pytest.mark.parametrize("value", ["12.345", "123456789.00", "1e9", "1e999999", Decimal("NaN"), Decimal("-Infinity")])
def test_a_decimal_that_would_be_rounded_or_does_not_fit_is_out_of_range(value):
    assert rejected(checker(type="decimal", precision=10, scale=2), value) == "out_of_range"


@pytest.mark.parametrize("value", ["NaN", "Infinity", True, [1], "12,50", "0x10", "1" * 101])
def test_a_decimal_that_is_not_a_decimal_number_is_wrong_type(value):
    assert rejected(checker(type="decimal", precision=10, scale=2), value) == "wrong_type"


@settings(max_examples=300)
@given(precision=st.integers(1, 38), data=st.data())
def test_a_decimal_as_text_is_kept_exactly_when_it_fits_and_else_out_of_range(precision, data):
    scale = data.draw(st.integers(0, precision))
    # lengths around the type's bounds: P-S integer digits, S decimal places
    whole = data.draw(st.text("0123456789", max_size=precision - scale + 2))
    fraction = data.draw(st.none() | st.text("0123456789", max_size=scale + 2))
    assume(whole or fraction)
    text = data.draw(st.sampled_from(["", "-", "+"])) + whole + ("" if fraction is None else "." + fraction)
    minimum = data.draw(st.none() | st.sampled_from([0, -5, 10]))
    check = checker(type="decimal", precision=precision, scale=scale, min=minimum)
    value = Decimal(text)
    exact = value.quantize(Decimal(1).scaleb(-scale), context=Context(prec=100))
    if exact == value and abs(value) < 10 ** (precision - scale) and (minimum is None or value >= minimum):
        assert check(text) == value
    else:
        assert rejected(check, text) == "out_of_range"


def test_trailing_zeros_beyond_the_scale_are_not_rounding():
    assert checker(type="decimal", precision=10, scale=2)("1.2000") == Decimal("1.20")


@pytest.mark.parametrize("text", ["6F1C2B9E-6A43-4D1E-9A51-0E8A1F3F7B21", "6f1c2b9e-6a43-4d1e-9a51-0e8a1f3f7b21"])
def test_a_uuid_is_kept_in_its_canonical_lower_case_text(text):
    assert checker(type="uuid")(text) == text.lower()


@pytest.mark.parametrize("text", ["6f1c2b9e6a434d1e9a510e8a1f3f7b21", "{6f1c2b9e-6a43-4d1e-9a51-0e8a1f3f7b21}",
                                  "6f1c2b9e-6a43-4d1e-9a51-0e8a1f3f7bzz", 42])
def test_anything_but_a_uuid_text_is_bad_uuid(text):
    assert rejected(checker(type="uuid"), text) == "bad_uuid"


def test_epoch_numbers_are_accepted_only_in_the_declared_unit():
    assert checker(type="timestamp", unit="ms")(1_000) == 1_000_000
    assert checker(type="timestamp", unit="s")(2) == 2_000_000
    assert rejected(checker(type="timestamp"), 1_000) == "bad_timestamp"
    assert rejected(checker(type="timestamp", unit="us"), 10 ** 20) == "timestamp_out_of_range"
    assert checker(type="date", unit="days")(1) == 1
    assert rejected(checker(type="date"), 1) == "bad_date"


def test_a_float_must_fit_32_bits_and_binary_comes_as_base64_in_json():
    assert rejected(checker(type="float"), 1e39) == "out_of_range"
    assert checker(type="binary")("AAE=") == b"\x00\x01"
    assert rejected(checker(type="binary"), "not base64!") == "wrong_type"


def test_nested_values_are_checked_at_every_level_and_name_their_path(make_spec):
    validator = RecordValidator(make_spec(fields=NESTED, partition_by=None, key=None))
    good = {"order_id": "o", "amount": 1.5, "address": {"zip": "1", "geo": {"lat": 1}}, "tags": ["x"],
            "attrs": {"k": 1, "n": None}}
    row = validator.check(None, json.dumps(good).encode())
    assert row["amount"] == Decimal("1.50") and row["address"] == {"zip": "1", "geo": {"lat": 1.0}}
    assert row["attrs"] == {"k": 1, "n": None}
    for broken, kind, detail in [
        ({"address": {"geo": {}}}, "missing_required", "address.zip is required"),
        ({"address": {"zip": "1", "geo": {"lat": "north"}}}, "wrong_type", "address.geo.lat must be a number"),
        ({"tags": ["x", None]}, "missing_required", "tags[1] is null"),
        ({"tags": ["x", 1]}, "wrong_type", "tags[1] must be a string"),
        ({"attrs": {"k": "1"}}, "wrong_type", "attrs['k'] must be an integer"),
        ({"attrs": ["k"]}, "wrong_type", "attrs must be an object"),
    ]:
        with pytest.raises(Rejected) as info:
            validator.check(None, json.dumps({**good, **broken}).encode())
        assert (info.value.kind, detail in info.value.detail) == (kind, True), info.value


# an element's spec: its type (with its bounds) and whether a null is allowed
ELEMENT_SPECS = st.builds(
    lambda kind, required: FieldSpec("element", **kind, required=required),
    st.sampled_from([{"type": "long"}, {"type": "int", "min": 0}, {"type": "double", "max": 100.0},
                     {"type": "string", "max_length": 3}, {"type": "decimal", "precision": 4, "scale": 1},
                     {"type": "struct", "fields": (FieldSpec("n", "int", required=True),)}]),
    st.booleans())
ELEMENTS = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(),
                     st.text(st.characters(blacklist_characters="[]"), max_size=4),
                     st.decimals(places=1, allow_nan=False, allow_infinity=False),
                     st.fixed_dictionaries({}, optional={"n": st.one_of(st.none(), st.integers(-5, 2**32))}))


def _outcome(check, value, label: str, position):
    """What `check` did with `value`: ("kept", its result) or (kind, detail with the element's name `label`
    and the element's position, as the check names it, replaced by `v<i>`)."""
    try:
        return "kept", check(value)
    except Rejected as rejected:
        detail = rejected.detail.replace("the list's elements", "the elements").replace("the map's values",
                                                                                         "the elements")
        for i in range(len(value)):
            detail = detail.replace(label.format(position(i)), f"v<{i}>")
        return rejected.kind, detail


@given(ELEMENT_SPECS, st.lists(ELEMENTS, max_size=6))
def test_a_map_checks_its_values_as_a_list_checks_its_elements(element, values):
    """Lists and maps share one check: the same elements, as a list's and as a map's values, are kept (each
    converted alike, a map's keys in order) or rejected alike, the rejection naming the same element."""
    keys = [f"k{i}" for i in range(len(values))]
    as_list = _outcome(field_checker(FieldSpec("v", "list", items=element)), values, "v[{}]", str)
    as_map = _outcome(field_checker(FieldSpec("v", "map", values=element)), dict(zip(keys, values, strict=True)),
                      "v[{}]", lambda i: repr(keys[i]))
    if as_list[0] == "kept":
        assert as_map == ("kept", dict(zip(keys, as_list[1], strict=True)))
    else:
        assert as_map == as_list


def test_json_numbers_reach_a_decimal_column_with_every_digit_sent(make_spec):
    validator = RecordValidator(make_spec(fields=[{"name": "order_id", "type": "string", "required": True},
                                                  {"name": "amount", "type": "decimal(38,18)"},
                                                  {"name": "rate", "type": "double"}], partition_by=None, key=None))
    row = validator.check(None, b'{"order_id": "o", "amount": 12345678901234567890.123456789012345678, "rate": 0.1}')
    assert row["amount"] == Decimal("12345678901234567890.123456789012345678") and row["rate"] == 0.1


# ----------------------------------------------------------------------------- writer schemas translated

AVRO = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "ref", "type": ["null", {"type": "string", "logicalType": "uuid"}], "default": None},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "changed", "type": {"type": "long", "connect.name": "io.debezium.time.Timestamp"}},
    {"name": "shipping", "type": {"type": "record", "name": "Address", "fields": [
        {"name": "zip", "type": "string"}]}},
    {"name": "billing", "type": ["null", "Address"]},
    {"name": "lines", "type": {"type": "array", "items": "long"}},
    {"name": "meta", "type": {"type": "map", "values": ["null", "string"]}},
    {"name": "again", "type": "Status"},
]}


def test_an_avro_schema_translates_to_contract_fields_with_names_logical_types_and_nullability():
    fields = {f.name: f for f in schemas.derive("AVRO", json.dumps(AVRO))}
    assert fields["order_id"] == FieldSpec("order_id", "string", required=True)
    assert (fields["amount"].type_text, fields["amount"].required) == ("decimal(12,2)", True)
    assert (fields["ref"].type, fields["ref"].required) == ("uuid", False)
    assert fields["status"].enum == ("NEW", "PAID") and fields["again"].enum == ("NEW", "PAID")
    assert (fields["placed"].type, fields["changed"].type, fields["changed"].unit) == ("timestamp", "timestamp", "ms")
    assert fields["billing"].type_text == "struct<zip:string>" and not fields["billing"].required
    assert fields["lines"].items.required and not fields["meta"].values.required


@pytest.mark.parametrize("field_type, why", [
    (["null", "string", "long"], "a union of several types"),
    ({"type": "int", "logicalType": "time-millis"}, "time-of-day"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, "decimal(40, 2)"),
    ("Unknown", "has no contract type"),
])
def test_avro_constructs_a_column_cannot_hold_are_named_with_their_path(field_type, why):
    schema = {"type": "record", "name": "R", "fields": [{"name": "nested", "type": {
        "type": "record", "name": "N", "fields": [{"name": "x", "type": field_type}]}}]}
    with pytest.raises(SchemaTranslationError) as info:
        schemas.derive("AVRO", json.dumps(schema))
    assert "nested.x" in str(info.value) and why in str(info.value)


def test_a_json_schema_translates_with_formats_refs_and_nullable_unions():
    schema = {"type": "object", "required": ["id", "when"], "$defs": {"Point": {
        "type": "object", "properties": {"lat": {"type": "number"}}}}, "properties": {
        "id": {"type": "integer"}, "when": {"type": "string", "format": "date-time"},
        "day": {"type": ["string", "null"], "format": "date"}, "ref": {"type": "string", "format": "uuid"},
        "kind": {"enum": ["a", "b"]}, "at": {"$ref": "#/$defs/Point"},
        "maybe": {"oneOf": [{"type": "null"}, {"type": "integer", "connect.type": "int32"}]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "number"}}}}
    fields = {f.name: f for f in schemas.derive("JSON", json.dumps(schema))}
    assert [(n, f.type_text, f.required) for n, f in fields.items()] == [
        ("id", "long", True), ("when", "timestamp", True), ("day", "date", False), ("ref", "uuid", False),
        ("kind", "string", False), ("at", "struct<lat:double>", False), ("maybe", "int", False),
        ("tags", "list<string>", False), ("attrs", "map<string,double>", False)]


PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Order {
  string order_id = 1;
  optional double amount = 2;
  google.protobuf.Timestamp placed = 3;
  repeated string tags = 4;
  map<string, int64> attrs = 5;
  enum Status { NEW = 0; PAID = 1; }
  Status status = 6;
  Address shipping = 7;
  google.protobuf.StringValue note = 8;
  uint32 count = 9;
}
message Address { string zip = 1; }
"""


def test_a_proto_file_compiles_and_translates_its_first_message():
    fields = {f.name: f for f in schemas.derive("PROTOBUF", PROTO)}
    assert [(n, f.type_text, f.required) for n, f in fields.items()] == [
        ("order_id", "string", True), ("amount", "double", False), ("placed", "timestamp", False),
        ("tags", "list<string>", True), ("attrs", "map<string,long>", True), ("status", "string", True),
        ("shipping", "struct<zip:string>", False), ("note", "string", False), ("count", "long", True)]
    assert fields["status"].enum == ("NEW", "PAID")


def test_a_proto_file_that_does_not_compile_says_what_protoc_said():
    with pytest.raises(SchemaTranslationError) as info:
        schemas.derive("PROTOBUF", 'syntax = "proto3"; message M { strin x = 1; }')
    assert "strin" in str(info.value)


def test_a_change_event_contributes_its_after_record():
    envelope = {"type": "record", "name": "Envelope", "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
            {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}]}]},
        {"name": "after", "type": ["null", "Value"]},
        {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"]}]}
    assert [f.name for f in schemas.derive("AVRO", json.dumps(envelope), envelope="debezium")] == ["id", "name"]
    with pytest.raises(SchemaTranslationError, match="not a Debezium change event"):
        schemas.derive("AVRO", json.dumps(AVRO), envelope="debezium")


# ------------------------------------------------------------------------------- compare and merge

scalar = st.sampled_from([FieldSpec("x", t) for t in ("string", "int", "long", "float", "double", "boolean")])


@st.composite
def contracts(draw, depth=0):
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True))
    fields = []
    for name in names:
        if depth < 2 and draw(st.booleans()):
            spec = FieldSpec(name, "struct", fields=draw(contracts(depth + 1)))
        else:
            spec = FieldSpec(name, draw(scalar).type)
        fields.append(FieldSpec(**{**spec.__dict__, "required": draw(st.booleans())}))
    return tuple(fields)


@given(contracts(), contracts())
def test_merging_a_writer_schema_leaves_nothing_to_add_or_widen_and_never_requires_more(have, writer):
    diff = schemas.compare(have, writer)
    merged = schemas.merge(have, writer)
    again = schemas.compare(merged, writer)
    assert not again.added and not again.widened
    assert sorted(again.incompatible) == sorted(diff.incompatible)
    assert [f.name for f in merged[:len(have)]] == [f.name for f in have]  # existing fields keep their place
    required_after = {p for top in merged for p, f in top.walk() if f.required}
    required_before = {p for top in have for p, f in top.walk() if f.required}
    # newly required paths only inside a field the writer added (itself optional: old records lack it)
    for path in required_after - required_before:
        assert any(path.startswith(added + ".") for added in diff.added), path


def test_compatible_and_incompatible_changes_are_told_apart():
    have = (FieldSpec("a", "int", required=True), FieldSpec("b", "decimal", precision=10, scale=2),
            FieldSpec("c", "string", enum=("x",)), FieldSpec("d", "string"))
    writer = (FieldSpec("a", "long"), FieldSpec("b", "decimal", precision=12, scale=2),
              FieldSpec("c", "string", enum=("x", "y")), FieldSpec("d", "long"), FieldSpec("e", "string"))
    diff = schemas.compare(have, writer)
    assert diff.added == ["e"] and diff.widened == ["a", "b", "c"] and diff.relaxed == ["a"]
    assert diff.incompatible_paths == ["d"] and "is string in the contract but long" in diff.incompatible[0]
    assert schemas.compare(have, (FieldSpec("b", "decimal", precision=12, scale=3),)).incompatible_paths == ["b"]


def test_a_writer_narrower_than_the_contract_changes_nothing_and_a_widened_table_holds_the_contract():
    """An older producer's int into a contract (or a table) already widened to long: its values fit as
    they are, in both directions of the comparison the job makes (contract to writer, table to contract)."""
    wide = (FieldSpec("a", "long", required=True), FieldSpec("b", "double"),
            FieldSpec("c", "decimal", precision=12, scale=2))
    narrow = (FieldSpec("a", "int", required=True), FieldSpec("b", "float"),
              FieldSpec("c", "decimal", precision=10, scale=2))
    diff = schemas.compare(wide, narrow)
    assert not diff.evolves and not diff.incompatible
    assert schemas.merge(wide, narrow) == wide
    assert schemas.compare(narrow, wide).widened == ["a", "b", "c"]
    assert schemas.compare((FieldSpec("a", "long"),), (FieldSpec("a", "double"),)).incompatible_paths == ["a"]
