"""The command line's argument types: each turns one option's text into its value or raises
argparse.ArgumentTypeError, which argparse reports as `argument --NAME: MESSAGE` with exit 2.

One type per kind of value, built on the definition the rest of the platform uses, so an option
accepts exactly what a spec file (or the Airflow UI) accepts for the same kind of value:

    duration(...)   a length of time, `lakehouse.core.spec.parse_duration`: 500ms, 5s, 2m, 1h, 7d
                    (a spec's trigger.interval, retention windows, SLOs)
    instant         a point in time, `lakehouse.core.spec.parse_moment`: ISO-8601 (UTC without an
                    offset) or a duration meaning that long ago (2h); the `since`/`until` of the UI
    instant_ms      the same, in milliseconds since the epoch (Kafka timestamps)
    seconds_ago     the same, as the seconds between it and now (a window that ends now)
    pipeline_name   a pipeline's name as a spec declares it (`IDENTIFIER`)
    table_name      namespace.table as a spec names its tables

and the numbers: `integer` (bounded, ASCII digits only), `at_least`, `port`, `seed`, `number`, `rate`,
`ratio`. Commands of other distributions (the development stack's `lakehouse stack`, `produce`) use
these too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import UTC, datetime

from lakehouse.core.durations import MAX_DURATION_S, parse_duration, parse_moment
from lakehouse.core.naming import IDENTIFIER, is_table_name

__all__ = ["at_least", "duration", "instant", "instant_ms", "integer", "number", "pipeline_name", "port", "rate",
           "ratio", "seconds_ago", "seed", "table_name"]


def integer(text: str, minimum: int, maximum: int | None = None) -> int:
    """`text` as a decimal integer from `minimum` to `maximum`."""
    digits = text[1:] if text.startswith("-") else text
    if not digits.isascii() or not digits.isdigit():  # int() would also take " 5", "5_000" and other scripts' digits
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    value = int(text) if len(digits) <= 30 else None  # int() refuses more than 4300 digits
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"{minimum} or more"
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: use {bounds}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer of at least `minimum`."""
    return lambda text: integer(text, minimum)


def seed(text: str) -> int:
    return integer(text, -(2 ** 63), 2 ** 63 - 1)


def port(text: str) -> int:
    return integer(text, 1, 65535)


def number(text: str, minimum: float, maximum: float = math.inf, *, open_minimum: bool = False) -> float:
    """`text` as a finite float from `minimum` (excluded when `open_minimum`) to `maximum`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < minimum or (open_minimum and value == minimum) or value > maximum:
        low = f"above {minimum:g}" if open_minimum else f"from {minimum:g}"
        high = f" to {maximum:g}" if math.isfinite(maximum) else ""
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: use a finite number {low}{high}")
    return value


def rate(text: str) -> float:
    return number(text, 0.0, open_minimum=True)


def ratio(text: str) -> float:
    return number(text, 0.0, 1.0)


def duration(*, positive: bool = True, maximum: float = MAX_DURATION_S) -> Callable[[str], float]:
    """An argument type: the seconds of a duration as a spec writes one (`parse_duration`), above 0 when
    `positive`, at most `maximum` seconds (pass the spec's cap of the same setting, DURATION_CAPS_S)."""
    def parse(text: str) -> float:
        try:
            return parse_duration(text, positive=positive, maximum=maximum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = "duration"
    return parse


def instant(text: str, now: datetime | None = None) -> datetime:
    """A point in time (UTC): ISO-8601, UTC without an offset, or a duration meaning that long before `now`
    (default: the current time), e.g. `2h`."""
    try:
        return parse_moment(text, now)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def instant_ms(text: str) -> int:
    """`instant(text)` in milliseconds since the epoch, as Kafka timestamps are."""
    return int(instant(text).timestamp() * 1000)


def seconds_ago(text: str) -> float:
    """The seconds from `instant(text)` until now: above 0 (a point in the past)."""
    now = datetime.now(UTC)
    seconds = (now - instant(text, now)).total_seconds()
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not in the past: give an earlier ISO-8601 time or a "
                                         f"duration ago above 0, e.g. 1h")
    return seconds


def pipeline_name(text: str) -> str:
    if not IDENTIFIER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a pipeline name (lower_snake_case, e.g. orders)")
    return text


def table_name(text: str) -> str:
    if not is_table_name(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a table name: use namespace.table in lower case, "
                                         f"e.g. raw.orders_rebuilt")
    return text
