"""The documentation holds together: a short README that indexes every page of docs/, and no link between
them that leads nowhere.

Links are checked as GitHub renders the pages: a relative link names a file of the repository (resolved from
the page that holds it), and a `#anchor` names a heading of the page it points into, by GitHub's slug rule
(the heading's text as rendered, lower case, every character that is not a letter, a digit, `_`, `-` or a
space dropped, spaces to hyphens, `-1`, `-2`, ... for repeated headings). Links inside code (fenced blocks,
inline code) are text, not links. Pure Python: nothing is started.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from lakehouse.core.config import REPO_ROOT

ROOT = REPO_ROOT
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 200

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ')'
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0] * len(opened.group(1))
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            found.append((number, line))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's markdown text: code spans and link texts count as their text,
    HTML tags and emphasis markers do not."""
    parts = []
    for i, piece in enumerate(_CODE_SPAN.split(heading)):
        kind = i % 3  # re.split with two groups: text, fence, code, text, ...
        if kind == 0:
            piece = _LINK.sub(lambda m: re.sub(r"^!?\[|\]\(.*$", "", m.group(0)), piece)
            piece = re.sub(r"<[^>]*>", "", piece)
            parts.append(piece)
        elif kind == 2:
            parts.append(piece.strip() if piece.strip() else piece)
    text = "".join(parts).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the page's headings give, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link of the page's prose."""
    found = []
    for number, line in _prose_lines(text):
        prose = _CODE_SPAN.sub("", line)
        found.extend((number, m.group(1)) for m in _LINK.finditer(prose))
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `page` that names no file under `root`, or a heading its page lacks."""
    problems = []
    for number, target in links(page.read_text(encoding="utf-8")):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue  # an external address: not checked here
        path_part, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{number}: {target}"
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if root not in (resolved, *resolved.parents):
            problems.append(f"{where}: leaves the repository")
            continue
        if not resolved.exists():
            problems.append(f"{where}: {resolved.relative_to(root)} does not exist")
            continue
        if anchor:
            if resolved.suffix != ".md" or resolved.is_dir():
                problems.append(f"{where}: an anchor into a file that is not a markdown page")
            elif unquote(anchor) not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{where}: {resolved.relative_to(root)} has no heading with anchor #{anchor}")
    return problems


def readme_lines(readme: Path = README) -> int:
    return len(readme.read_text(encoding="utf-8").splitlines())


def unindexed_pages(readme: Path = README, docs: Path = DOCS) -> list[str]:
    """The pages of `docs` that `readme` does not link to."""
    linked = {(readme.parent / unquote(target.partition("#")[0])).resolve()
              for _, target in links(readme.read_text(encoding="utf-8")) if not _SCHEME.match(target)}
    return [p.name for p in sorted(docs.glob("*.md")) if p.resolve() not in linked]


# --- the repository's pages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_of_a_page_leads_somewhere(page):
    assert broken_links(page) == []


def test_the_readme_is_at_most_200_lines():
    assert readme_lines() <= README_MAX_LINES, \
        f"README.md has {readme_lines()} lines; move detail into a page of docs/"


def test_every_page_of_docs_is_linked_from_the_readme():
    assert unindexed_pages() == [], "pages of docs/ the README's index does not link to"


# --- the checker itself: it finds what is broken, and only that ----------------------------------------------

@pytest.mark.parametrize("heading, anchor", [
    ("Guarantees: what holds and what does not", "guarantees-what-holds-and-what-does-not"),
    ("`replay`: offsets, a time range or dead letters, without duplicates",
     "replay-offsets-a-time-range-or-dead-letters-without-duplicates"),
    ("Secured Kafka (SASL/SCRAM, TLS)", "secured-kafka-saslscram-tls"),
    ("What you will see with `make demo`", "what-you-will-see-with-make-demo"),
    ("How CI runs: `.ci/run`", "how-ci-runs-cirun"),
    ("`maintain --dry-run`", "maintain---dry-run"),
    ("Cost: what `lakehouse cost` measures", "cost-what-lakehouse-cost-measures"),
    ("The [README](../README.md) and `<pipeline>_ingest`", "the-readme-and-pipeline_ingest"),
    ("Ünïcode stays, émphasis *goes*", "ünïcode-stays-émphasis-goes"),
])
def test_headings_get_githubs_anchors(heading, anchor):
    assert slug(heading) == anchor


def test_a_repeated_heading_is_numbered_and_a_heading_in_code_is_no_heading():
    text = "# Usage\n\n## Usage\n\n```\n# not a heading\n```\n\n### Usage\n"
    assert anchors(text) == {"usage", "usage-1", "usage-2"}


def _site(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def _reasons(problems: list[str]) -> list[str]:
    return [p.split(": ", 1)[1] for p in problems]  # without "file:line: "


def test_the_checker_reports_a_missing_file_a_missing_anchor_and_a_link_out_of_the_repository(tmp_path):
    root = _site(tmp_path / "repo", {
        "docs/a.md": "# A page\n\n## Details here\n",
        "README.md": "[ok](docs/a.md#details-here) [gone](docs/b.md) [no anchor](docs/a.md#details)\n"
                     "[same page](#nowhere) [out](../outside.md) [web](https://example.com/x.md#y)\n",
        "../outside.md": "# Outside\n",
    })
    assert _reasons(broken_links(root / "README.md", root)) == [
        "docs/b.md: docs/b.md does not exist",
        "docs/a.md#details: docs/a.md has no heading with anchor #details",
        "#nowhere: README.md has no heading with anchor #nowhere",
        "../outside.md: leaves the repository",
    ]


def test_links_inside_code_are_not_checked_while_titled_links_and_images_are(tmp_path):
    root = _site(tmp_path, {
        "docs/x.md": "# X\n", "docs/img.png": "",
        "docs/page.md": "# Page\n\n```\n[in a fence](missing.md)\n```\n\n`[inline code](missing.md)`\n\n"
                        "[titled](x.md \"a title\") ![image](img.png) ![gone](nothing.png) [dir](../docs)\n",
    })
    assert _reasons(broken_links(root / "docs" / "page.md", root)) == ["nothing.png: docs/nothing.png does not exist"]


def test_a_readme_over_the_limit_and_a_page_left_out_of_its_index_are_found(tmp_path):
    root = _site(tmp_path, {
        "docs/linked.md": "# Linked\n", "docs/orphan.md": "# Orphan\n",
        "README.md": "[linked](docs/linked.md#linked)\n" + "a line\n" * README_MAX_LINES,
    })
    assert readme_lines(root / "README.md") == README_MAX_LINES + 1
    assert unindexed_pages(root / "README.md", root / "docs") == ["orphan.md"]
