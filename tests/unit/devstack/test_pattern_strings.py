"""Strings for a contract's `pattern` (lakehouse_dev.pattern_strings): what `matching` hands out matches the
pattern whole within the max length, what `mismatching` picks fits the length but not the pattern, and a pattern
it cannot walk or fit is refused naming the field."""

from __future__ import annotations

import re
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakehouse_dev.pattern_strings import matching, mismatching, pattern_core
from lakehouse_dev.record_formats import ProduceError

PATTERNS = [r"^[A-Z]{3}$", r"^[a-z]{2}-\d{4}(-[A-Z])?$", r"\A[0-9a-f]{8}\Z", r"^(EU|US|APAC)-\w{2,5}$",
            r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", r"^(ab|cd)\1x?$", r"^[^0-9]{1,3}\.[0-9]+$", r"^.{4}\S\s?\D$",
            r"^SKU_\d+$", r"^[A-Z][a-z]*( [A-Z][a-z]*)*$"]


@given(pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 2**32 - 1), max_length=st.none() | st.integers(20, 80))
def test_every_string_handed_out_matches_the_whole_pattern_within_the_max_length(pattern, seed, max_length):
    """(20 characters or more: about a third of the candidates for the longest patterns fit, so TRIES draws find
    one; a length no candidate fits is the refusal below.)"""
    one = matching(pattern, max_length, Random(seed), "orders.yaml: field sku")
    for _ in range(20):
        value = one()
        assert re.fullmatch(pattern, value), (pattern, value)
        assert max_length is None or len(value) <= max_length


@given(pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 2**32 - 1), max_length=st.none() | st.integers(1, 12))
def test_a_near_miss_fits_the_max_length_but_never_the_pattern(pattern, seed, max_length):
    value = mismatching(pattern, max_length, Random(seed))
    assert value is not None  # "?" and "0" miss every pattern above and fit any length
    assert not re.fullmatch(pattern, value) and (max_length is None or len(value) <= max_length)


def test_no_near_miss_when_the_pattern_takes_every_candidate():
    assert mismatching(r"^.*$", None, Random(1)) is None


def test_the_same_seed_gives_the_same_strings():
    first, again = (matching(r"^[a-z]{2}-\d{4}(-[A-Z])?$", 9, Random(7), "f") for _ in range(2))
    assert [first() for _ in range(50)] == [again() for _ in range(50)]


def test_a_lookaround_is_refused_naming_the_field_and_the_pattern():
    one = matching(r"^(?=a)\w+$", None, Random(0), "orders.yaml: field code")
    with pytest.raises(ProduceError, match=r"orders.yaml: field code: cannot generate values for pattern '\^\(\?=a\)"):
        one()


def test_a_pattern_no_string_within_the_max_length_matches_is_refused():
    one = matching(r"^[a-z]{5}$", 3, Random(0), "orders.yaml: field code")
    with pytest.raises(ProduceError, match="cannot generate values matching .* within max_length 3"):
        one()


@pytest.mark.parametrize(("pattern", "core"), [("^[A-Z]{3}$", "[A-Z]{3}"), (r"\A[A-Z]{2}\Z", "[A-Z]{2}"),
                                               (r"\A\d+\z", r"\d+"), ("a@b", "a@b")])
def test_the_core_of_a_pattern_is_it_without_its_anchors(pattern, core):
    assert pattern_core(pattern) == core


def test_a_seed_gives_the_strings_it_always_gave():
    """Benches and tests replay a seed and expect the same records: the strings below are what walking the
    pattern's tree for every string gave before the tree was compiled once."""
    one = matching(r"^(EU|US|APAC)-\w{2,5}(-[a-z]\d?)?$", None, Random(7), "f")
    assert [one() for _ in range(6)] == ["US-zPd", "APAC-xL", "APAC-cfB-c", "EU-d0Kh8", "APAC-KL-b", "EU-sAj"]
    again = matching(r"^(ab|cd)\1x?$", None, Random(3), "f")
    assert [again() for _ in range(6)] == ["abab", "cdcdx", "abab", "cdcdx", "abab", "cdcdx"]
