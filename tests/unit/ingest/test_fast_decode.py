"""The fast decode path is an optimisation, never a second opinion.

For every record, `RecordValidator.check_row` (msgspec first, the reference on
any doubt) gives exactly what the reference `RecordValidator.check` gives: the
same row values, down to their types and float bits, or the same rejection kind
and detail. Valid records take the fast path; the reader's batches carry the
reference verdicts and each task reports its stage clock once.

The unit half; the end-to-end half is tests/e2e/test_fast_decode_e2e.py.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from lakehouse.core.spec import load_pipeline
from lakehouse.ingest.json_decode import DECODERS, JsonDecoder
from lakehouse.ingest.reader import (
    make_redecoder,
)
from lakehouse.ingest.rejects import ERROR_KINDS, Rejected
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev.synthesis import synthesize

# Every field type, optional fields, bounds, enums, a pattern and a key: the contract the traps run against.
SINK_FIELDS = [
    {"name": "sku", "type": "string", "required": True, "pattern": r"^[a-z]{2}-\d{4}$", "max_length": 8},
    {"name": "qty", "type": "int", "required": True, "min": 1, "max": 1000},
    {"name": "rack", "type": "int"},
    {"name": "serial", "type": "long"},
    {"name": "grade", "type": "long", "enum": [1, 2, 3]},
    {"name": "weight_kg", "type": "double", "min": 0.5, "max": 20},
    {"name": "price", "type": "double"},
    {"name": "in_stock", "type": "boolean"},
    {"name": "released", "type": "date"},
    {"name": "seen_at", "type": "timestamp"},
    {"name": "size", "type": "string", "enum": ["S", "M", "L"]},
    {"name": "label", "type": "string", "max_length": 5},
]
GOOD_ITEM = {"sku": "ab-1234", "qty": 5, "rack": 7, "serial": 123, "grade": 2, "weight_kg": 1.5, "price": 9.99,
             "in_stock": True, "released": "2026-11-21", "seen_at": "2026-11-21T10:00:00.250+01:00", "size": "M",
             "label": "new"}
KEY = b"ab-1234"


@pytest.fixture
def sink(make_spec):
    return make_spec(fields=SINK_FIELDS, key={"field": "sku"}, partition_by=None)


def item(**changes) -> bytes:
    """GOOD_ITEM as JSON with fields replaced (`...` removes one)."""
    record = {**GOOD_ITEM, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


def raw(fields: str) -> bytes:
    """A JSON object written by hand: the valid `sku` and `qty`, then `fields` verbatim."""
    text = '{"sku": "ab-1234", "qty": 5' + (", " + fields if fields else "") + "}"
    return text.encode("utf-8", "surrogatepass")


def outcome(validator: RecordValidator, check, key: bytes | None, value: bytes | None) -> tuple:
    """What one path makes of a record: its typed values (type and repr, so -0.0 is not 0.0),
    ("delete",) for a tombstone delete, or the rejection's kind and detail."""
    try:
        row = check(validator.check_key(key), value)
    except Rejected as rejected:
        return ("rejected", rejected.kind, rejected.detail)
    if row is None:
        return ("delete",)
    values = [row[name] for name in validator.names] if isinstance(row, dict) else list(row)
    return ("row", [(type(v).__name__, repr(v)) for v in values])


def assert_same_verdicts(validator: RecordValidator, records) -> None:
    for key, value in records:
        assert outcome(validator, validator.check_row, key, value) == \
            outcome(validator, validator.check, key, value), (key, value)


HOSTILE = [
    # -- JSON the two decoders could read differently
    ("duplicate keys: the last wins", KEY, raw('"rack": 1, "rack": 2')),
    ("duplicate keys: the first is wrong", KEY, raw('"rack": "one", "rack": 2')),
    ("duplicate keys: the last is wrong", KEY, raw('"rack": 1, "rack": "two"')),
    ("duplicate key field", KEY, b'{"sku": "zz-9999", "qty": 5, "sku": "ab-1234"}'),
    ("escaped key names", KEY, b'{"\\u0073ku": "ab-1234", "q\\u0074y": 5}'),
    ("NaN", KEY, raw('"price": NaN')),
    ("Infinity", KEY, raw('"price": Infinity')),
    ("-Infinity", KEY, raw('"price": -Infinity')),
    ("NaN in an unknown field", KEY, raw('"extra": NaN')),
    ("1e400 in a double", KEY, raw('"price": 1e400')),
    ("-1e400 in a double", KEY, raw('"price": -1e400')),
    ("1e400 in an unknown field", KEY, raw('"extra": 1e400')),
    ("rounds past the largest double", KEY, raw('"price": 1.7976931348623159e308')),
    ("the largest double", KEY, raw('"price": 1.7976931348623157e308')),
    ("underflows to zero", KEY, raw('"price": 1e-400')),
    ("the smallest subnormal", KEY, raw('"price": 5e-324')),
    ("an integer a double rounds", KEY, raw('"price": 9007199254740993')),
    ("a 31-digit integer for a double", KEY, raw(f'"price": {10**30}')),
    ("a 401-digit integer for a double", KEY, raw(f'"price": {10**400}')),
    ("-0 for a double", KEY, raw('"price": -0')),
    ("-0.0 for a double", KEY, raw('"price": -0.0')),
    ("the largest long", KEY, raw(f'"serial": {2**63 - 1}')),
    ("the smallest long", KEY, raw(f'"serial": {-2**63}')),
    ("one past the largest long", KEY, raw(f'"serial": {2**63}')),
    ("one below the smallest long", KEY, raw(f'"serial": {-2**63 - 1}')),
    ("an integer beyond 64 bits for a long", KEY, raw(f'"serial": {10**30}')),
    ("the largest int", KEY, raw(f'"rack": {2**31 - 1}')),
    ("one past the largest int", KEY, raw(f'"rack": {2**31}')),
    ("one below the smallest int", KEY, raw(f'"rack": {-2**31 - 1}')),
    ("-0 for an int", KEY, raw('"rack": -0')),
    ("a float for an int", KEY, raw('"rack": 5.0')),
    ("an exponent for an int", KEY, raw('"rack": 5e0')),
    ("true for an int", KEY, raw('"rack": true')),
    ("true for a double", KEY, raw('"price": true')),
    ("1 for a boolean", KEY, raw('"in_stock": 1')),
    ("a number as text", KEY, raw('"price": "9.99"')),
    ("4300 digits in an unknown field", KEY, raw('"extra": ' + "7" * 4300)),
    ("4301 digits in an unknown field", KEY, raw('"extra": ' + "7" * 4301)),
    ("4301 digits in a string", KEY, raw('"extra": "' + "7" * 4301 + '"')),
    ("a lone surrogate in a field", KEY, raw('"label": "\\ud800"')),
    ("a lone low surrogate in a field", KEY, raw('"label": "x\\udc00"')),
    ("a lone surrogate after a non-ASCII character", KEY, raw('"label": "\\u00e9\\ud83d"')),
    ("a surrogate pair split by a character", KEY, raw('"label": "\\ud83dx\\ude00"')),
    ("a lone surrogate in an enum field", KEY, raw('"size": "\\ud800"')),
    ("a lone surrogate in a pattern field", KEY, raw('"sku": "ab-1234\\ud800"')),
    ("a lone surrogate in the key field, no key", None, raw('"sku": "\\ud800"')),
    ("a lone surrogate in an unknown field", KEY, raw('"extra": "\\ud800"')),
    ("an escaped surrogate pair", KEY, raw('"label": "\\ud83d\\ude00"')),
    ("five astral characters fit five", KEY, raw('"label": "' + "\U0001F600" * 5 + '"')),
    ("six astral characters do not", KEY, raw('"label": "' + "\U0001F600" * 6 + '"')),
    ("an escaped NUL", KEY, raw('"label": "\\u0000"')),
    ("a raw control character", KEY, raw('"label": "a\x01b"')),
    ("Latin-1 in an unknown field", KEY, b'{"sku": "ab-1234", "qty": 5, "note": "caf\xe9"}'),
    ("Latin-1 in a field", KEY, b'{"sku": "ab-1234", "qty": 5, "label": "caf\xe9"}'),
    ("a surrogate encoded in UTF-8", KEY, b'{"sku": "ab-1234", "qty": 5, "note": "\xed\xa0\x80"}'),
    ("an overlong UTF-8 encoding", KEY, b'{"sku": "ab-1234", "qty": 5, "note": "\xc0\x80"}'),
    ("a byte order mark", KEY, b"\xef\xbb\xbf" + raw("")),
    ("whitespace around the object", KEY, b" \n\t" + raw("") + b"\r\n "),
    ("trailing garbage", KEY, raw("") + b" x"),
    ("two objects", KEY, raw("") + raw("")),
    ("a trailing comma", KEY, b'{"sku": "ab-1234", "qty": 5,}'),
    ("single quotes", KEY, b"{'sku': 'ab-1234', 'qty': 5}"),
    ("leading zeros", KEY, raw('"rack": 07')),
    ("a plus sign", KEY, raw('"rack": +7')),
    ("hexadecimal", KEY, raw('"rack": 0x7')),
    ("nesting 50 deep in an unknown field", KEY, raw('"extra": ' + "[" * 50 + "]" * 50)),
    ("nesting 150 deep in an unknown field", KEY, raw('"extra": ' + "[" * 150 + "]" * 150)),
    ("nesting 5000 deep in an unknown field", KEY, raw('"extra": ' + "[" * 5000 + "]" * 5000)),
    ("unknown fields of every JSON type", KEY, raw('"extra": {"a": [1, 2.5, {"b": null}], "c": true}, "d": "x"')),
    ("an array", KEY, b"[" + raw("") + b"]"),
    ("a string", KEY, b'"ab-1234"'),
    ("a number", KEY, b"42"),
    ("null", KEY, b"null"),
    ("true", KEY, b"true"),
    ("no bytes", KEY, b""),
    ("only whitespace", KEY, b"  "),
    # -- the contract, rule by rule
    ("a valid item", KEY, item()),
    ("only the required fields", KEY, raw("")),
    ("null for every optional field", KEY, item(**{f["name"]: None for f in SINK_FIELDS if not f.get("required")})),
    ("an empty object", KEY, b"{}"),
    ("a required field missing", KEY, item(qty=...)),
    ("a required field null", KEY, item(qty=None)),
    ("below an int's minimum", KEY, item(qty=0)),
    ("above an int's maximum", KEY, item(qty=1001)),
    ("an integer outside a long enum", KEY, item(grade=4)),
    ("a float in a long enum", KEY, item(grade=2.0)),
    ("a double at its minimum", KEY, item(weight_kg=0.5)),
    ("a double just below its minimum", KEY, item(weight_kg=0.49999999999999994)),
    ("an integer at a double's maximum", KEY, item(weight_kg=20)),
    ("a double just above its maximum", KEY, item(weight_kg=20.000000000000004)),
    ("a string outside the enum", KEY, item(size="XL")),
    ("an enum value in the wrong case", KEY, item(size="m")),
    ("a string too long", KEY, item(label="abcdef")),
    ("a pattern mismatch", b"AB-1234", item(sku="AB-1234")),
    ("a newline after a pattern's $", b"ab-1234\n", item(sku="ab-1234\n")),
    ("Arabic-Indic digits match \\d", "ab-١٢٣٤".encode(), item(sku="ab-١٢٣٤")),
    ("a key field too long", b"ab-123456", item(sku="ab-123456")),
    ("a number for a string", KEY, item(label=5)),
    ("a timestamp in UTC", KEY, item(seen_at="2026-11-21T10:00:00Z")),
    ("a timestamp before 1970", KEY, item(seen_at="1969-12-31T23:59:59.999999+00:00")),
    ("a timestamp in year 1 east of UTC", KEY, item(seen_at="0001-01-01T00:00:00+01:00")),
    ("the last timestamp of year 9999 west of UTC", KEY, item(seen_at="9999-12-31T23:59:59.999999-23:59")),
    ("the first timestamp Python holds", KEY, item(seen_at="0001-01-01T00:00:00Z")),
    ("the first day of year 1 west of UTC", KEY, item(seen_at="0001-01-01T00:00:00-23:59")),
    ("the last timestamp Python holds", KEY, item(seen_at="9999-12-31T23:59:59.999999+00:00")),
    ("the last day of year 9999 east of UTC", KEY, item(seen_at="9999-12-31T23:59:59+23:59")),
    ("one minute into year 10000 in UTC", KEY, item(seen_at="9999-12-31T00:01:00-23:59")),
    ("half an hour into year 10000 in UTC", KEY, item(seen_at="9999-12-31T23:30:00-01:00")),
    ("half an hour before year 1 in UTC", KEY, item(seen_at="0001-01-01T00:30:00+01:00")),
    ("a leap second", KEY, item(seen_at="2016-12-31T23:59:60Z")),
    ("a timestamp without an offset", KEY, item(seen_at="2026-11-21T10:00:00")),
    ("a timestamp with a space", KEY, item(seen_at="2026-11-21 10:00:00+00:00")),
    ("a compact timestamp", KEY, item(seen_at="20261121T100000Z")),
    ("a timestamp with seven fraction digits", KEY, item(seen_at="2026-11-21T10:00:00.1234567+00:00")),
    ("hour 24", KEY, item(seen_at="2026-11-21T24:00:00Z")),
    ("an offset of 24 hours", KEY, item(seen_at="2026-11-21T10:00:00+24:00")),
    ("epoch milliseconds", KEY, item(seen_at=1763719200000)),
    ("a date", KEY, item(released="1969-12-31")),
    ("the first date", KEY, item(released="0001-01-01")),
    ("the last date", KEY, item(released="9999-12-31")),
    ("year 0", KEY, item(released="0000-12-31")),
    ("year 10000", KEY, item(released="10000-01-01")),
    ("an impossible date", KEY, item(released="2026-02-30")),
    ("a compact date", KEY, item(released="20261121")),
    ("an ISO week date", KEY, item(released="2026-W47-6")),
    ("a date with a time", KEY, item(released="2026-11-21T00:00")),
    ("a date as a number", KEY, item(released=20261121)),
    # -- source rules
    ("a key that differs from the key field", b"zz-0000", item()),
    ("no key", None, item()),
    ("a key that is not UTF-8", b"\xff", item()),
    ("a value over max_value_bytes", KEY, raw('"pad": "' + "x" * 70_000 + '"')),
    ("a tombstone on an append pipeline", KEY, None),
]


@pytest.mark.parametrize("key, value", [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_a_hostile_record_gets_the_reference_verdict(sink, key, value):
    assert_same_verdicts(RecordValidator(sink), [(key, value)])


# Kinds the reader gives from a record's Kafka metadata or its own failures, never the validator.
READER_KINDS = {"bad_kafka_timestamp", "reader_failure"}
# JSON never reaches the wire formats' kinds (tests/unit/ingest/test_avro_values.py)
WIRE_KINDS = {"bad_wire_format", "unknown_schema", "malformed_avro", "malformed_protobuf"}
# kinds of contract types the fast path leaves to the reference (tests/unit/core/test_contract_types.py), and of
# change streams (tests/unit/ingest/test_cdc.py)
REFERENCE_TYPE_KINDS = {"bad_uuid", "bad_envelope", "unsupported_change"}


def test_the_hostile_records_reach_every_error_kind(sink):
    plain = RecordValidator(sink)
    quarantined = RecordValidator(sink, quarantined=frozenset({"price"}))
    kinds = set()
    for validator in (plain, quarantined):
        assert_same_verdicts(validator, [case[1:] for case in HOSTILE])
        kinds |= {v[1] for v in (outcome(validator, validator.check, k, x) for _, k, x in HOSTILE)
                  if v[0] == "rejected"}
    assert kinds == set(ERROR_KINDS) - READER_KINDS - WIRE_KINDS - REFERENCE_TYPE_KINDS


@pytest.mark.parametrize("pipeline", ["orders", "customers"])
def test_synthetic_traffic_gets_the_reference_verdicts(pipeline):
    validator = RecordValidator(load_pipeline(pipeline))
    records = list(synthesize(validator.spec, 3_000, bad_ratio=0.3, seed=11))
    assert {r.kind for r in records} - {None}  # broken records are part of the traffic
    assert_same_verdicts(validator, [(r.key, r.value) for r in records])


def test_byte_level_mutations_of_valid_records_get_the_reference_verdicts(sink):
    validator = RecordValidator(sink)
    rng = random.Random(5)
    tokens = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"null", b"NaN", b"1e400", b"-0", b"1.0",
              b"\xff", b"\xc3", b"\\ud800", b"\x01", b"99999999999999999999", b"\xef\xbb\xbf", b"Z", b"+05:30"]
    mutants = []
    for record in synthesize(sink, 1_500, seed=9):
        value = bytearray(record.value)
        for _ in range(rng.randint(1, 3)):
            at = rng.randint(0, len(value))
            if rng.random() < 0.4:
                del value[at:at + rng.randint(1, 4)]
            else:
                value[at:at] = rng.choice(tokens)
        mutants.append((record.key, bytes(value)))
    assert_same_verdicts(validator, mutants)


@pytest.mark.parametrize("pipeline", ["orders", "customers", "sink"])
def test_valid_records_take_the_fast_path(pipeline, sink):
    spec = sink if pipeline == "sink" else load_pipeline(pipeline)
    validator = RecordValidator(spec)
    records = [(r.key, r.value) for r in synthesize(spec, 2_000, seed=4)]
    assert_same_verdicts(validator, records)  # calls check_row once per record
    assert validator.fallbacks == 0


def test_rejected_records_fall_back_to_the_reference(sink):
    validator = RecordValidator(sink)
    with pytest.raises(Rejected):
        validator.check_row("ab-1234", item(qty=0))
    assert validator.fallbacks == 1


def test_tombstones_on_an_upsert_pipeline_are_deletes_on_both_paths():
    validator = RecordValidator(load_pipeline("customers"))
    assert_same_verdicts(validator, [(b"c-1", None), (None, None)])
    assert outcome(validator, validator.check_row, b"c-1", None) == ("delete",)


def test_contract_corners_get_the_reference_verdicts(make_spec):
    def records(samples: list[str]) -> list[tuple[bytes, bytes]]:
        """Each sample as field `v`, and a record without it."""
        return [(b"k-1", ('{"customer_id": "k-1", "v": ' + s + "}").encode()) for s in samples] \
            + [(b"k-1", b'{"customer_id": "k-1"}')]

    corners = [
        # enum values the other rules forbid: "XL" is too long, "m" fails the pattern
        ({"name": "v", "type": "string", "enum": ["S", "M", "XL", "m"], "max_length": 1, "pattern": "^[A-Z]$"},
         ['"S"', '"XL"', '"m"', '"Q"']),
        ({"name": "v", "type": "long", "enum": [1, 2, 3], "min": 2}, ["1", "2"]),
        # bounds that are not integers (the spec refuses bounds that are not finite)
        ({"name": "v", "type": "long", "min": 0.5, "max": 2.5}, ["0", "1", "2", "3"]),
        # an optional field no value can satisfy
        ({"name": "v", "type": "long", "enum": [5], "max": 4}, ["5", "4", "null"]),
    ]
    for field, samples in corners:
        spec = make_spec(fields=[{"name": "customer_id", "type": "string", "required": True}, field],
                         key={"field": "customer_id"}, partition_by=None)
        assert_same_verdicts(RecordValidator(spec), records(samples))


def test_contracts_the_fast_path_cannot_mirror_use_the_reference_only(make_spec):
    keyed_by_double = make_spec(fields=[{"name": "n", "type": "double", "required": True}],
                                key={"field": "n"}, partition_by=None)
    impossible = make_spec(fields=[{"name": "customer_id", "type": "string", "required": True},
                                   {"name": "v", "type": "long", "required": True, "enum": [5], "max": 4}],
                           key={"field": "customer_id"}, partition_by=None)
    for spec, records in ((keyed_by_double, [(b"5", b'{"n": 5}'), (b"5", b'{"n": 5.0}'), (b"5.0", b'{"n": 5}')]),
                          (impossible, [(b"c", b'{"customer_id": "c", "v": 5}')])):
        validator = RecordValidator(spec)
        assert validator.fast_path is None
        assert_same_verdicts(validator, records)


def test_a_quarantine_uses_the_reference_path(sink):
    validator = RecordValidator(sink, quarantined=frozenset({"price"}))
    assert validator.fast_path is None
    with pytest.raises(Rejected) as info:
        validator.check_row("ab-1234", item())
    assert info.value.kind == "schema_incompatible"


def test_a_decoder_registered_over_json_replaces_the_fast_path(sink, monkeypatch):
    class EnvelopeDecoder(JsonDecoder):
        """Reads records wrapped as {"payload": {...}}, as some producers send them."""

        def decode(self, value: bytes) -> dict:
            return super().decode(value)["payload"]

    monkeypatch.setitem(DECODERS, "json", lambda spec, registry: EnvelopeDecoder())
    validator = RecordValidator(sink)
    assert validator.fast_path is None
    row = validator.check_row("ab-1234", b'{"payload": ' + item() + b"}")
    assert row[:2] == ("ab-1234", 5)


# ---------------------------------------------------------------------------- the reader

class SummedSeconds:
    """Stands where Spark passes a float Accumulator: keeps every amount added."""

    def __init__(self) -> None:
        self.added: list[float] = []

    def add(self, seconds: float) -> None:
        self.added.append(seconds)


def test_redecoding_dead_letters_reports_decode_time_and_no_read_time(sink):
    records = list(synthesize(sink, 300, bad_ratio=0.5, seed=8))
    dead_letters = pa.RecordBatch.from_pylist([
        {"_kafka": {"topic": sink.source.topic, "partition": 0, "offset": i, "timestamp": None, "key": None},
         "key": r.key, "value": r.value, "headers": [{"key": k, "value": v} for k, v in r.headers]}
        for i, r in enumerate(records)])
    read, decode = SummedSeconds(), SummedSeconds()
    batches = list(make_redecoder(sink, frozenset(), 1, timers=(read, decode))(iter([dead_letters])))

    rows = pa.Table.from_batches(batches).to_pylist()
    # a dead letter keeps no Kafka timestamp it could not hold, so that one decodes now
    assert [r["_dlq_error_kind"] for r in rows] == [None if r.kind == "bad_kafka_timestamp" else r.kind
                                                    for r in records]
    assert read.added == [0.0]
    assert len(decode.added) == 1 and decode.added[0] > 0
