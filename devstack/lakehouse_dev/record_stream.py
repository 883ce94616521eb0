"""The records of one append or upsert pipeline, valid and broken on purpose, in the spec's formats.

A `RecordStream` writes lakehouse_dev.record_factory's valid records with the spec's value and key writers
(lakehouse_dev.record_formats) and, with `bad_ratio` > 0, breaks about that share of them, one defect per
record, the kinds the spec can carry taken in turn (lakehouse_dev.defects), each checked against the
reader before it is handed out (lakehouse_dev.verdicts). Each record is a `SyntheticRecord`, as
lakehouse_dev.change_streams' Debezium streams hand out too; a broken one carries a `fault` header naming
its kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from random import Random

from lakehouse.core import config
from lakehouse.core.spec import PipelineSpec
from lakehouse_dev.defects import FAULT_HEADER, FIELD_KINDS, FORMAT_KINDS, MAX_SENDABLE_BYTES, FieldPath, RecordBreaker
from lakehouse_dev.record_factory import RecordFactory
from lakehouse_dev.record_formats import CONTENT_TYPES, ProduceError, key_writer, value_writer
from lakehouse_dev.verdicts import (
    ATTEMPTS,
    SELF_TEST_RECORDS,
    attempts_failed,
    check_valid,
    reader_validator,
    verdict,
    written,
)

SOURCE_HEADER = ("source", b"lakehouse-produce")


@dataclass(frozen=True)
class SyntheticRecord:
    """One record to send: its Kafka key, value, headers and timestamp, and the defect it carries."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    kind: str | None = None  # the defect, None for a valid record
    timestamp: int | None = None  # the Kafka timestamp (ms) to send; None: the producer's clock


class RecordStream:
    """The records of one (append or upsert) spec in its formats: valid ones, and broken ones of the kinds
    the spec can carry, each checked against the reader before it is handed out.

    The kinds (`kinds`, an order of BAD_KINDS) and the fields each may break are found when the stream is
    made: a few records of each are checked against the reader, and what the value's writer schema
    cannot carry (a wrong type in a typed Avro record) is left out. Raises ProduceError when the
    contract cannot be generated, a valid record is refused or is larger than source.max_value_bytes,
    or the writer schemas cannot be found or registered.
    """

    def __init__(self, spec: PipelineSpec, rng: Random, platform: config.PlatformConfig | None = None,
                 now: Callable[[], datetime] | None = None):
        self.spec = spec
        self.rng = rng
        self.factory = RecordFactory(spec, rng, now=now)
        self.breaker = RecordBreaker(self.factory)
        key_fields = (spec.contract.field(spec.source.key_field),) if spec.source.key_field else ()
        self.key_names = tuple(f.name for f in key_fields)
        self.values = value_writer(spec, platform, key_names=self.key_names)
        self.keys = key_writer(spec, platform, key_fields)
        self.validator = reader_validator(spec, platform)
        self.content_type = CONTENT_TYPES[self.values.fmt]
        self.paths: dict[str, list[FieldPath | None]] = {}
        self.kinds = self._self_test()

    def key_of(self, record: dict) -> bytes | None:
        if self.keys is None or any(record.get(name) is None for name in self.key_names):
            return None
        return self.keys.encode({name: record[name] for name in self.key_names})

    def records(self, count: int, bad_ratio: float) -> Iterator[SyntheticRecord]:
        turn = 0
        for _ in range(count):
            headers = [SOURCE_HEADER, ("trace_id", uuid.UUID(int=self.rng.getrandbits(128), version=4).hex.encode()),
                       ("content-type", self.content_type)]
            if bad_ratio and self.kinds and self.rng.random() < bad_ratio:
                kind = self.kinds[turn % len(self.kinds)]
                turn += 1
                key, value, timestamp = self.broken(kind)
                yield SyntheticRecord(key, value, headers + [(FAULT_HEADER, kind.encode())], kind, timestamp)
            else:
                record = self.factory.valid()
                yield SyntheticRecord(self.key_of(record), self.values.encode(record), headers, None)

    def broken(self, kind: str) -> tuple[bytes | None, bytes | None, int | None]:
        """Key, value and Kafka timestamp of a record the reader rejects as `kind`; ProduceError when none
        comes out in ATTEMPTS tries."""
        last = None
        for _ in range(ATTEMPTS):
            made = self._attempt(kind, self.rng.choice(self.paths[kind]))
            if made is not None:
                last = verdict(self.validator, *made)
                if last == kind:
                    return made
        raise attempts_failed(self.spec, kind, last)

    def _attempt(self, kind: str, path: FieldPath | None) -> tuple[bytes | None, bytes | None, int | None] | None:
        """One try at a record broken as `kind` (at `path`), unchecked; None when its formats cannot write it."""
        record = self.factory.valid()
        key = self.key_of(record)
        try:
            if kind in self.values.OWN_KINDS:
                return key, self.values.broken(kind, record, self.rng), None
            if kind == "null_value":
                return key, None, None
            if kind == "null_key":
                return None, self.values.encode(record), None
            if kind == "bad_key":
                if key is None:
                    return None
                own = self.keys.OWN_KINDS[0] if self.keys.OWN_KINDS else kind
                key_record = record if self.keys.fmt == "string" else {n: record[n] for n in self.key_names}
                return self.keys.broken(own, key_record, self.rng), self.values.encode(record), None
            if kind == "bad_kafka_timestamp":
                return key, self.values.encode(record), self.breaker.kafka_timestamp()
            if kind == "key_mismatch":  # the key of another entity
                if key is None:
                    return None
                other = {name: self.factory.value(self.factory.spec.contract.field(name)) for name in self.key_names}
                return self.key_of(other), self.values.encode(record), None
            self.breaker.corrupt(kind, record, path)
            return key, self.values.encode(record), None
        except Exception:  # noqa: BLE001 - the writer schema cannot hold this defect (fastavro, protobuf errors)
            return None

    def _self_test(self) -> tuple[str, ...]:
        """Check a few valid records and each defect kind against the reader, on a copy of the state;
        returns the kinds this spec can carry (keeping, per kind, the fields that carry it)."""
        state = self.factory.state()
        try:
            for _ in range(SELF_TEST_RECORDS):
                self._check_valid(self.factory.valid())
            kinds = []
            for kind in FORMAT_KINDS[self.values.fmt]:
                if kind == "oversize" and self.spec.source.max_value_bytes + 1024 >= MAX_SENDABLE_BYTES:
                    continue  # Kafka itself would refuse it
                candidates = self.breaker.paths(kind) if kind in FIELD_KINDS else [None]
                kept = [p for p in candidates if any(self._carries(kind, p) for _ in range(3))]
                if kept:
                    self.paths[kind] = kept
                    kinds.append(kind)
            return tuple(kinds)
        finally:
            self.factory.restore(state)

    def _check_valid(self, record: dict) -> None:
        """ProduceError unless valid `record` fits the writer schema and source.max_value_bytes and the reader
        takes it."""
        key, value = written(self.spec, lambda: (self.key_of(record), self.values.encode(record)))
        limit = self.spec.source.max_value_bytes
        if len(value) > limit:
            raise ProduceError(f"{self.spec.path}: source.max_value_bytes is {limit} "
                               f"but a valid record takes {len(value)} bytes")
        check_valid(self.validator, key, value, "record", record)

    def _carries(self, kind: str, path: FieldPath | None) -> bool:
        made = self._attempt(kind, path)
        return made is not None and verdict(self.validator, *made) == kind
