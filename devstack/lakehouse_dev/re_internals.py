"""The `re` module's internals the synthetic producer relies on, and the only module that touches them
(CPython 3.11, the Docker image's Python and the lowest `requires-python` allows).

The producer generates strings that match a contract's `pattern` by walking the pattern's parse tree. The
standard library keeps its regular-expression parser private: `re._parser.parse` (the tree: a list of
(opcode, argument) pairs) and `re._constants` (the opcodes and categories the tree holds). Python 3.11 moved
them there from the deprecated `sre_parse` and `sre_constants`. tests/test_adapters.py pins the Python version
and that both still have what the producer uses.
"""

from __future__ import annotations

from re import _constants as opcodes
from re import _parser

WRITTEN_AGAINST = ("python", "3.11")
INTERNALS = frozenset({"_parser", "_constants", "sre_parse", "sre_constants"})

__all__ = ["INTERNALS", "WRITTEN_AGAINST", "opcodes", "parse"]


def parse(pattern: str, flags: int = 0):
    """The parse tree of `pattern` (a sequence of (opcode, argument) pairs, the opcodes of `opcodes`); raises
    re.error for a pattern `re` cannot compile."""
    return _parser.parse(pattern, flags)

