"""Strings for a contract's regular-expression `pattern`: ones that match it, and plausible ones that do not.

`matching(pattern, max_length, rng, where)` makes a generator of matching strings from the pattern's parse tree
(lakehouse_dev.re_internals), compiled once into a tree of functions, each candidate verified with `re` before
it is handed out;
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


# a compiled piece of a pattern: the groups matched so far (number -> text) -> a random string for the piece
_Node = Callable[[dict[int, str]], str]
_REPEATS = (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None))


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


def _unsupported(reason: str) -> _Node:
    """A node that refuses when it is reached (as walking the tree did: a lookaround in a branch never taken
    does not stop the others)."""
    def refuse(groups: dict[int, str]) -> str:
        raise _PatternUnsupported(reason)
    return refuse


def _class_chars(items) -> str:
    """The characters a class (`[...]`, the IN opcode's items) draws from; raises _PatternUnsupported."""
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


def _pool(op, av) -> str | list[str] | None:
    """The characters one token of a single character draws from (rng.choice of them), None for any other
    token; raises _PatternUnsupported for a class it cannot draw from."""
    if op is sre_c.NOT_LITERAL:
        return [c for c in string.ascii_letters if ord(c) != av]
    if op is sre_c.ANY:
        return string.ascii_letters
    if op is sre_c.IN:
        return _class_chars(av)
    if op is sre_c.CATEGORY:
        return _CATEGORY_CHARS.get(av) or string.ascii_letters
    return None


def _compile(tokens, rng: Random) -> _Node:
    """A generator of candidates for the tokens of a pattern's syntax tree (`_parsed`): a function of the
    groups matched so far (number -> text, filled as it goes) that returns a random string. The tree is
    walked once, here; the function draws from `rng` what a walk of the tree for every string drew, in the
    same order, so a seed gives the same strings.

    Covers literals, classes, ranges, categories, alternation, groups, back references and repeats; a
    lookaround (or a class it cannot draw from) compiles to a node that raises _PatternUnsupported when
    reached.
    """
    parts: list[str | _Node] = []
    for op, av in tokens:
        if op is sre_c.AT:
            continue  # anchors and word boundaries add no characters
        if op is sre_c.LITERAL:
            if parts and isinstance(parts[-1], str):
                parts[-1] += chr(av)
            else:
                parts.append(chr(av))
            continue
        parts.append(_token(op, av, rng))
    if not parts:
        return lambda groups: ""
    if len(parts) == 1:
        only = parts[0]
        if isinstance(only, str):
            return lambda groups: only
        return only
    nodes = [(lambda groups, text=part: text) if isinstance(part, str) else part for part in parts]
    return lambda groups: "".join([node(groups) for node in nodes])


def _token(op, av, rng: Random) -> _Node:
    """The node of one token other than a literal or an anchor."""
    choice = rng.choice
    try:
        pool = _pool(op, av)
    except _PatternUnsupported as exc:
        return _unsupported(str(exc))
    if pool is not None:
        return lambda groups: choice(pool)
    if op is sre_c.BRANCH:
        branches = [_compile(branch, rng) for branch in av[1]]
        return lambda groups: choice(branches)(groups)
    if op is sre_c.SUBPATTERN:
        inner, number = _compile(av[-1], rng), av[0]
        if number is None:
            return inner

        def group(groups: dict[int, str]) -> str:
            text = groups[number] = inner(groups)
            return text
        return group
    if op is sre_c.GROUPREF:
        return lambda groups: groups.get(av, "")
    if op in _REPEATS:
        lo, hi, sub = av
        hi = lo + 8 if hi is sre_c.MAXREPEAT else min(hi, lo + 8)
        randint = rng.randint
        if len(sub) == 1 and sub[0][0] is not sre_c.LITERAL:
            try:
                chars = _pool(*sub[0])
            except _PatternUnsupported:
                chars = None
            if chars is not None:  # the common case, a class repeated: [A-Z]{3}, \d+
                return lambda groups: "".join([choice(chars) for _ in range(randint(lo, hi))])
        item = _compile(sub, rng)
        return lambda groups: "".join([item(groups) for _ in range(randint(lo, hi))])
    return _unsupported(str(op))


def matching(pattern: str, max_length: int | None, rng: Random, where: str) -> Callable[[], str]:
    """A generator of strings that match `pattern` whole and fit `max_length`, drawn from `rng`.

    Each call raises ProduceError (naming `where`, e.g. the spec and field) for a pattern whose syntax it
    cannot walk (a lookaround) or when TRIES candidates all miss the pattern or the length.
    """
    compiled = re.compile(pattern)
    candidates: list[_Node] = []  # the pattern's candidate generator, compiled at the first call

    def one() -> str:
        for _ in range(TRIES):
            try:
                if not candidates:
                    candidates.append(_compile(_parsed(pattern), rng))
                value = candidates[0]({})
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
