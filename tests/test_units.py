"""Sizes and percentages as users write them: every bad value is a ValueError that reads well.
Durations as the outputs show them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gputrain.assertions.markers import parse_duration
from pytest_gputrain.units import (
    MAX_SIZE,
    format_duration,
    format_value,
    parse_percent,
    parse_size,
    shown,
)


@pytest.mark.parametrize(("value", "expected"), [
    ("6GiB", 6 * 2**30), ("6 GB", 6 * 10**9), (6e9, 6 * 10**9), (512, 512), ("1.5 KiB", 1536),
    ("0", 0), (MAX_SIZE, MAX_SIZE), ("1 TiB", 2**40),
])
def test_sizes(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize(("value", "problem"), [
    (10**400, "invalid size an integer of about 401 digits: larger than 1 EiB (2**60 bytes)"),
    (-(10**5000), "invalid size a negative integer of about 5001 digits: must not be negative"),
    (MAX_SIZE + 1, "invalid size 1152921504606846977: larger than 1 EiB"),
    ("2000000 TiB", "invalid size '2000000 TiB': larger than 1 EiB"),
    ("1e400", "invalid size '1e400': larger than 1 EiB"),
    ("9" * 500, "invalid size '" + "9" * 40 + "'... (500 characters): larger than 1 EiB"),
    (1e300, "invalid size 1e+300: larger than 1 EiB"),
    (math.inf, "invalid size inf: larger than 1 EiB"),
    (math.nan, "invalid size nan: not a number"),
    (-1, "invalid size -1: must not be negative"),
    (-0.5, "invalid size -0.5: must not be negative"),
    (True, "invalid size True: a boolean is not a size"),
    (None, "invalid size None: a NoneType is not a size"),
    ("lots", "invalid size 'lots': expected a number and a unit"),
    ("6 GiBs", "invalid size '6 GiBs': unknown unit 'gibs'"),
], ids=shown)
def test_bad_sizes_name_the_value_and_show_an_example(value: object, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_size(value)
    message = str(raised.value)
    assert message.startswith(problem)
    assert message.endswith('e.g. "6GiB", "6 GB", "512MiB" or 6e9 (bytes)')


@pytest.mark.parametrize(("value", "problem"), [
    (10**400, "invalid percentage an integer of about 401 digits: must lie between 0 and 100"),
    (-(10**400), "invalid percentage a negative integer of about 401 digits: must lie between"),
    (101, "invalid percentage 101: must lie between 0 and 100"),
    ("1e400", "invalid percentage '1e400': must lie between 0 and 100"),
    (math.inf, "invalid percentage inf: must lie between 0 and 100"),
    (math.nan, "invalid percentage nan: not a number"),
    ("nan%", "invalid percentage 'nan%': not a number"),
    (False, "invalid percentage False: a boolean is not a percentage"),
    ("lots", "invalid percentage 'lots': expected a number"),
], ids=shown)
def test_bad_percentages_name_the_value_and_show_an_example(value: object, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_percent(value)
    message = str(raised.value)
    assert message.startswith(problem)
    assert message.endswith('e.g. 70 or "70%"')


@pytest.mark.parametrize("value", [10**400, "1e400", math.inf, math.nan, -1, True], ids=shown)
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError, match=r"invalid duration .*e\.g\. 2, 0\.5"):
        parse_duration(value)


LONG_NUMBERS = st.builds(lambda digits, tail: "9" * digits + tail,
                        st.integers(min_value=300, max_value=5000),
                        st.sampled_from(["", " GiB", ".5", "e9", " A1", "s", "ms"]))
NUMBERS = st.one_of(st.integers(), st.integers().map(lambda n: n * 10**5000), st.floats(),
                    st.booleans(), st.none(), st.text(max_size=30), LONG_NUMBERS)


@given(NUMBERS)
def test_nothing_but_value_error_ever_escapes(value: object) -> None:
    for parse in (parse_size, parse_percent, parse_duration):
        try:
            result = parse(value)
        except ValueError as exc:
            assert len(str(exc)) < 300  # the value is shown, never printed in full
        else:
            assert math.isfinite(result)
            if parse is parse_size:
                assert 0 <= result <= MAX_SIZE


def test_shown_keeps_values_short_and_never_fails() -> None:
    assert shown(10**5000) == "an integer of about 5001 digits"
    assert shown("x" * 100) == repr("x" * 40) + "... (100 characters)"
    assert shown([1] * 100).endswith("...") and len(shown([1] * 100)) == 40
    assert shown(6) == "6"


@pytest.mark.parametrize(("seconds", "readable", "precise"), [
    (None, "–", "–"),
    (0.0123, "12.3 ms", "12.300 ms"),
    (0.009986, "10.0 ms", "9.986 ms"),
    (0.9, "900.0 ms", "900.000 ms"),
    (1.5, "1.50 s", "1.500 s"),
    (0.0000456, "0.0 ms", "45.6 µs"),
    (-0.002, "-2.0 ms", "-2.000 ms"),
])
def test_one_duration_formatter_for_every_output(seconds: float | None, readable: str,
                                                 precise: str) -> None:
    """Findings, the ladder and per-rank summaries read ``readable``; the regression gate, whose
    verdicts turn on a few percent, ``precise``."""
    assert format_duration(seconds) == readable
    assert format_duration(seconds, precise=True) == precise
    if seconds is not None:
        assert format_value(seconds, "s") == readable
