"""Synthetic records for any pipeline without Kafka: the records `lakehouse produce` sends, for tests and benches.

`synthesize(spec, count, bad_ratio, seed, ...)` yields `count` SyntheticRecords, about `bad_ratio` of them
broken on purpose, reproducible from `seed`: an append or upsert pipeline's from a RecordStream
(lakehouse_dev.record_stream), a `target.mode: cdc` pipeline's Debezium change stream from a ChangeStream
(lakehouse_dev.change_streams). `record_source` is that choice, for callers that want the stream itself
(lakehouse_dev.produce narrows its kinds to what the topic keeps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from random import Random

from lakehouse.core import config, errors
from lakehouse.core.spec import PipelineSpec
from lakehouse_dev.change_streams import ChangeStream
from lakehouse_dev.record_stream import RecordStream, SyntheticRecord


def check_arguments(count: int, bad_ratio: float) -> None:
    """ValueError for a count below 0 or a share of broken records outside [0, 1]."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 0.0 <= bad_ratio <= 1.0:
        raise ValueError(f"bad_ratio must be between 0 and 1, got {bad_ratio}")


def record_source(spec: PipelineSpec, seed: int | None, now: Callable[[], datetime] | None,
                  platform: config.PlatformConfig | None, connect_schemas: bool) -> RecordStream | ChangeStream:
    """The record source of `spec`: a RecordStream, or for a change stream (target.mode cdc) a ChangeStream."""
    if platform is None and spec.wire_formats:
        platform = config.load()
    rng = Random(seed)
    if spec.source.envelope is not None:
        return ChangeStream(spec, rng, platform, now=now, connect_schemas=connect_schemas)
    if connect_schemas:
        raise errors.ConfigurationError(f"Connect schemas (schemas.enable=true) belong to change streams; pipeline "
                                        f"{spec.name!r} is in target.mode {spec.target.mode}, not cdc")
    return RecordStream(spec, rng, platform, now=now)


def synthesize(spec: PipelineSpec, count: int, bad_ratio: float = 0.0, seed: int | None = None,
               now: Callable[[], datetime] | None = None, platform: config.PlatformConfig | None = None,
               connect_schemas: bool = False) -> Iterator[SyntheticRecord]:
    """The records `produce` would send, without Kafka: `count` of them, about `bad_ratio` broken.

    Each record is broken with probability `bad_ratio` (drawn from the seeded RNG); broken records
    take the kinds the spec can carry in turn. `connect_schemas` writes a change stream's JSON keys and
    values with their Kafka Connect schema (schemas.enable=true). Raises, before yielding anything,
    ValueError for a count below 0 or a ratio outside [0, 1], and ProduceError when the contract cannot
    be generated or the writer schemas cannot be found.
    """
    check_arguments(count, bad_ratio)
    return record_source(spec, seed, now, platform, connect_schemas).records(count, bad_ratio)
