"""Value decoders: what one is (`Decoder`, bytes to a mapping of field name to JSON-like values), and
the plain JSON one (`JsonDecoder`), the reference the contract checks and the JSON fast path are
defined against. The wire formats' decoders (Avro, Protobuf, JSON Schema) are lakehouse.ingest.wire_decoders'.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal, DecimalException
from typing import Protocol

from lakehouse.core.spec import PipelineSpec
from lakehouse.ingest.rejects import Rejected


class Decoder(Protocol):
    """Turns value bytes into a mapping of field name to JSON-like values."""

    def decode(self, value: bytes) -> dict: ...


def _reject_constant(name: str) -> float:
    raise Rejected("out_of_range", f"{name} is not a finite number")


class JsonDecoder:
    """Plain JSON values. With `decimals` (a contract with decimal fields), JSON numbers with a fraction
    or an exponent are read exactly (Decimal), so that a decimal column gets the digits that were sent."""

    def __init__(self, decimals: bool = False):
        self._decoder = json.JSONDecoder(parse_constant=_reject_constant, parse_float=Decimal if decimals else None)

    def decode(self, value: bytes) -> dict:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejected("not_utf8", f"value is not UTF-8 at byte {exc.start}") from None
        try:
            obj = self._decoder.decode(text)
        except Rejected:
            raise
        except RecursionError:
            raise Rejected("malformed_json", "value nests too deeply") from None
        except DecimalException:  # read exactly (`decimals`), a number like 1e99999999999999999999 is no decimal
            raise Rejected("out_of_range", "a number's exponent is beyond what a decimal holds") from None
        except ValueError as exc:
            raise Rejected("malformed_json", str(exc)[:200]) from None
        if not isinstance(obj, dict):
            raise Rejected("not_an_object", f"value is a JSON {type(obj).__name__}, expected an object")
        return obj


# value_format "json" -> the decoder's factory, given the spec and the schema registry's client settings (or
# None); the wire formats' decoders are lakehouse.ingest.wire_decoders'
DECODERS: dict[str, Callable[[PipelineSpec, dict | None], Decoder]] = {
    "json": lambda spec, registry: JsonDecoder(spec.contract.has_decimals)}

