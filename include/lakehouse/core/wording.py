"""How messages quote what a user wrote: bounded (error messages echo hostile values, not megabytes of
them), and with the nearest word the platform knows when the value looks like a typo of one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

MAX_SUGGESTED_CHARS = 200  # difflib compares in quadratic time: a longer value is no typo anyway


def shown(value: Any, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit: YAML's hex and base-60 integers have none
        return "a value too large to show"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def closest(value: Any, known: Iterable[str]) -> str | None:
    """The word of `known` that text `value` most likely misspells (difflib's ratio, case folded), or None."""
    if not isinstance(value, str) or not value or len(value) > MAX_SUGGESTED_CHARS:
        return None
    by_folded = {word.lower(): word for word in known if word != value}
    found = difflib.get_close_matches(value.lower(), list(by_folded), n=1, cutoff=0.6)
    return by_folded[found[0]] if found else None


def did_you_mean(value: Any, known: Iterable[str]) -> str:
    """`; did you mean 'word'?` naming the word of `known` that `value` most likely misspells, else ''."""
    word = closest(value, known)
    return "" if word is None else f"; did you mean {word!r}?"
