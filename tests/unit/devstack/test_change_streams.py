"""`lakehouse produce` for a `target.mode: cdc` pipeline: a Debezium change stream as the PostgreSQL connector
writes it (a snapshot, then transactions of creates, updates and deletes with their tombstones), in both
forms of Kafka Connect's JSON converter and as the Avro converter writes it; its summary is exactly what the
reader's verdicts, applied in order, leave in the table."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.devstack.test_synthesis import verdicts

from lakehouse.core import config, errors, schemas
from lakehouse.ingest.schema_store import parse_schema
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev import change_streams
from lakehouse_dev.record_formats import ProduceError
from lakehouse_dev.synthesis import synthesize

FIELDS = [{"name": "id", "type": "long", "required": True},
          {"name": "sku", "type": "string", "required": True, "pattern": "^[A-Z]{3}-[0-9]{4}$"},
          {"name": "email", "type": "string"},
          {"name": "price", "type": "decimal(10,2)", "min": 0},
          {"name": "status", "type": "string", "required": True, "enum": ["active", "blocked"]},
          {"name": "seen_at", "type": "timestamp"},
          {"name": "updated_at", "type": "timestamp", "unit": "us", "required": True}]
SOURCE_FIELDS = ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us", "ts_ns", "schema",
                 "table", "txId", "lsn", "xmin"]


def cdc_spec(make_spec, value_format: str = "json", **source):
    return make_spec(fields=FIELDS, mode="cdc", table_key=["id"], partition_by=None, publish={"view": None},
                     source={"topic": f"shop.public.accounts_{uuid.uuid4().hex[:6]}", "value_format": value_format,
                             "key": {"field": None}, **source})


def avro_cdc_spec(make_spec, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", f"mock://cdc-{uuid.uuid4().hex[:8]}")
    return cdc_spec(make_spec, "avro"), config.load(fresh=True)


def events(records) -> list[tuple[dict | None, dict | None]]:
    """(key, envelope) of each valid JSON record, Connect's {"schema", "payload"} unwrapped."""
    def unwrap(raw):
        if raw is None:
            return None
        doc = json.loads(raw)
        return doc["payload"] if set(doc) == {"schema", "payload"} else doc
    return [(unwrap(r.key), unwrap(r.value)) for r in records if r.kind is None]


def applied(spec, records, validator=None) -> tuple[dict, set]:
    """The table the reader's verdicts leave: every valid change applied in order; (rows by key, deleted keys)."""
    validator = validator or RecordValidator(spec)
    table, deleted = {}, set()
    for r in records:
        if r.kind is not None:
            continue
        _, row, op = validator.check_change(r.key, r.value)
        key = (row[0],)
        if op == "delete":
            table.pop(key, None)
            deleted.add(key)
        else:
            table[key] = dict(zip(spec.contract.names, row[:-1]))
            deleted.discard(key)
    return table, deleted


def test_a_change_stream_starts_with_a_snapshot_then_streams_transactions_with_tombstones(make_spec):
    spec = cdc_spec(make_spec)
    records = list(synthesize(spec, 400, seed=1))
    changes = events(records)
    ops = [e["op"] if e is not None else "tombstone" for _, e in changes]
    snapshot = ops[:80]
    assert snapshot == ["r"] * 80 and "r" not in ops[80:]  # count // 5 rows, read first
    assert [e["source"]["snapshot"] for _, e in changes[:80]] == ["true"] * 79 + ["last"]
    assert {e["source"]["lsn"] for _, e in changes[:80]} == {changes[0][1]["source"]["lsn"]}  # one snapshot position
    assert {"c", "u", "d"} <= set(ops[80:])
    latest: dict[int, dict] = {}  # the source row of each id, as the stream last showed it
    for i, op in enumerate(ops):
        key, event = changes[i]
        if op in ("u", "d"):  # the row before is the one the stream last showed for the key
            assert event["before"] == latest[key["id"]]
        if op == "d":  # ... no row after, then its tombstone under the same key
            assert event["after"] is None and ops[i + 1] == "tombstone" and changes[i + 1][0] == key
            del latest[key["id"]]
        elif op in ("r", "c", "u"):
            assert event["after"]["id"] == key["id"] and (op == "u") == (key["id"] in latest)
            latest[key["id"]] = event["after"]
    streamed = [e for _, e in changes[80:] if e is not None]
    lsns = [e["source"]["lsn"] for e in streamed]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns) and lsns[0] > changes[0][1]["source"]["lsn"]
    assert all(e["source"]["snapshot"] == "false" for e in streamed)
    txs = Counter(e["source"]["txId"] for e in streamed)
    assert max(txs.values()) > 1  # transactions of several changes share an id and a commit time


def test_each_event_is_debeziums_envelope_with_the_postgresql_source_block(make_spec):
    spec = cdc_spec(make_spec)
    key, event = events(synthesize(spec, 50, seed=2))[10]
    assert list(event) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    source = event["source"]
    assert list(source) == SOURCE_FIELDS
    assert (source["version"], source["connector"], source["schema"]) == ("2.7.0.Final", "postgresql", "public")
    server, _, table = spec.source.topic.split(".")
    assert (source["name"], source["db"], source["table"]) == (server, server, table)
    assert json.loads(source["sequence"])[-1] == str(source["lsn"])
    assert event["ts_ms"] >= source["ts_ms"] and event["ts_us"] == event["ts_ms"] * 1000
    assert list(event["after"]) == [f["name"] for f in FIELDS]  # every column, null or not
    assert isinstance(event["after"]["price"], (str, type(None)))  # decimal.handling.mode=string
    assert event["after"]["seen_at"] is None or event["after"]["seen_at"].endswith("Z")  # ZonedTimestamp
    assert key == {"id": event["after"]["id"]}


def test_with_connect_schemas_keys_and_values_carry_the_converters_schema(make_spec):
    spec = cdc_spec(make_spec)
    records = list(synthesize(spec, 30, seed=3, connect_schemas=True))
    value, key = json.loads(records[0].value), json.loads(records[0].key)
    assert set(value) == set(key) == {"schema", "payload"}
    envelope = value["schema"]
    prefix = spec.source.topic
    assert (envelope["name"], envelope["type"]) == (f"{prefix}.Envelope", "struct")
    by_field = {f["field"]: f for f in envelope["fields"]}
    assert list(by_field) == ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
    assert by_field["after"]["name"] == f"{prefix}.Value" and by_field["after"]["optional"] is True
    assert by_field["source"]["name"] == "io.debezium.connector.postgresql.Source"
    columns = {f["field"]: f for f in by_field["after"]["fields"]}
    assert columns["updated_at"]["name"] == "io.debezium.time.MicroTimestamp" and columns["id"]["type"] == "int64"
    assert columns["status"]["parameters"] == {"allowed": "active,blocked"}
    assert key["schema"]["name"] == f"{prefix}.Key" and key["payload"] == {"id": value["payload"]["after"]["id"]}
    assert verdicts(spec, records) == [None] * len(records)


def test_the_avro_envelope_is_the_avro_converters_and_yields_the_contract(make_spec, monkeypatch):
    spec, platform = avro_cdc_spec(make_spec, monkeypatch)
    stream = change_streams.ChangeStream(spec, __import__("random").Random(4), platform)
    envelope = json.loads(stream.values.text)
    assert (envelope["type"], envelope["name"], envelope["namespace"]) == ("record", "Envelope", spec.source.topic)
    by_name = {f["name"]: f["type"] for f in envelope["fields"]}
    assert by_name["before"][0] == "null" and by_name["before"][1]["name"] == "Value"
    assert by_name["after"] == ["null", f"{spec.source.topic}.Value"]
    assert by_name["source"]["connect.name"] == "io.debezium.connector.postgresql.Source"
    assert by_name["op"] == "string" and by_name["ts_ms"] == ["null", "long"]
    parse_schema(stream.values.text)
    price = next(f for f in by_name["before"][1]["fields"] if f["name"] == "price")["type"][1]
    assert (price["logicalType"], price["precision"], price["scale"]) == ("decimal", 10, 2)  # decimal.handling.mode=precise
    derived = schemas.derive("AVRO", stream.values.text, "debezium")
    assert [(f.name, f.type_text, f.unit) for f in derived] == [(f.name, f.type_text, f.unit) for f in spec.contract.fields]


@pytest.mark.parametrize("value_format", ["json", "avro", "protobuf", "json_schema"])
def test_every_broken_event_is_the_readers_kind_and_the_summary_is_what_the_valid_ones_leave(
        make_spec, monkeypatch, value_format):
    spec, platform = avro_cdc_spec(make_spec, monkeypatch) if value_format == "avro" else (None, None)
    if value_format != "avro":
        monkeypatch.setenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", f"mock://cdc-{uuid.uuid4().hex[:8]}")
        platform = config.load(fresh=True)
        spec = cdc_spec(make_spec, value_format)
    from lakehouse_dev import synthesis
    from lakehouse_dev.verdicts import verdict

    stream = synthesis.record_source(spec, 7, None, platform, False)
    records = list(stream.records(1200, 0.25))
    validator = RecordValidator(spec, registry=platform.schema_registry())
    assert [verdict(validator, r.key, r.value, r.timestamp) for r in records] == [r.kind for r in records]
    kinds = {r.kind for r in records if r.kind}
    assert {"bad_envelope", "unsupported_change", "key_mismatch", "null_key", "bad_key", "bad_kafka_timestamp",
            "bad_enum", "out_of_range", "pattern_mismatch"} <= kinds
    table, deleted = applied(spec, records, validator)
    summary = stream.summary()
    assert summary.final_rows == table
    assert summary.deleted_keys == deleted - set(table) and summary.deleted_keys
    assert summary.snapshot == 240 and sum(summary.by_op.values()) == 1200
    assert summary.by_op["d"] == summary.by_op["tombstone"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(0, 300), bad_ratio=st.sampled_from([0.0, 0.1, 0.5]),
       connect_schemas=st.booleans())
def test_any_stream_ends_in_the_summary_and_keeps_each_keys_events_in_order(make_spec, seed, count, bad_ratio,
                                                                          connect_schemas):
    spec = cdc_spec(make_spec)
    from lakehouse_dev import synthesis

    stream = synthesis.record_source(spec, seed, None, None, connect_schemas)
    records = list(stream.records(count, bad_ratio))
    assert len(records) == count
    assert verdicts(spec, records) == [r.kind for r in records]
    table, deleted = applied(spec, records)
    assert stream.summary().final_rows == table and stream.summary().deleted_keys == deleted - set(table)
    # one key, one byte string: Kafka's partitioner keeps a key's events on one partition, in order
    by_id: dict[int, set[bytes]] = {}
    for r in records:
        if r.kind is None:
            by_id.setdefault(RecordValidator(spec).check_change(r.key, r.value)[1][0], set()).add(r.key)
    assert all(len(keys) == 1 for keys in by_id.values())


def test_connect_schemas_belong_to_json_change_streams(make_spec, monkeypatch):
    spec, platform = avro_cdc_spec(make_spec, monkeypatch)
    with pytest.raises(errors.ConfigurationError, match="JSON converter"):
        synthesize(spec, 1, platform=platform, connect_schemas=True)
    with pytest.raises(errors.ConfigurationError, match="not cdc"):
        synthesize(make_spec(), 1, connect_schemas=True)


def test_a_change_stream_without_writer_schemas_is_refused_naming_both_sources(make_spec, monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_SCHEMA_REGISTRY_URL", raising=False)
    spec = cdc_spec(make_spec, "avro")
    with pytest.raises(ProduceError, match="source.schemas.*LAKEHOUSE_SCHEMA_REGISTRY_URL"):
        synthesize(spec, 1, platform=config.load(fresh=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=200), st.integers(0, 2**32))
def test_keyed_rows_are_a_dict_that_draws_any_present_key(steps, seed):
    """KeyedRows behaves as a dict under sets and pops, and its draw is always a present key (each of them
    reachable): the stream's O(1) pick of the row an update or delete changes."""
    rng = __import__("random").Random(seed)
    rows, reference = change_streams.KeyedRows(), {}
    for add, key in steps:
        if add or not reference:
            rows[key] = reference[key] = (key, len(reference))
        else:
            drawn = rows.choice(rng)
            assert drawn in reference
            assert rows.pop(drawn) == reference.pop(drawn)
        assert dict(rows) == reference
    if reference:
        drawn = {rows.choice(rng) for _ in range(50 * len(reference))}
        assert drawn == set(reference)
    copy = change_streams.KeyedRows(rows)
    assert dict(copy) == reference and (not reference or copy.choice(rng) in reference)


def test_the_share_of_updates_and_deletes_is_the_streams_setting(make_spec):
    spec = cdc_spec(make_spec)
    stream = change_streams.ChangeStream(spec, __import__("random").Random(5), config.load(), updates=0.2,
                                         deletes=0.05)
    records = list(stream.records(6_000, bad_ratio=0.0))
    ops = stream.by_op
    streamed = ops.get("c", 0) + ops.get("u", 0) + ops.get("d", 0)
    assert len(records) == 6_000 and ops.get("tombstone") == ops.get("d")
    assert abs(ops["u"] / streamed - 0.2) < 0.03 and abs(ops["d"] / streamed - 0.05) < 0.015
    summary = stream.summary()
    assert len(summary.final_rows) == ops.get("r", 0) + ops["c"] - ops["d"]  # every delete removed a live row
    with pytest.raises(ValueError, match="must be shares"):
        change_streams.ChangeStream(spec, __import__("random").Random(5), config.load(), updates=0.9, deletes=0.2)
