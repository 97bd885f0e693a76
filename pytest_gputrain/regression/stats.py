"""Statistics of the regression gate, in pure Python (no numpy, no scipy).

- ``mann_whitney_u``: the Mann–Whitney U (Wilcoxon rank-sum) test. Exact null distribution when
  there are no ties and the samples are small (``n1 * n2 <= EXACT_LIMIT``), otherwise the normal
  approximation with tie correction and continuity correction.
- ``hodges_lehmann``: the Hodges–Lehmann shift estimate (median of all pairwise differences) with
  its distribution-free confidence interval.
- ``compare_samples``: the gate's decision. A regression needs *both* a significant test
  (one-sided ``p < alpha``) *and* a relative change of medians above the threshold: on a noisy
  GPU a tiny but consistent shift is significant, and a large but noisy one is not, and neither
  alone should fail a merge.
- ``throttled_rounds``: which rounds ran while the GPU slowed itself down (NVML clock event
  reasons, or an SM clock far below the run's median); those rounds are left out of step times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Alternative = Literal["greater", "less", "two-sided"]

# Exact distribution (no ties) up to this many pairs; above it the normal approximation is
# already within ~1e-3 of the exact p-value and the exact count would cost O(n1 * n2 * min(n)).
EXACT_LIMIT = 2500

# NVML clock event reasons that mean "the GPU slowed itself down": SwPowerCap 0x4,
# HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# A round whose SM clock is below this fraction of the run's median SM clock is throttled too.
CLOCK_FLOOR = 0.9
# Fewer usable rounds than this on either side: no verdict ("insufficient data").
MIN_SAMPLES = 8


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of an empty sample")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (the default of numpy and R, "type 7")."""
    if not values:
        raise ValueError("quantile of an empty sample")
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q!r} is not in [0, 1]")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sample")
    return math.fsum(values) / len(values)


def stdev(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (len(values) - 1))


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def normal_ppf(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's approximation, refined by Newton steps)."""
    if not 0 < p < 1:
        raise ValueError(f"probability {p!r} is not in (0, 1)")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    low = 0.02425
    if p < low:
        q = math.sqrt(-2 * math.log(p))
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    elif p > 1 - low:
        q = math.sqrt(-2 * math.log(1 - p))
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    else:
        q = p - 0.5
        r = q * q
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    for _ in range(2):  # Newton on Phi(x) - p
        error = 0.5 * math.erfc(-x / math.sqrt(2)) - p
        x -= error * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
    return x


def rank(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        average = (start + end) / 2 + 1
        for position in range(start, end + 1):
            ranks[order[position]] = average
        ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


@lru_cache(maxsize=64)
def u_distribution(n1: int, n2: int) -> tuple[int, ...]:
    """Number of arrangements giving each U = 0 .. n1*n2 under H0 (no ties).

    These are the coefficients of the Gaussian binomial [n1 + n2 choose n1]_q, built as
    prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i) with m = min(n1, n2), n = max(n1, n2); every partial
    product is itself a polynomial, so plain integer arithmetic stays exact.
    """
    m, n = min(n1, n2), max(n1, n2)
    poly = [1]
    for i in range(1, m + 1):
        grown = poly + [0] * (n + i)
        for j in range(len(grown) - 1, n + i - 1, -1):
            grown[j] -= poly[j - (n + i)]
        for j in range(i, len(grown)):
            grown[j] += grown[j - i]
        poly = grown[: n * i + 1]
    return tuple(poly)


@dataclass(frozen=True)
class MannWhitney:
    """The outcome of a Mann–Whitney U test of ``x`` against ``y``."""

    u: float  # U of x: pairs with x > y, plus half of the tied pairs
    p_value: float
    alternative: Alternative
    method: Literal["exact", "normal"]
    z: float | None = None


def mann_whitney_u(x: Sequence[float], y: Sequence[float],
                   alternative: Alternative = "greater") -> MannWhitney:
    """Test whether ``x`` tends to be larger than ``y`` (``"greater"``), smaller, or either.

    ``"greater"`` asks whether values drawn from ``x`` exceed values drawn from ``y`` more often
    than chance (P(X > Y) > 1/2): for the gate, ``x`` is the current run and ``y`` the baseline.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u needs two non-empty samples")
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative {alternative!r} is not greater, less or two-sided")
    ranks, ties = rank([*x, *y])
    u1 = math.fsum(ranks[:n1]) - n1 * (n1 + 1) / 2
    has_ties = any(t > 1 for t in ties)
    if not has_ties and n1 * n2 <= EXACT_LIMIT:
        return MannWhitney(u1, _exact_p(round(u1), n1, n2, alternative), alternative, "exact")
    big_n = n1 + n2
    tie_term = sum(t**3 - t for t in ties) / (big_n * (big_n - 1))
    variance = n1 * n2 / 12 * ((big_n + 1) - tie_term)
    centre = n1 * n2 / 2
    if variance <= 0:  # every value equal: no evidence either way
        return MannWhitney(u1, 1.0, alternative, "normal", 0.0)
    sigma = math.sqrt(variance)
    if alternative == "greater":
        z = (u1 - centre - 0.5) / sigma
        p = normal_sf(z)
    elif alternative == "less":
        z = (u1 - centre + 0.5) / sigma
        p = normal_sf(-z)
    else:
        z = max(abs(u1 - centre) - 0.5, 0.0) / sigma
        p = 2 * normal_sf(z)
    return MannWhitney(u1, min(1.0, max(0.0, p)), alternative, "normal", z)


def _exact_p(u: int, n1: int, n2: int, alternative: Alternative) -> float:
    counts = u_distribution(n1, n2)
    total = math.comb(n1 + n2, n1)
    upper = sum(counts[u:]) / total  # P(U >= u)
    lower = sum(counts[: u + 1]) / total  # P(U <= u)
    if alternative == "greater":
        return min(1.0, upper)
    if alternative == "less":
        return min(1.0, lower)
    return min(1.0, 2 * min(upper, lower))


@dataclass(frozen=True)
class ShiftEstimate:
    """Hodges–Lehmann estimate of how much ``x`` exceeds ``y``, with a confidence interval."""

    shift: float
    low: float | None
    high: float | None
    confidence: float


def hodges_lehmann(x: Sequence[float], y: Sequence[float],
                   confidence: float = 0.95) -> ShiftEstimate:
    """Median of all differences x_i - y_j, and the distribution-free interval around it.

    The interval takes the order statistics of the pairwise differences at the ranks where the
    (normal approximation to the) U distribution puts its ``(1 - confidence) / 2`` tails.
    """
    if not x or not y:
        raise ValueError("hodges_lehmann needs two non-empty samples")
    differences = sorted(a - b for a in x for b in y)
    shift = median(differences)
    n1, n2 = len(x), len(y)
    z = normal_ppf(1 - (1 - confidence) / 2)
    k = math.floor(n1 * n2 / 2 - z * math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12))
    if k < 0:
        return ShiftEstimate(shift, None, None, confidence)
    return ShiftEstimate(shift, differences[k], differences[len(differences) - 1 - k],
                         confidence)


Verdict = Literal["regression", "improvement", "ok", "insufficient_data"]


@dataclass(frozen=True)
class SampleComparison:
    """How the current sample compares with the baseline sample of one metric."""

    verdict: Verdict
    baseline_median: float | None
    current_median: float | None
    change: float | None  # relative change of medians: (current - baseline) / baseline
    p_value: float | None  # one-sided, in the direction of the observed change
    method: str | None
    shift: ShiftEstimate | None  # Hodges–Lehmann shift of current over baseline (metric units)
    reason: str


def relative_change(baseline: float, current: float) -> float | None:
    if baseline == 0:
        return 0.0 if current == 0 else None
    return (current - baseline) / abs(baseline)


def compare_samples(baseline: Sequence[float], current: Sequence[float], *, threshold: float,
                    alpha: float, min_samples: int = MIN_SAMPLES) -> SampleComparison:
    """The gate's decision for one metric where larger is worse (time, memory).

    ``threshold`` is a fraction (0.05 for 5 %). A regression needs the one-sided test
    "current > baseline" significant at ``alpha`` and the medians' relative change above
    ``threshold``; an improvement is the mirror image; everything else is ``ok``.
    """
    if len(baseline) < min_samples or len(current) < min_samples:
        return SampleComparison(
            "insufficient_data",
            median(baseline) if baseline else None,
            median(current) if current else None,
            None, None, None, None,
            f"{len(baseline)} baseline and {len(current)} current rounds usable; "
            f"at least {min_samples} needed on each side",
        )
    base_median, cur_median = median(baseline), median(current)
    change = relative_change(base_median, cur_median)
    slower = mann_whitney_u(current, baseline, "greater")
    faster = mann_whitney_u(current, baseline, "less")
    shift = hodges_lehmann(current, baseline, confidence=1 - alpha)
    worse = cur_median > base_median or (cur_median == base_median and slower.p_value
                                         <= faster.p_value)
    test = slower if worse else faster
    beyond = change is None or abs(change) > threshold
    significant = test.p_value < alpha
    if significant and beyond:
        verdict: Verdict = "regression" if worse else "improvement"
        reason = (f"p = {test.p_value:.2g} < {alpha:g} and the median changed by "
                  f"{_percent(change)} (threshold {threshold * 100:g} %)")
    else:
        verdict = "ok"
        if not significant:
            reason = f"not significant (p = {test.p_value:.2g} >= {alpha:g})"
        else:
            reason = (f"significant, but the median changed by {_percent(change)}, within the "
                      f"{threshold * 100:g} % threshold")
    return SampleComparison(verdict, base_median, cur_median, change, test.p_value, test.method,
                            shift, reason)


def _percent(change: float | None) -> str:
    return "an infinite amount (baseline 0)" if change is None else f"{change * 100:+.2f} %"


def throttled_rounds(reasons: Sequence[int | None], sm_clocks: Sequence[float | None],
                     clock_floor: float = CLOCK_FLOOR) -> list[bool]:
    """Flag rounds whose NVML sample shows a slowdown reason or a clock far below the median.

    Unknown samples (``None``) are never flagged: no evidence of throttling is no throttling.
    """
    count = max(len(reasons), len(sm_clocks))
    known_clocks = [c for c in sm_clocks if c is not None and c > 0]
    floor = median(known_clocks) * clock_floor if known_clocks else None
    flags = []
    for i in range(count):
        mask = reasons[i] if i < len(reasons) else None
        clock = sm_clocks[i] if i < len(sm_clocks) else None
        slowed = mask is not None and bool(mask & THROTTLE_MASK)
        low_clock = floor is not None and clock is not None and clock < floor
        flags.append(slowed or low_clock)
    return flags
