"""Durations and instants as specs, the command line and the Airflow UI write them: one parser each.

A duration is `500ms`, `5s`, `2m`, `1h`, `7d` or a bare number of seconds, finite and capped; an
instant is ISO-8601 text (UTC when it has no offset), or a duration meaning that long ago.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from lakehouse.core.wording import shown

MAX_DURATION_S = 10 * 365 * 86400.0  # any duration: 10 years
DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_PATTERN = r"([0-9]+(?:\.[0-9]+)?) *(ms|s|m|h|d)"  # matched in full: 500ms, 5s, 2m, 1h, 7d
_DURATION = re.compile(DURATION_PATTERN)


def duration_text(seconds: float) -> str:
    """`seconds` in the largest unit that divides it: 86400 -> '1d', 90 -> '90s'."""
    for unit in ("d", "h", "m"):
        if seconds % DURATION_UNITS[unit] == 0:
            return f"{seconds / DURATION_UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


def as_float(value: int | float) -> float:
    """`value` as a float; infinity for an integer too large for one."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def parse_duration(value: Any, *, positive: bool = False, maximum: float = MAX_DURATION_S) -> float:
    """Seconds in a duration such as `5s`, `500ms`, `2m`, `7d`; a bare number is seconds.

    Returns a finite number from 0 (above 0 when `positive`) to `maximum` (default 10 years).
    Raises ValueError for anything else: NaN, infinity, negative, too long, or not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = as_float(value)
    else:
        match = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if not match:
            raise ValueError(f"{shown(value)} is not a duration like 500ms, 5s, 2m, 1h or 7d")
        seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{shown(value)} is not a duration: it must be finite and 0 or more")
    if seconds > maximum:
        raise ValueError(f"{shown(value)} is longer than {duration_text(maximum)}, the longest allowed here")
    if positive and seconds == 0:
        raise ValueError(f"{shown(value)} must be longer than 0")
    return seconds


def parse_instant(text: str) -> datetime:
    """A point in time from ISO-8601 text (UTC when it has no offset), in UTC. Raises ValueError."""
    try:
        parsed = datetime.fromisoformat(text)
        parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        return datetime.fromtimestamp(parsed.timestamp(), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        raise ValueError(f"{str(text)[:60]!r} is not an ISO-8601 time, e.g. 2026-11-21T10:00:00Z") from None


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """A point in time (UTC): ISO-8601 (UTC when it has no offset) or a duration meaning that long before
    `now` (`30m`, `2h`, `7d`). Raises ValueError saying both forms for anything else."""
    now = now or datetime.now(UTC)
    try:
        return now - timedelta(seconds=parse_duration(text))
    except (ValueError, OverflowError):
        pass
    try:
        return parse_instant(text)
    except ValueError:
        raise ValueError(f"{str(text)[:60]!r} is neither an ISO-8601 time (2026-11-21T10:00:00Z) nor a duration "
                         f"ago (30m, 2h, 7d)") from None

