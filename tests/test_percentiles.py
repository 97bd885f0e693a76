"""Percentiles through the standard library, as numpy's default computes them."""

from __future__ import annotations

import math

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gputrain.percentiles import percentiles


def test_percentiles_interpolate_linearly() -> None:
    values = [40.0, 0.0, 30.0, 10.0, 20.0]  # any order
    assert percentiles(values, 0, 10, 50, 90, 100) == pytest.approx((0, 4, 20, 36, 40))
    assert percentiles([7.0], 0, 90) == (7.0, 7.0)  # one value (Python < 3.13 refuses it)
    assert percentiles([3, 1], 50) == (2.0,)


def test_no_values_and_percentiles_past_100_are_errors() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentiles([], 50)
    with pytest.raises(ValueError, match="from 0 to 100"):
        percentiles([1.0, 2.0], 101)


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.lists(st.integers(0, 100), min_size=1, max_size=5))
def test_percentiles_match_numpy(values: list[float], qs: list[int]) -> None:
    expected = numpy.percentile(values, qs)
    got = percentiles(values, *qs)
    assert got == pytest.approx(list(expected), rel=1e-12, abs=1e-9)


def test_tied_values_come_back_within_a_unit_in_the_last_place() -> None:
    # statistics.quantiles computes (x * (n - d) + x * d) / n, not always exactly x.
    for tie in (0.1, 1.1, 20.0, 63.7):
        for got in percentiles([tie] * 7, *range(101)):
            assert abs(got - tie) <= math.ulp(tie)
