"""Hostile specs: whatever a spec file holds, loading it returns a valid spec or raises SpecError, quickly.

Property-based (hypothesis) with modest example counts: the whole module runs in a few seconds.
"""

import copy
import math
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core.config import REPO_ROOT
from lakehouse.core import events
from lakehouse.core.spec import (
    CAPS,
    DURATION_CAPS_S,
    MAX_DURATION_S,
    MAX_MATCHED_CHARS,
    MAX_SPEC_BYTES,
    OPS_TIMELINE_TABLE,
    SPEC_COLUMN_PROPERTIES,
    SPEC_PROPERTIES,
    PipelineSpec,
    SpecError,
    contract_pattern,
    is_table_name,
    load_spec,
    load_specs,
    parse_duration,
)

ORDERS = REPO_ROOT / "include" / "pipelines" / "orders.yaml"
TEMPLATE = yaml.safe_load(ORDERS.read_text())
EXAMPLES = settings(max_examples=40, deadline=None, database=None)

# Characters a name must never carry: whitespace (ASCII and Unicode line breaks) and control characters.
JUNK = ["\n", "\r", "\t", " ", "\x0b", "\x0c", "\x00", "\x1b", "\x7f", "\x85", "\u00a0", "\u2028", "\u2029"]
NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)
# Where a name sits in the spec, and the field a bad one is reported at.
NAME_FIELDS = {
    "name": ("name",),
    "source.topic": ("source", "topic"),
    "target.catalog": ("target", "catalog"),
    "target.table": ("target", "table"),
    "dead_letter.table": ("dead_letter", "table"),
    "publish.view": ("publish", "view"),
    "publish.branch": ("publish", "branch"),
    "candidate_for": ("candidate_for",),
}
NAME_VALUES = {"source.topic": "{}", "target.table": "raw.{}", "dead_letter.table": "raw.{}_dlq",
               "publish.view": "serve.{}"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder for the files the properties write (module scope: hypothesis reruns one test many times)."""
    return tmp_path_factory.mktemp("hostile")


def write(directory: Path, raw, name: str = "spec.yaml") -> Path:
    path = directory / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return path


def set_at(raw: dict, keys: tuple[str, ...], value) -> dict:
    """A deep copy of `raw` with `value` at the nested `keys`."""
    changed = copy.deepcopy(raw)
    here = changed
    for key in keys[:-1]:
        if not isinstance(here.get(key), dict):
            here[key] = {}
        here = here[key]
    here[keys[-1]] = value
    return changed


def load_or_spec_error(path: Path) -> PipelineSpec | SpecError:
    """The spec, or the SpecError; any other exception fails the test."""
    try:
        return load_spec(path)
    except SpecError as exc:
        assert exc.path == str(path) and exc.field and exc.why
        return exc


# ------------------------------------------------------------------------------------------ names

@EXAMPLES
@given(name=NAME, junk=st.sampled_from(JUNK), at=st.sampled_from(["start", "middle", "end"]),
       field=st.sampled_from(sorted(NAME_FIELDS)))
def test_a_name_with_whitespace_or_a_control_character_is_refused(scratch, name, junk, at, field):
    value = NAME_VALUES.get(field, "{}").format(name)
    cut = len(value) // 2
    bad = {"start": junk + value, "middle": value[:cut] + junk + value[cut:], "end": value + junk}[at]
    assert not is_table_name(bad)
    error = load_or_spec_error(write(scratch, set_at(TEMPLATE, NAME_FIELDS[field], bad)))
    assert isinstance(error, SpecError) and error.field == field, error


@EXAMPLES
@given(text=st.text(max_size=40))
def test_a_table_name_is_printable_ascii_with_one_dot_and_nothing_around_it(text):
    if is_table_name(text):
        assert text.isascii() and text.isprintable() and text == text.strip() and text.count(".") == 1
    assert is_table_name(f"raw.{text}") == (text != "" and text[0] in "abcdefghijklmnopqrstuvwxyz_"
                                             and all(c in "abcdefghijklmnopqrstuvwxyz0123456789_" for c in text)
                                             and len(text) <= 128)


# ------------------------------------------------------------------------------------ any document

YAML_TEXT = st.text(alphabet=st.sampled_from(list("ab:- []{},'\"!&*#|>\n\t09.%@`?~=\\") + ["\u00e9", "\ufeff"]),
                    max_size=200)


@EXAMPLES
@given(text=YAML_TEXT)
def test_any_text_loads_or_fails_with_a_spec_error(scratch, text):
    load_or_spec_error(write(scratch, text))


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["5s", "0s", "1e400s", ".inf", "-1", "raw.x\n", "day(event_time)", "bucket(0, order_id)",
                     "@hourly", "61 * * * *", "lakehouse.pipeline", "ops.pipeline_events"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=3)),
                      max_leaves=8)


def key_paths(raw: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of the template, nested mappings included."""
    paths = []
    for key, value in raw.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths.extend(key_paths(value, (*prefix, key)))
    return paths


KEY_PATHS = key_paths(TEMPLATE) + [("target", "properties"), ("target", "fanout"), ("retention", "delete_after"),
                                   ("target", "properties", "write.wap.enabled"), ("colour",),
                                   ("target", "properties", "write.data.path"), ("target", "properties", "gc.enabled"),
                                   ("target", "properties", "write.py-location-provider.impl"),
                                   ("target", "properties", "commit.retry.num-retries"),
                                   ("target", "properties", "write.metadata.metrics.column.currency")]


@EXAMPLES
@given(keys=st.sampled_from(KEY_PATHS), value=VALUES)
def test_any_value_anywhere_loads_within_the_caps_or_fails_with_a_spec_error(scratch, keys, value):
    loaded = load_or_spec_error(write(scratch, set_at(TEMPLATE, keys, value)))
    if isinstance(loaded, PipelineSpec):
        durations = [loaded.trigger.interval_s, loaded.slo.freshness_s, loaded.slo.lag_s,
                     loaded.supervision.restart_backoff_s, loaded.maintenance.orphan_safety_window_s,
                     loaded.retention.outage_budget_s, loaded.retention.replay_window_s]
        assert all(math.isfinite(d) and 0 <= d <= MAX_DURATION_S for d in durations)
        assert 0 < loaded.trigger.interval_s <= DURATION_CAPS_S["trigger.interval"]
        assert 1 <= loaded.source.partitions <= CAPS["source.partitions"]
        assert 1 <= loaded.trigger.max_records_per_batch <= CAPS["trigger.max_records_per_batch"]
        assert all(is_table_name(t) for t in (*loaded.owned_tables, *loaded.views))
        assert all(isinstance(k, str) and isinstance(v, str) and not k.startswith("lakehouse.")
                   for k, v in loaded.target.properties.items())
        # only the allow-list: never where files go, what may be deleted, or code to import
        assert all(k in SPEC_PROPERTIES or k.startswith(tuple(SPEC_COLUMN_PROPERTIES))
                   for k in loaded.target.properties)


# ------------------------------------------------------------------------------- contract patterns

PATTERN_TEXT = st.one_of(
    st.text(alphabet=st.sampled_from(list("a!.*+?|()[]{}^$\\-,0123:=<>PpdwszZbB") + ["\u00e9", "\U0001f600"]),
            max_size=30),
    st.sampled_from(["(a+)+$", "(a|a?)+!", "(.*a){12}", "(?=a)a", "(a)\\1", "a{,3}", "((a{100}){100}){100}", "",
                     "[A-Z]{3}\\Z", "x" * 1001]),
)
LONG_VALUES = ["a" * 20_000 + "!", "\u00e9" * MAX_MATCHED_CHARS, ("a" * 63 + "!") * (MAX_MATCHED_CHARS // 64)]


@EXAMPLES
@given(pattern=PATTERN_TEXT, max_length=st.one_of(st.none(), st.integers(1, CAPS["source.max_value_bytes"])))
def test_any_contract_pattern_loads_and_matches_in_linear_time_or_fails_with_a_spec_error(scratch, pattern,
                                                                                         max_length):
    """Patterns run on producer-controlled values: one that loads answers on the longest value a field with a
    pattern may hold at once, whatever it is (`(a+)+$` included); one RE2 does not run is refused where it is."""
    raw = copy.deepcopy(TEMPLATE)
    currency = next(f for f in raw["contract"]["fields"] if f["name"] == "currency")
    currency.update(pattern=pattern, **({} if max_length is None else {"max_length": max_length}))
    loaded = load_or_spec_error(write(scratch, raw))
    if isinstance(loaded, SpecError):
        assert loaded.field in ("contract.fields[currency].pattern", "contract.fields[currency].max_length")
        return
    field = loaded.contract.field("currency")
    assert field.pattern == pattern and (field.max_length or 0) <= MAX_MATCHED_CHARS
    matches = contract_pattern(pattern)
    started = time.monotonic()
    verdicts = [matches(value) for value in LONG_VALUES]
    assert time.monotonic() - started < 5, (pattern, verdicts)


# ------------------------------------------------------------------------------- YAML bombs and size

BILLION_LAUGHS = "\n".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\n"


def test_an_alias_bomb_is_refused_at_once(scratch):
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"\(file\): is not valid YAML: aliases \(\*name\) are not allowed"):
        load_spec(write(scratch, BILLION_LAUGHS, "bomb.yaml"))
    assert time.monotonic() - started < 0.5


def test_anchors_without_aliases_are_harmless(scratch):
    text = ORDERS.read_text().replace("name: orders", "name: &pipeline orders")
    assert load_spec(write(scratch, text, "anchored.yaml")).name == "orders"


@pytest.mark.parametrize("text, why", [
    ("[" * 100_000, "nests deeper than 32 levels"),
    ("name: a\nname: b\n", "found duplicate key 'name'"),
    ("1: x\nname: y\n", "field names must be strings, got 1"),
    ("- just\n- a list\n", "must be a mapping, got list"),
    ("name: !!python/object:os.system ls\n", "could not determine a constructor"),
    (ORDERS.read_text().replace("partitions: 3", "partitions: 0x" + "f" * 20_000), "a value too large to show"),
    (ORDERS.read_text().replace("partitions: 3", "partitions: 1" + "0" * 5000), "is not valid YAML: Exceeds"),
])
def test_hostile_yaml_is_a_spec_error(scratch, text, why):
    with pytest.raises(SpecError, match=why.replace("(", r"\(").replace(")", r"\)")):
        load_spec(write(scratch, text, "hostile.yaml"))


def test_a_file_over_one_mebibyte_is_refused_unread(scratch):
    path = scratch / "huge.yaml"
    path.write_text(ORDERS.read_text() + "#" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=r"\(file\): is larger than 1024 KiB"):
        load_spec(path)


def test_a_fifo_or_non_utf8_file_is_a_spec_error_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "pipe.yaml")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1"))
    errors = load_specs(tmp_path).errors
    assert errors[str(tmp_path / "pipe.yaml")].why == "is not a regular file"
    assert errors[str(tmp_path / "latin1.yaml")].why.startswith("is not UTF-8 text")


# -------------------------------------------------------------------------------------- durations

DURATION_INPUTS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2 ** 80), max_value=2 ** 80),
    st.text(max_size=12), st.booleans(), st.none(),
    st.from_regex(r"-?[0-9]{1,400}(\.[0-9]{1,5})? ?(ms|s|m|h|d)", fullmatch=True),
)


@settings(max_examples=200, deadline=None, database=None)
@given(value=DURATION_INPUTS, positive=st.booleans(), maximum=st.sampled_from([86400.0, MAX_DURATION_S]))
def test_a_duration_is_finite_and_within_its_cap_or_a_value_error(value, positive, maximum):
    try:
        seconds = parse_duration(value, positive=positive, maximum=maximum)
    except ValueError:
        return
    assert math.isfinite(seconds) and 0 <= seconds <= maximum and (seconds > 0 or not positive)


@EXAMPLES
@given(value=DURATION_INPUTS)
def test_a_spec_duration_is_within_its_cap_or_a_spec_error(scratch, value):
    raw = set_at(TEMPLATE, ("maintenance", "orphan_safety_window"), "3650d")  # past 100 of the longest trigger
    loaded = load_or_spec_error(write(scratch, set_at(raw, ("trigger", "interval"), value)))
    if isinstance(loaded, SpecError):
        assert loaded.field == "trigger.interval"
    else:
        assert 0 < loaded.trigger.interval_s <= 86400


# ----------------------------------------------------------------------------- one table, one owner

POOL = ["raw.a", "raw.b", "raw.c", "serve.a", "serve.b"]


def expected_broken(claims: dict[str, tuple[str, str, str]]) -> set[str]:
    """The pipelines a folder of specs claiming (table, dead-letter table, view) should refuse."""
    alone = {name for name, names in claims.items() if len(set(names)) == 3}
    broken = set(claims) - alone
    for name in alone:
        others = {n for other in alone - {name} for n in claims[other]}
        if others & set(claims[name]):
            broken.add(name)
    return broken


@settings(max_examples=20, deadline=None, database=None)
@given(claims=st.lists(st.tuples(*[st.sampled_from(POOL)] * 3), min_size=2, max_size=4))
def test_overlapping_specs_break_every_file_involved_and_only_those(tmp_path_factory, claims):
    directory = tmp_path_factory.mktemp("overlap")
    wanted = {}
    for i, (table, dead_letters, view) in enumerate(claims):
        name = f"p{i}"
        raw = copy.deepcopy(TEMPLATE)
        raw.update(name=name, source={**raw["source"], "topic": name})
        raw["target"]["table"], raw["dead_letter"]["table"], raw["publish"]["view"] = table, dead_letters, view
        write(directory, raw, f"{name}.yaml")
        wanted[name] = (table, dead_letters, view)
    found = load_specs(directory)
    broken = expected_broken(wanted)
    assert set(found.specs) == set(wanted) - broken
    assert {Path(path).stem for path in found.errors} == broken
    for path, error in found.errors.items():
        mine = set(wanted[Path(path).stem])
        if len(mine) == 3:  # broken by another file: the message names it and a table both claim
            assert any(f"'{other}'" in error.why and f"({directory / other}.yaml)" in error.why
                       for other in wanted if other != Path(path).stem)
            assert any(f"{table!r} is also" in error.why for table in mine)


def test_the_ops_timeline_name_is_the_events_modules():
    assert OPS_TIMELINE_TABLE == events.EVENTS_TABLE
