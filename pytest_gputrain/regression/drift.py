"""Drift no single comparison shows: the branch's level over a look-back window.

A gate compares a candidate with the newest sessions of its baseline, so two 1.5 % slowdowns
merged one after the other each pass a 2.5 % gate, and so does a runner that gets a little
slower every week. With a look-back window (``--gpu-lookback=N``, ``compare --lookback N``), the
current sessions are also compared with the level the baseline's branch had at the start of its
newest N sessions (in the current sessions' environment):

- the steps in the window are found as ``history --changes`` finds them
  (``branch_history.find_changes``);
- the level at the start is set by the window's oldest sessions before its first step, at most
  ``change_points.WINDOW`` of them (with no step, the oldest ``WINDOW``: a gradual drift);
- the current sessions against that level are decided as the gate decides
  (``stats.compare_sessions``: past the gate's threshold and ``p < alpha``).

A drift is reported, with the steps in the window that went its way (their runs and commits),
when that decision finds a slowdown that the comparison with the baseline itself did not. It is
a warning, not a failure: the pull request in front of the gate did not make it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_gputrain.regression import change_points, stats
from pytest_gputrain.regression.branch_history import (
    Change,
    Series,
    Session,
    build_series,
    find_changes,
)
from pytest_gputrain.regression.change_points import ChangePointsUnavailable
from pytest_gputrain.regression.compare import GateReport, GateSettings, session_value
from pytest_gputrain.regression.options import MIN_LOOKBACK, TIME_METRICS
from pytest_gputrain.regression.store import ResultRecord, Store


@dataclass(frozen=True)
class Drift:
    """The current sessions against the level at the start of the look-back window."""

    nodeid: str
    metric: str
    name: str  # the branch (run name) whose window it is
    window: tuple[Session, ...]
    reference: tuple[Session, ...]  # the sessions that set the level at the window's start
    level: float  # their geometric mean
    current: float
    change: float
    p_value: float
    changes: tuple[Change, ...]  # steps inside the window that went the drift's way

    def describe(self) -> str:
        first = self.reference[0].run
        steps = ", ".join(
            f"{c.step.change * 100:+.2f} % at run #{c.first.run.id}"
            + (f" (commit {c.first.run.commit[:10]})" if c.first.run.commit else "")
            for c in self.changes)
        made = (f"made of {steps}" if steps else
                f"gradual, no single step (runs #{first.id} to #{self.window[-1].run.id})")
        return (f"{self.change * 100:+.2f} % against the level of {self.name!r} at the start "
                f"of its last {len(self.window)} sessions (run #{first.id}, {first.created_at}; "
                f"p = {self.p_value:.2g}), {made}")

    def to_json(self) -> dict[str, object]:
        return {"nodeid": self.nodeid, "metric": self.metric, "name": self.name,
                "window_runs": [s.run.id for s in self.window],
                "reference_runs": [s.run.id for s in self.reference],
                "level": self.level, "current": self.current, "change": self.change,
                "p_value": self.p_value, "steps": [c.to_json() for c in self.changes],
                "description": self.describe()}


def find_drift(window: Sequence[Session], current: Sequence[float], *, threshold: float,
               alpha: float, nodeid: str = "", metric: str = "step_time",
               name: str = "") -> Drift | None:
    """The drift of ``current`` (one summary per current session) against the level at the
    start of ``window`` (the branch's sessions, oldest first), or None."""
    if len(window) < MIN_LOOKBACK or not current:
        return None
    series = find_changes(Series(name, nodeid, metric, list(window)))
    first = series.changes[0].step.index if series.changes else len(window)
    reference = window[:min(first, change_points.WINDOW)]
    decision = stats.compare_sessions([s.value for s in reference], list(current),
                                      threshold=threshold, alpha=alpha)
    if (decision.change is None or decision.p_value is None or decision.baseline is None
            or decision.current is None):
        return None
    if not (decision.change > threshold and decision.p_value < alpha):
        return None
    slower = tuple(c for c in series.changes if c.step.change > 0)
    return Drift(nodeid, metric, name, tuple(window), tuple(reference), decision.baseline,
                 decision.current, decision.change, decision.p_value, slower)


def find_drifts(store: Store, name: str, current: dict[str, list[ResultRecord]],
                settings: GateSettings, lookback: int, *, exclude: Iterable[int] = (),
                skip: Iterable[tuple[str, str]] = ()) -> list[Drift]:
    """Each current test's drift against the newest ``lookback`` sessions saved under
    ``name`` in its environment (runs in ``exclude`` left out), for each gated metric; tests
    and metrics in ``skip`` (the comparison itself found a regression there) are not looked
    at."""
    excluded, skipped = set(exclude), set(skip)
    found: list[Drift] = []
    for nodeid in sorted(current):
        records = current[nodeid]
        # The times and peak memory drift; an exact counter changes at a commit, which the
        # comparison itself names.
        metrics = [m for m in settings.thresholds
                   if m in TIME_METRICS and (nodeid, m) not in skipped]
        if not records or not metrics:
            continue
        entries = [(run, result) for run, result in store.history(
            nodeid, fingerprint_hash=records[-1].fingerprint_hash, name=name,
            limit=lookback + len(excluded)) if run.id not in excluded][-lookback:]
        for series in build_series(entries, nodeid, metrics=metrics,
                                   step_summary=settings.step_summary):
            values = [v for v, _ in (session_value(r, series.metric, settings.step_summary)
                                     for r in records) if v is not None and v > 0]
            drift = find_drift(series.sessions, values, nodeid=nodeid, metric=series.metric,
                               name=name, threshold=settings.thresholds[series.metric],
                               alpha=settings.alpha)
            if drift is not None:
                found.append(drift)
    return found


def add_drifts(store: Store, report: GateReport, current: dict[str, list[ResultRecord]],
               lookback: int) -> None:
    """The gate's comparison done, look for drift over the baseline branch's newest
    ``lookback`` sessions (the current runs left out) and add it to ``report.drifts``; without
    ruptures, a note naming the extra."""
    if not report.baseline_runs:
        return
    try:
        report.drifts.extend(find_drifts(
            store, report.baseline_runs[0].name, current, report.settings, lookback,
            exclude=[run.id for run in report.current_runs],
            skip=[(c.nodeid, c.metric) for c in report.comparisons
                  if c.verdict == "regression"]))
    except ChangePointsUnavailable as exc:
        report.notes.append(f"gpu_lookback: no drift looked for: {exc}")
