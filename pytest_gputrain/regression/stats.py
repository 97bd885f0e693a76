"""Statistics of the regression gate.

The unit of evidence is the *session* (one pytest process, saved as one run): rounds inside a
session vary by microseconds, whole sessions by milliseconds (different cuDNN algorithms, clocks,
what else the process did), so rounds of one session are not independent evidence about the code.
Each session is summarised by one number (its fastest clean round, or their median:
``compare.session_value``) and the gate compares those numbers:

- ``pooled_spread``: the spread between sessions of the same code (of the logs of their
  summaries, so about a relative spread), pooled from every group of repeated sessions at hand
  (the replicate sessions of each side and the store's history of the test in the same
  environment), with its degrees of freedom.
- ``stray_session``: a session that ran at another pace from the rest of its group (a
  launch-bound step whose host was slow in that one process, a neighbour on the GPU), found by
  Dixon's Q test and left out of the comparison and of the spread, so one stray session neither
  hides a slowdown nor makes one.
- ``compare_sessions``: the decision. A regression needs the change of the sessions' geometric
  mean past the threshold *and* a one-sided t-test over sessions (on the logs) significant at
  ``alpha``. "ok" needs the sessions to be able to see a change of the threshold's size: their
  ``resolution`` (the smallest change the t-test finds significant 95 % of the time) must not
  exceed the threshold. Otherwise, and when no repeated sessions anywhere give the spread, the
  verdict is "cannot tell", with ``sessions_to_decide``: how many sessions a side would resolve
  the threshold at the spread seen. The decision also states the smallest slowdown it would
  catch (flag as a regression) 95 % of the time.
- ``throttled_rounds``: which rounds ran while the GPU slowed itself down (NVML clock event
  reasons, or an SM clock far below the session's median); those rounds are left out.

Medians, means and normal quantiles come from the standard library's ``statistics`` (quartiles
through ``pytest_gputrain.percentiles``). Student's t
is not there: its tail is computed from the regularized incomplete beta function (a continued
fraction), checked against ``scipy.stats.t`` in the tests.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_gputrain.percentiles import percentiles

# NVML clock event reasons that mean "the GPU slowed itself down": HwSlowdown 0x8,
# SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80. SwPowerCap (0x4) is
# left out: a busy GPU at its default power limit reports it all the time (GPU Boost at work, not a
# fault), and flagging it would leave a power-heavy step with no clean rounds; when the cap does
# pull the clocks down mid-session, the clock floor below catches those rounds.
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80
# A round whose SM clock is below this fraction of the session's median SM clock is throttled too.
CLOCK_FLOOR = 0.9
# A session with fewer clean rounds than this has no summary (it is left out of comparisons).
MIN_ROUNDS = 8
# Dixon's Q at 95 % confidence for 3 to 10 values (Rorabacher, Anal. Chem. 63 (1991) 139): the
# extreme value is an outlier when its gap to its neighbour is this share of the group's range.
DIXON_Q95 = {3: 0.970, 4: 0.829, 5: 0.710, 6: 0.625, 7: 0.568, 8: 0.526, 9: 0.493, 10: 0.466}
# "Detectable": the smallest true change the gate catches with this probability.
DETECTION_POWER = 0.95
# ``sessions_to_decide`` looks no further: past this many sessions a side, no CI job would run
# them, and the answer is "no number of sessions on this host".
MOST_SESSIONS = 10_000


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of an empty sample")
    return float(statistics.median(values))


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile, interpolated linearly (numpy's and R's
    default, "type 7")."""
    low, middle, high = percentiles(values, 25, 50, 75)
    return low, middle, high


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sample")
    return statistics.fmean(values)


def stdev(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than two values."""
    return statistics.stdev(values) if len(values) >= 2 else 0.0


# -- Student's t ---------------------------------------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def regularized_beta(x: float, a: float, b: float, complement: float | None = None) -> float:
    """I_x(a, b), the regularized incomplete beta function. ``complement`` is ``1 - x`` when
    the caller has it exactly (near x = 1, ``1 - x`` computed in floating point loses digits)."""
    y = 1.0 - x if complement is None else complement
    if x <= 0:
        return 0.0
    if y <= 0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log(y))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, y) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (``inf``: the normal)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom {df!r} must be > 0")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    if math.isinf(df):
        return 1.0 - statistics.NormalDist().cdf(t)
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2, 0.5, t * t / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


# Cached: the gate asks for the same few quantiles (1 - alpha and the power, at the degrees of
# freedom at hand) in every comparison and in every step of ``sessions_to_decide``'s search.
@functools.lru_cache(maxsize=4096)
def t_ppf(p: float, df: float) -> float:
    """The t with P(T <= t) = p: bisection on the upper tail ``t_sf`` (accurate far out), with
    the lower half by symmetry."""
    if not 0 < p < 1:
        raise ValueError(f"probability {p!r} is not in (0, 1)")
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    if p < 0.5:
        return -_upper_quantile(p, df)
    return _upper_quantile(1.0 - p, df)


def _upper_quantile(tail: float, df: float) -> float:
    """The t >= 0 with P(T > t) = ``tail`` (``tail`` <= 0.5)."""
    low, high = 0.0, 1.0
    while t_sf(high, df) > tail:
        low, high = high, high * 2
    for _ in range(400):
        middle = (low + high) / 2
        if t_sf(middle, df) > tail:
            low = middle
        else:
            high = middle
        if high - low <= 1e-13 * high:
            break
    return (low + high) / 2


# -- the spread between sessions -----------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The standard deviation of one session's summary on a log scale (about the relative
    spread: 0.01 is 1 %), pooled over groups of repeated sessions of the same code; ``None``
    with no degrees of freedom. ``df_sides`` of the degrees come from the compared sides' own
    replicate sessions, ``df_history`` from repeated sessions in the store's history."""

    sd: float | None
    df: int
    df_sides: int = 0
    df_history: int = 0
    history_groups: int = 0


def _log_squares(group: Sequence[float]) -> tuple[float, int]:
    """Sum of squared deviations of the logs from their mean, and the group's degrees of
    freedom; a group with a value that is not positive has no log spread."""
    if len(group) < 2 or min(group) <= 0:
        return 0.0, 0
    logs = [math.log(value) for value in group]
    centre = statistics.fmean(logs)
    return math.fsum((value - centre) ** 2 for value in logs), len(group) - 1


def stray_session(values: Sequence[float], threshold: float) -> int | None:
    """The index of a session that ran at another pace from the others of its group, or
    ``None``. On the logs of the sessions' summaries, the most extreme one is a stray when
    Dixon's Q test rejects it at 95 % (3 to 10 sessions) and its gap to its neighbour is past
    ``threshold`` too, so sessions that differ by less than the gate could ever flag stay."""
    critical = DIXON_Q95.get(len(values))
    if critical is None or min(values) <= 0:
        return None
    order = sorted(range(len(values)), key=lambda i: values[i])
    logs = [math.log(values[i]) for i in order]
    span = logs[-1] - logs[0]
    if span <= 0:
        return None
    low, high = logs[1] - logs[0], logs[-1] - logs[-2]
    gap, index = (high, order[-1]) if high >= low else (low, order[0])
    if gap / span > critical and gap > math.log1p(threshold):
        return index
    return None


def without_stray(values: Sequence[float], threshold: float,
                  other_side: Sequence[float] = ()) -> tuple[list[float], int | None]:
    """``values`` less its stray session (``stray_session``), and that session's index. A
    session that stands apart from its own side but lies within the range of ``other_side``
    stays: sessions of both sides at that pace are a mix of two paces (a host busy in some
    sessions), not one stray, and leaving it out of one side alone would make a difference."""
    stray = stray_session(values, threshold)
    if stray is not None and other_side and min(other_side) <= values[stray] <= max(other_side):
        stray = None
    return [v for i, v in enumerate(values) if i != stray], stray


def pooled_spread(sides: Iterable[Sequence[float]],
                  history: Iterable[Sequence[float]] = ()) -> Spread:
    """Pooled spread between sessions of the same code (a one-way ANOVA's within-group variance
    of the logs: each group measured against its own mean)."""
    squares, df_sides, df_history, groups = 0.0, 0, 0, 0
    for group in sides:
        ss, df = _log_squares(group)
        squares += ss
        df_sides += df
    for group in history:
        ss, df = _log_squares(group)
        squares += ss
        df_history += df
        groups += df > 0
    df = df_sides + df_history
    sd = math.sqrt(squares / df) if df else None
    return Spread(sd, df, df_sides, df_history, groups)


# -- the decision --------------------------------------------------------------------------------

Verdict = Literal["regression", "improvement", "ok", "cannot_tell", "insufficient_data"]


@dataclass(frozen=True)
class SessionComparison:
    """How the current sessions compare with the baseline sessions on one metric.

    Values are per-session summaries; ``baseline``/``current`` are their geometric means;
    ``change`` is ``current / baseline - 1``; ``detectable`` is the smallest true slowdown this
    comparison catches 95 % of the time (a fraction, ``None`` when the spread is unknown);
    ``resolution`` the smallest true change its t-test finds significant 95 % of the time,
    threshold aside (``resolution``); ``sessions_to_decide``, for a "cannot tell" whose spread
    is known, the sessions a side that would resolve the threshold (``None`` past
    ``MOST_SESSIONS``); ``p_value`` is one-sided, in the direction of the observed change.
    """

    verdict: Verdict
    baseline_sessions: int
    current_sessions: int
    baseline: float | None
    current: float | None
    change: float | None
    p_value: float | None
    detectable: float | None
    spread: Spread
    reason: str
    baseline_stray: int | None = None  # index of a stray session left out (``stray_session``)
    current_stray: int | None = None
    resolution: float | None = None
    sessions_to_decide: int | None = None


def detectable_change(threshold: float, alpha: float, standard_error: float, df: int,
                      power: float = DETECTION_POWER) -> float:
    """The smallest true slowdown caught with probability ``power``. On the log scale the
    observed difference must pass both the threshold and the significance bound
    ``t(1 - alpha) * se``, and it scatters around the true difference with the standard error
    ``se``."""
    bound = math.log1p(threshold)
    if standard_error > 0:
        bound = max(bound, t_ppf(1 - alpha, df) * standard_error)
        bound += t_ppf(power, df) * standard_error
    return math.expm1(bound)


def resolution(alpha: float, standard_error: float, df: float,
               power: float = DETECTION_POWER) -> float:
    """The smallest true change (a fraction) that a one-sided t-test at ``alpha`` with this
    standard error finds significant with probability ``power``, whatever the threshold: what
    the sessions can tell from their own spread. An "ok" claims no change of the threshold's
    size, which only sessions whose resolution is within the threshold can back."""
    if standard_error == 0:
        return 0.0
    return math.expm1((t_ppf(1 - alpha, df) + t_ppf(power, df)) * standard_error)


def sessions_to_decide(sd: float, df_history: int, threshold: float, alpha: float,
                       power: float = DETECTION_POWER, most: int = MOST_SESSIONS) -> int | None:
    """The fewest sessions a side (as many on each) whose resolution is within ``threshold``,
    at the spread ``sd`` between sessions: the size of the recipe that would decide. The
    degrees of freedom grow with the sessions (``2 (n - 1)``, besides ``df_history`` from the
    store). ``None`` when more than ``most`` would be needed."""
    def resolved(n: int) -> bool:
        df = df_history + 2 * (n - 1)
        return resolution(alpha, sd * math.sqrt(2 / n), df, power) <= threshold

    low = 0 if df_history else 1  # a known-unresolved count: one a side has no spread alone
    high = 1 if df_history else 2
    while not resolved(high):  # the resolution shrinks as sessions are added: double, bisect
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        middle = (low + high) // 2
        if resolved(middle):
            high = middle
        else:
            low = middle
    return high


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def compare_sessions(baseline: Sequence[float], current: Sequence[float], *, threshold: float,
                     alpha: float, history: Iterable[Sequence[float]] = ()) -> SessionComparison:
    """The gate's decision for one metric where larger is worse (time, memory).

    ``baseline`` and ``current`` hold one summary per session; ``history`` holds groups of
    repeated sessions of the same test and environment from the store (each group one code
    version). ``threshold`` is a fraction (0.05 for 5 %): a slowdown must pass it, an
    improvement its mirror image (a ratio of 1 / (1 + threshold)). One spread, pooled from
    every group: the sessions of both sides ran the same test on the same kind of machine.
    """
    strays: dict[str, int | None] = {"baseline": None, "current": None}
    if min((*baseline, *current), default=0) > 0:
        (baseline, strays["baseline"]), (current, strays["current"]) = (
            without_stray(baseline, threshold, current),
            without_stray(current, threshold, baseline))  # each judged against the whole other
        history = [without_stray(group, threshold)[0] for group in history]
    spread = pooled_spread([baseline, current], history)
    nb, nc = len(baseline), len(current)
    if not nb or not nc:
        return SessionComparison("insufficient_data", nb, nc, None, None, None, None, None,
                                 spread, f"{nb} baseline and {nc} current session(s) with "
                                 f"at least {MIN_ROUNDS} clean rounds; one a side is needed")
    if min(*baseline, *current) <= 0:
        if max(*baseline, *current) == 0:
            return SessionComparison("ok", nb, nc, 0.0, 0.0, 0.0, None, None, spread,
                                     "0 on both sides")
        return SessionComparison("insufficient_data", nb, nc, None, None, None, None, None,
                                 spread, "a session's value is 0: a relative change is "
                                 "undefined")
    base, cur = _geometric_mean(baseline), _geometric_mean(current)
    difference = math.log(cur) - math.log(base)
    change = math.expm1(difference)
    seen = f"{change * 100:+.2f} %"
    left = [f"{side} session {index + 1}" for side, index in strays.items() if index is not None]
    stray_note = (f"; left out as stray (Dixon's Q: far from the other sessions of its side): "
                  f"{', '.join(left)}" if left else "")
    if spread.sd is None:
        return SessionComparison(
            "cannot_tell", nb, nc, base, cur, change, None, None, spread,
            f"saw {seen}, but with {nb} baseline and {nc} current session(s) and no repeated "
            "sessions of this test in the store's history, the spread between sessions is "
            "unknown: rounds of one session cannot tell a code change from a session's luck. "
            "Run 2 or more sessions a side (docs/regression.md, the CI recipe)")
    standard_error = spread.sd * math.sqrt(1 / nb + 1 / nc)
    detectable = detectable_change(threshold, alpha, standard_error, spread.df)
    if standard_error == 0:  # deterministic (peak memory): the change is exact
        p_value = 0.5 if difference == 0 else 0.0
    else:
        p_value = t_sf(abs(difference) / standard_error, spread.df)
    significant = p_value < alpha
    beyond = abs(difference) > math.log1p(threshold)
    resolved = resolution(alpha, standard_error, spread.df)
    sessions = (f"{nb} vs {nc} session(s), spread {spread.sd * 100:.2f} % from "
                f"{spread.df} degree(s) of freedom")
    needed: int | None = None
    if significant and beyond:
        verdict: Verdict = "regression" if difference > 0 else "improvement"
        reason = (f"{seen}, past the {threshold * 100:g} % threshold, and p = {p_value:.2g} < "
                  f"{alpha:g} over sessions ({sessions})")
    else:
        if not significant:
            reason = (f"{seen} is within the spread between sessions (p = {p_value:.2g} >= "
                      f"{alpha:g}; {sessions})")
        else:
            reason = (f"{seen} is significant (p = {p_value:.2g}) but within the "
                      f"{threshold * 100:g} % threshold ({sessions})")
        caught = f"a slowdown of {detectable * 100:.1f} % would be caught 95 % of the time"
        if resolved <= threshold:
            verdict = "ok"
            reason += f"; {caught}"
        else:
            verdict = "cannot_tell"
            needed = sessions_to_decide(spread.sd, spread.df_history, threshold, alpha)
            if f"{resolved * 100:.1f}" != f"{detectable * 100:.1f}":
                caught = f"{resolved * 100:.1f} % is significant 95 % of the time; {caught}"
            else:
                caught = f"{resolved * 100:.1f} % is significant and caught 95 % of the time"
            decide = (f"{needed} session(s) a side would decide" if needed is not None else
                      f"more than {MOST_SESSIONS} sessions a side would be needed at this "
                      "spread: make the sessions steadier (docs/regression.md)")
            reason += (f"; these sessions cannot see a change of the {threshold * 100:g} % "
                       f"threshold (a change of {caught}): {decide}")
    return SessionComparison(verdict, nb, nc, base, cur, change, p_value, detectable, spread,
                             reason + stray_note, strays["baseline"], strays["current"],
                             resolved, needed)


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
