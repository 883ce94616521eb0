"""What the CLI prints for people: tables and progress, drawn by rich on a terminal, plain where a program
reads them.

A report is a list of blocks, each a `Table` or a line of text. `text(blocks)` is the plain form: columns
aligned with spaces, what a pipe, a log file, a DAG's task log and the tests read, the same on every machine.
`show(blocks)` draws the tables with rich (a box, a bold header, numbers to the right, the status words in
colour) when the stream is a terminal, and prints `text(blocks)` otherwise; rich itself honours NO_COLOR,
TERM=dumb and the terminal's width.

`progress()` is what a long command (replay, verify, a big `--once`) hands its work for messages: on a
terminal a spinner line says what the command waits for now while the finished steps scroll above it, with
the seconds since the start; elsewhere each message is one line on stderr, as before.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

NUMBER = re.compile(r"^[-+]?[\d,]+(\.\d+)?( ?[a-zA-Z%]{1,3})?\*?$")  # 1,234  0.84 s  12.5 MB  3.5h  2026-11-26*
STATUS_STYLES = {"ok": "green", "failed": "bold red", "fail": "bold red", "skipped": "yellow", "error": "bold red",
                 "warn": "yellow", "stale": "yellow", "lost": "bold red"}


@dataclass(frozen=True)
class Table:
    """Rows of cells under a header; every row as long as the header."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"a row of {len(row)} cells under a header of {len(self.header)}: {row!r}")

    @classmethod
    def of(cls, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
        return cls(tuple(header), tuple(tuple(r) for r in rows))

    def lines(self) -> list[str]:
        """The plain form: each column as wide as its widest cell, two spaces apart, no trailing blanks."""
        everything = [self.header, *self.rows]
        widths = [max(len(r[i]) for r in everything) for i in range(len(self.header))]
        return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in everything]

    def numeric(self, column: int) -> bool:
        """Whether every filled cell of `column` reads as a number (a count, a size, a duration)."""
        cells = [r[column] for r in self.rows if r[column] not in ("", "-", "?")]
        return bool(cells) and all(NUMBER.match(c) for c in cells)

    def rich(self) -> RichTable:
        drawn = RichTable(header_style="bold", show_edge=False, pad_edge=False)
        for i, name in enumerate(self.header):
            drawn.add_column(Text(name), justify="right" if self.numeric(i) else "left", overflow="fold")
        for row in self.rows:
            drawn.add_row(*(Text(c, style=STATUS_STYLES.get(c.lower(), "")) for c in row))
        return drawn


Block = Table | str


def text(blocks: Sequence[Block]) -> str:
    """The plain form of a report."""
    lines: list[str] = []
    for block in blocks:
        lines.extend(block.lines() if isinstance(block, Table) else [block])
    return "\n".join(lines)


def _terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def show(blocks: Sequence[Block], stream: TextIO | None = None) -> None:
    """Print a report: drawn by rich on a terminal, plain elsewhere."""
    stream = stream or sys.stdout
    if not _terminal(stream):
        print(text(blocks), file=stream, flush=True)
        return
    console = Console(file=stream, highlight=False)
    for block in blocks:
        console.print(block.rich() if isinstance(block, Table) else Text(block))


@contextmanager
def progress(stream: TextIO | None = None, suffix: str = "") -> Iterator[Callable[[str], None]]:
    """A callable taking progress messages while the `with` block runs (see the module's docstring)."""
    stream = stream or sys.stderr
    if not _terminal(stream):
        yield lambda message: print(f"{message}{suffix}", file=stream, flush=True)
        return
    console = Console(file=stream, highlight=False)
    started = time.monotonic()
    with console.status("starting", spinner="dots") as spinner:
        def say(message: str) -> None:
            console.print(Text.assemble((f"{time.monotonic() - started:7.1f}s ", "dim"), message))
            spinner.update(f"{message}{suffix}")

        yield say
