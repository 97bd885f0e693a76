"""Statistics of the regression gate: Mann–Whitney U, Hodges–Lehmann, the decision, throttling."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gputrain.regression import stats
from pytest_gputrain.regression.stats import (
    compare_samples,
    hodges_lehmann,
    mann_whitney_u,
    median,
    quantile,
    throttled_rounds,
    u_distribution,
)


def brute_force_distribution(n1: int, n2: int) -> tuple[int, ...]:
    counts: Counter[int] = Counter()
    for positions in itertools.combinations(range(n1 + n2), n1):
        counts[sum(p + 1 for p in positions) - n1 * (n1 + 1) // 2] += 1
    return tuple(counts[u] for u in range(n1 * n2 + 1))


@pytest.mark.parametrize(("n1", "n2"), [(1, 1), (1, 5), (2, 3), (3, 2), (4, 4), (5, 7), (7, 3)])
def test_exact_distribution_matches_enumeration(n1: int, n2: int) -> None:
    assert u_distribution(n1, n2) == brute_force_distribution(n1, n2)
    assert sum(u_distribution(n1, n2)) == math.comb(n1 + n2, n1)


def test_exact_p_value_by_hand() -> None:
    # x entirely above y, 3 vs 3: only 1 of C(6,3) = 20 arrangements is as extreme.
    result = mann_whitney_u([4, 5, 6], [1, 2, 3], "greater")
    assert result.method == "exact"
    assert result.u == 9
    assert result.p_value == pytest.approx(1 / 20)
    assert mann_whitney_u([4, 5, 6], [1, 2, 3], "less").p_value == pytest.approx(1.0)
    assert mann_whitney_u([4, 5, 6], [1, 2, 3], "two-sided").p_value == pytest.approx(2 / 20)


def test_normal_approximation_close_to_exact() -> None:
    rng = random.Random(7)
    x = [rng.gauss(0.3, 1) for _ in range(30)]
    y = [rng.gauss(0, 1) for _ in range(30)]
    exact = mann_whitney_u(x, y, "greater")
    assert exact.method == "exact"
    old = stats.EXACT_LIMIT
    stats.EXACT_LIMIT = 0
    try:
        normal = mann_whitney_u(x, y, "greater")
    finally:
        stats.EXACT_LIMIT = old
    assert normal.method == "normal"
    assert normal.p_value == pytest.approx(exact.p_value, abs=0.005)


def test_tie_correction() -> None:
    # Constant but different values (peak VRAM): all ties within each group, full separation.
    result = mann_whitney_u([110.0] * 50, [100.0] * 50, "greater")
    assert result.method == "normal"
    assert result.p_value < 1e-10
    # Everything equal: no evidence at all.
    same = mann_whitney_u([5.0] * 20, [5.0] * 20, "greater")
    assert same.p_value == 1.0
    # Tie correction makes the test less conservative than ignoring ties would.
    x = [1, 2, 2, 3, 3, 3, 4, 4, 5, 6]
    y = [0, 1, 1, 2, 2, 2, 3, 3, 4, 4]
    corrected = mann_whitney_u(x, y, "greater")
    n1 = n2 = 10
    u, mu = corrected.u, n1 * n2 / 2
    uncorrected = stats.normal_sf((u - mu - 0.5) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12))
    assert corrected.p_value < uncorrected


def test_rejects_empty_and_bad_alternative() -> None:
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError):
        mann_whitney_u([1.0], [2.0], "bigger")  # type: ignore[arg-type]


samples = st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), min_size=1,
                   max_size=40)


@settings(max_examples=200, deadline=None)
@given(samples, samples)
def test_properties(x: list[float], y: list[float]) -> None:
    greater = mann_whitney_u(x, y, "greater")
    less = mann_whitney_u(x, y, "less")
    assert 0 <= greater.p_value <= 1 and 0 <= less.p_value <= 1
    # U of x plus U of y is the number of pairs.
    assert greater.u + mann_whitney_u(y, x, "greater").u == pytest.approx(len(x) * len(y))
    # Swapping the samples swaps the alternatives.
    assert mann_whitney_u(y, x, "less").p_value == pytest.approx(greater.p_value)
    assert greater.p_value + less.p_value >= 1 - 1e-9  # the two tails overlap at u


def test_median_and_quantile() -> None:
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5
    assert quantile([1, 2, 3, 4, 5], 0.25) == 2
    assert quantile([1, 2], 0.5) == 1.5
    with pytest.raises(ValueError):
        median([])


def test_hodges_lehmann_recovers_shift() -> None:
    rng = random.Random(3)
    y = [rng.gauss(10, 1) for _ in range(60)]
    x = [rng.gauss(12, 1) for _ in range(60)]
    estimate = hodges_lehmann(x, y, confidence=0.95)
    assert estimate.low is not None and estimate.high is not None
    assert estimate.low < estimate.shift < estimate.high
    assert estimate.low < 2.0 < estimate.high
    tiny = hodges_lehmann([1.0], [2.0])
    assert tiny.shift == -1.0 and tiny.low is None


def lognormal(rng: random.Random, n: int, centre: float, sigma: float) -> list[float]:
    return [centre * math.exp(rng.gauss(0, sigma)) for _ in range(n)]


def test_five_percent_shift_detected_at_n50() -> None:
    """Lognormal step times with 5 % noise; a 5 % slowdown; gate threshold 2 %, alpha 0.01."""
    detected = 0
    for seed in range(100):
        rng = random.Random(seed)
        base = lognormal(rng, 50, 0.010, 0.05)
        slow = lognormal(rng, 50, 0.0105, 0.05)
        decision = compare_samples(base, slow, threshold=0.02, alpha=0.01)
        detected += decision.verdict == "regression"
    assert detected >= 95


def test_no_shift_false_positive_rate_near_alpha() -> None:
    """The test alone: p < alpha in about alpha of the seeds when nothing changed."""
    trials, hits_01, hits_05, gate_alarms = 2000, 0, 0, 0
    for seed in range(trials):
        rng = random.Random(10_000 + seed)
        base = lognormal(rng, 50, 0.010, 0.05)
        same = lognormal(rng, 50, 0.010, 0.05)
        p = mann_whitney_u(same, base, "greater").p_value
        hits_01 += p < 0.01
        hits_05 += p < 0.05
        if seed < 500:
            gate_alarms += compare_samples(base, same, threshold=0.02,
                                           alpha=0.01).verdict == "regression"
    assert hits_01 / trials <= 0.02
    assert 0.035 <= hits_05 / trials <= 0.065  # 0.05 ± 3 standard errors
    assert gate_alarms / 500 <= 0.02  # the threshold can only lower the test's rate


def test_significant_but_small_change_is_ok() -> None:
    rng = random.Random(1)
    base = lognormal(rng, 100, 0.010, 0.002)
    slow = lognormal(rng, 100, 0.0101, 0.002)  # +1 %, very consistent
    decision = compare_samples(base, slow, threshold=0.05, alpha=0.01)
    assert decision.p_value is not None and decision.p_value < 0.01
    assert decision.verdict == "ok"
    assert "within" in decision.reason


def test_large_but_noisy_change_is_ok() -> None:
    base = [1.0, 5.0, 1.1, 4.9, 1.2, 5.1, 1.0, 5.0, 1.05, 4.95]
    slow = [1.3, 5.2, 1.4, 5.1, 1.2, 5.3, 1.3, 5.2, 1.25, 5.15]
    decision = compare_samples(base, slow, threshold=0.05, alpha=0.01)
    assert decision.verdict == "ok"
    assert "not significant" in decision.reason


def test_improvement_and_insufficient_data() -> None:
    rng = random.Random(2)
    base = lognormal(rng, 40, 0.010, 0.01)
    fast = lognormal(rng, 40, 0.008, 0.01)
    assert compare_samples(base, fast, threshold=0.05, alpha=0.01).verdict == "improvement"
    short = compare_samples(base[:3], fast, threshold=0.05, alpha=0.01)
    assert short.verdict == "insufficient_data"
    assert "3 baseline" in short.reason


def test_zero_baseline() -> None:
    decision = compare_samples([0.0] * 20, [100.0] * 20, threshold=0.02, alpha=0.01)
    assert decision.verdict == "regression"
    assert decision.change is None
    assert compare_samples([0.0] * 20, [0.0] * 20, threshold=0.02, alpha=0.01).verdict == "ok"


def test_throttled_rounds() -> None:
    reasons = [0, 0x1, 0x4, 0x8, 0x20, 0x40, 0x80, 0x10, None, 0]
    clocks = [1980.0] * 9 + [1500.0]
    flags = throttled_rounds(reasons, clocks)
    assert flags == [False, False, True, True, True, True, True, False, False, True]
    # No NVML at all: nothing flagged.
    assert throttled_rounds([None] * 3, [None] * 3) == [False] * 3
    assert throttled_rounds([], []) == []
