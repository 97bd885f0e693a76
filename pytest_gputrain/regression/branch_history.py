"""A test's history on a branch: its sessions in order, the steps in them, and what changed there.

A *branch* is a run name (``--gpu-save=main`` every night: the branch ``main``). Its *series*
for one test and one metric is every saved session of that test under that name, oldest first,
each summarised as the gate summarises a session (``compare.session_value``: the fastest clean
step, or the median with ``step_summary="median"``; the largest peak of VRAM); a session with
too few clean rounds has no summary and is left out (counted). The environment is not filtered:
a driver, torch or GPU change is one of the things a step is looked for at, and each step says
what changed in the environment where it happened (``Change.cause``).

``change_points.find_steps`` finds the steps; this module reads the store and names, for each
step, the first session after it (its run, commit and environment) and the last one before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_gputrain.regression import change_points
from pytest_gputrain.regression.compare import session_value
from pytest_gputrain.regression.fingerprint import FieldDifference, differences
from pytest_gputrain.regression.options import TIME_METRICS
from pytest_gputrain.regression.settings import DEFAULT_STEP_SUMMARY
from pytest_gputrain.regression.store import ResultRecord, RunInfo, Store

# The environment fields a step is blamed on when they changed where it happened: the GPU, its
# driver, and torch with the CUDA and cuDNN it was built with.
CAUSE_FIELDS = ("gpu_name", "driver_version", "torch_version", "torch_cuda", "cudnn_version")
# Newest sessions of a test read at most, over all its branches.
DEFAULT_LIMIT = 500


@dataclass(frozen=True)
class Session:
    run: RunInfo
    result: ResultRecord
    value: float


@dataclass(frozen=True)
class Change:
    """A step of one series, with the sessions on either side of it."""

    step: change_points.Step
    first: Session  # the first session after the step
    last_before: Session
    environment: tuple[FieldDifference, ...]  # strict fingerprint fields that changed there

    @property
    def cause(self) -> str | None:
        """"driver_version '550.54' -> '580.159'" when the GPU, driver or torch changed at
        the step (the likely cause), else None."""
        found = [d for d in self.environment if d.field in CAUSE_FIELDS]
        return "; ".join(d.describe() for d in found) or None

    def to_json(self) -> dict[str, object]:
        step = self.step
        return {"index": step.index, "change": step.change, "before": step.before,
                "after": step.after, "p_value": step.p_value, "confidence": step.confidence,
                "sessions_before": step.sessions_before, "sessions_after": step.sessions_after,
                "first_run": self.first.run.to_json(),
                "last_run_before": self.last_before.run.to_json(),
                "first_fingerprint": self.first.result.fingerprint,
                "environment_changes": [d.to_json() for d in self.environment],
                "likely_cause": self.cause}


@dataclass
class Series:
    """One test's sessions under one name, for one metric, and the steps found in them."""

    name: str
    nodeid: str
    metric: str
    sessions: list[Session] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    left_out: int = 0  # sessions without a summary (too few clean rounds, metric not measured)

    @property
    def values(self) -> list[float]:
        return [session.value for session in self.sessions]

    @property
    def latest_change(self) -> Change | None:
        return self.changes[-1] if self.changes else None

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "nodeid": self.nodeid, "metric": self.metric,
                "sessions": [{"run": s.run.id, "created_at": s.run.created_at,
                              "commit": s.run.commit, "value": s.value} for s in self.sessions],
                "left_out": self.left_out,
                "changes": [change.to_json() for change in self.changes]}


def environment_changes(sessions: Sequence[Session], index: int) -> tuple[FieldDifference, ...]:
    """Strict fingerprint fields that changed between two successive sessions at ``index``
    (between the last session before and the first after), or one session either side of it
    (a step is placed to within a session)."""
    for at in (index, index - 1, index + 1):
        if 0 < at < len(sessions):
            found = tuple(d for d in differences(sessions[at - 1].result.fingerprint,
                                                 sessions[at].result.fingerprint) if d.strict)
            if found:
                return found
    return ()


def build_series(entries: Iterable[tuple[RunInfo, ResultRecord]], nodeid: str, *,
                 metrics: Sequence[str] = TIME_METRICS,
                 step_summary: str = DEFAULT_STEP_SUMMARY) -> list[Series]:
    """The series of one test's results (oldest first), one per name and metric that has a
    session with a summary."""
    found: dict[tuple[str, str], Series] = {}
    for run, result in entries:
        for metric in metrics:
            series = found.setdefault((run.name, metric), Series(run.name, nodeid, metric))
            value, _ = session_value(result, metric, step_summary)
            if value is None or not value > 0:
                series.left_out += 1
            else:
                series.sessions.append(Session(run, result, value))
    return [series for series in found.values() if series.sessions]


def find_changes(series: Series, *, alpha: float = change_points.DEFAULT_ALPHA,
                 min_change: float = change_points.DEFAULT_MIN_CHANGE) -> Series:
    """``series`` with its steps found (``change_points.find_steps``)."""
    sessions = series.sessions
    steps = change_points.find_steps(series.values, alpha=alpha, min_change=min_change)
    series.changes = [Change(step, sessions[step.index], sessions[step.index - 1],
                             environment_changes(sessions, step.index)) for step in steps]
    return series


def read_series(store: Store, nodeids: Sequence[str], *, name: str | None = None,
                limit: int = DEFAULT_LIMIT, metrics: Sequence[str] = TIME_METRICS,
                step_summary: str = DEFAULT_STEP_SUMMARY) -> list[Series]:
    """Each test's series in the store (each test's newest ``limit`` results), of one name or
    of every name; sorted by name, test and metric."""
    found: list[Series] = []
    for nodeid in nodeids:
        entries = store.history(nodeid, name=name, limit=limit)
        found.extend(build_series(entries, nodeid, metrics=metrics, step_summary=step_summary))
    return sorted(found, key=lambda s: (s.name, s.nodeid, TIME_METRICS.index(s.metric)
                                        if s.metric in TIME_METRICS else len(TIME_METRICS)))
