"""Steps in a series of session summaries: where a test's step time or peak memory changed level.

The series holds one value per session, oldest first, each the session's summary as the gate
makes it (``compare.session_value``). Finding the steps takes two parts:

- **Where**: ruptures' PELT (Killick et al. 2012; Truong, Oudre and Vayatis, "Selective review of
  offline change point detection methods", Signal Processing 167, 2020) over the logs of the
  values, scaled by the series' own session-to-session noise (a robust estimate from successive
  differences), with the least-absolute-deviation cost (``l1``: each segment around its median,
  so a session that ran at the host's pace does not pull a segment) and at least ``MIN_SIZE``
  sessions a segment. docs/regression.md says why ruptures and not E-Divisive, with figures.
- **Whether**: each proposed step is decided the way the gate decides a pull request: the
  sessions just before it and just after it (at most ``WINDOW`` each, within their segments)
  go through ``stats.compare_sessions`` (geometric means, stray sessions left out, a t-test
  over sessions on the logs). A step is kept when ``p`` is below ``alpha`` over the number of
  places the search could have put it (Bonferroni: the search picked the place where the
  sessions differ most, so one place's p alone would flatter it), its size is at least
  ``min_change``, and the level holds: each of the first ``MIN_SIZE`` sessions after it lies
  past the midpoint between the two levels (two sessions at the host's pace and then the old
  level again are no step). The weakest step that fails is dropped and the others decided
  again over the merged segments, until every one left holds.

ruptures (with NumPy and SciPy) is the ``changes`` extra; ``ChangePointsUnavailable`` names it
when it is missing.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_gputrain.regression import stats

EXTRA_HINT = ("finding changes needs ruptures: pip install 'pytest-gputrain[changes]' "
              "(or pip install ruptures)")
# The fewest sessions on either side of a step: a step is found once this many sessions ran
# after it, and one or two sessions at another pace are not a segment of their own.
MIN_SIZE = 3
# Sessions on each side of a step that decide it: enough for the t-test, near enough to the
# step that a later drift does not blur it.
WINDOW = 10
# The chance of a false step in a whole series of unchanged sessions: each place is decided at
# ``alpha`` over the number of places a step could be put (Bonferroni), as the search picked the
# place where the sessions differ most.
DEFAULT_ALPHA = 0.01
DEFAULT_MIN_CHANGE = 0.005
# PELT's penalty per step, in units of the noise, times log(n) (BIC-like): low enough to
# propose every step the decision could keep (the decision, not the penalty, controls false
# steps); benchmarks/change_points.py measures both.
PENALTY = 2.0
# The noise estimate's floor, on the log scale (0.01 %): a deterministic series (peak memory)
# has no noise, and any change of it past ``min_change`` is a step.
NOISE_FLOOR = 1e-4
# A session slower than the sessions around it by this many times the noise is a stray.
STRAY_NOISES = 6.0


class ChangePointsUnavailable(Exception):
    """ruptures is not installed (the ``changes`` extra)."""


@dataclass(frozen=True)
class Step:
    """A change of level at ``index`` (the first value after it)."""

    index: int
    before: float  # the level before: geometric mean of the sessions that decided it
    after: float
    change: float  # after / before - 1
    p_value: float  # one-sided, over sessions (``stats.compare_sessions``)
    sessions_before: int
    sessions_after: int

    @property
    def confidence(self) -> float:
        return 1.0 - self.p_value


def _ruptures() -> Any:
    try:
        import ruptures
    except ImportError:
        raise ChangePointsUnavailable(EXTRA_HINT) from None
    return ruptures


def check_available() -> None:
    """``ChangePointsUnavailable`` naming the extra when ruptures cannot be imported."""
    _ruptures()


def noise(logs: Sequence[float]) -> float:
    """The session-to-session noise of a series on the log scale: the median absolute deviation
    of successive differences, as a standard deviation (robust to steps and to strays)."""
    differences = [b - a for a, b in itertools.pairwise(logs)]
    if not differences:
        return NOISE_FLOOR
    centre = statistics.median(differences)
    mad = statistics.median(abs(d - centre) for d in differences)
    return max(mad * 1.4826 / math.sqrt(2), NOISE_FLOOR)


def candidates(values: Sequence[float]) -> list[int]:
    """Where PELT would put steps (indices of the first value after each)."""
    if len(values) < 2 * MIN_SIZE:
        return []
    ruptures = _ruptures()
    import numpy

    logs = [math.log(v) for v in values]
    scale = noise(logs)
    centre = statistics.median(logs)
    signal = numpy.array([(v - centre) / scale for v in logs]).reshape(-1, 1)
    search = ruptures.Pelt(model="l1", min_size=MIN_SIZE, jump=1).fit(signal)
    return [int(b) for b in search.predict(pen=PENALTY * math.log(len(values)))[:-1]]


Propose = Callable[[Sequence[float]], list[int]]


def find_steps(values: Sequence[float], *, alpha: float = DEFAULT_ALPHA,
               min_change: float = DEFAULT_MIN_CHANGE, propose: Propose = candidates
               ) -> list[Step]:
    """The steps of a series of positive session summaries, oldest first (see the module).
    ``propose`` gives the places to decide (PELT; benchmarks/change_points.py passes others to
    compare them)."""
    if any(not v > 0 for v in values):
        raise ValueError("session summaries must be positive")
    left_out = set(strays(values, min_change))
    kept = [i for i in range(len(values)) if i not in left_out]
    steady = [values[i] for i in kept]
    places = sorted(set(propose(steady)))
    each = alpha / max(1, len(steady) - 2 * MIN_SIZE + 1)
    while True:
        edges = [0, *places, len(steady)]
        found: list[Step] = []
        weakest: tuple[float, int] | None = None
        for i, place in enumerate(places):
            step = decide(steady, edges[i], place, edges[i + 2], alpha=each,
                          min_change=min_change)
            if isinstance(step, Step):
                found.append(replace(step, index=kept[step.index]))
            elif weakest is None or step > weakest[0]:
                weakest = (step, place)
        if weakest is None:
            return found
        places.remove(weakest[1])


def strays(values: Sequence[float], min_change: float = DEFAULT_MIN_CHANGE) -> list[int]:
    """Sessions that ran at another pace than those around them: slower by more than
    ``STRAY_NOISES`` times the noise (and ``min_change``) than both the median of the
    ``MIN_SIZE`` sessions before and that of up to ``MIN_SIZE`` after (a host busy in that
    process: what slows a session besides the code only ever adds time). A step's first
    sessions are like those after them, so they are never strays; the newest session, with
    none after it, is not judged."""
    if len(values) <= MIN_SIZE:
        return []
    margin = math.exp(max(STRAY_NOISES * noise([math.log(v) for v in values]),
                          math.log1p(min_change)))
    found = []
    for i in range(MIN_SIZE, len(values) - 1):
        before = statistics.median(values[i - MIN_SIZE:i])
        after = statistics.median(values[i + 1:i + 1 + MIN_SIZE])
        if values[i] > max(before, after) * margin:
            found.append(i)
    return found


def decide(values: Sequence[float], start: int, place: int, end: int, *, alpha: float,
           min_change: float) -> Step | float:
    """The step at ``place`` between the segments ``[start, place)`` and ``[place, end)``, or,
    when it does not hold, a score of how far it is from holding (larger: weaker)."""
    before = list(values[max(start, place - WINDOW):place])
    after = list(values[place:min(end, place + WINDOW)])
    if min(len(before), len(after)) < MIN_SIZE:
        return 2.0
    decision = stats.compare_sessions(before, after, threshold=min_change, alpha=alpha)
    if decision.p_value is None or decision.change is None:
        return 2.0
    if decision.p_value >= alpha or abs(decision.change) < min_change:
        return 1.0 + decision.p_value
    if not _holds(before, after):
        return 1.0
    assert decision.baseline is not None and decision.current is not None
    return Step(place, decision.baseline, decision.current, decision.change, decision.p_value,
                decision.baseline_sessions, decision.current_sessions)


def _holds(before: Sequence[float], after: Sequence[float]) -> bool:
    """Each of the first ``MIN_SIZE`` sessions after the step lies past the midpoint between
    the medians of the two sides, on the side of the new level."""
    old, new = statistics.median(before), statistics.median(after)
    middle = math.sqrt(old * new)
    first = after[:MIN_SIZE]
    return all(v > middle for v in first) if new > old else all(v < middle for v in first)
