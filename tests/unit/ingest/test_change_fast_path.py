"""The change events' fast paths are an optimisation, never a second opinion.

For every change event, `RecordValidator.check_change` (msgspec for plain JSON, a compiled change per Avro writer
schema; the reference on any doubt) gives exactly what the reference alone gives: the same key text, the same
row values down to their types, the same `_cdc` value and op, or the same rejection kind and detail. Valid
events take the fast path.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.core.spec import load_pipeline
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.schema_store import parse_schema
from lakehouse.ingest.validator import RecordValidator
from lakehouse.ingest.wire import wire_value

# Every type the fast path checks itself or hands to the reference's checker, required and optional
FIELDS = [{"name": "id", "type": "long", "required": True},
          {"name": "sku", "type": "string", "required": True, "pattern": "^[A-Z]{3}-[0-9]{4}$"},
          {"name": "email", "type": "string", "max_length": 12},
          {"name": "size", "type": "string", "enum": ["S", "M"]},
          {"name": "qty", "type": "int", "min": 0},
          {"name": "weight", "type": "double", "max": 100},
          {"name": "active", "type": "boolean"},
          {"name": "balance", "type": "decimal(10,2)"},
          {"name": "updated_at", "type": "timestamp", "unit": "us"},
          {"name": "seen_at", "type": "timestamp"},
          {"name": "born", "type": "date"}]
ROW = {"id": 7, "sku": "ABC-1234", "email": "a@x", "size": "M", "qty": 3, "weight": 1.5, "active": True,
       "balance": "1.50", "updated_at": 1_764_000_000_000_123, "seen_at": "2026-11-28T10:00:00Z", "born": "1990-05-01"}
SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": 1_764_000_000_000,
          "db": "shop", "schema": "public", "table": "accounts", "lsn": 24023128, "txId": 565, "snapshot": "false"}
KEY = b'{"id": 7}'


@pytest.fixture
def cdc_spec(make_spec):
    return make_spec(fields=FIELDS, mode="cdc", table_key=["id"], partition_by=None,
                     source={"key": {"field": None}, "value_format": "json"}, publish={"view": None})


def change(op: str = "c", after: object = ..., source: object = ..., **top) -> bytes:
    """A change event of ROW (fields replaced by `after` when it is a dict), as JSON."""
    if after is ...:
        after = None if op == "d" else ROW
    event = {"before": None, "after": after, "source": SOURCE if source is ... else source, "op": op,
             "ts_ms": 1_764_000_000_100, "transaction": None, **top}
    return json.dumps(event).encode()


def with_row(**changes) -> bytes:
    return change(after={k: v for k, v in {**ROW, **changes}.items() if v is not ...})


def verdict(validator: RecordValidator, key: bytes | None, value: bytes | None) -> tuple:
    """The key text, row (each value's type and repr, so Decimal('1.5') is not Decimal('1.50')) and op, or
    the rejection's kind and detail."""
    try:
        key_text, row, op = validator.check_change(key, value)
    except Rejected as rejected:
        return ("rejected", rejected.kind, rejected.detail)
    return (key_text, [(type(v).__name__, repr(v)) for v in row], op)


def assert_reference_verdicts(spec, records) -> RecordValidator:
    """Each record's verdict with the fast path is the reference's; returns the validator with it."""
    fast, reference = RecordValidator(spec), RecordValidator(spec)
    assert fast.change_path is not None
    reference.change_path = None
    for key, value in records:
        assert verdict(fast, key, value) == verdict(reference, key, value), (key, value)
    return fast


HOSTILE = [
    # -- the envelope
    ("a create", KEY, change("c")),
    ("a snapshot read", KEY, change("r")),
    ("an update", KEY, change("u")),
    ("a delete", KEY, change("d")),
    ("a delete with an after row", KEY, change("d", after=ROW)),
    ("a delete with a broken after row", KEY, change("d", after={"id": "x"})),
    ("a delete whose after is a number", KEY, change("d", after=5)),
    ("a tombstone", KEY, None),
    ("a truncate", KEY, change("t")),
    ("a logical decoding message", KEY, change("m")),
    ("an unknown op", KEY, change("x")),
    ("a null op", KEY, change(None)),
    ("an op that is a number", KEY, change(1)),
    ("no op", KEY, json.dumps({"after": ROW, "source": SOURCE}).encode()),
    ("a create without an after row", KEY, change("c", after=None)),
    ("a create whose after is a list", KEY, change("c", after=[ROW])),
    ("a create whose after is text", KEY, change("c", after="row")),
    ("the envelope with schemas", KEY, json.dumps({"schema": {"type": "struct"}, "payload": json.loads(
        change("u"))}).encode()),
    ("a schema beside the envelope's fields", KEY, change("u", schema={"type": "struct"})),
    ("a payload beside the envelope's fields", KEY, change("u", payload=None)),
    ("an after row with schemas", KEY, change("u", after={"schema": {}, "payload": ROW})),
    ("an after row with a payload field", KEY, change("u", after={**ROW, "payload": 1})),
    ("an array", KEY, b"[1]"),
    ("null", KEY, b"null"),
    ("no bytes", KEY, b""),
    ("not UTF-8", KEY, change("c")[:-1] + b"\xff}"),
    ("a byte order mark", KEY, b"\xef\xbb\xbf" + change("c")),
    ("trailing garbage", KEY, change("c") + b" x"),
    ("NaN in before", KEY, change("u", before=None)[:-1] + b', "x": NaN}'),
    ("a lone surrogate in before", KEY, change("u")[:-1] + b', "before": {"t": "\\ud800"}}'),
    ("before nested 150 deep", KEY, change("u")[:-1] + b', "before": ' + b"[" * 150 + b"]" * 150 + b"}"),
    ("duplicate ops: the last wins", KEY, change("c")[:-1] + b', "op": "d"}'),
    ("duplicate afters: the last is broken", KEY, change("c")[:-1] + b', "after": {"id": 7}}'),
    ("duplicate fields in the row", KEY, change("c").replace(b'"qty": 3', b'"qty": 3, "qty": -1')),
    ("a value over max_value_bytes", KEY, change("c", after={**ROW, "pad": "x" * 70_000})),
    # -- the source's commit time and position
    ("no source", KEY, change("c", source=None)),
    ("a source that is text", KEY, change("c", source="pg")),
    ("a source without ts_ms: the event's", KEY, change("c", source={"lsn": 5})),
    ("a source with a null ts_ms", KEY, change("c", source={"ts_ms": None, "lsn": 5})),
    ("a ts_ms that is text", KEY, change("c", source={"ts_ms": "5"})),
    ("a ts_ms that is true", KEY, change("c", source={"ts_ms": True})),
    ("a ts_ms past year 9999", KEY, change("c", source={"ts_ms": 10 ** 15})),
    ("a ts_ms with a fraction", KEY, change("c", source={"ts_ms": 1.5})),
    ("an lsn that is true", KEY, change("c", source={"lsn": True})),
    ("a negative lsn", KEY, change("c", source={"lsn": -1})),
    ("an lsn past decimal(38,0)", KEY, change("c", source={"lsn": 10 ** 38})),
    ("an lsn as text", KEY, change("c", source={"lsn": "5"})),
    ("MySQL's binlog position", KEY, change("c", source={"file": "mysql-bin.000003", "pos": 154, "row": 2})),
    ("SQL Server's change_lsn", KEY, change("c", source={"change_lsn": "0000002a:00000568:0002"})),
    ("a broken change_lsn", KEY, change("c", source={"change_lsn": "zz"})),
    ("Oracle's scn", KEY, change("c", source={"scn": "1234567"})),
    ("MongoDB's sec and ord", KEY, change("c", source={"sec": 1_700_000_000, "ord": 3})),
    # -- the row
    ("only the required fields", KEY, change("c", after={"id": 7, "sku": "ABC-1234"})),
    ("null for every optional field", KEY, with_row(**{f["name"]: None for f in FIELDS if not f.get("required")})),
    ("a required field missing", KEY, with_row(sku=...)),
    ("a required field null", KEY, with_row(sku=None)),
    ("a pattern mismatch", KEY, with_row(sku="abc-1234")),
    ("a newline after a pattern's $", KEY, with_row(sku="ABC-1234\n")),
    ("a string too long", KEY, with_row(email="a" * 13)),
    ("a lone surrogate in a string", KEY, change("c").replace(b'"a@x"', b'"\\ud800"')),
    ("a string outside the enum", KEY, with_row(size="L")),
    ("below an int's minimum", KEY, with_row(qty=-1)),
    ("an int past 32 bits", KEY, with_row(qty=2 ** 31)),
    ("a float for an int", KEY, change("c").replace(b'"qty": 3', b'"qty": 3.0')),
    ("true for an int", KEY, with_row(qty=True)),
    ("a double above its maximum", KEY, with_row(weight=100.5)),
    ("1e400 for a double", KEY, change("c").replace(b'"weight": 1.5', b'"weight": 1e400')),
    ("an integer for a double", KEY, with_row(weight=2)),
    ("1 for a boolean", KEY, with_row(active=1)),
    ("a decimal as text", KEY, with_row(balance="12.30")),
    ("a decimal as a number", KEY, change("c").replace(b'"1.50"', b"1.50")),
    ("a decimal with an exponent", KEY, change("c").replace(b'"1.50"', b"15E-1")),
    ("a decimal with a 20th place, as a number", KEY, change("c").replace(b'"1.50"', b"1.00000000000000000001")),
    ("a decimal exponent no decimal holds", KEY, change("c").replace(b'"1.50"', b"1e99999999999999999999")),
    ("a decimal with three places", KEY, with_row(balance="1.234")),
    ("a decimal too large", KEY, with_row(balance="123456789.00")),
    ("a decimal that is true", KEY, with_row(balance=True)),
    ("a timestamp in microseconds as text", KEY, with_row(updated_at="2026-11-28T10:00:00Z")),
    ("a timestamp in microseconds past year 9999", KEY, with_row(updated_at=10 ** 18)),
    ("an ISO timestamp without an offset", KEY, with_row(seen_at="2026-11-28T10:00:00")),
    ("an impossible date", KEY, with_row(born="2026-02-30")),
    ("unknown fields in the row", KEY, with_row(extra={"a": [1, 2.5, None]})),
    # -- the key
    ("a key that differs from the row", b'{"id": 8}', change("c")),
    ("a delete's key", b'{"id": 8}', change("d")),
    ("a key with schemas", b'{"schema": {"type": "struct"}, "payload": {"id": 7}}', change("c")),
    ("a key with more fields, sorted", b'{"z": "b", "id": 7, "a": 1}', change("c")),
    ("a key whose id is text", b'{"id": "7"}', change("c")),
    ("a key whose id is a float", b'{"id": 7.0}', change("c")),
    ("a key whose id is true", b'{"id": true}', change("c")),
    ("a key whose id is null", b'{"id": null}', change("c")),
    ("a key without the id", b'{"other": 7}', change("c")),
    ("a key with non-ASCII text", '{"id": 7, "n": "é"}'.encode(), change("c")),
    ("a key with an escaped quote", b'{"id": 7, "n": "a\\"b"}', change("c")),
    ("a key with a backslash", b'{"id": 7, "n": "a\\\\b"}', change("c")),
    ("a key with a control character", b'{"id": 7, "n": "a\\u0001b"}', change("c")),
    ("a key with DEL", b'{"id": 7, "n": "a\x7fb"}', change("c")),
    ("a key with a non-ASCII field name", '{"id": 7, "é": 1}'.encode(), change("c")),
    ("a key field name with a space", b'{"id": 7, "a b": 1}', change("c")),
    ("a key with a nested record", b'{"id": 7, "n": {"a": 1}}', change("c")),
    ("a key with duplicate ids: the last wins", b'{"id": 8, "id": 7}', change("c")),
    ("a key past 64 bits", b'{"id": 18446744073709551616}', change("c")),
    ("a key with whitespace", b' { "id" : 7 } ', change("c")),
    ("a key that is a number", b"7", change("c")),
    ("a key that is not UTF-8", b'{"id": 7, "n": "\xff"}', change("c")),
    ("a key that is not JSON", b"{id: 7}", change("c")),
    ("no key", None, change("c")),
]


@pytest.mark.parametrize("key, value", [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_a_hostile_change_event_gets_the_reference_verdict(cdc_spec, key, value):
    assert_reference_verdicts(cdc_spec, [(key, value)])


def test_valid_change_events_take_the_fast_path(cdc_spec):
    validator = assert_reference_verdicts(cdc_spec, [(KEY, change(op)) for op in ("c", "r", "u", "d")]
                                          + [(KEY, None), (b'{"id": 7, "tenant": "eu-1"}', change("u"))])
    assert validator.fallbacks == 0


def test_a_synthetic_change_stream_gets_the_reference_verdicts_mostly_on_the_fast_path():
    from lakehouse_dev.change_streams import ChangeStream

    spec = load_pipeline("inventory")
    records = list(ChangeStream(spec, random.Random(3), updates=0.2, deletes=0.05).records(3_000, 0.1))
    broken = sum(r.kind is not None for r in records)
    assert broken  # broken events are part of the traffic
    validator = assert_reference_verdicts(spec, [(r.key, r.value) for r in records])
    assert validator.fallbacks <= broken


def test_byte_level_mutations_of_change_events_get_the_reference_verdicts():
    from lakehouse_dev.change_streams import ChangeStream

    spec = load_pipeline("inventory")
    rng = random.Random(5)
    tokens = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"null", b"NaN", b"1e400", b"-0", b"1.0", b"\xff",
              b"\\ud800", b"\x01", b"99999999999999999999", b'"op":"t"', b'"schema":1,', b'"payload":{},', b"Z"]
    mutants = []
    for record in ChangeStream(spec, random.Random(9), updates=0.2, deletes=0.05).records(1_500, 0.0):
        key, value = bytearray(record.key or b""), bytearray(record.value or b"")
        for target in (value, value, key):
            at = rng.randint(0, len(target))
            if rng.random() < 0.4:
                del target[at:at + rng.randint(1, 4)]
            else:
                target[at:at] = rng.choice(tokens)
        mutants.append((bytes(key), bytes(value) if record.value is not None else None))
    assert_reference_verdicts(spec, mutants)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6)
    | st.sampled_from(["ABC-1234", "M", "1.50", "2026-11-28T10:00:00Z", "1990-05-01", "c", "u", "d"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["c", "r", "u", "d", "t", None, 1]),
       row=st.fixed_dictionaries({}, optional={f["name"]: JSON_VALUES | st.just(ROW[f["name"]]) for f in FIELDS}),
       source=st.none() | st.fixed_dictionaries({}, optional={
           name: JSON_VALUES | st.integers(min_value=-5, max_value=10 ** 39)
           for name in ("ts_ms", "lsn", "file", "pos", "row", "change_lsn", "scn", "sec", "ord", "connector")}),
       extra=st.dictionaries(st.sampled_from(["before", "ts_ms", "schema", "payload", "transaction"]), JSON_VALUES,
                             max_size=2),
       key=st.dictionaries(st.sampled_from(["id", "n", "é", "a b"]), JSON_VALUES | st.just(7), max_size=3))
def test_arbitrary_change_events_get_the_reference_verdicts(cdc_spec, op, row, source, extra, key):
    event = {"op": op, "after": row, "source": source, **extra}
    assert_reference_verdicts(cdc_spec, [(json.dumps(key).encode(), json.dumps(event).encode())])


def test_a_quarantine_or_an_append_pipeline_has_no_change_fast_path(cdc_spec, make_spec):
    assert RecordValidator(cdc_spec, quarantined=frozenset({"email"})).change_path is None
    assert RecordValidator(make_spec()).change_path is None  # no change stream


def test_a_contract_no_row_can_pass_takes_the_reference_path(make_spec):
    spec = make_spec(fields=[*FIELDS, {"name": "code", "type": "string", "required": True, "enum": ["LONG"],
                                       "max_length": 2}],
                     mode="cdc", table_key=["id"], partition_by=None, source={"key": {"field": None},
                                                                              "value_format": "json"},
                     publish={"view": None})
    validator = RecordValidator(spec)
    assert validator.change_path is None
    with pytest.raises(Rejected) as info:
        validator.check_change(KEY, with_row(code="LONG"))
    assert info.value.kind == "too_long"


# ---- Avro: Debezium's envelope as Confluent's AvroConverter writes it, the contract from the writer schema

AVRO_VALUE = {"type": "record", "name": "Value", "namespace": "shop.public.accounts", "fields": [
    {"name": "id", "type": "long"},
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "size", "type": ["null", {"type": "enum", "name": "Size", "symbols": ["S", "M"]}], "default": None},
    {"name": "qty", "type": ["null", "int"], "default": None},
    {"name": "weight", "type": ["null", "double"], "default": None},
    {"name": "active", "type": ["null", "boolean"], "default": None},
    {"name": "balance", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}],
     "default": None},
    {"name": "updated_at", "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}],
     "default": None},
    {"name": "seen_at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None}]}
AVRO_SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
    {"name": "ts_ms", "type": "long"}, {"name": "snapshot", "type": ["string", "null"], "default": "false"},
    {"name": "lsn", "type": ["null", "long"], "default": None},
    {"name": "file", "type": ["null", "string"], "default": None},
    {"name": "pos", "type": ["null", "long"], "default": None}]}
AVRO_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.accounts", "fields": [
    {"name": "before", "type": ["null", AVRO_VALUE], "default": None},
    {"name": "after", "type": ["null", "shop.public.accounts.Value"], "default": None},
    {"name": "source", "type": AVRO_SOURCE},
    {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "namespace": "event", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"}]}], "default": None},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
AVRO_KEY = {"type": "record", "name": "Key", "namespace": "shop.public.accounts",
            "fields": [{"name": "id", "type": "long"}]}
AVRO_ROW = {"id": 7, "email": "a@x", "size": "M", "qty": 3, "weight": 1.5, "active": True,
            "balance": Decimal("1.50"), "updated_at": 1_764_000_000_000_123, "seen_at": 1_764_000_000_000}
AVRO_SOURCE_VALUES = {"version": "2.7.0.Final", "connector": "postgresql", "ts_ms": 1_764_000_000_000,
                      "snapshot": "false", "lsn": 24023128, "file": None, "pos": None}


@pytest.fixture
def avro_spec(make_spec):
    folder = make_spec.directory / "schemas"
    folder.mkdir(exist_ok=True)
    (folder / "1.avsc").write_text(json.dumps(AVRO_KEY))
    (folder / "2.avsc").write_text(json.dumps(AVRO_ENVELOPE))
    return make_spec(mode="cdc", table_key=["id"], partition_by=None,
                     contract={"fields": None, "from": "writer_schema"},
                     source={"value_format": "avro", "schemas": "schemas", "key": {"field": None}},
                     publish={"view": None})


def avro_key(i: int = 7) -> bytes:
    return wire_value(1, parse_schema(json.dumps(AVRO_KEY)), {"id": i})


def avro_event(op: str = "c", after: dict | None = ..., before: dict | None = None, **top) -> bytes:
    if after is ...:
        after = None if op == "d" else AVRO_ROW
    return wire_value(2, parse_schema(json.dumps(AVRO_ENVELOPE)), {
        "before": before, "after": after, "source": {**AVRO_SOURCE_VALUES, **top.pop("source", {})},
        "transaction": top.pop("transaction", None), "op": op, "ts_ms": top.pop("ts_ms", 1_764_000_000_100)})


def assert_avro_reference_verdicts(spec, records) -> RecordValidator:
    """Each record's verdict with the compiled changes is the reference's; returns the validator with them."""
    fast, reference = RecordValidator(spec), RecordValidator(spec)
    reference.decoder.compile_change = lambda writer, contract: None  # the reference alone
    reference.key_decoder.compile_record = lambda writer: None
    for key, value in records:
        assert verdict(fast, key, value) == verdict(reference, key, value), (key, value)
    return fast


def test_valid_avro_change_events_take_the_compiled_change(avro_spec):
    events = [(avro_key(), avro_event(op)) for op in ("c", "r", "u", "d")] + [
        (avro_key(), avro_event("u", before=AVRO_ROW, transaction={"id": "t1", "total_order": 2})),
        (avro_key(), avro_event("c", after={**AVRO_ROW, **dict.fromkeys(list(AVRO_ROW)[1:])})),
        (avro_key(), avro_event("c", source={"lsn": None, "file": "mysql-bin.000003", "pos": 154})),
        (avro_key(), None)]
    validator = assert_avro_reference_verdicts(avro_spec, events * 2)
    assert validator.fallbacks == 1  # the first event of the writer schema, which the reference reads


AVRO_HOSTILE_KEYS = [
    ("a key of another row", avro_key(8)),
    ("a key byte short", avro_key()[:-1]),
    ("a key byte left over", avro_key() + b"\x00"),
    ("a key varint past 64 bits", avro_key()[:5] + b"\xff" * 10 + b"\x01"),
    ("a key of the envelope's schema", avro_event("c")),
    ("a key of an unknown schema", b"\x00\x00\x00\x00\x09\x0e"),
    ("a key without the magic byte", b"\x01" + avro_key()[1:]),
    ("no key bytes", b""),
]


@pytest.mark.parametrize("key", [case[1] for case in AVRO_HOSTILE_KEYS], ids=[case[0] for case in AVRO_HOSTILE_KEYS])
def test_a_hostile_avro_key_gets_the_reference_verdict(avro_spec, key):
    assert_avro_reference_verdicts(avro_spec, [(avro_key(), avro_event("c")), (key, avro_event("c")),
                                               (key, avro_event("d")), (key, None)])


AVRO_HOSTILE = [
    ("a truncate", avro_event("t")),
    ("an unknown op", avro_event("x")),
    ("an empty op", avro_event("")),
    ("a create without an after row", avro_event("c", after=None)),
    ("a key that differs from the row", avro_event("c", after={**AVRO_ROW, "id": 8})),
    ("a negative source position", avro_event("c", source={"lsn": -1})),
    ("a ts_ms past year 9999", avro_event("c", source={"ts_ms": 10 ** 15})),
    ("a timestamp past year 9999", avro_event("c", after={**AVRO_ROW, "updated_at": 10 ** 18})),
    ("a byte left over", avro_event("c") + b"\x00"),
    ("a byte short", avro_event("c")[:-1]),
    ("no payload", avro_event("c")[:5]),
    ("an unknown schema id", b"\x00\x00\x00\x00\x09" + avro_event("c")[5:]),
    ("a union index out of range", avro_event("c")[:5] + b"\x06" + avro_event("c")[6:]),
    # fields the change is not read from are skipped, not unchecked: fastavro refuses them as it reads them
    ("a source string that is not UTF-8", avro_event("c").replace(b"2.7.0.Final", b"2.7.0.Fin\xffl")),
    ("a before row's string that is not UTF-8",
     avro_event("u", before={**AVRO_ROW, "email": "b@y"}).replace(b"b@y", b"b\xffy")),
    ("a before row's enum index out of range",
     avro_event("u", before={**AVRO_ROW, "email": "b@y"}).replace(b"b@y\x02\x02", b"b@y\x02\x08")),
    ("a transaction id that is not UTF-8", avro_event("c", transaction={"id": "tx-1", "total_order": 2})
     .replace(b"tx-1", b"tx\xff1")),
]


@pytest.mark.parametrize("value", [case[1] for case in AVRO_HOSTILE], ids=[case[0] for case in AVRO_HOSTILE])
def test_a_hostile_avro_change_event_gets_the_reference_verdict(avro_spec, value):
    assert_avro_reference_verdicts(avro_spec, [(avro_key(), avro_event("c")), (avro_key(), value)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["c", "r", "u", "d", "t", "", "é"]),
       after=st.none() | st.fixed_dictionaries({
           "id": st.sampled_from([7, 8, -1, 2 ** 63 - 1]), "email": st.none() | st.text(max_size=4),
           "size": st.none() | st.sampled_from(["S", "M"]), "qty": st.none() | st.integers(-2 ** 31, 2 ** 31 - 1),
           "weight": st.none() | st.floats(allow_nan=True, allow_infinity=True),
           "active": st.none() | st.booleans(),
           "balance": st.none() | st.decimals(min_value=-10 ** 7, max_value=10 ** 7, places=2, allow_nan=False),
           "updated_at": st.none() | st.integers(-2 ** 63, 2 ** 63 - 1),
           "seen_at": st.none() | st.integers(-10 ** 14, 10 ** 14)}),
       source=st.fixed_dictionaries({}, optional={
           "ts_ms": st.integers(-2 ** 63, 2 ** 63 - 1), "lsn": st.none() | st.integers(-2 ** 63, 2 ** 63 - 1),
           "file": st.none() | st.text(max_size=12), "pos": st.none() | st.integers(-5, 2 ** 40)}),
       ts_ms=st.none() | st.integers(-2 ** 63, 2 ** 63 - 1), key_id=st.integers(-2 ** 63, 2 ** 63 - 1),
       mutation=st.none() | st.tuples(st.integers(5, 200), st.integers(0, 3), st.binary(max_size=3)),
       key_mutation=st.none() | st.tuples(st.integers(0, 8), st.integers(0, 2), st.binary(max_size=2)))
def test_arbitrary_avro_change_events_get_the_reference_verdicts(avro_spec, op, after, source, ts_ms, key_id,
                                                                 mutation, key_mutation):
    value, key = avro_event(op, after=after, before=after, source=source, ts_ms=ts_ms), avro_key(key_id)
    for found, where in ((mutation, "value"), (key_mutation, "key")):
        if found is not None:  # bytes cut out and put in: what a broken producer or a bit flip makes of it
            at, cut, put = found
            if where == "value":
                value = value[:at] + put + value[at + cut:]
            else:
                key = key[:at] + put + key[at + cut:]
    assert_avro_reference_verdicts(avro_spec, [(avro_key(), avro_event("c")), (key, value)])
