"""What the CLI prints for people (lakehouse.core.console): the plain form programs read, and rich's drawing on a
terminal, holding the same cells."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakehouse.core import console

# a cell as the CLI's tables hold them: printable, no line breaks, no run of two spaces (the column gap)
cells = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x24F, exclude_categories=("Cc", "Zs")),
                min_size=1, max_size=12)
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")  # styles, and the cursor codes of a spinner


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@st.composite
def tables(draw) -> console.Table:
    width = draw(st.integers(1, 5))
    header = draw(st.lists(cells, min_size=width, max_size=width))
    rows = draw(st.lists(st.lists(cells, min_size=width, max_size=width), max_size=6))
    return console.Table.of(header, rows)


@given(tables())
def test_the_plain_form_aligns_every_column_and_keeps_every_cell(table):
    lines = table.lines()
    assert len(lines) == 1 + len(table.rows)
    starts = [0]
    for i in range(len(table.header) - 1):
        starts.append(starts[-1] + max(len(r[i]) for r in (table.header, *table.rows)) + 2)
    for line, row in zip(lines, (table.header, *table.rows), strict=True):
        assert [line[start:start + len(cell)] for start, cell in zip(starts, row, strict=True)] == list(row)
        assert line == line.rstrip()
        assert line.split() == list(row)  # no cell holds a blank: the columns split back into the cells


@given(tables())
def test_a_terminal_gets_the_same_cells_drawn_by_rich(table):
    shown = Terminal()
    console.show([table], shown)
    drawn = ANSI.sub("", shown.getvalue())  # rich's markup syntax in a cell ("[bold]") is text, not style
    for cell in (*table.header, *(c for r in table.rows for c in r)):
        assert cell in drawn


def test_a_pipe_gets_the_plain_form_of_every_block():
    days = console.Table.of(("DAY", "RECORDS"), [("2026-11-26", "1,200"), ("2026-11-27*", "7")])
    report = ["orders: topic orders", days, "note: today so far"]
    piped = io.StringIO()
    console.show(report, piped)
    assert piped.getvalue() == ("orders: topic orders\n"
                                "DAY          RECORDS\n"
                                "2026-11-26   1,200\n"
                                "2026-11-27*  7\n"
                                "note: today so far\n")
    assert console.text(report) + "\n" == piped.getvalue()


def test_numbers_are_right_aligned_on_a_terminal_and_status_words_coloured():
    table = console.Table.of(("PART", "STATUS", "SECONDS"),
                             [("kafka", "ok", "0.84 s"), ("catalog", "failed", "12.5 s")])
    assert [table.numeric(i) for i in range(3)] == [False, False, True]
    shown = Terminal()
    console.show([table], shown)
    drawn = shown.getvalue()
    assert "\x1b[" in drawn  # styled: a terminal
    kafka, catalog = (line for line in drawn.splitlines() if "kafka" in line or "catalog" in line)
    assert kafka.rstrip().endswith("0.84 s") and catalog.rstrip().endswith("12.5 s")


def test_a_row_longer_or_shorter_than_the_header_is_refused():
    with pytest.raises(ValueError, match="a row of 1 cells under a header of 2"):
        console.Table.of(("A", "B"), [("only one",)])


def test_progress_is_one_line_per_message_off_a_terminal_and_a_timed_line_on_one():
    piped = io.StringIO()
    with console.progress(piped, suffix=" ...") as say:
        say("reading partition 0")
        say("waiting for the catalog")
    assert piped.getvalue() == "reading partition 0 ...\nwaiting for the catalog ...\n"
    shown = Terminal()
    with console.progress(shown) as say:
        say("reading partition 0")
    printed = ANSI.sub("", shown.getvalue()).splitlines()
    seconds, *message = printed[0].split()  # the seconds since the start (a loaded machine: not always 0.0), the message
    assert re.fullmatch(r"\d+\.\ds", seconds) and message == ["reading", "partition", "0"]
