"""One bad record never stops the line: whatever a record holds, it comes out once, as a row or a dead letter.

Property-based: arbitrary bytes, hostile JSON (lone surrogates, numbers past every
bound, deep nesting), the edge of every contract type, any 64-bit Kafka timestamp and
any headers go through the reader's BatchBuilder, and the Arrow batch it emits must
validate, name every offset exactly once and hold only values Python, Spark and
Iceberg can represent. Then the reader's own failures: an exception while decoding is
a `reader_failure` dead letter, a value Arrow refuses costs its record only, a record
the driver marked as poisoned is dead-lettered undecoded, and an error that still
escapes a task names the record it was at. No broker, no Spark.
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import confluent_kafka
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, cimpl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polling import wait_until
from tests.unit.ingest.test_fast_decode import outcome

from lakehouse.core import errors
from lakehouse.core.errors import (
    BrokerStalledError,
    OffsetGapError,
    RecordFailureError,
    SourceError,
    TopicMissingError,
    TopicRecreatedError,
)
from lakehouse.core.offsets import OffsetRange
from lakehouse.core.spec import Contract, FanoutSpec, FieldSpec, load_pipeline
from lakehouse.ingest import layout
from lakehouse.ingest import reader as kafka_source
from lakehouse.ingest.checks import MAX_TIMESTAMP_US, MIN_TIMESTAMP_US
from lakehouse.ingest.reader import (
    MAX_KAFKA_TIMESTAMP_MS,
    MIN_KAFKA_TIMESTAMP_MS,
    BatchBuilder,
    make_reader,
    make_redecoder,
    read_range,
)
from lakehouse.ingest.rejects import ERROR_KINDS
from lakehouse.ingest.validator import RecordValidator

TOPIC = "hostile"
INGESTED_AT = 1_763_719_200_000_000
EXAMPLES = settings(max_examples=75, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Every contract type, with the rules that decide verdicts: max_length, pattern, enum, the key field.
FIELDS = (
    FieldSpec("id", "string", required=True, max_length=40),
    FieldSpec("label", "string"),
    FieldSpec("code", "string", pattern=r"^[A-Z]{3}$"),
    FieldSpec("size", "string", enum=("S", "M", "L")),
    FieldSpec("small", "int"),
    FieldSpec("big", "long"),
    FieldSpec("ratio", "double"),
    FieldSpec("flag", "boolean"),
    FieldSpec("at", "timestamp"),
    FieldSpec("day", "date"),
)


def every_type_spec():
    """The orders pipeline with a contract of every type, keyed by `id`, fanned out on `size`."""
    orders = load_pipeline("orders")
    return replace(orders, contract=Contract(FIELDS),
                   source=replace(orders.source, key_field="id", key_required=False, max_value_bytes=20_000),
                   target=replace(orders.target, partition_by=(),
                                  fanout=FanoutSpec("size", {"S": "raw.hostile_small"})))


SPEC = every_type_spec()


def builder(validator: RecordValidator | None = None) -> BatchBuilder:
    return BatchBuilder(SPEC, validator or RecordValidator(SPEC), INGESTED_AT)


def assert_sound(batch: pa.RecordBatch, offsets: list[int]) -> list[dict]:
    """Checks what Spark and the tables will rely on; returns the rows."""
    batch.validate(full=True)  # among others: every string is valid UTF-8
    assert batch.schema == layout.batch_schema(SPEC)[0]
    for name, column in zip(batch.schema.names, batch.columns):
        column.to_pylist()  # timestamps and dates become datetime and date: in range
        if pa.types.is_timestamp(column.type):
            valid = column.drop_null().cast(pa.int64()).to_pylist()
            assert all(MIN_TIMESTAMP_US <= v <= MAX_TIMESTAMP_US for v in valid), name
    rows = batch.to_pylist()
    assert sorted(r["_kafka"]["offset"] for r in rows) == sorted(offsets)  # each exactly once
    for row in rows:
        if row["_route"] is None:
            assert row["_dlq_error_kind"] in ERROR_KINDS and row["_dlq_error_detail"], row
            assert all(row[name] is None for name in SPEC.contract.names)
        else:
            assert row["_dlq_error_kind"] is None and row["_op"] in ("upsert", "delete")
        kafka_ts = row["_kafka"]["timestamp"]
        assert kafka_ts is None or kafka_ts.tzinfo is not None
    return rows


def contract_values(batch: pa.RecordBatch) -> list[tuple]:
    """Each row's contract values in the validator's form (timestamps as epoch microseconds, dates as epoch
    days), to compare with `RecordValidator.check_row`."""
    columns = []
    for name in SPEC.contract.names:
        column = batch.column(name)
        if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
            column = column.cast(pa.int64() if pa.types.is_timestamp(column.type) else pa.int32())
        columns.append(column.to_pylist())
    return list(zip(*columns, strict=True))


# ---------------------------------------------------------------------------- hostile input

# Text with lone surrogates: what json.loads makes of "\ud800"
ANY_TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
JSON_TEXT = ANY_TEXT.map(json.dumps)  # lone surrogates as \uXXXX escapes, as JSON may carry them


def fixed_offset_times() -> st.SearchStrategy[str]:
    """ISO-8601 times with any offset up to +-23:59:59.999999, from year 1 to 9999."""
    offsets = st.integers(-(86_400 * 10**6 - 1), 86_400 * 10**6 - 1).map(
        lambda us: timezone(timedelta(microseconds=us)))
    return st.builds(lambda moment, tz: moment.replace(tzinfo=tz).isoformat(), st.datetimes(), offsets)


EDGES = {
    "string": ['"ok"', '""', '"\\ud800"', '"\\udc00x"', '"\\u00e9\\ud83d"', '"x\\udfffy"', '"\\ud83d\\ude00"',
               '"\\u0000"', '"' + "x" * 41 + '"', '"ABC"', '"abc"', '"S"', '"XL"'],
    "int": [str(2**31 - 1), str(2**31), str(-2**31), str(-2**31 - 1), "0", "-0", "5.0", "1e3"],
    "long": [str(2**63 - 1), str(2**63), str(-2**63), str(-2**63 - 1), str(10**30), "7" * 4300, "7" * 4301],
    "double": ["1.7976931348623157e308", "1.7976931348623159e308", "1e400", "-1e400", "NaN", "Infinity",
               "-Infinity", "5e-324", "1e-400", "-0.0", str(10**400), "9007199254740993"],
    "boolean": ["true", "false", "1", '"true"', "null"],
    "timestamp": [json.dumps(t) for t in (
        "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+00:01", "0001-01-01T00:00:00-23:59",
        "0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999-00:01",
        "9999-12-31T00:00:00-23:59", "9999-12-31T00:01:00-23:59", "9999-12-31T23:30:00-01:00",
        "2016-12-31T23:59:60Z", "2026-11-21T10:00:00+23:59:59.999999", "2026-11-21T10:00:00", "2026-11-21",
        "1970-01-01T00:00:00.000001-00:00")] + ["1763719200000"],
    "date": [json.dumps(d) for d in ("0001-01-01", "9999-12-31", "0000-01-01", "10000-01-01", "2026-02-29",
                                     "2024-02-29", "2026-W47-6")] + ["20261121"],
}
GENERATED = {
    "string": JSON_TEXT,
    "int": st.integers(-2**32, 2**32).map(str),
    "long": st.integers(-2**65, 2**65).map(str),
    "double": st.floats(allow_nan=False, allow_infinity=False).map(repr),
    "boolean": st.booleans().map(json.dumps),
    "timestamp": fixed_offset_times().map(json.dumps),
    "date": st.dates().map(lambda d: json.dumps(d.isoformat())),
}
ANY_EDGE = st.sampled_from(sorted({v for values in EDGES.values() for v in values}))


def field_value(f: FieldSpec) -> st.SearchStrategy[str]:
    """JSON text for field `f`: mostly its type's edges, else generated values of its type or any other
    type's edge."""
    edges = st.sampled_from(EDGES[f.type])
    return st.one_of(edges, edges, GENERATED[f.type], ANY_EDGE)


def json_values() -> st.SearchStrategy:
    """Arbitrary JSON values, nested, with text that may hold lone surrogates and numbers of any size."""
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), ANY_TEXT)
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(ANY_TEXT, inner, max_size=3)),
                        max_leaves=8)


VALID = {  # JSON text of values the contract accepts, per field
    "id": st.text("abcdefghijk-0123456789", min_size=1, max_size=12).map(json.dumps),
    "label": st.text(max_size=12).map(json.dumps),
    "code": st.from_regex(r"[A-Z]{3}", fullmatch=True).map(json.dumps),
    "size": st.sampled_from(['"S"', '"M"', '"L"']),
    "small": st.integers(-2**31, 2**31 - 1).map(str),
    "big": st.integers(-2**63, 2**63 - 1).map(str),
    "ratio": st.floats(allow_nan=False, allow_infinity=False).map(repr),
    "flag": st.booleans().map(json.dumps),
    "at": fixed_offset_times().map(json.dumps),
    "day": st.dates().map(lambda d: json.dumps(d.isoformat())),
}


@st.composite
def contract_records(draw) -> tuple[bytes | None, bytes]:
    """Key and value of a record of the contract, valid but for a few fields set to edges or wrong
    types, plus now and then an unknown field of any JSON and some nesting."""
    hostile = draw(st.sets(st.sampled_from(FIELDS), min_size=1, max_size=2))
    fields = {f.name: draw(field_value(f) if f in hostile else VALID[f.name])
              for f in FIELDS if f.required or f in hostile or draw(st.booleans())}
    parts = [f'"{name}": {text}' for name, text in fields.items()]
    if draw(st.integers(0, 3)) == 0:
        parts.append('"extra": ' + json.dumps(draw(json_values())))
    if draw(st.integers(0, 5)) == 0:
        depth = draw(st.sampled_from([1, 99, 101, 999, 3000]))
        parts.append('"deep": ' + "[" * depth + "]" * depth)
    value = ("{" + ", ".join(draw(st.permutations(parts))) + "}").encode("utf-8", "surrogatepass")
    try:
        id_ = json.loads(fields["id"])
    except ValueError:  # 4301 digits
        id_ = None
    keyed = isinstance(id_, str) and draw(st.integers(0, 3)) > 0  # the key is the id, as producers send it
    return (id_.encode("utf-8", "surrogatepass") if keyed else None), value


VALUES = st.one_of(
    st.none(),
    st.binary(max_size=40),
    json_values().map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
)
KEYS = st.one_of(st.none(), st.binary(max_size=12), ANY_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
                 st.sampled_from([b"k-1", b"ok"]))
KAFKA_TIMESTAMPS = st.one_of(
    st.none(),
    st.integers(-2**63, 2**63 - 1),
    st.integers(MIN_KAFKA_TIMESTAMP_MS, MAX_KAFKA_TIMESTAMP_MS),
    st.sampled_from([MIN_KAFKA_TIMESTAMP_MS - 1, MIN_KAFKA_TIMESTAMP_MS, MAX_KAFKA_TIMESTAMP_MS,
                     MAX_KAFKA_TIMESTAMP_MS + 1, -1, 0, 2**63 - 1, -2**63]),
)
HEADERS = st.lists(st.tuples(st.one_of(ANY_TEXT, st.binary(max_size=8), st.none()),
                             st.one_of(st.binary(max_size=8), st.none(), ANY_TEXT)), max_size=3)
KEYS_AND_VALUES = st.one_of(contract_records(), contract_records(), st.tuples(KEYS, VALUES))
RECORDS = st.builds(lambda ts, kv, headers: (ts, *kv, headers), KAFKA_TIMESTAMPS, KEYS_AND_VALUES, HEADERS)


@EXAMPLES
@given(st.lists(RECORDS, min_size=1, max_size=8))
def test_every_record_comes_out_once_as_a_row_or_a_dead_letter(records):
    built = builder()
    for offset, (ts_ms, key, value, headers) in enumerate(records):
        built.add(TOPIC, 0, offset, ts_ms, key, value, headers)
    batch = built.flush()
    rows = assert_sound(batch, list(range(len(records))))
    assert batch.column("_ingested_at").cast(pa.int64()).to_pylist() == [INGESTED_AT] * len(records)
    reference = RecordValidator(SPEC)
    by_offset = sorted(zip(rows, contract_values(batch), strict=True), key=lambda r: r[0]["_kafka"]["offset"])
    for (row, values), (ts_ms, key, value, _) in zip(by_offset, records, strict=True):
        if row["_route"] is None:  # dead letters keep the raw record, and say precisely what is wrong
            assert (row["_dlq_key"], row["_dlq_value"]) == (key, value)
            assert row["_dlq_error_kind"] != "reader_failure", row["_dlq_error_detail"]
        elif row["_op"] == "upsert":  # a row holds the reference's verdict, and goes where its `size` routes it
            assert values == reference.check_row(reference.check_key(key), value)
            assert row["_route"] == ("raw.hostile_small" if row["size"] == "S" else SPEC.target.table)
        in_range = ts_ms is not None and MIN_KAFKA_TIMESTAMP_MS <= ts_ms <= MAX_KAFKA_TIMESTAMP_MS
        assert (row["_dlq_error_kind"] == "bad_kafka_timestamp") == (ts_ms is not None and not in_range)
        expected = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ts_ms) if in_range else None
        assert row["_kafka"]["timestamp"] == expected


@EXAMPLES
@given(st.lists(KEYS_AND_VALUES, min_size=1, max_size=10))
def test_the_fast_path_and_the_reference_agree_on_hostile_records(records):
    validator = RecordValidator(SPEC)
    assert validator.fast_path is not None
    for key, value in records:
        assert outcome(validator, validator.check_row, key, value) == outcome(validator, validator.check, key, value)


@pytest.mark.parametrize("moment, kind", [
    ("0001-01-01T00:00:00Z", None),
    ("0001-01-01T00:00:00-23:59", None),
    ("0001-01-01T00:00:00+00:00:01", "timestamp_out_of_range"),
    ("0001-01-01T00:30:00+01:00", "timestamp_out_of_range"),
    ("9999-12-31T23:59:59.999999Z", None),
    ("9999-12-31T00:00:00-23:59", None),
    ("9999-12-31T23:30:00-01:00", "timestamp_out_of_range"),
    ("9999-12-31T23:59:59.999999-00:00:01", "timestamp_out_of_range"),
    ("2016-12-31T23:59:60Z", "bad_timestamp"),  # a leap second: no datetime holds it
])
def test_event_times_are_kept_exactly_when_they_are_representable(moment, kind):
    built = builder()
    built.add(TOPIC, 0, 0, None, b"k", json.dumps({"id": "k", "at": moment}).encode(), [])
    [row] = assert_sound(built.flush(), [0])
    assert row["_dlq_error_kind"] == kind
    if kind is None:
        assert row["at"] == datetime.fromisoformat(moment.replace("Z", "+00:00"))
    else:
        assert moment in row["_dlq_error_detail"]


@pytest.mark.parametrize("text", ["\ud800", "a\udc00", "\u00e9\ud83d", "\ud83d\u00e9\ude00"])
@pytest.mark.parametrize("field", ["id", "label", "code", "size"])
def test_a_string_that_is_not_unicode_is_a_bad_string_in_any_string_field(field, text):
    value = json.dumps({"id": "k", field: text}).encode()  # the surrogate as a \u escape, like JSON can carry it
    built = builder()
    built.add(TOPIC, 0, 0, None, b"k", value, [])
    [row] = assert_sound(built.flush(), [0])
    assert row["_dlq_error_kind"] == "bad_string" and row["_dlq_value"] == value
    assert f"{field} holds a lone surrogate" in row["_dlq_error_detail"]
    assert "\\ud" in row["_dlq_error_detail"]  # quoted as an escape, so the detail is valid UTF-8


def test_valid_astral_characters_and_nul_are_kept():
    built = builder()
    built.add(TOPIC, 0, 0, None, b"k", json.dumps({"id": "k", "label": "\U0001F600\u0000\u00e9"}).encode(), [])
    [row] = assert_sound(built.flush(), [0])
    assert row["label"] == "\U0001F600\u0000\u00e9"


@EXAMPLES
@given(KAFKA_TIMESTAMPS)
def test_a_kafka_timestamp_outside_the_range_is_dead_lettered_with_its_raw_value(ts_ms):
    built = builder()
    built.add(TOPIC, 3, 42, ts_ms, b"k", b'{"id": "k"}', [("h", b"v")])
    [row] = assert_sound(built.flush(), [42])
    if ts_ms is None or MIN_KAFKA_TIMESTAMP_MS <= ts_ms <= MAX_KAFKA_TIMESTAMP_MS:
        assert row["_route"] == SPEC.target.table
    else:
        assert row["_dlq_error_kind"] == "bad_kafka_timestamp"
        assert row["_kafka"]["timestamp"] is None and str(ts_ms) in row["_dlq_error_detail"]
        assert row["_kafka"]["key"] == "k" and row["_dlq_headers"] == [{"key": "h", "value": b"v"}]


def test_a_batch_of_only_unrepresentable_kafka_timestamps_is_all_dead_letters():
    stamps = [2**63 - 1, -2**63, 1_763_719_200_000_000, MAX_KAFKA_TIMESTAMP_MS + 1, MIN_KAFKA_TIMESTAMP_MS - 1]
    built = builder()
    for offset, ts_ms in enumerate(stamps):
        built.add(TOPIC, 0, offset, ts_ms, b"k", b'{"id": "k"}', [])
    rows = assert_sound(built.flush(), list(range(len(stamps))))
    assert {r["_dlq_error_kind"] for r in rows} == {"bad_kafka_timestamp"}
    assert all(r["_kafka"]["timestamp"] is None for r in rows)


@EXAMPLES
@given(HEADERS)
def test_a_dead_letter_keeps_its_headers_and_says_which_it_had_to_change(headers):
    built = builder()
    built.add(TOPIC, 0, 0, None, b"k", b"not json", headers)
    [row] = assert_sound(built.flush(), [0])
    assert row["_dlq_error_kind"] == "malformed_json"
    assert len(row["_dlq_headers"]) == len(headers)
    for i, (kept, (key, value)) in enumerate(zip(row["_dlq_headers"], headers)):
        if key is None or (isinstance(key, str) and not re.search("[\ud800-\udfff]", key)):
            assert kept["key"] == key
        else:
            assert f"the key of header {i}, " in row["_dlq_error_detail"]
        assert kept["value"] == (value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value)


def test_headers_confluent_kafka_cannot_decode_are_left_out_with_a_note():
    def unreadable_headers():
        """Message.headers() of a record whose header key is b"\xff" on the wire."""
        try:
            b"\xff".decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SystemError("<method 'headers'> returned a result with an exception set") from exc

    built = builder()
    built.add(TOPIC, 0, 0, None, b"k", b"not json", unreadable_headers)
    [row] = assert_sound(built.flush(), [0])
    assert row["_dlq_error_kind"] == "malformed_json" and row["_dlq_headers"] == []
    assert "the headers could not be read (UnicodeDecodeError" in row["_dlq_error_detail"]


def test_a_real_message_with_a_header_key_that_is_not_utf8_is_dead_lettered():
    """Produced through librdkafka's C API (confluent-kafka's producer cannot send such a key) to a
    mock cluster, read back with confluent-kafka: Message.headers() raises on it. librdkafka's symbols
    are looked up through confluent-kafka's own extension module, which links it (wherever it is)."""
    message = _message_with_raw_header_keys(ctypes.CDLL(cimpl.__file__),
                                            [(b"good", b"1"), (b"\xff\xfe", b"v"), (b"after", None)])
    built = builder()
    built.add(TOPIC, message.partition(), message.offset(), None, message.key(), message.value(), message.headers)
    [row] = assert_sound(built.flush(), [message.offset()])
    assert row["_dlq_error_kind"] == "malformed_json" and row["_dlq_value"] == b"not json"
    assert row["_dlq_headers"] == [] and "can't decode byte 0xff" in row["_dlq_error_detail"]


def _message_with_raw_header_keys(lib, headers: list[tuple[bytes, bytes | None]]):
    """One confluent_kafka Message carrying `headers` byte for byte, through a librdkafka mock cluster."""
    found: list[str] = []

    class Bootstrap(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.extend(re.findall(r"bootstrap\.servers=(\S+)", record.getMessage()))

    log = logging.getLogger(f"mock-cluster-{uuid.uuid4().hex}")
    log.addHandler(Bootstrap())
    log.setLevel(logging.DEBUG)
    log.propagate = False
    cluster = confluent_kafka.Producer({"test.mock.num.brokers": 1, "debug": "mock", "logger": log})
    cluster.poll(0.5)
    assert found, "the mock cluster did not say where it listens"

    lib.rd_kafka_conf_new.restype = lib.rd_kafka_new.restype = lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t]
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_header_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t, ctypes.c_char_p,
                                        ctypes.c_ssize_t]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"bootstrap.servers", found[0].encode(), error, 512)
    producer = lib.rd_kafka_new(0, conf, error, 512)  # RD_KAFKA_PRODUCER
    raw_headers = lib.rd_kafka_headers_new(len(headers))
    for key, value in headers:
        lib.rd_kafka_header_add(raw_headers, key, len(key), value, -1 if value is None else len(value))
    value = b"not json"
    # rd_kafka_producev(rk, TOPIC, "t", PARTITION, 0, VALUE, ptr, len, HEADERS, hdrs, END)
    assert lib.rd_kafka_producev(ctypes.c_void_p(producer), ctypes.c_int(1), ctypes.c_char_p(b"t"),
                                 ctypes.c_int(3), ctypes.c_int32(0), ctypes.c_int(4), ctypes.c_char_p(value),
                                 ctypes.c_size_t(len(value)), ctypes.c_int(10), ctypes.c_void_p(raw_headers),
                                 ctypes.c_int(0)) == 0
    assert lib.rd_kafka_flush(ctypes.c_void_p(producer), 10_000) == 0
    lib.rd_kafka_destroy(ctypes.c_void_p(producer))
    consumer = confluent_kafka.Consumer({"bootstrap.servers": found[0], "group.id": "g",
                                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([confluent_kafka.TopicPartition("t", 0, 0)])

        def record():
            message = consumer.poll(0.5)  # blocks up to 0.5 s itself
            return message if message is not None and message.error() is None else None

        return wait_until(record, 20, "the mock cluster to give the record back", interval=0)
    finally:
        consumer.close()


# ---------------------------------------------------------------------------- the reader's own failures

class ExplodingValidator(RecordValidator):
    """A validator with a bug: it raises on values that start with b"boom", or hands Arrow a value
    it refuses for values that start with b"leak"."""

    def check_row(self, key_text, value):
        if value and value.startswith(b"boom"):
            raise ZeroDivisionError("boom \ud800")  # even the message is not valid UTF-8
        if value and value.startswith(b"leak"):
            return ("k", "\ud800", None, None, 2**40, None, None, None, None, None)
        return super().check_row(key_text, value)


def test_an_exception_while_decoding_is_a_reader_failure_of_that_record_only():
    built = builder(ExplodingValidator(SPEC))
    for offset, (key, value) in enumerate([(b"a", b'{"id": "a"}'), (b"b", b"boom!"), (b"c", b'{"id": "c"}')]):
        built.add(TOPIC, 1, offset, 1_763_719_200_000, key, value, [("trace", b"t")])
    rows = assert_sound(built.flush(), [0, 1, 2])
    assert [r["_route"] is not None for r in rows] == [True, False, True]
    failed = rows[1]
    assert failed["_dlq_error_kind"] == "reader_failure"
    assert failed["_dlq_error_detail"] == "the reader failed on this record: ZeroDivisionError: boom \\ud800"
    assert (failed["_dlq_key"], failed["_dlq_value"], failed["_dlq_headers"]) == \
        (b"b", b"boom!", [{"key": "trace", "value": b"t"}])


def test_a_value_arrow_refuses_costs_its_record_not_the_batch():
    built = builder(ExplodingValidator(SPEC))
    values = [b'{"id": "k"}', b"leak", b"not json", b'{"id": "k", "size": "S"}', b"leak again"] * 30
    for offset, value in enumerate(values):
        built.add(TOPIC, 0, offset, 1_763_719_200_000 + offset, b"k", value, [("trace", b"t")])
    rows = assert_sound(built.flush(), list(range(len(values))))
    kinds = [r["_dlq_error_kind"] for r in rows]
    assert kinds == [None, "reader_failure", "malformed_json", None, "reader_failure"] * 30
    leaked = rows[1]
    assert (leaked["_dlq_key"], leaked["_dlq_value"], leaked["_kafka"]["key"]) == (b"k", b"leak", "k")
    assert leaked["_kafka"]["timestamp"] == datetime(2025, 11, 21, 10, 0, 0, 1000, tzinfo=timezone.utc)
    assert leaked["_dlq_error_detail"].startswith("Arrow refused this record's values: ")
    assert "headers left out" in leaked["_dlq_error_detail"]
    assert rows[2]["_dlq_headers"] == [{"key": "trace", "value": b"t"}]  # other dead letters are untouched


def test_the_builder_refuses_an_ingestion_time_no_timestamp_column_can_hold():
    with pytest.raises(ValueError, match="ingested_at_us"):
        BatchBuilder(SPEC, RecordValidator(SPEC), (MAX_TIMESTAMP_US + 1))


def test_redecoding_keeps_kafka_timestamps_to_the_millisecond():
    # float seconds * 1000 is one millisecond off for these, among others
    stamps = [70_262_315_826_648, 138_175_930_508_076, -62_135_596_800_000, 253_402_300_799_999, -1, None]
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    dead_letters = pa.RecordBatch.from_pylist([
        {"_kafka": {"topic": TOPIC, "partition": 0, "offset": i, "key": "k",
                    "timestamp": None if ms is None else epoch + timedelta(milliseconds=ms)},
         "key": b"k", "value": b'{"id": "k"}', "headers": []} for i, ms in enumerate(stamps)],
        schema=pa.schema([("_kafka", layout.KAFKA_STRUCT), ("key", pa.binary()), ("value", pa.binary()),
                          ("headers", layout.HEADERS)]))
    [batch] = make_redecoder(SPEC, frozenset(), INGESTED_AT)(iter([dead_letters]))
    kafka = batch.column("_kafka").field("timestamp").cast(pa.int64()).to_pylist()
    assert kafka == [None if ms is None else ms * 1000 for ms in stamps]


# ---------------------------------------------------------------------------- tasks: poison and markers

class FakeError:
    def __init__(self, code: int):
        self._code = code

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return f"error {self._code}"


class FakeMessage:
    """What read_range asks of a confluent_kafka.Message."""

    def __init__(self, offset: int, value: bytes | None = b'{"id": "k"}', key: bytes | None = b"k",
                 ts: int | None = 1_763_719_200_000, headers=(), partition: int = 0, error: FakeError | None = None,
                 timestamp_error: Exception | None = None):
        self._offset, self._value, self._key, self._ts = offset, value, key, ts
        self._headers, self._partition, self._error = list(headers), partition, error
        self._timestamp_error = timestamp_error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self):
        return self._error

    def timestamp(self) -> tuple[int, int]:
        if self._timestamp_error is not None:
            raise self._timestamp_error
        return (0, -1) if self._ts is None else (1, self._ts)

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers or None


class FakeConsumer:
    """Serves `messages` of partition 0 from the assigned offset; `fail_at` makes consume() raise
    once the position reaches that offset."""

    def __init__(self, messages: list[FakeMessage], fail_at: int | None = None, failure: Exception | None = None):
        self.messages = {m.offset(): m for m in messages}
        self.position = 0
        self.fail_at, self.failure = fail_at, failure or RuntimeError("consumer lost its mind")
        self.closed = False

    def assign(self, partitions) -> None:
        self.position = partitions[0].offset

    def consume(self, num_messages: int, timeout: float) -> list:
        if self.fail_at is not None and self.position >= self.fail_at:
            raise self.failure
        out = []
        for offset in range(self.position, self.position + num_messages):
            if offset in self.messages:
                out.append(self.messages[offset])
                self.position = offset + 1
            if self.fail_at is not None and self.position >= self.fail_at:
                break
        return out

    def close(self) -> None:
        self.closed = True


def read(consumer: FakeConsumer, end: int, validator: RecordValidator | None = None, **kwargs) -> list[dict]:
    batches = list(read_range(consumer, OffsetRange(TOPIC, 0, 0, end), builder(validator), batch_rows=7,
                              stall_timeout=5, **kwargs))
    return assert_sound(pa.Table.from_batches(batches).combine_chunks().to_batches()[0], list(range(end)))


class CountingValidator(RecordValidator):
    """Counts the records it is asked to decode (each starts with its key)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.decoded = 0

    def check_key(self, key):
        self.decoded += 1
        return super().check_key(key)


@EXAMPLES
@given(records=st.lists(RECORDS, min_size=1, max_size=12), poisoned=st.sets(st.integers(0, 11), max_size=3))
def test_poisoned_records_are_dead_lettered_undecoded_and_every_offset_comes_out_once(records, poisoned):
    messages = [FakeMessage(i, value, key, ts, headers) for i, (ts, key, value, headers) in enumerate(records)]
    validator = CountingValidator(SPEC)
    reasons = {o: f"the reader failed on this record: boom {o}" for o in poisoned if o < len(records)}
    rows = read(FakeConsumer(messages), len(records), validator, poisoned=reasons)
    for row in rows:
        offset = row["_kafka"]["offset"]
        if offset in reasons:  # the reason, then what the headers needed, if anything
            assert row["_dlq_error_kind"] == "reader_failure"
            assert row["_dlq_error_detail"].startswith(reasons[offset])
            assert (row["_dlq_key"], row["_dlq_value"]) == (records[offset][1], records[offset][2])
    assert validator.decoded == sum(1 for i, (ts, *_) in enumerate(records) if i not in reasons
                                    and (ts is None or MIN_KAFKA_TIMESTAMP_MS <= ts <= MAX_KAFKA_TIMESTAMP_MS))


def test_make_reader_dead_letters_the_poisoned_records_of_each_range(monkeypatch):
    messages = [FakeMessage(i, headers=[("trace", b"%d" % i)]) for i in range(10)]
    consumer = FakeConsumer(messages)
    monkeypatch.setattr(kafka_source, "kafka_consumer", lambda conf, group, **extra: consumer)
    reader = make_reader(SPEC, {}, frozenset(), INGESTED_AT, batch_rows=4,
                         poisoned={(0, 3): "crashed the reader: SIGSEGV", (0, 42): "not in this range",
                                   (1, 5): "another partition"})
    plan = pa.RecordBatch.from_pylist([{"topic": TOPIC, "partition": 0, "start": 2, "end": 10}])
    rows = pa.Table.from_batches(list(reader(iter([plan])))).to_pylist()
    assert [r["_kafka"]["offset"] for r in rows] == list(range(2, 10))
    assert [(r["_kafka"]["offset"], r["_dlq_error_kind"], r["_dlq_error_detail"]) for r in rows if r["_route"] is None] \
        == [(3, "reader_failure", "crashed the reader: SIGSEGV")]
    assert rows[1]["_dlq_headers"] == [{"key": "trace", "value": b"3"}] and rows[1]["_dlq_value"] == b'{"id": "k"}'
    assert consumer.closed


def marker(exc: BaseException) -> tuple[str, dict[str, str]] | None:
    return errors.marker_in(str(exc))


def test_an_error_from_the_consumer_names_the_record_the_task_was_at():
    consumer = FakeConsumer([FakeMessage(i) for i in range(20)], fail_at=13)
    with pytest.raises(RecordFailureError) as info:
        read(consumer, 20)
    assert marker(info.value) == ("record-failure", {"topic": TOPIC, "partition": "0", "offset": "13"})
    assert errors.task_marker("record-failure", topic=TOPIC, partition=0, offset=13) in str(info.value)
    assert "RuntimeError: consumer lost its mind" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, errors.LakehouseError) and not errors.transient_cause(info.value)


def test_an_error_reading_a_message_names_that_message():
    messages = [FakeMessage(i) for i in range(10)]
    messages[6] = FakeMessage(6, timestamp_error=OverflowError("timestamp of 9 bytes"))
    with pytest.raises(RecordFailureError) as info:
        read(FakeConsumer(messages), 10)
    assert marker(info.value)[1] == {"topic": TOPIC, "partition": "0", "offset": "6"}
    assert "OverflowError: timestamp of 9 bytes" in str(info.value)


def test_a_fault_half_way_names_the_record_it_hit():
    def lose_the_task(point: str) -> None:
        if point == "during_read":
            raise RuntimeError("executor lost")

    with pytest.raises(RecordFailureError, match="executor lost") as info:
        read(FakeConsumer([FakeMessage(i) for i in range(10)]), 10, fault=lose_the_task)
    assert marker(info.value)[1]["offset"] == "5"


@pytest.mark.parametrize("code, transient", [(KafkaError._TRANSPORT, True), (KafkaError._FATAL, False)])
def test_an_error_of_the_kafka_client_is_a_source_error_never_a_record_failure(code, transient):
    consumer = FakeConsumer([FakeMessage(i) for i in range(10)], fail_at=4,
                            failure=KafkaException(KafkaError(code, "broker trouble")))
    with pytest.raises(SourceError) as info:
        read(consumer, 10)
    assert not isinstance(info.value, RecordFailureError)
    assert f"{TOPIC}[0]@[0,10): Kafka failed at offset 4" in str(info.value)
    if transient:
        assert isinstance(info.value, BrokerStalledError) and errors.transient_cause(info.value)
        assert marker(info.value) == ("retryable", {"why": "kafka-transient-error", "topic": TOPIC,
                                                    "partition": "0", "offset": "4"})
    else:
        assert marker(info.value) is None and not errors.transient_cause(info.value)


def test_kafka_errors_on_messages_keep_their_types():
    gone = [FakeMessage(0), FakeMessage(1, error=FakeError(KafkaError.OFFSET_OUT_OF_RANGE))]
    with pytest.raises(OffsetGapError, match="deleted from Kafka") as info:
        read(FakeConsumer(gone), 5)
    assert marker(info.value) is None
    broken = [FakeMessage(0), FakeMessage(1, error=FakeError(KafkaError._MSG_TIMED_OUT))]
    with pytest.raises(SourceError, match="error") as info:
        read(FakeConsumer(broken), 5)
    assert type(info.value) is SourceError


def test_a_stalled_broker_is_a_retryable_source_error():
    with pytest.raises(BrokerStalledError) as info:
        list(read_range(FakeConsumer([]), OffsetRange(TOPIC, 2, 100, 200), builder(), batch_rows=10,
                        stall_timeout=0))
    stalled = info.value
    assert isinstance(stalled, SourceError) and isinstance(stalled, errors.BrokerUnavailableError)
    assert isinstance(stalled, errors.RetryableError) and isinstance(stalled, errors.SourceError)
    assert "no records past offset 100" in str(stalled)
    assert marker(stalled) == ("retryable", {"why": "broker-stalled", "topic": TOPIC, "partition": "2",
                                             "offset": "100"})
    assert errors.transient_cause(RuntimeError(f"Python worker failed: {stalled}")) == "broker-stalled"


def test_kafka_source_errors_are_lakehouse_source_errors():
    assert issubclass(SourceError, errors.SourceError)
    for cls in (TopicMissingError, OffsetGapError, TopicRecreatedError):
        assert cls.__bases__ == (SourceError,)
    assert SourceError("x").exit_code == errors.EXIT_SOURCE


def test_the_bounds_are_what_python_datetime_holds():
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert epoch + timedelta(microseconds=MIN_TIMESTAMP_US) == datetime.min.replace(tzinfo=timezone.utc)
    assert epoch + timedelta(microseconds=MAX_TIMESTAMP_US) == datetime.max.replace(tzinfo=timezone.utc)
    assert MIN_KAFKA_TIMESTAMP_MS * 1000 >= MIN_TIMESTAMP_US and (MIN_KAFKA_TIMESTAMP_MS - 1) * 1000 < MIN_TIMESTAMP_US
    assert MAX_KAFKA_TIMESTAMP_MS * 1000 <= MAX_TIMESTAMP_US < (MAX_KAFKA_TIMESTAMP_MS + 1) * 1000
