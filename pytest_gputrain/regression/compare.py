"""Comparing this session's benchmarks with a saved baseline run, test by test, metric by metric.

Per test: the fingerprints are compared first (different strict fields: "not comparable", unless
forced), throttled rounds are left out of step times, then ``stats.compare_samples`` decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_gputrain.regression import stats
from pytest_gputrain.regression.benchmark import BenchmarkResult
from pytest_gputrain.regression.fingerprint import FieldDifference, differences
from pytest_gputrain.regression.store import ResultRecord, RunInfo

Verdict = Literal["regression", "improvement", "ok", "insufficient_data", "not_comparable", "new"]
VERDICT_LABELS: dict[str, str] = {
    "regression": "REGRESSION",
    "improvement": "improved",
    "ok": "ok",
    "insufficient_data": "insufficient data",
    "not_comparable": "not comparable",
    "new": "new (no baseline)",
}
DEFAULT_ALPHA = 0.01


@dataclass(frozen=True)
class GateSettings:
    thresholds: dict[str, float]  # metric -> fraction (0.05 = 5 %)
    alpha: float = DEFAULT_ALPHA
    force: bool = False


@dataclass(frozen=True)
class MetricComparison:
    nodeid: str
    metric: str
    verdict: Verdict
    threshold: float | None
    baseline_median: float | None = None
    current_median: float | None = None
    change: float | None = None
    p_value: float | None = None
    method: str | None = None
    shift: float | None = None  # Hodges–Lehmann shift, metric units
    shift_low: float | None = None
    shift_high: float | None = None
    baseline_rounds: int = 0  # rounds used
    current_rounds: int = 0
    baseline_throttled: int = 0  # rounds left out
    current_throttled: int = 0
    reason: str = ""
    differences: tuple[FieldDifference, ...] = ()
    forced: bool = False

    @property
    def label(self) -> str:
        return VERDICT_LABELS[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid, "metric": self.metric, "verdict": self.verdict,
            "threshold": self.threshold, "baseline_median": self.baseline_median,
            "current_median": self.current_median, "change": self.change,
            "p_value": self.p_value, "method": self.method,
            "hodges_lehmann_shift": self.shift,
            "shift_interval": (None if self.shift_low is None
                               else [self.shift_low, self.shift_high]),
            "baseline_rounds": self.baseline_rounds, "current_rounds": self.current_rounds,
            "baseline_throttled": self.baseline_throttled,
            "current_throttled": self.current_throttled, "reason": self.reason,
            "fingerprint_differences": [d.to_json() for d in self.differences],
            "forced": self.forced,
        }


@dataclass
class GateReport:
    """Everything the outputs show about this session's benchmarks."""

    settings: GateSettings
    benchmarks: list[BenchmarkResult] = field(default_factory=list)
    compare_spec: str | None = None
    baseline: RunInfo | None = None
    comparisons: list[MetricComparison] = field(default_factory=list)
    saved_run: RunInfo | None = None
    save_name: str | None = None
    commit: str | None = None
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the store or an output could not be used

    def count(self, verdict: str) -> int:
        return sum(1 for c in self.comparisons if c.verdict == verdict)

    @property
    def regressions(self) -> list[MetricComparison]:
        return [c for c in self.comparisons if c.verdict == "regression"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def mismatches(self) -> dict[str, tuple[FieldDifference, ...]]:
        """Tests whose baseline fingerprint differs (strict fields), with the differences."""
        found: dict[str, tuple[FieldDifference, ...]] = {}
        for comparison in self.comparisons:
            if any(d.strict for d in comparison.differences):
                found.setdefault(comparison.nodeid, comparison.differences)
        return found


def _values(record: ResultRecord, metric: str) -> tuple[list[float] | None, int]:
    values = record.metrics.get(metric)
    if not values:
        return None, 0
    if metric != "step_time":
        return [float(v) for v in values], 0
    throttled = record.metrics.get("throttled") or []
    if len(throttled) != len(values):
        return [float(v) for v in values], 0
    kept = [float(v) for v, bad in zip(values, throttled, strict=True) if not bad]
    return kept, len(values) - len(kept)


def compare_test(current: BenchmarkResult, baseline: ResultRecord | None,
                 settings: GateSettings) -> list[MetricComparison]:
    """One row per gated metric that the current benchmark measured."""
    measured = [m for m in settings.thresholds if current.metric(m)]
    if baseline is None:
        return [MetricComparison(current.nodeid, m, "new", settings.thresholds[m],
                                 current_median=stats.median(current.metric(m, clean=False)
                                                             or [0.0]),
                                 current_rounds=current.rounds,
                                 reason="no result for this test in the baseline run")
                for m in measured]
    found = tuple(differences(baseline.fingerprint, current.fingerprint))
    strict = [d for d in found if d.strict]
    current_record = ResultRecord(current.nodeid, current.fingerprint, "", current.rounds,
                                  current.metrics(), current.summary())
    rows = []
    for metric in measured:
        threshold = settings.thresholds[metric]
        base_values, base_throttled = _values(baseline, metric)
        cur_values, cur_throttled = _values(current_record, metric)
        common: dict[str, Any] = {
            "threshold": threshold, "differences": found,
            "baseline_throttled": base_throttled, "current_throttled": cur_throttled,
        }
        if strict and not settings.force:
            rows.append(MetricComparison(
                current.nodeid, metric, "not_comparable",
                baseline_median=stats.median(base_values) if base_values else None,
                current_median=stats.median(cur_values) if cur_values else None,
                reason="environment differs: " + "; ".join(d.describe() for d in strict)
                       + " (--gpu-compare-force compares anyway)",
                **common))
            continue
        if base_values is None:
            rows.append(MetricComparison(
                current.nodeid, metric, "new",
                current_median=stats.median(cur_values) if cur_values else None,
                reason=f"the baseline has no {metric} for this test", **common))
            continue
        decision = stats.compare_samples(base_values, cur_values or [], threshold=threshold,
                                         alpha=settings.alpha)
        reason = decision.reason
        if strict:
            reason += "; forced despite: " + "; ".join(d.describe() for d in strict)
        shift = decision.shift
        rows.append(MetricComparison(
            current.nodeid, metric, decision.verdict,
            baseline_median=decision.baseline_median, current_median=decision.current_median,
            change=decision.change, p_value=decision.p_value, method=decision.method,
            shift=shift.shift if shift else None,
            shift_low=shift.low if shift else None, shift_high=shift.high if shift else None,
            baseline_rounds=len(base_values), current_rounds=len(cur_values or []),
            reason=reason, forced=bool(strict), **common))
    return rows


def compare_session(current: list[BenchmarkResult], baseline: dict[str, ResultRecord],
                    settings: GateSettings) -> list[MetricComparison]:
    rows: list[MetricComparison] = []
    for result in sorted(current, key=lambda r: r.nodeid):
        rows.extend(compare_test(result, baseline.get(result.nodeid), settings))
    return rows


def session_fingerprint(results: list[BenchmarkResult]) -> dict[str, Any]:
    """The fingerprint most of this session's benchmarks ran under (the run's fingerprint)."""
    from pytest_gputrain.regression.fingerprint import fingerprint_hash

    counts: dict[str, tuple[int, dict[str, Any]]] = {}
    for result in results:
        key = fingerprint_hash(result.fingerprint)
        seen, _ = counts.get(key, (0, result.fingerprint))
        counts[key] = (seen + 1, result.fingerprint)
    if not counts:
        return {}
    return max(counts.values(), key=lambda item: item[0])[1]
