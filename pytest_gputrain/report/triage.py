"""What the top of the HTML report says, in words: the verdict, and one line per test.

- ``headline``: the tests' outcomes and the diagnosis, said apart: a run with a failed test is
  red whatever ``gpu_fail_on`` says (the diagnosis may be set never to fail the run; the tests
  still failed).
- ``test_figures``: a test's row of the summary table: its step time, the share of the step
  spent waiting for the DataLoader, the GPU's busy share, peak memory against the budget.
- ``finding_cost``: the share of the step (or of the training) a finding's fault takes, from
  its evidence, so that a costly finding is shown open whatever its severity.
- ``no_timeline_words``: why a failed test has no timeline, in the words of what it did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.findings import Finding
from pytest_gputrain.units import format_bytes

FAILING = ("failed", "error")
COSTLY_PERCENT = 25.0  # a finding costing this share of the step is shown open
# Evidence that is the share of the step (or of the steps) a fault takes: the cost a warning
# states (docs/architecture.md, "Every warning carries its cost").
COST_FACTS = frozenset({
    "run.loader.wait_percent", "run.loader.epoch_start_percent", "run.sync.wait_percent",
    "run.profile.sync_wait_percent", "run.profile.loader_wait_percent",
    "run.profile.host_work_percent",
    "run.profile.idle_without_waits_percent", "run.profile.h2d_pageable_percent",
    "run.profile.h2d_small_host_percent", "run.profile.comm_exposed_percent",
    "run.stalls.time_percent", "run.user_profiler_percent", "run.optimizer.step_host_percent",
    "run.nvml.throttle_percent", "run.new_shape_time_percent",
    "run.compile.recompile_steps_percent", "run.checkpoint.time_percent",
    "run.empty_cache_steps_percent",
})


def finding_cost(finding: Finding) -> float | None:
    """The largest share (%) of the step a finding's evidence says its fault takes; for a loss
    that turned NaN or Inf, the share of the checks that found it (training wasted)."""
    values = {e.name: e.value for e in finding.evidence}
    costs = [float(v) for name, v in values.items()
             if name in COST_FACTS and isinstance(v, int | float) and not isinstance(v, bool)]
    bad, checks = values.get("run.loss.nonfinite_checks"), values.get("run.loss.checks")
    if isinstance(bad, int) and isinstance(checks, int) and checks and bad:
        costs.append(100.0 * bad / checks)
    return max(costs, default=None)


@dataclass(frozen=True)
class Headline:
    """The verdict at the top of the page and in the tab's title."""

    failed: bool  # red: a test failed or errored, or the diagnosis failed the run
    tests: str  # "4 of 14 tests failed (2 errors)" / "All 14 tests passed"
    diagnosis: str  # "GPU diagnosis: 6 errors, 7 warnings, 3 info"
    gate: str  # what the diagnosis did to the run
    title: str  # the tab's title


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def headline(outcomes: Mapping[str, int], summary: Any, fail_on: str, diagnosis_failed: bool,
             derived: bool) -> Headline:
    total = sum(outcomes.values())
    failed, errors = outcomes.get("failed", 0), outcomes.get("error", 0)
    if failed or errors:
        words = [f"{failed} of {_plural(total, 'test')} failed" if failed else ""]
        if errors:
            words.append(_plural(errors, "error") + " in setup or teardown" if failed else
                         f"{errors} of {_plural(total, 'test')} errored")
        tests = ", ".join(w for w in words if w)
    elif total:
        others = {k: v for k, v in outcomes.items() if k != "passed" and v}
        tests = ("The test passed" if total == 1 else f"All {total} tests passed") \
            if not others else f"{outcomes.get('passed', 0)} of {_plural(total, 'test')} " \
            "passed, " + ", ".join(f"{v} {k}" for k, v in sorted(others.items()))
    else:
        tests = "No test recorded GPU facts"
    if derived and total:
        tests += " (from the facts file: a test with a failure record failed)"
    counts = [_plural(summary.error, "error"), _plural(summary.warning, "warning"),
              f"{summary.info} info"]
    diagnosis = "GPU diagnosis: " + ", ".join(counts)
    if fail_on == "never":
        gate = "The diagnosis does not fail the run (gpu_fail_on = never)."
    elif diagnosis_failed:
        gate = f"The diagnosis failed the run: a finding at {fail_on} level or above."
    else:
        gate = f"The diagnosis passed: no finding at {fail_on} level or above."
    red = bool(failed or errors or diagnosis_failed)
    verdict = "FAILED" if red else "passed"
    title = f"{verdict}: {tests.split(' (')[0]}; {_plural(summary.error, 'error')}, " \
            f"{_plural(summary.warning, 'warning')} — GPU diagnosis"
    return Headline(red, tests, diagnosis, gate, title)


@dataclass
class Figures:
    """One test's numbers in the summary table (None: not measured)."""

    step_time: float | None = None  # s, median steady step
    loader_wait: float | None = None  # % of the step
    gpu_busy: float | None = None  # %
    gpu_busy_source: str = ""
    peak_memory: int | None = None  # bytes
    budget: int | None = None  # bytes
    step_times: list[float] | None = None  # for the sparkline (ms)

    @property
    def memory_words(self) -> str:
        if self.peak_memory is None:
            return "–"
        if not self.budget:
            return format_bytes(self.peak_memory)
        return f"{format_bytes(self.peak_memory)} of {format_bytes(self.budget)} " \
               f"({100 * self.peak_memory / self.budget:.0f} %)"

    @property
    def memory_share(self) -> float | None:
        if self.peak_memory is None or not self.budget:
            return None
        return 100.0 * self.peak_memory / self.budget


def test_figures(run: dict[str, Any] | None, failure: dict[str, Any] | None) -> Figures:
    figures = Figures()
    if run is not None:
        loader, profile = run.get("loader") or {}, run.get("profile") or {}
        nvml, memory = run.get("nvml") or {}, run.get("memory") or {}
        figures.step_time = run.get("step_time")
        figures.loader_wait = loader.get("wait_percent")
        if profile.get("busy_percent_unprofiled") is not None:
            figures.gpu_busy = min(100.0, float(profile["busy_percent_unprofiled"]))
            figures.gpu_busy_source = "kernel time per step (profiler window) / median step"
        elif profile.get("busy_percent") is not None:
            figures.gpu_busy = float(profile["busy_percent"])
            figures.gpu_busy_source = "kernels running, in the profiler window"
        elif nvml.get("utilization_mean") is not None:
            figures.gpu_busy = float(nvml["utilization_mean"])
            figures.gpu_busy_source = "mean NVML utilisation"
        peak = memory.get("peak_memory") or nvml.get("process_memory_max")
        figures.peak_memory = peak if isinstance(peak, int) else None
        figures.budget = memory.get("budget")
        timeline = run.get("timeline") or {}
        times = timeline.get("step_time") or run.get("step_times") or []
        figures.step_times = [float(t) * 1e3 for t in times]
    if failure is not None and failure.get("requested"):
        peak = failure.get("peak_memory")
        if isinstance(peak, int) and (figures.peak_memory or 0) < peak:
            figures.peak_memory = peak
        figures.budget = failure.get("budget") or figures.budget
    return figures


def no_timeline_words(run: dict[str, Any] | None, failure: dict[str, Any] | None,
                      gpu: bool) -> str:
    """Why a test has no timeline to draw, fitting what it did (``gpu``: the session had a GPU
    the test could use)."""
    if failure is None:
        if run is None:
            return ("No training recorded: the test stepped no optimizer, called no module, "
                    "iterated no DataLoader and used no CUDA.")
        return "No timeline: the test took no optimizer step."
    kind = str(failure.get("kind") or "").replace("_", " ")
    when = failure.get("when")
    where = {"setup": " in its setup", "teardown": " in its teardown"}.get(str(when), "")
    if failure.get("in_loader_worker") or failure.get("kind") in ("cuda_fork", "loader_worker"):
        where = " in a DataLoader worker process"
    what = f"a {kind} error" if kind and kind != "not gpu" else \
        f"{failure.get('exc_type') or 'an exception'}"
    did = ""
    if run is not None and run.get("forwards"):
        did = f" after {_plural(int(run['forwards']), 'forward')} of its model"
    sampled = ("the timeline samples memory and the GPU from the first optimizer step on a CUDA "
               "device (and memory at an out-of-memory error)") if gpu else \
        "this session had no GPU to sample"
    return f"No timeline: the test failed{where} with {what}{did}, before its first optimizer " \
           f"step; {sampled}."
