"""Every way a record can be wrong maps to a specific dead-letter reason; valid records are typed."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from lakehouse.core.spec import load_pipeline
from lakehouse.ingest.rejects import ERROR_KINDS, Rejected
from lakehouse.ingest.validator import RecordValidator

GOOD = {"order_id": "ord-1", "customer_id": "c-1", "amount": 12.5, "currency": "EUR", "status": "paid",
        "event_time": "2026-11-21T10:00:00.250+01:00"}


@pytest.fixture(scope="module")
def orders():
    return RecordValidator(load_pipeline("orders"))


def check(validator, value, key=b"ord-1"):
    key_text = validator.check_key(key)
    return validator.check(key_text, value)


def with_(**changes):
    record = dict(GOOD)
    for k, v in changes.items():
        if v is ...:
            record.pop(k)
        else:
            record[k] = v
    return json.dumps(record).encode()


def test_a_valid_record_becomes_a_typed_row(orders):
    row = check(orders, json.dumps(GOOD).encode())
    assert row["amount"] == 12.5 and row["status"] == "paid"
    expected = datetime(2026, 11, 21, 9, 0, 0, 250000, tzinfo=timezone.utc)
    assert row["event_time"] == int(expected.timestamp() * 1_000_000)


def test_integers_are_accepted_for_doubles_and_z_for_utc(orders):
    row = check(orders, with_(amount=3, event_time="2026-11-21T10:00:00Z"))
    assert row["amount"] == 3.0


@pytest.mark.parametrize("value, key, kind, detail", [
    (b'{"order_id": "ord-1", ', b"ord-1", "malformed_json", "Expecting"),
    (b"\xff\xfe{}", b"ord-1", "not_utf8", "byte 0"),
    (b"[1, 2]", b"ord-1", "not_an_object", "JSON list"),
    (b"42", b"ord-1", "not_an_object", "JSON int"),
    (b'"text"', b"ord-1", "not_an_object", "JSON str"),
    (with_(customer_id=...), b"ord-1", "missing_required", "customer_id is required"),
    (with_(customer_id=None), b"ord-1", "missing_required", "customer_id is required"),
    (with_(amount="12.5"), b"ord-1", "wrong_type", "amount must be a number"),
    (with_(amount=True), b"ord-1", "wrong_type", "amount must be a number"),
    (with_(order_id=1), b"ord-1", "wrong_type", "order_id must be a string"),
    (with_(status="lost"), b"ord-1", "bad_enum", "status 'lost' is not one of"),
    (with_(amount=-0.01), b"ord-1", "out_of_range", "below the minimum 0"),
    (b'{"order_id":"ord-1","customer_id":"c","amount":NaN,"currency":"EUR","status":"paid",'
     b'"event_time":"2026-11-21T10:00:00Z"}', b"ord-1", "out_of_range", "NaN is not a finite number"),
    (b'{"order_id":"ord-1","customer_id":"c","amount":1e999,"currency":"EUR","status":"paid",'
     b'"event_time":"2026-11-21T10:00:00Z"}', b"ord-1", "out_of_range", "not a finite double"),
    (with_(amount=10**400), b"ord-1", "out_of_range", "not a finite double"),  # no double holds it
    (with_(currency="eur"), b"ord-1", "pattern_mismatch", "does not match"),
    (with_(currency="EURO"), b"ord-1", "pattern_mismatch", "does not match"),
    (with_(order_id="x" * 65), None, "null_key", "requires one"),
    (with_(order_id="x" * 65), b"x" * 65, "too_long", "65 characters"),
    (with_(event_time="yesterday"), b"ord-1", "bad_timestamp", "not ISO-8601"),
    (with_(event_time="2026-11-21T10:00:00"), b"ord-1", "bad_timestamp", "no UTC offset"),
    (with_(event_time=1763719200000), b"ord-1", "bad_timestamp", "must be an ISO-8601 string"),
    (with_(event_time="2016-12-31T23:59:60Z"), b"ord-1", "bad_timestamp", "not ISO-8601"),  # a leap second
    (with_(event_time="9999-12-31T23:30:00-01:00"), b"ord-1", "timestamp_out_of_range",
     "outside 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z in UTC"),
    (with_(event_time="0001-01-01T00:30:00+01:00"), b"ord-1", "timestamp_out_of_range", "outside"),
    (with_(customer_id="c-\ud800"), b"ord-1", "bad_string", "customer_id holds a lone surrogate '\\ud800'"),
    (with_(status="paid\udc00"), b"ord-1", "bad_string", "status holds a lone surrogate"),
    (b"{" + b'"pad": "' + b"x" * 70000 + b'"}', b"ord-1", "oversize", "at most 65536"),
    (None, b"ord-1", "null_value", "tombstone"),
    (with_(), None, "null_key", "requires one"),
    (with_(), b"\xc3\x28", "bad_key", "not UTF-8"),
    (with_(), b"ord-2", "key_mismatch", "differs from order_id"),
    (b"[" * 100_000 + b"]" * 100_000, b"ord-1", "oversize", "bytes"),
])
def test_hostile_records_are_rejected_with_a_reason(orders, value, key, kind, detail):
    assert kind in ERROR_KINDS
    with pytest.raises(Rejected) as info:
        check(orders, value, key)
    assert info.value.kind == kind
    assert detail in info.value.detail


def test_deep_nesting_within_the_size_limit_is_malformed_not_a_crash():
    spec = load_pipeline("orders")
    from dataclasses import replace

    roomy = RecordValidator(replace(spec, source=replace(spec.source, max_value_bytes=10_000_000)))
    with pytest.raises(Rejected) as info:
        check(roomy, b'{"a":' * 200_000 + b"1" + b"}" * 200_000)
    assert info.value.kind == "malformed_json"


def test_the_first_and_last_representable_instants_are_kept(orders):
    first = check(orders, with_(event_time="0001-01-01T00:00:00-23:59"))["event_time"]
    last = check(orders, with_(event_time="9999-12-31T23:59:59.999999+00:00"))["event_time"]
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert epoch + timedelta(microseconds=first) == datetime(1, 1, 1, 23, 59, tzinfo=timezone.utc)
    assert epoch + timedelta(microseconds=last) == datetime.max.replace(tzinfo=timezone.utc)


def test_unknown_fields_are_ignored(orders):
    assert "coupon" not in check(orders, with_(coupon="X"))


def test_upsert_tombstones_with_a_key_are_deletes():
    customers = RecordValidator(load_pipeline("customers"))
    assert check(customers, None, b"c-1") is None
    with pytest.raises(Rejected, match="null_key"):
        check(customers, None, None)


def test_quarantined_fields_dead_letter_records_that_carry_them():
    spec = load_pipeline("orders")
    validator = RecordValidator(spec, quarantined=frozenset({"amount"}))
    with pytest.raises(Rejected) as info:
        check(validator, with_())
    assert info.value.kind == "schema_incompatible"
