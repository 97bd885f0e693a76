"""Comparing the sessions of two sides, test by test, metric by metric.

A side is one or more sessions (saved runs, or this pytest session) of one code version. Per
test: the fingerprints are compared first (different strict fields: "not comparable", unless
forced); the metrics gated are the settings' thresholds, and under the default policy those of
the kind of step the sessions timed (``policy.gated``). Each session is summarised by one value
per metric (step time: its fastest clean round, or their median; GPU time per step: the same of
its queued rounds; peak VRAM: its largest peak; host CPU time and instructions: the fastest
round of the counting pass); then ``stats.compare_sessions`` decides over the sessions, with the
spread between sessions taken from each side's replicate sessions and from the store's history
of the test in the same environment. The exact counters (kernels, syncs, copies, allocations,
operators per step) need no statistics: ``counters.decide_exact`` compares the counts, and a
count that rose is a regression on its own evidence, its cause named in words. The conditions
of the sessions (cuDNN autotuning, an earlier profiler, clocks) are compared too, and a
difference is named in the verdict: such sides are not like for like.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pytest_gputrain.regression import counters, policy, process_state, stats
from pytest_gputrain.regression.benchmark import BenchmarkResult
from pytest_gputrain.regression.fingerprint import FieldDifference, differences, fingerprint_hash
from pytest_gputrain.regression.options import DEFAULT_ALPHA, DEFAULT_CANNOT_TELL
from pytest_gputrain.regression.settings import DEFAULT_STEP_SUMMARY
from pytest_gputrain.regression.store import ResultRecord, RunInfo

if TYPE_CHECKING:
    from pytest_gputrain.regression.store import Store

Verdict = Literal["regression", "improvement", "ok", "cannot_tell", "insufficient_data",
                  "not_comparable", "new"]
VERDICTS: tuple[Verdict, ...] = ("regression", "improvement", "ok", "cannot_tell",
                                 "insufficient_data", "not_comparable", "new")
VERDICT_LABELS: dict[str, str] = {
    "regression": "REGRESSION",
    "improvement": "improved",
    "ok": "ok",
    "cannot_tell": "cannot tell",
    "insufficient_data": "insufficient data",
    "not_comparable": "not comparable",
    "new": "new (no baseline)",
}
# The history read for one test: its newest results in the same environment.
HISTORY_LIMIT = 200

History = Callable[[str, str], list[list[ResultRecord]]]


@dataclass(frozen=True)
class GateSettings:
    thresholds: dict[str, float]  # metric -> fraction (0.05 = 5 %)
    alpha: float = DEFAULT_ALPHA
    force: bool = False
    step_summary: str = DEFAULT_STEP_SUMMARY  # "min" or "median" (settings.STEP_SUMMARIES)
    cannot_tell: str = DEFAULT_CANNOT_TELL  # "pass", "warn" or "fail" (settings.CANNOT_TELL)
    auto: bool = False  # the default policy: each test's metrics by its kind (policy.py)
    off: frozenset[str] = frozenset()  # metrics the spec turned off

    def gated(self, kinds: Iterable[str | None]) -> dict[str, float]:
        """The metrics a test whose sessions were judged ``kinds`` is gated on."""
        return policy.gated(self.thresholds, self.auto, self.off, kinds)


@dataclass(frozen=True)
class MetricComparison:
    nodeid: str
    metric: str
    verdict: Verdict
    threshold: float | None
    baseline_value: float | None = None  # mean of the sessions' summaries
    current_value: float | None = None
    baseline_values: tuple[float, ...] = ()  # one summary per usable session
    current_values: tuple[float, ...] = ()
    change: float | None = None
    p_value: float | None = None
    detectable: float | None = None
    resolution: float | None = None  # smallest change significant 95 % of the time
    sessions_to_decide: int | None = None  # for "cannot tell": sessions a side that would decide
    spread: float | None = None
    spread_df: int = 0
    spread_df_sides: int = 0
    spread_df_history: int = 0
    history_groups: int = 0
    baseline_left_out: int = 0  # sessions with too few clean rounds
    current_left_out: int = 0
    baseline_throttled: int = 0  # throttled rounds left out, over all sessions
    current_throttled: int = 0
    baseline_stray: int | None = None  # index into baseline_values of a stray session left out
    current_stray: int | None = None
    reason: str = ""
    differences: tuple[FieldDifference, ...] = ()
    unlike: tuple[str, ...] = ()
    forced: bool = False
    exact: bool = False  # an exact counter, every session of each side counting the same
    cause: str = ""  # what changed behind the verdict, in words (counters.py)
    bound: tuple[str | None, ...] = ()  # the kinds of step the sessions were judged (policy)

    @property
    def label(self) -> str:
        return VERDICT_LABELS[self.verdict]

    @property
    def baseline_sessions(self) -> int:
        return len(self.baseline_values)

    @property
    def current_sessions(self) -> int:
        return len(self.current_values)

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid, "metric": self.metric, "verdict": self.verdict,
            "threshold": self.threshold,
            "baseline": {"sessions": self.baseline_sessions, "value": self.baseline_value,
                         "values": list(self.baseline_values),
                         "left_out": self.baseline_left_out,
                         "stray": self.baseline_stray,
                         "throttled_rounds": self.baseline_throttled},
            "current": {"sessions": self.current_sessions, "value": self.current_value,
                        "values": list(self.current_values),
                        "left_out": self.current_left_out,
                        "stray": self.current_stray,
                        "throttled_rounds": self.current_throttled},
            "change": self.change, "p_value": self.p_value,
            "detectable_change": self.detectable, "resolution": self.resolution,
            "sessions_to_decide": self.sessions_to_decide,
            "spread": {"relative_sd": self.spread, "df": self.spread_df,
                       "df_sides": self.spread_df_sides, "df_history": self.spread_df_history,
                       "history_groups": self.history_groups},
            "reason": self.reason, "cause": self.cause, "exact": self.exact,
            "bound": [policy.KIND_WORDS.get(kind, str(kind)) for kind in self.bound],
            "fingerprint_differences": [d.to_json() for d in self.differences],
            "unlike": list(self.unlike), "forced": self.forced,
        }


class ReportedDrift(Protocol):
    """What the outputs read of a drift (``drift.Drift``, which imports this module)."""

    @property
    def nodeid(self) -> str: ...

    @property
    def metric(self) -> str: ...

    def describe(self) -> str: ...

    def to_json(self) -> dict[str, object]: ...


@dataclass
class GateReport:
    """Everything the outputs show about one comparison (and this session's benchmarks)."""

    settings: GateSettings
    benchmarks: list[BenchmarkResult] = field(default_factory=list)
    compare_spec: str | None = None
    baseline_runs: list[RunInfo] = field(default_factory=list)
    current_runs: list[RunInfo] = field(default_factory=list)  # empty: this pytest session
    current_spec: str | None = None
    session_budget: int | None = None  # the sequential recipe's most sessions a side
    comparisons: list[MetricComparison] = field(default_factory=list)
    drifts: list[ReportedDrift] = field(default_factory=list)  # against a look-back window
    explanations: list[dict[str, Any]] = field(default_factory=list)  # explain.explain_sides
    saved_run: RunInfo | None = None
    save_name: str | None = None
    commit: str | None = None
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the store or an output could not be used
    # Each compared test's step times per round, of every baseline session: what the HTML
    # report's steps lane overlays (output.report_section's "steps").
    baseline_steps: dict[str, list[list[float]]] = field(default_factory=dict)

    def count(self, verdict: str) -> int:
        return sum(1 for c in self.comparisons if c.verdict == verdict)

    @property
    def regressions(self) -> list[MetricComparison]:
        return [c for c in self.comparisons if c.verdict == "regression"]

    @property
    def undecided(self) -> list[MetricComparison]:
        """The comparisons that cannot tell: their sessions could not see a change of the
        threshold's size, or gave no spread at all."""
        return [c for c in self.comparisons if c.verdict == "cannot_tell"]

    @property
    def failed(self) -> bool:
        """A regression, or a "cannot tell" under the policy ``fail``."""
        return bool(self.regressions) or (self.settings.cannot_tell == "fail"
                                          and bool(self.undecided))

    @property
    def warned(self) -> bool:
        """Passed, with a "cannot tell" that the policy ``warn`` shows as a warning."""
        return not self.failed and self.settings.cannot_tell == "warn" and bool(self.undecided)

    def sessions_to_decide(self, budget: int) -> int | None:
        """For the sequential recipe (add a pair of sessions, compare again): how many sessions
        a side would decide the comparisons that cannot tell yet, when more sessions within
        ``budget`` a side would decide one of them; else ``None`` (nothing undecided, a
        regression found, or no number within the budget would do). A spread still unknown
        (one session a side) asks for one more."""
        if self.regressions:
            return None
        wanted = []
        for c in self.undecided:
            have = min(c.baseline_sessions, c.current_sessions)
            need = c.sessions_to_decide if c.spread is not None else have + 1
            if need is not None and have < need <= budget:
                wanted.append(need)
        return min(wanted) if wanted else None

    def mismatches(self) -> dict[str, tuple[FieldDifference, ...]]:
        """Tests whose baseline fingerprint differs (strict fields), with the differences."""
        found: dict[str, tuple[FieldDifference, ...]] = {}
        for comparison in self.comparisons:
            if any(d.strict for d in comparison.differences):
                found.setdefault(comparison.nodeid, comparison.differences)
        return found


def as_record(result: BenchmarkResult) -> ResultRecord:
    """This session's benchmark in the store's shape."""
    return ResultRecord(result.nodeid, result.fingerprint, fingerprint_hash(result.fingerprint),
                        result.rounds, result.metrics(), result.summary(),
                        counters=result.counters)


def has_metric(record: ResultRecord, metric: str) -> bool:
    """Whether a session measured ``metric``."""
    if metric in counters.COUNTERS:
        return counters.measured(record, metric)
    return bool(record.metrics.get(metric))


def session_value(record: ResultRecord, metric: str, step_summary: str = DEFAULT_STEP_SUMMARY
                  ) -> tuple[float | None, int]:
    """One session's summary of a metric, and how many throttled rounds it left out.

    Step time: the fastest clean round, or their median with ``step_summary="median"`` (None
    with fewer than ``stats.MIN_ROUNDS`` clean rounds); GPU time: the same over the rounds that
    were queued in time (``None`` entries are the others); peak VRAM: the largest peak of the
    session. The fastest round is the default because what slows a round besides the code (a
    host busy with other work, so a launch-bound step waits for its launches; a neighbour on the
    GPU) only ever adds time, and comes and goes within a session: on the H200 the median of a
    launch-bound ResNet-18 session ran anywhere from 7.5 to 11.5 ms, its fastest round at
    7.44-7.54 ms in all but two sessions of 28. An exact counter: its count per step; host CPU
    time and instructions: the fastest round of the counting pass (or the median).
    """
    if metric in counters.EXACT:
        return counters.exact_value(record, metric), 0
    if metric in counters.STATISTICAL:
        rounds = counters.rounds_of(record, metric)
        if len(rounds) < stats.MIN_ROUNDS:
            return None, 0
        return (min(rounds) if step_summary == "min" else stats.median(rounds)), 0
    values = record.metrics.get(metric)
    if not values:
        return None, 0
    if metric == "gpu_time":
        queued = [float(v) for v in values if v is not None]
        if len(queued) < stats.MIN_ROUNDS:
            return None, 0
        return (min(queued) if step_summary == "min" else stats.median(queued)), 0
    numbers = [float(v) for v in values]
    if metric != "step_time":
        return max(numbers), 0
    throttled = record.metrics.get("throttled") or []
    if len(throttled) == len(numbers):
        clean = [v for v, bad in zip(numbers, throttled, strict=True) if not bad]
    else:
        clean = numbers
    dropped = len(numbers) - len(clean)
    if len(clean) < stats.MIN_ROUNDS:
        return None, dropped
    return (min(clean) if step_summary == "min" else stats.median(clean)), dropped


def _side(records: Sequence[ResultRecord], metric: str,
          step_summary: str) -> tuple[list[float], int, int]:
    """Usable session values, sessions left out, throttled rounds left out."""
    values, left_out, throttled = [], 0, 0
    for record in records:
        value, dropped = session_value(record, metric, step_summary)
        throttled += dropped
        if value is None:
            left_out += 1
        else:
            values.append(value)
    return values, left_out, throttled


def _conditions(records: Sequence[ResultRecord]) -> list[dict[str, Any]]:
    found = []
    for record in records:
        facts = dict(record.summary.get("conditions") or {})
        if facts.get("sm_clock_median") is None:
            facts["sm_clock_median"] = record.summary.get("sm_clock_median")
        found.append(facts)
    return found


def _machines(baseline: Sequence[ResultRecord], current: Sequence[ResultRecord]) -> list[str]:
    """The sides ran on different hosts: the difference between two machines of one kind is
    then part of the change, and the spread between sessions covers it only as far as the
    repeated sessions themselves ran on several machines."""
    before = {r.fingerprint.get("host") for r in baseline} - {None}
    after = {r.fingerprint.get("host") for r in current} - {None}
    if before and after and not before & after:
        return ["host: the sides ran on different machines"]
    return []


def compare_test(nodeid: str, baseline: Sequence[ResultRecord], current: Sequence[ResultRecord],
                 settings: GateSettings,
                 history: Sequence[Sequence[ResultRecord]] = ()) -> list[MetricComparison]:
    """One row per gated metric that the current sessions measured.

    ``baseline`` and ``current`` hold one record per session; ``history`` holds groups of
    repeated sessions (each group one code version) of this test in this environment.
    """
    kinds = tuple(dict.fromkeys(counters.bound_of(r) for r in (*baseline, *current)))
    thresholds = settings.gated(kinds)
    measured = [m for m in thresholds if any(has_metric(record, m) for record in current)]
    if not baseline:
        rows = []
        for metric in measured:
            values, left_out, throttled = _side(current, metric, settings.step_summary)
            rows.append(MetricComparison(
                nodeid, metric, "new", thresholds[metric],
                current_value=stats.mean(values) if values else None,
                current_values=tuple(values), current_left_out=left_out,
                current_throttled=throttled, reason="no result for this test in the baseline",
                bound=kinds))
        return rows
    found = tuple(differences(baseline[-1].fingerprint, current[-1].fingerprint))
    strict = [d for d in found if d.strict]
    unlike = tuple(process_state.unlike(_conditions(baseline), _conditions(current))
                   + _machines(baseline, current))
    moved = counters.changed(baseline, current)  # every exact counter that changed, in words
    rows = []
    for metric in measured:
        threshold = thresholds[metric]
        base_values, base_left, base_throttled = _side(baseline, metric, settings.step_summary)
        cur_values, cur_left, cur_throttled = _side(current, metric, settings.step_summary)
        common: dict[str, Any] = {
            "threshold": threshold, "differences": found, "unlike": unlike,
            "baseline_values": tuple(base_values), "current_values": tuple(cur_values),
            "baseline_left_out": base_left, "current_left_out": cur_left,
            "baseline_throttled": base_throttled, "current_throttled": cur_throttled,
            "bound": kinds,
        }
        if strict and not settings.force:
            rows.append(MetricComparison(
                nodeid, metric, "not_comparable",
                baseline_value=stats.mean(base_values) if base_values else None,
                current_value=stats.mean(cur_values) if cur_values else None,
                reason="environment differs: " + "; ".join(d.describe() for d in strict)
                       + " (--gpu-compare-force compares anyway)",
                **common))
            continue
        if not any(has_metric(record, metric) for record in baseline):
            rows.append(MetricComparison(
                nodeid, metric, "new",
                current_value=stats.mean(cur_values) if cur_values else None,
                reason=f"the baseline has no {metric} for this test", **common))
            continue
        if metric in counters.EXACT:
            rows.append(_exact_row(nodeid, metric, baseline, current, unlike, strict, common))
            continue
        past = [_side(group, metric, settings.step_summary)[0] for group in history]
        decision = stats.compare_sessions(base_values, cur_values, threshold=threshold,
                                          alpha=settings.alpha, history=past)
        reason = decision.reason
        cause = ""
        if metric in counters.STATISTICAL:
            cause = counters.cause(metric, baseline, current)
        elif moved:  # the clock moved (or could not tell) where the counts changed: say which
            cause = "counters that changed: " + "; ".join(moved)
        if cause and (decision.verdict in ("regression", "cannot_tell")
                      or metric in counters.STATISTICAL):
            reason += f"; {cause}"
        if unlike:
            reason += "; the sides are not like for like: " + "; ".join(unlike)
        if strict:
            reason += "; forced despite: " + "; ".join(d.describe() for d in strict)
        spread = decision.spread
        rows.append(MetricComparison(
            nodeid, metric, decision.verdict,
            baseline_value=decision.baseline, current_value=decision.current,
            change=decision.change, p_value=decision.p_value, detectable=decision.detectable,
            resolution=decision.resolution, sessions_to_decide=decision.sessions_to_decide,
            spread=spread.sd, spread_df=spread.df, spread_df_sides=spread.df_sides,
            spread_df_history=spread.df_history, history_groups=spread.history_groups,
            baseline_stray=decision.baseline_stray, current_stray=decision.current_stray,
            reason=reason, forced=bool(strict), cause=cause, **common))
    return rows


def _exact_row(nodeid: str, metric: str, baseline: Sequence[ResultRecord],
               current: Sequence[ResultRecord], unlike: tuple[str, ...],
               strict: Sequence[FieldDifference], common: dict[str, Any]) -> MetricComparison:
    """An exact counter's row: the counts decide (``counters.decide_exact``), and a change
    names its cause."""
    decision = counters.decide_exact(metric, common["threshold"], baseline, current)
    verdict, reason = decision.verdict, decision.reason
    cause = ""
    if verdict in ("regression", "improvement"):
        cause = counters.cause(metric, baseline, current)
        if cause and decision.phrase:
            reason = reason.replace(decision.phrase, f"{decision.phrase} ({cause})", 1)
        if metric == "kernels" and counters.autotuned(baseline, current):
            verdict = "cannot_tell"
            reason += ("; but the ATen operators are the same on both sides and cuDNN "
                       "autotuning is on (torch.backends.cudnn.benchmark): each process picks "
                       "its own convolution kernels by timing them, so the kernels differ "
                       "without the code")
    if unlike:
        reason += "; the sides are not like for like: " + "; ".join(unlike)
    if strict:
        reason += "; forced despite: " + "; ".join(d.describe() for d in strict)
    exact_resolution = 0.0 if decision.exact else None
    return MetricComparison(
        nodeid, metric, verdict,  # type: ignore[arg-type]
        baseline_value=decision.baseline, current_value=decision.current,
        change=decision.change, resolution=exact_resolution, reason=reason,
        forced=bool(strict), exact=decision.exact, cause=cause, **common)


def compare_sides(baseline: dict[str, list[ResultRecord]], current: dict[str, list[ResultRecord]],
                  settings: GateSettings, history: History | None = None
                  ) -> list[MetricComparison]:
    """Every test of the current side against the baseline side; ``history(nodeid, hash)``
    gives the groups of repeated sessions of a test from the store."""
    rows: list[MetricComparison] = []
    for nodeid in sorted(current):
        records = current[nodeid]
        past = history(nodeid, records[-1].fingerprint_hash) if history and records else []
        rows.extend(compare_test(nodeid, baseline.get(nodeid, []), records, settings, past))
    return rows


def store_history(store: Store, exclude: set[int]) -> History:
    """The store's history of a test in one environment as groups of repeated sessions: runs
    that share a name and a commit, two or more of them, none of the runs in ``exclude`` (the
    compared sides). Runs without a commit are left out: nothing says they ran the same code."""

    def groups(nodeid: str, fingerprint: str) -> list[list[ResultRecord]]:
        found: dict[tuple[str, str], list[ResultRecord]] = {}
        for run, result in store.history(nodeid, fingerprint_hash=fingerprint,
                                         limit=HISTORY_LIMIT):
            if run.id in exclude or run.commit is None:
                continue
            found.setdefault((run.name, run.commit), []).append(result)
        return [group for group in found.values() if len(group) >= 2]
    return groups


def session_fingerprint(results: list[BenchmarkResult]) -> dict[str, Any]:
    """The fingerprint most of this session's benchmarks ran under (the run's fingerprint)."""
    counts: dict[str, tuple[int, dict[str, Any]]] = {}
    for result in results:
        key = fingerprint_hash(result.fingerprint)
        seen, _ = counts.get(key, (0, result.fingerprint))
        counts[key] = (seen + 1, result.fingerprint)
    if not counts:
        return {}
    return max(counts.values(), key=lambda item: item[0])[1]
