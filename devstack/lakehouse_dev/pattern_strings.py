"""Strings for a contract's regular-expression `pattern`: ones that match it, and plausible ones that do not.

`matching(pattern, max_length, rng, where)` makes a generator of matching strings by walking the pattern's
parse tree (lakehouse_dev.re_internals), each candidate verified with `re` before it is handed out;
`mismatching(...)` picks a near miss for the `pattern_mismatch` defect; `pattern_core` strips the anchors so
callers can recognise the common patterns (a currency, a country, an e-mail address) and draw realistic
values for them instead.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from random import Random

from lakehouse_dev.re_internals import opcodes as sre_c
from lakehouse_dev.re_internals import parse as parse_pattern
from lakehouse_dev.record_formats import ProduceError

# how many candidates `matching` draws before it gives up on a pattern within a max_length
TRIES = 50


class _PatternUnsupported(Exception):
    pass


_PRINTABLE = string.ascii_letters + string.digits + "-_.+@#/ "
_CATEGORY_CHARS = {
    sre_c.CATEGORY_DIGIT: string.digits,
    sre_c.CATEGORY_NOT_DIGIT: string.ascii_letters + "-_.",
    sre_c.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    sre_c.CATEGORY_NOT_WORD: "-.+@ /",
    sre_c.CATEGORY_SPACE: " ",
    sre_c.CATEGORY_NOT_SPACE: string.ascii_letters + string.digits + "-_.",
}


def _parsed(pattern: str):
    """The pattern's syntax tree (raises _PatternUnsupported)."""
    try:
        return parse_pattern(pattern)
    except Exception as exc:  # noqa: BLE001 - the spec validated it with re.compile; be safe anyway
        raise _PatternUnsupported(str(exc)) from None


def _from_pattern(tree, rng: Random, classes: dict[int, str]) -> str:
    """A random string built from a pattern's syntax tree `tree` (`_parsed`; a candidate: the caller verifies
    it); `classes` keeps the characters of each class of the tree (by the id of its items) between calls.

    Covers literals, classes, ranges, categories, alternation, groups, back
    references and repeats; raises _PatternUnsupported for lookarounds.
    """
    groups: dict[int, str] = {}

    def chars_of(items) -> str:
        known = classes.get(id(items))
        if known is None:
            known = classes[id(items)] = class_chars(items)
        return known

    def class_chars(items) -> str:
        negate = False
        pool: list[str] = []
        for op, av in items:
            if op is sre_c.NEGATE:
                negate = True
            elif op is sre_c.LITERAL:
                pool.append(chr(av))
            elif op is sre_c.RANGE:
                lo, hi = av
                pool.extend(chr(c) for c in range(lo, min(hi, lo + 200) + 1))
            elif op is sre_c.CATEGORY:
                pool.extend(_CATEGORY_CHARS.get(av, ""))
            else:
                raise _PatternUnsupported(str(op))
        if negate:
            excluded = set(pool)
            pool = [c for c in _PRINTABLE if c not in excluded]
        if not pool:
            raise _PatternUnsupported("empty character class")
        return "".join(pool)

    def walk(tokens) -> str:
        out: list[str] = []
        for op, av in tokens:
            if op is sre_c.LITERAL:
                out.append(chr(av))
            elif op is sre_c.NOT_LITERAL:
                out.append(rng.choice([c for c in string.ascii_letters if ord(c) != av]))
            elif op is sre_c.ANY:
                out.append(rng.choice(string.ascii_letters))
            elif op is sre_c.IN:
                out.append(rng.choice(chars_of(av)))
            elif op is sre_c.CATEGORY:
                out.append(rng.choice(_CATEGORY_CHARS.get(av) or string.ascii_letters))
            elif op is sre_c.BRANCH:
                out.append(walk(rng.choice(av[1])))
            elif op is sre_c.SUBPATTERN:
                text = walk(av[-1])
                if av[0] is not None:
                    groups[av[0]] = text
                out.append(text)
            elif op is sre_c.GROUPREF:
                out.append(groups.get(av, ""))
            elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
                lo, hi, sub = av
                hi = lo + 8 if hi is sre_c.MAXREPEAT else min(hi, lo + 8)
                out.extend(walk(sub) for _ in range(rng.randint(lo, hi)))
            elif op is sre_c.AT:
                continue  # anchors and word boundaries add no characters
            else:
                raise _PatternUnsupported(str(op))
        return "".join(out)

    return walk(tree)


def matching(pattern: str, max_length: int | None, rng: Random, where: str) -> Callable[[], str]:
    """A generator of strings that match `pattern` whole and fit `max_length`, drawn from `rng`.

    Each call raises ProduceError (naming `where`, e.g. the spec and field) for a pattern whose syntax it
    cannot walk (a lookaround) or when TRIES candidates all miss the pattern or the length.
    """
    compiled = re.compile(pattern)
    tree: list = []  # the pattern's syntax tree, parsed at the first call
    classes: dict[int, str] = {}

    def one() -> str:
        for _ in range(TRIES):
            try:
                if not tree:
                    tree.append(_parsed(pattern))
                value = _from_pattern(tree[0], rng, classes)
            except _PatternUnsupported as exc:
                raise ProduceError(f"{where}: cannot generate values for pattern {pattern!r} ({exc})") from None
            if compiled.fullmatch(value) and (max_length is None or len(value) <= max_length):
                return value
        raise ProduceError(f"{where}: cannot generate values matching {pattern!r} within max_length {max_length}")
    return one


def mismatching(pattern: str, max_length: int | None, rng: Random) -> str | None:
    """A plausible string that fits `max_length` (checked first) but not `pattern`, or None."""
    core = pattern_core(pattern)
    if core == "[A-Z]{3}":
        options = ["eur", "EURO", "US$", "€"]
    elif core == "[A-Z]{2}":
        options = ["DEU", "de", "Germany"]
    elif "@" in core:
        options = ["anna.mueller.example.com", "anna@", "@example.com"]
    else:
        options = []
    options += ["?", "not a match!", "0", "-", "x" * 3]
    compiled = re.compile(pattern)
    fitting = [o for o in options if not compiled.fullmatch(o) and (max_length is None or len(o) <= max_length)]
    return rng.choice(fitting) if fitting else None


def pattern_core(pattern: str) -> str:
    """The pattern without its anchors, to recognise the common ones."""
    core = pattern
    for prefix in ("^", "\\A"):
        core = core[len(prefix):] if core.startswith(prefix) else core
    for suffix in ("$", "\\Z", "\\z"):
        core = core[: -len(suffix)] if core.endswith(suffix) else core
    return core
