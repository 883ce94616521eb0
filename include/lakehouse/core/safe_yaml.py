"""Spec files as YAML, read safely and with the line of every value.

Hostile input is bounded: a spec file is a regular file of at most MAX_SPEC_BYTES UTF-8 bytes holding
plain YAML: PyYAML's safe loader without aliases (`*ref` expands into billions of nodes), duplicate
keys (the second would silently win) or nesting deeper than MAX_YAML_DEPTH (the composer recurses).

`read_yaml_file` returns a `YamlDocument`: the data, and the line each mapping entry and list item
starts on, so that an error names the line of the value it is about (`YamlDocument.line_of`).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lakehouse.core.errors import SpecError
from lakehouse.core.wording import shown

MAX_SPEC_BYTES = 1024 * 1024  # a spec is a page of YAML; a larger file is a mistake or an attack
MAX_YAML_DEPTH = 32


class _SpecYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, duplicate keys or nesting deeper than MAX_YAML_DEPTH."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in pipeline specs: write the value out",
                self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nests deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"found duplicate key {shown(key_node.value)}", key_node.start_mark)
                    seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class YamlDocument:
    """A YAML document's data, and `lines`: the 1-based line of each mapping entry (its key's line) and
    list item, by its path of keys and indexes from the top, e.g. ("contract", "fields", 2, "type")."""

    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)

    def line_of(self, where: str) -> int | None:
        """The line of the value a spec field path names (`target.properties.write.parquet.page-size-bytes`,
        `contract.fields[2].type`, `contract.fields[amount].type`: a list item by index or by its `name`),
        or of the nearest enclosing value the document has (a missing key is reported where its mapping
        is); None for the document as a whole."""
        path: tuple = ()
        here, rest = self.data, where
        while rest:
            if rest.startswith("[") and isinstance(here, list):
                token, _, rest = rest[1:].partition("]")
                index = int(token) if token.isdigit() else next(
                    (i for i, item in enumerate(here) if isinstance(item, dict) and item.get("name") == token), None)
                if index is None or index >= len(here):
                    break
                path, here = (*path, index), here[index]
            elif isinstance(here, dict):
                rest = rest.removeprefix(".")
                # the longest key the path starts with: property names and route values hold dots
                keys = [key for key in here if rest == str(key) or rest.startswith((f"{key}.", f"{key}["))]
                if not keys:
                    break
                key = max(keys, key=lambda k: len(str(k)))
                path, here, rest = (*path, key), here[key], rest[len(str(key)):]
            else:
                break
        return self.lines.get(path)


def _lines(node: yaml.Node, data: Any, path: tuple, lines: dict[tuple, int]) -> None:
    """Record in `lines` the line of every mapping entry and list item under `node`, constructed as `data`."""
    if isinstance(node, yaml.MappingNode) and isinstance(data, dict) and len(node.value) == len(data):
        for (key_node, value_node), key in zip(node.value, data, strict=True):  # construction keeps the order
            lines[(*path, key)] = key_node.start_mark.line + 1
            _lines(value_node, data[key], (*path, key), lines)
    elif isinstance(node, yaml.SequenceNode) and isinstance(data, list) and len(node.value) == len(data):
        for index, (item_node, item) in enumerate(zip(node.value, data, strict=True)):
            lines[(*path, index)] = item_node.start_mark.line + 1
            _lines(item_node, item, (*path, index), lines)


def parse_yaml(text: str, name: str = "<text>") -> YamlDocument:
    """The YAML document in `text` with its lines; raises yaml.YAMLError (with the mark of the problem)
    or ValueError (an integer of more than 4300 digits)."""
    loader = _SpecYamlLoader(text)
    loader.name = name  # error marks say 'in "orders.yaml", line 3', not '<unicode string>'
    try:
        node = loader.get_single_node()
        if node is None:
            return YamlDocument(None)
        data = loader.construct_document(node)
        lines: dict[tuple, int] = {}
        _lines(node, data, (), lines)
        return YamlDocument(data, lines)
    finally:
        loader.dispose()


def read_yaml_file(path: Path) -> YamlDocument:
    """The YAML document in spec file `path`; raises SpecError when the file is not a readable regular
    file of at most MAX_SPEC_BYTES UTF-8 bytes holding plain YAML (with the line of the YAML error)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or a device would block or never end
            raise SpecError(path, "(file)", "is not a regular file")
        with path.open("rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(path, "(file)", f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(path, "(file)", f"is larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is a page of YAML")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(path, "(file)", f"is not UTF-8 text: {exc}") from None
    try:
        return parse_yaml(text, path.name)
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
        mark = getattr(exc, "problem_mark", None)
        if mark is None or mark.index >= len(text):  # the end of the file: where the unclosed part begins
            mark = getattr(exc, "context_mark", None) or mark
        raise SpecError(path, "(file)", f"is not valid YAML: {exc}",
                        line=None if mark is None else mark.line + 1) from None
