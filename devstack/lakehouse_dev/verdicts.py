"""What the reader makes of a synthetic record: the synthetic streams check each record against it.

`verdict` is the dead-letter kind lakehouse.ingest's reader gives a record (its RecordValidator, in the
reader's order), None when it takes it. A stream checks SELF_TEST_RECORDS valid records and each defect kind
when it starts, and each broken record before handing it out (up to ATTEMPTS tries), so a produce report's
`bad_by_kind` is what an ingest dead-letters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lakehouse.core import config, errors
from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.reader import MAX_KAFKA_TIMESTAMP_MS, MIN_KAFKA_TIMESTAMP_MS
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.validator import RecordValidator
from lakehouse_dev.record_formats import ProduceError

# how many valid records a stream checks against the reader when it starts
SELF_TEST_RECORDS = 50
# how many tries a stream makes at a broken record the reader rejects as its kind
ATTEMPTS = 20


def verdict(validator: RecordValidator, key: bytes | None, value: bytes | None, timestamp: int | None) -> str | None:
    """The dead-letter kind the reader gives a record (lakehouse.ingest.reader.BatchBuilder.add's checks in
    its order: the Kafka timestamp, the key, the value), None when it takes it. Raises what the
    validator raises for a writer schema the contract does not take (a LakehouseError)."""
    if timestamp is not None and not MIN_KAFKA_TIMESTAMP_MS <= timestamp <= MAX_KAFKA_TIMESTAMP_MS:
        return "bad_kafka_timestamp"
    try:
        if validator.spec.is_cdc:
            validator.check_change(key, value)
        else:
            validator.check_row(validator.check_key(key), value)
    except Rejected as rejected:
        return rejected.kind
    return None


def check_valid(validator: RecordValidator, key: bytes | None, value: bytes | None, what: str, shown: Any) -> None:
    """A stream's self-test of one valid `what` (record, change event): ProduceError when the reader refuses
    the writer schema or rejects it (`shown` in the message), since the generator then lacks a rule."""
    spec = validator.spec
    try:
        refused = verdict(validator, key, value, None)
    except errors.LakehouseError as exc:
        raise ProduceError(f"{spec.path}: the reader refuses the writer schema: {exc}") from None
    if refused is not None:
        raise ProduceError(f"{spec.path}: generated a {what} the reader rejects as {refused} ({shown!r:.300}); "
                           f"the generator needs a rule for this contract")


def reader_validator(spec: PipelineSpec, platform: config.PlatformConfig | None) -> RecordValidator:
    """The reference validator `verdict` asks, with the schema registry the ingest job's driver would use."""
    registry = platform.schema_registry() if platform is not None and spec.wire_formats else None
    return RecordValidator(spec, registry=registry)


def written(spec: PipelineSpec, write: Callable[[], Any]) -> Any:
    """`write()` of a valid record; ProduceError when the writer schema cannot hold it (a folder schema of
    other types than the contract's)."""
    try:
        return write()
    except ProduceError:
        raise
    except Exception as exc:  # noqa: BLE001 - fastavro's and protobuf's errors for a value the schema refuses
        raise ProduceError(f"{spec.path}: a valid record does not fit the writer schema: {type(exc).__name__}: "
                           f"{str(exc)[:300]}; the folder's schema and the contract disagree") from None


def attempts_failed(spec: PipelineSpec, kind: str, last: str | None) -> ProduceError:
    """The error for a defect `kind` no try made the reader reject as `kind` (`last`: its last verdict)."""
    return ProduceError(f"{spec.path}: could not make a {kind} record that the reader rejects as {kind} "
                        f"(in {ATTEMPTS} attempts; the last was {'accepted' if last is None else last!r}); "
                        f"the generator needs a rule for this contract")
