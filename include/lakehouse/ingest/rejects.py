"""Why a record cannot enter its table: `Rejected(kind, detail)`, raised by the decoders and the contract
checks and turned into a dead-letter row by the reader, and the kinds it may carry (ERROR_KINDS), which
the dead-letter table's error_kind column holds.
"""

from __future__ import annotations

from typing import Any

# The reasons a record can be dead-lettered; stored in the dead-letter table's error_kind.
ERROR_KINDS = (
    "malformed_json",      # value is not parseable JSON
    "bad_wire_format",     # wire formats: no magic byte 0 and 4-byte schema id before the payload
    "unknown_schema",      # wire formats: the writer schema id is in neither the schema folder nor the registry
    "malformed_avro",      # Avro: the payload does not decode with its writer schema
    "malformed_protobuf",  # Protobuf: the payload (or its message indexes) does not decode with its writer schema
    "not_utf8",            # value bytes are not UTF-8
    "not_an_object",       # JSON, but not an object
    "missing_required",    # a required field is absent or null
    "wrong_type",          # a field has the wrong JSON type
    "bad_enum",            # value outside the field's enum
    "out_of_range",        # number outside min/max or the type's bounds, or not finite
    "pattern_mismatch",    # string does not match the field's pattern
    "too_long",            # string longer than max_length
    "bad_timestamp",       # not ISO-8601 with a UTC offset
    "bad_date",            # not an ISO-8601 date
    "bad_uuid",            # not a UUID in its 8-4-4-4-12 text form
    "oversize",            # value larger than source.max_value_bytes
    "null_value",          # tombstone where the pipeline has no use for one
    "null_key",            # no key where the spec requires one
    "bad_key",             # key bytes are not UTF-8
    "key_mismatch",        # key differs from the key field in the value
    "schema_incompatible", # carries a field the table cannot take under the quarantine policy
    "bad_envelope",        # CDC: not a change event (no op, an unknown op, no `after` row for an insert/update)
    "unsupported_change",  # CDC: a truncate (op t) or a message (op m): no row to apply
    "bad_string",          # a string field holds text that is not Unicode (an escaped lone surrogate "\ud800")
    "timestamp_out_of_range",  # ISO-8601 with an offset, but outside TIMESTAMP_RANGE once in UTC
    "bad_kafka_timestamp",     # the record's Kafka timestamp is outside TIMESTAMP_RANGE (set by the reader)
    "reader_failure",      # the reader failed on this record (a bug, a library error) or the driver marked
                           # it after a task failed on it; error_detail names the exception
)


class Rejected(Exception):
    """A record that cannot enter the table; `kind` is one of ERROR_KINDS."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def show(value: Any) -> str:
    """`value` as a reject's detail quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."



def quarantined(name: str) -> Rejected:
    """The verdict on a value of field `name` while the contract's change of it is quarantined
    (schema_policy.on_incompatible: quarantine)."""
    return Rejected("schema_incompatible",
                    f"{name} changed incompatibly in the contract; quarantined until the table is fixed")
