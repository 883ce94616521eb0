"""The reading of a spec document that records every problem instead of stopping at the first.

A `Reader` walks one document (a lakehouse.core.safe_yaml.YamlDocument). Each check that refuses a value
records a SpecError (the key path, why, and the line of the value in the file) and hands on INVALID in
its place; a later check that needs that value skips it, so one mistake is reported once, never again by
every check that reads it. lakehouse.core.spec_parse and lakehouse.core.spec_contract hold the spec's
rules; this module only the mechanics, and the words of the messages every kind of value shares.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from croniter import croniter

from lakehouse.core.durations import MAX_DURATION_S, as_float, parse_duration
from lakehouse.core.errors import SpecError
from lakehouse.core.naming import IDENTIFIER, TABLE_NAME
from lakehouse.core.safe_yaml import YamlDocument
from lakehouse.core.vocabulary import CAPS, DURATION_CAPS_S, SCHEDULE_PRESETS
from lakehouse.core.wording import closest, did_you_mean, shown


class Invalid:
    """The type of INVALID: what a check hands on in place of a value it refused (and recorded)."""

    def __repr__(self) -> str:
        return "INVALID"


# What a check hands on for a refused value, in annotations: `FieldSpec | Refused`. Typed loosely (Any), as a
# type checker cannot follow the sentinel through the `is INVALID` tests that guard every use of it.
Refused = Any
INVALID: Any = Invalid()


def ok(*values: Any) -> bool:
    """Whether none of `values` is INVALID (each was read, or left out and defaulted)."""
    return all(value is not INVALID for value in values)


class Reader:
    """Walks one spec document, recording each problem as a SpecError with its key path and line.

    Every reading method takes INVALID through silently (its problem is already recorded) and returns
    INVALID for a value it refuses, after recording why."""

    def __init__(self, path: Path, document: YamlDocument):
        self.path = path
        self.document = document
        self.problems: list[SpecError] = []
        self._misspelt: set[tuple[str, str]] = set()  # (mapping, key) an unknown key was taken to mean

    def problem(self, where: str, why: str, line: int | None = None) -> Refused:
        """Record that the value at key path `where` ("" or "(file)": the whole file) is wrong, and why;
        at `line`, else the line of the value (or of its nearest enclosing one) in the document."""
        where = where or "(file)"
        self.problems.append(SpecError(self.path, where, why, self.document.line_of(where) if line is None else line))
        return INVALID

    def line_at(self, *path: Any) -> int | None:
        """The line of the value at the exact key path `path` (keys and indexes), or None."""
        return self.document.lines.get(path)

    def mark(self) -> int:
        return len(self.problems)

    def failed_since(self, mark: int) -> bool:
        return len(self.problems) > mark

    def mapping(self, raw: Any, where: str, allowed: tuple[str, ...]) -> Refused:  # a dict, or INVALID
        """`raw` as a mapping ({} for None) of the keys of `allowed` it holds; each other key is recorded
        as unknown (naming the nearest allowed key), and a non-mapping refused."""
        if raw is INVALID:
            return INVALID
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            return self.problem(where, f"must be a mapping, got {type(raw).__name__}")
        known: dict[str, Any] = {}
        for key, value in raw.items():
            here = f"{where}.{key}" if where else str(key)
            if not isinstance(key, str):
                self.problem(where, f"field names must be strings, got {shown(key)}", self.document.line_of(here))
            elif key in allowed:
                known[key] = value
            else:
                meant = closest(key, (k for k in allowed if k not in raw))
                if meant is not None:
                    self._misspelt.add((where, meant))
                self.problem(f"{where}.{key[:60]}" if where else key[:60],
                             f"unknown field (allowed: {', '.join(sorted(allowed))})"
                             + ("" if meant is None else f"; did you mean {meant!r}?"), self.document.line_of(here))
        return known

    def get(self, raw: dict | Refused, key: str, default: Any = None) -> Any:
        """`raw[key]`, `default` when it is not there, INVALID when `raw` is."""
        return INVALID if raw is INVALID else raw.get(key, default)

    def required(self, raw: dict | Refused, key: str, where: str) -> Any:
        """`raw[key]`; records that it is required when it is missing or null (unless an unknown key
        of the same mapping was taken to be this one misspelt: that was reported already)."""
        if raw is INVALID:
            return INVALID
        if key not in raw or raw[key] is None:
            if (where, key) in self._misspelt:
                return INVALID
            return self.problem(f"{where}.{key}" if where else key, "is required")
        return raw[key]

    def string(self, value: Any, where: str, pattern: re.Pattern | None = None, hint: str = "") -> Any:
        """`value` as a non-empty string matching `pattern` in full."""
        if value is INVALID:
            return INVALID
        if not isinstance(value, str) or not value:
            return self.problem(where, f"must be a non-empty string, got {shown(value)}")
        if pattern is not None and not pattern.fullmatch(value):
            return self.problem(where, f"{shown(value)} is not valid{': ' + hint if hint else ''}")
        return value

    def identifier(self, value: Any, where: str, hint: str = "use lower_snake_case") -> Any:
        return self.string(value, where, IDENTIFIER, f"{hint}, at most 128 characters")

    def integer(self, value: Any, where: str, minimum: int = 0, maximum: int | None = None) -> Any:
        """`value` as an integer from `minimum` to `maximum` (default CAPS[where])."""
        if value is INVALID:
            return INVALID
        maximum = CAPS[where] if maximum is None else maximum
        if isinstance(value, bool) or not isinstance(value, int):
            return self.problem(where, f"must be an integer, got {shown(value)}")
        if value < minimum:
            return self.problem(where, f"must be >= {minimum}, got {shown(value)}")
        if value > maximum:
            return self.problem(where, f"must be <= {maximum} (the platform's cap), got {shown(value)}")
        return value

    def number(self, value: Any, where: str) -> Any:
        """`value` as a finite float (NaN and infinity refused)."""
        if value is INVALID:
            return INVALID
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.problem(where, f"must be a number, got {shown(value)}")
        number = as_float(value)
        if not math.isfinite(number):
            return self.problem(where, f"must be a finite number, got {shown(value)}")
        return number

    def text(self, value: Any, where: str) -> Any:
        """Free text (a description): a string, '' when absent."""
        if value is INVALID:
            return INVALID
        if value is None:
            return ""
        if not isinstance(value, str):
            return self.problem(where, f"must be a string, got {shown(value)}; quote it")
        return value

    def boolean(self, value: Any, where: str) -> Any:
        if value is INVALID:
            return INVALID
        if not isinstance(value, bool):
            return self.problem(where, f"must be true or false, got {shown(value)}")
        return value

    def choice(self, value: Any, where: str, choices: tuple[str, ...]) -> Any:
        """`value` if it is one of `choices`; else recorded, naming the choice it most likely misspells."""
        if value is INVALID:
            return INVALID
        if not isinstance(value, str) or value not in choices:
            return self.problem(where, f"{shown(value)} is not one of {', '.join(choices)}"
                                       f"{did_you_mean(value, choices)}")
        return value

    def duration(self, value: Any, where: str, positive: bool = False) -> Any:
        """Seconds of duration `value`, at most DURATION_CAPS_S[where] (default MAX_DURATION_S)."""
        if value is INVALID:
            return INVALID
        try:
            return parse_duration(value, positive=positive, maximum=DURATION_CAPS_S.get(where, MAX_DURATION_S))
        except ValueError as exc:
            return self.problem(where, str(exc))

    def table(self, value: Any, where: str) -> Any:
        return self.string(value, where, TABLE_NAME,
                           "use namespace.table in lower case, e.g. raw.orders, at most 128 characters each")

    def schedule(self, value: Any, where: str) -> Any:
        """An Airflow schedule: one of SCHEDULE_PRESETS or a five-field cron expression."""
        text = self.string(value, where)
        if text is INVALID:
            return INVALID
        if text in SCHEDULE_PRESETS or (len(text.split()) == 5 and croniter.is_valid(text)):
            return text
        meant = did_you_mean(text, SCHEDULE_PRESETS) if text.startswith("@") else ""
        return self.problem(where, f"{shown(value)} is not a schedule: use a cron expression such as "
                                   f"'*/10 * * * *' or one of {', '.join(SCHEDULE_PRESETS)}{meant}")
