"""Contract `pattern`s run on producer-controlled values, so they run on RE2: matching takes time linear in
the value whatever the pattern (`(a+)+$` on 'a'*50+'b' would keep Python's re busy for ages), values are
length-bounded before matching, and a spec whose pattern RE2 does not run is refused with the reason.
Pure unit tests: no Spark, no broker."""

from __future__ import annotations

import json
import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.core import schemas
from lakehouse.core.errors import SchemaTranslationError
from lakehouse.core.spec import MAX_MATCHED_CHARS, MAX_PATTERN_CHARS, FieldSpec, SpecError, contract_pattern
from lakehouse.ingest.checks import field_checker
from lakehouse.ingest.rejects import Rejected
from lakehouse.ingest.validator import RecordValidator

GUARD_S = 60  # generous: RE2 answers in microseconds, Python's re on these would take years
EVIL = [("(a+)+$", "a" * 50 + "b"), ("(a|aa)*c", "a" * 60), ("(x+x+)+y", "x" * 60),
        ("(\\w+\\s?)*$", "word " * 30 + "!"), ("^(([a-z])+.)+[A-Z]([a-z])+$", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa!")]


def verdicts(check, values) -> list | str:
    """check(value) for each value in a thread: each the value or the Rejected kind; "hung" after GUARD_S."""
    found: list = []

    def run():
        for value in values:
            try:
                found.append(check(value))
            except Rejected as rejected:
                found.append(rejected.kind)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(GUARD_S)
    return found if not worker.is_alive() else "hung"


@pytest.fixture
def code_spec(make_spec):
    """A pipeline whose `code` field is `pattern`-checked: make_spec with that pattern."""
    def build(pattern: str, **extra):
        return make_spec(fields=[{"name": "order_id", "type": "string", "required": True},
                                 {"name": "code", "type": "string", "required": True, "pattern": pattern, **extra}],
                         partition_by=None, max_value_bytes=1024 * 1024)
    return build


# ----------------------------------------------------------------------------- linear-time matching

@pytest.mark.parametrize("pattern, value", EVIL)
def test_a_catastrophic_pattern_gets_its_verdict_at_once(pattern, value):
    check = field_checker(FieldSpec("code", "string", pattern=pattern))
    assert verdicts(check, [value]) == ["pattern_mismatch"]


def test_a_catastrophic_pattern_in_a_spec_dead_letters_on_both_reader_paths(code_spec):
    validator = RecordValidator(code_spec("(a+)+$"))
    assert validator.fast_path is not None  # the JSON fast path is the one that runs in production
    bad = json.dumps({"order_id": "ord-1", "code": "a" * 50 + "b"}).encode()
    good = json.dumps({"order_id": "ord-1", "code": "a" * 5000}).encode()
    assert verdicts(lambda v: validator.check_row("ord-1", v), [bad, good]) == \
        ["pattern_mismatch", ("ord-1", "a" * 5000)]
    assert verdicts(lambda v: validator.check("ord-1", v), [bad]) == ["pattern_mismatch"]


# --------------------------------------------------------------------------------- length bounded

def test_a_value_longer_than_the_matched_bound_is_refused_before_matching_on_both_paths(code_spec):
    validator = RecordValidator(code_spec("[a-z]+"))
    at_bound = "a" * MAX_MATCHED_CHARS
    over = json.dumps({"order_id": "ord-1", "code": at_bound + "a"}).encode()
    assert validator.check_row("ord-1", json.dumps({"order_id": "ord-1", "code": at_bound}).encode()) == \
        ("ord-1", at_bound)
    for check in (validator.check, validator.check_row):
        with pytest.raises(Rejected) as info:
            check("ord-1", over)
        assert info.value.kind == "too_long"
        assert str(info.value.detail) == (f"code has {MAX_MATCHED_CHARS + 1} characters; a field with a pattern "
                                          f"is matched up to {MAX_MATCHED_CHARS}")


def test_a_field_with_a_pattern_cannot_declare_a_longer_max_length(code_spec):
    with pytest.raises(SpecError) as info:
        code_spec("[a-z]+", max_length=MAX_MATCHED_CHARS + 1)
    assert info.value.field == "contract.fields[code].max_length"
    assert f"a field with a pattern holds at most {MAX_MATCHED_CHARS} characters" in info.value.why
    assert code_spec("[a-z]+", max_length=MAX_MATCHED_CHARS).contract.field("code").max_length == MAX_MATCHED_CHARS


# ------------------------------------------------------------------------------ what RE2 cannot run

@pytest.mark.parametrize("pattern, why", [
    ("^(?=x)[a-z]+$", "is not a pattern RE2 runs (invalid perl operator: (?=)"),
    ("^(?!x)[a-z]+$", "is not a pattern RE2 runs (invalid perl operator: (?!)"),
    ("(?<=a)b", "is not a pattern RE2 runs (invalid perl operator: (?<=)"),
    ("(a)\\1", "is not a pattern RE2 runs (invalid escape sequence: \\1)"),
    ("a++", "is not a pattern RE2 runs (bad repetition operator: ++)"),
    ("[A-Z]{3}\\Z", "\\Z is written \\z"),
    ("[0-9]{,3}", "uses {,n}, which Python's re reads as {0,n} and RE2 as text: write {0,n}"),
    ("(a{100}){100}", "is not a pattern RE2 runs"),
    ("x" * (MAX_PATTERN_CHARS + 1), f"at most {MAX_PATTERN_CHARS}"),
    ("[A-Z", "is not a regular expression: unterminated character set"),
    ("\\p{L}+", "is not a regular expression: bad escape \\p"),
])
def test_a_pattern_re2_does_not_run_is_refused_at_load_with_the_reason(code_spec, pattern, why):
    with pytest.raises(SpecError) as info:
        code_spec(pattern)
    assert info.value.field == "contract.fields[code].pattern"
    assert why in info.value.why


def test_a_writer_schemas_pattern_re2_does_not_run_is_a_translation_error_naming_the_field():
    document = {"type": "object", "required": ["code"],
                "properties": {"code": {"type": "string", "pattern": "^(?!test)[a-z]+$"}}}
    with pytest.raises(SchemaTranslationError, match=r"^code: pattern '\^\(\?!test\)\[a-z\]\+\$' is not a pattern "
                                                     r"RE2 runs \(invalid perl operator: \(\?!\)"):
        schemas.derive("JSON", json.dumps(document))
    document["properties"]["code"]["pattern"] = "^[a-z]+$"
    assert schemas.derive("JSON", json.dumps(document))[0].pattern == "^[a-z]+$"


# ------------------------------------------------------------------------------- the same meaning

def regex_tree(depth: int = 3):
    """Patterns in the syntax Python's re and RE2 share and read alike (ASCII, no \\d \\w \\s classes)."""
    atom = st.sampled_from(["a", "b", "c", ".", "[ab]", "[^a]", "[a-c]", "\\.", "x"])
    if depth == 0:
        return atom
    inner = regex_tree(depth - 1)
    return st.one_of(
        atom,
        st.builds(lambda a, b: a + b, inner, inner),
        st.builds(lambda a, b: f"(?:{a}|{b})", inner, inner),
        st.builds(lambda a, q: f"(?:{a}){q}", inner, st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,2}"])),
        st.builds(lambda a: f"({a})", inner),
    )


@settings(max_examples=300, deadline=None, database=None)
@given(pattern=st.one_of(regex_tree(), regex_tree().map(lambda p: f"^{p}$")),
       text=st.text(alphabet="abcx.\n", max_size=12))
def test_a_pattern_means_what_it_means_in_pythons_re(pattern, text):
    """Specs written before patterns ran on RE2 keep their verdicts (on the shared syntax, anchors around the
    whole: inside a pattern Python's `$` also matches before a final newline, RE2's only at the end)."""
    assert contract_pattern(pattern)(text) == (re.fullmatch(pattern, text) is not None)


@settings(max_examples=300, deadline=None, database=None)
@given(text=st.text(alphabet=st.sampled_from("ab.@ \t\n\v\f\r\u00a0\u2028é\ud800z"), max_size=16))
def test_classes_are_ascii_and_a_lone_surrogate_never_matches(text):
    """RE2 reads \\s as ASCII whitespace without the vertical tab (Python's re: Unicode's); docs/spec.md says so."""
    matches = contract_pattern("^[^@\\s]+@[^@\\s]+\\.[a-z]{2,}$")
    expected = re.fullmatch("[^@\t\n\f\r ]+@[^@\t\n\f\r ]+\\.[a-z]{2,}", text) is not None
    if "\ud800" in text:
        expected = False  # not Unicode: the reader dead-letters it as bad_string before any pattern
    assert matches(text) == expected
