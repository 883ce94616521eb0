"""Contract patterns (`pattern:` of a string field), run on RE2.

Patterns run on producer-controlled values, so they run on RE2, whose matching takes time linear in
the value (no backtracking: `(a+)+$` cannot explode). RE2 has no lookarounds (`(?=`, `(?!`, `(?<=`),
backreferences (`\\1`), atomic groups or possessive repeats, and reads `\\d`, `\\w`, `\\s` and `\\b` as
ASCII (`\\p{Nd}`, `\\p{L}` are Unicode's). A pattern is also one Python's `re` reads, as the development
tools generate sample values with it. Values longer than MAX_MATCHED_CHARS are refused before matching.

This module is the one place that reaches into RE2's binding (`re2._re2`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import re2
from re2 import _re2

from lakehouse.core.errors import PatternError

MAX_PATTERN_CHARS = 1000
MAX_MATCHED_CHARS = 65_536
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print each refused pattern on the process's stderr
_RE2_OPTIONS.never_capture = True  # a yes or no is all a contract asks
_RE2_OPTIONS.max_mem = 8 << 20  # per pattern; a larger program is refused at compile time
_ANCHOR_BOTH = _re2.RE2.Anchor.ANCHOR_BOTH
# `{,n}`: Python's re reads it as {0,n}, RE2 as the text "{,n}"; one pattern must mean one thing
_OPEN_REPEAT = re.compile(r"(?<!\\)\{,")


@functools.lru_cache(maxsize=512)
def contract_pattern(pattern: str) -> Callable[[str], bool]:
    """Whether a text matches `pattern` in full, as a function run on RE2 (linear time, thread-safe);
    raises PatternError for a pattern RE2 or Python's re cannot compile, or longer than
    MAX_PATTERN_CHARS. Callers bound the text first (MAX_MATCHED_CHARS).

    The function calls RE2's binding directly (`re2._re2`): `re2.compile(...).fullmatch` builds a match
    object per call, several times slower on the reader's hot path."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"is {len(pattern)} characters long, at most {MAX_PATTERN_CHARS}")
    if _OPEN_REPEAT.search(pattern):
        raise PatternError("uses {,n}, which Python's re reads as {0,n} and RE2 as text: write {0,n}")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:  # deep nesting overflows the regex parser
        raise PatternError(f"is not a regular expression: {exc} (a pattern is the syntax Python's re and RE2 "
                           f"share)") from None
    try:
        compiled = _re2.RE2(pattern.encode("utf-8"), _RE2_OPTIONS)
    except UnicodeEncodeError:
        raise PatternError("holds a lone surrogate, which is not Unicode") from None
    if not compiled.ok():
        why = compiled.error()
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise PatternError(f"is not a pattern RE2 runs ({why}): contract patterns run in linear time, without "
                           f"lookarounds (?= (?! (?<=, backreferences \\1, atomic groups or possessive repeats; "
                           f"\\Z is written \\z")
    match = compiled.Match

    def fullmatch(text: str) -> bool:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no Unicode pattern matches it
            return False
        start: int = match(_ANCHOR_BOTH, data, 0, len(data))[0][0]  # -1: no match
        return start >= 0

    return fullmatch
