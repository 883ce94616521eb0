"""Verification and the publish gate on every pipeline mode and every value and key format (end to end).

Each case produces synthetic records in its formats (`lakehouse_dev.synthesis.synthesize`: valid ones and
every defect the formats can carry, so dead letters too), ingests them on the real broker and Spark, and
then asks the question a reader's publication depends on: does `lakehouse verify` pass on the correct
tables, and does the publish gate take exactly the verified snapshots? Then the tables are damaged as a
careless hand would (a row deleted, a row duplicated, for tables kept by key a deleted key brought back)
and verification must fail naming each damage, and the gate must refuse the damaged snapshots.

The modes: append (one table), fan-out (rows routed to two tables), upsert keyed by the Kafka key (text
keys, and JSON, Avro, Protobuf and JSON Schema record keys, with the value formats spread over them) and
change streams (Debezium's JSON with and without Kafka Connect's schemas, and Avro).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from e2e import send, table
from pyiceberg.expressions import And, EqualTo
from tests.unit.ingest.test_cdc import avro_cdc_spec
from tests.unit.devstack.test_synthesis_formats import in_format

from lakehouse.audit import keys as verify_keys
from lakehouse.audit import verify, verify_model
from lakehouse.core.errors import UnverifiedError
from lakehouse.core.topics import ensure_topics
from lakehouse.ingest.job import IngestJob
from lakehouse.wap import publish
from lakehouse_dev.synthesis import synthesize

pytestmark = pytest.mark.slow

CDC_FIELDS = [{"name": "id", "type": "long", "required": True},
              {"name": "sku", "type": "string", "required": True},
              {"name": "on_hand", "type": "int", "required": True, "min": 0},
              {"name": "updated_at", "type": "timestamp", "unit": "us", "required": True}]


@dataclass(frozen=True)
class Case:
    mode: str                    # append | fanout | upsert | cdc
    value_format: str = "json"
    key_format: str = "string"
    connect_schemas: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "-".join(filter(None, (self.mode, self.value_format, self.key_format,
                                      "connect" if self.connect_schemas else "")))


CASES = [
    Case("append"),
    Case("fanout"),
    Case("upsert"),
    Case("upsert", "avro", "json"),
    Case("upsert", "protobuf", "avro"),
    Case("upsert", "json_schema", "protobuf"),
    Case("upsert", "json", "json_schema"),
    Case("cdc", "json", "json"),
    Case("cdc", "json", "json", connect_schemas=True),
    Case("cdc", "avro", "avro"),
]


def case_spec(make_spec, case: Case):
    """The spec of `case`, its writer schemas in a folder beside it (no registry)."""
    if case.mode == "cdc" and case.value_format == "avro":
        return avro_cdc_spec(make_spec, source={"partitions": 2})  # key and envelope schemas in the folder
    if case.mode == "cdc":
        return make_spec(fields=CDC_FIELDS, mode="cdc", table_key=["id"], partition_by=None, partitions=2,
                         source={"value_format": case.value_format, "key": {"field": None}})
    if case.mode == "fanout":
        return make_spec(partitions=2, fanout={"field": "status", "routes": {"cancelled": "raw.orders_{suffix}_x"}})
    if case.mode == "append":
        return make_spec(partitions=2)
    return in_format(make_spec, case.value_format, key_format=None if case.key_format == "string" else case.key_format,
                     mode="upsert", table_key=["payment_id"], partitions=2)


def produced(spec, case: Case, platform) -> list:
    """Synthetic records of the case (some broken), sent to the topic; for upsert also tombstones of a few
    keys the records wrote, and a later record of one of them (the key comes back)."""
    records = list(synthesize(spec, 240, bad_ratio=0.1, seed=7, platform=platform,
                              connect_schemas=case.connect_schemas))
    pairs = [(r.key, r.value) for r in records]
    if case.mode == "upsert":
        valid = [r for r in records if r.kind is None]
        pairs += [(r.key, None) for r in valid[:3]] + [(valid[0].key, valid[0].value)]
    send(platform, spec.source.topic, pairs)
    return records


def verified(spec, platform) -> verify_model.Verification:
    return verify.verify(spec, platform, progress=lambda line: None)


def gate(spec, platform, spark) -> dict[str, int]:
    """Publish the heads of the pipeline's data tables through the gate that requires a verification."""
    heads = {name: table(platform, spec, name).current_snapshot().snapshot_id for name in spec.target.tables}
    publish.publish(spec, heads, platform, spark_factory=lambda: spark, require_verified=True)
    return heads


def deleted_key(spec, platform) -> tuple[str, int, int] | None:
    """(key text, partition, offset) of a key whose delete the tombstone ledger holds (no row holds the key)."""
    ledger = table(platform, spec, spec.tombstone_table).scan().to_arrow()
    if not ledger.num_rows:
        return None
    kafka = ledger.column("_kafka")
    keys = verify_keys.key_text([ledger.column(k) for k in spec.target.key]).to_pylist()
    return keys[0], pc.struct_field(kafka, "partition")[0].as_py(), pc.struct_field(kafka, "offset")[0].as_py()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verify_and_the_publish_gate_pass_correct_tables_and_name_each_damage(case, platform, make_spec, spark):
    spec = case_spec(make_spec, case)
    ensure_topics([spec], platform)
    records = produced(spec, case, platform)
    IngestJob(spec, platform, spark).run_once()

    first = verified(spec, platform)
    assert first.ok, first.summary()
    assert first.findings.offsets >= len(records) and first.findings.rows > 0
    keyed = spec.target.mode == "upsert"
    if keyed:
        assert first.keys_checked > 0
    published = gate(spec, platform, spark)

    # the damage, on the default table: a row deleted and a row duplicated
    data = table(platform, spec, spec.target.table)
    rows = data.scan().to_arrow()
    kafka = rows.column("_kafka")
    victim, twin = ((pc.struct_field(kafka, "partition")[i].as_py(), pc.struct_field(kafka, "offset")[i].as_py())
                    for i in (0, 1))
    spark.sql(f"DELETE FROM {spec.qualified(spec.target.table)} "
              f"WHERE _kafka.partition = {victim[0]} AND _kafka.offset = {victim[1]}")
    data = data.refresh()
    data.append(data.scan(row_filter=And(EqualTo("_kafka.partition", twin[0]),
                                         EqualTo("_kafka.offset", twin[1]))).to_arrow())
    revived = deleted_key(spec, platform) if keyed else None
    if revived is not None:  # a deleted key's row comes back: another row's values under that key, at its delete
        key, p, o = revived
        row, key_column = rows.slice(2, 1), spec.target.key[0]
        typed = pa.array([key], pa.string()).cast(row.schema.field(key_column).type)
        row = row.set_column(row.schema.get_field_index(key_column), key_column, typed)
        k = row.column("_kafka").combine_chunks()
        row = row.set_column(row.schema.get_field_index("_kafka"), "_kafka", pa.StructArray.from_arrays(
            [k.field("topic"), pa.array([p], pa.int32()), pa.array([o], pa.int64()), k.field("timestamp"),
             k.field("key")], fields=list(k.type)))
        data.refresh().append(row)

    found = verified(spec, platform)
    assert not found.ok
    kinds = {(p.kind, p.partition, p.offset) for p in found.findings.problems}
    # a key's row deleted: the key's newest record is neither its row nor a dead letter (keyed tables); an
    # offset Kafka holds that no table holds (append tables)
    assert ("missing", *victim) in kinds, found.summary()
    assert ("duplicated", *twin) in kinds, found.summary()
    if keyed:
        assert revived is not None  # every keyed case deletes keys
        stale = {(p.kind, p.partition, p.offset) for p in found.findings.problems if p.key == revived[0]}
        assert ("stale", *revived[1:]) in stale, found.summary()  # a row of a key its newest record deleted
    heads = {name: table(platform, spec, name).current_snapshot().snapshot_id for name in spec.target.tables}
    with pytest.raises(UnverifiedError):
        publish.publish(spec, heads, platform, spark_factory=lambda: spark, require_verified=True)
    assert {name: publish.published_head(table(platform, spec, name), spec.publish.branch)
            for name in published} == published  # readers still see the verified snapshots
    json.dumps(found.to_json())  # the report serialises (the CLI's --json and the event)
