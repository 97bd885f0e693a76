"""Where on a test's timeline each of its findings happened: the moments the page shades.

A finding about a run names facts (its evidence); the moments are the spans of the run those
facts were measured over, on the lanes the finding is about: the steps that waited for the
DataLoader, each checkpoint save, each compilation, the growth of allocated memory, the
throttled samples, the profiler window a kernel figure comes from, the failure. Worked out from
the run's recorded series (``run.timeline``, ``run.step_times``) as the facts file keeps them
(plain JSON), so a replay shades what the session shaded. A finding whose facts have no time
(a setting, a layer's shape) gets its lanes and no span: clicking it still points at the chart.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from typing import Any

from pytest_gputrain.findings import Finding

MAX_SPANS = 200  # spans per moment on the page (merged where they touch)
LOADER_SHARE = 0.5  # a step "waited for the DataLoader" when the wait was this share of it
Span = list[float]


class StepClock:
    """Step number (1-based) -> its span on the test's clock: from every step's time where the
    facts keep them all (``run.step_times``), else from the kept steps of the timeline."""

    def __init__(self, run: dict[str, Any]) -> None:
        timeline = run.get("timeline") or {}
        times = run.get("step_times") or []
        self.count = int(run.get("steps") or timeline.get("steps") or 0)
        self.numbers: list[int] = []
        self.ends: list[float] = []
        self.times: list[float] = []
        if times and len(times) == self.count:
            self.numbers = list(range(1, self.count + 1))
            self.ends = list(itertools.accumulate(float(t) for t in times))
            self.times = [float(t) for t in times]
        elif timeline.get("step_end"):
            self.numbers = list(timeline.get("step_number") or [])
            self.ends = [float(t) for t in timeline["step_end"]]
            self.times = [float(t) for t in timeline.get("step_time") or []]
            if len(self.numbers) != len(self.ends) or len(self.times) != len(self.ends):
                self.numbers, self.ends, self.times = [], [], []
        self.end = float(max([run.get("duration") or 0.0, *self.ends[-1:]]))

    def span(self, number: int) -> Span | None:
        """Step ``number``'s start and end; after the last step, up to the end of the test."""
        if not self.ends:
            return None
        if number > (self.numbers[-1] if self.numbers else 0):
            return [self.ends[-1], max(self.end, self.ends[-1])]
        at = bisect.bisect_left(self.numbers, number)
        if at < len(self.numbers) and self.numbers[at] == number:
            return [self.ends[at] - self.times[at], self.ends[at]]
        # A step thinned away: between the kept steps around it, in proportion.
        if at == 0:
            return [0.0, self.ends[0] - self.times[0]]
        before_n, after_n = self.numbers[at - 1], self.numbers[at]
        before_t, after_t = self.ends[at - 1], self.ends[at] - self.times[at]
        share = (after_t - before_t) / max(1, after_n - before_n - 1)
        start = before_t + share * (number - before_n - 1)
        return [start, start + share]

    def spans(self, numbers: list[int]) -> list[Span]:
        return [span for number in numbers if (span := self.span(int(number))) is not None]


def merge(spans: list[Span], gap: float) -> list[Span]:
    """Spans sorted and joined where less than ``gap`` apart, rounded, at most MAX_SPANS (the
    closest ones joined first by widening the gap)."""
    ordered = sorted([float(a), float(b)] for a, b in spans if b >= a)
    while True:
        merged: list[Span] = []
        for start, end in ordered:
            if merged and start - merged[-1][1] <= gap:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        if len(merged) <= MAX_SPANS:
            return [[round(a, 3), round(b, 3)] for a, b in merged]
        gap = max(gap * 2, 1e-3)


# -- the moments of each kind of finding -------------------------------------------------------

Reader = Callable[[dict[str, Any], dict[str, Any] | None, StepClock], tuple[str, list[Span]]]


def _loader_waits(run: dict[str, Any], failure: dict[str, Any] | None,
                  clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    numbers, waits, times = (timeline.get(k) or [] for k in (
        "step_number", "loader_wait", "step_time"))
    waited = [n for n, w, t in zip(numbers, waits, times, strict=False)
              if t and w >= LOADER_SHARE * t]
    words = f"steps that waited for the DataLoader over {LOADER_SHARE:.0%} of the step"
    return words, clock.spans(waited)


def _window(run: dict[str, Any], failure: dict[str, Any] | None,
            clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    start, end = timeline.get("window_start"), timeline.get("window_end")
    if start is None or end is None:
        return "measured in the profiler window (not placed on this timeline)", []
    return "the profiler window these figures were measured in", [[start, end]]


def _saves(run: dict[str, Any], failure: dict[str, Any] | None,
           clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    steps = timeline.get("save_steps")
    if steps:
        return "the steps that saved a checkpoint", clock.spans(steps)
    checkpoint = run.get("checkpoint") or {}
    if (checkpoint.get("steps_percent") or 0) >= 99 and clock.ends:
        # Facts recorded before the save steps were kept: every step after warm-up saved.
        warmup = int(run.get("warmup_steps") or 0)
        first = clock.span(warmup + 1)
        return "every step after warm-up saved a checkpoint", \
            [[first[0], clock.ends[-1]]] if first else []
    return "checkpoint saves (their steps were not recorded)", []


def _compiles(run: dict[str, Any], failure: dict[str, Any] | None,
              clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    steps = timeline.get("compile_steps")
    if steps:
        return "the steps in which torch.compile compiled", clock.spans(steps)
    return "compilations (their steps were not recorded)", []


def _stalls(run: dict[str, Any], failure: dict[str, Any] | None,
            clock: StepClock) -> tuple[str, list[Span]]:
    numbers = (run.get("stalls") or {}).get("step_numbers") or []
    return "the stalled steps (the first 10)", clock.spans(numbers)


def _growth(run: dict[str, Any], failure: dict[str, Any] | None,
            clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    times = timeline.get("memory_time") or []
    warmup = int(run.get("warmup_steps") or 0)
    start = clock.span(warmup + 1)
    if not times or start is None:
        return "the growth of allocated memory", []
    return "allocated memory growing, from the end of warm-up", [[start[0], times[-1]]]


def _throttled(run: dict[str, Any], failure: dict[str, Any] | None,
               clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    times, flags = timeline.get("nvml_time") or [], timeline.get("throttled") or []
    spans = []
    for index, flag in enumerate(flags[:len(times)]):
        if flag:
            stop = times[index + 1] if index + 1 < len(times) else clock.end
            spans.append([times[index], stop])
    return "the samples with the clocks held down", spans


def _others(run: dict[str, Any], failure: dict[str, Any] | None,
            clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    times = timeline.get("nvml_time") or []
    used, own = timeline.get("memory_used") or [], timeline.get("process_memory") or []
    spans = []
    for index, (u, o) in enumerate(zip(used, own, strict=False)):
        if u is not None and o is not None and u - o > 2**30 and index < len(times):
            stop = times[index + 1] if index + 1 < len(times) else clock.end
            spans.append([times[index], stop])
    return "the samples where other processes held over 1 GiB", spans


def _nonfinite(run: dict[str, Any], failure: dict[str, Any] | None,
               clock: StepClock) -> tuple[str, list[Span]]:
    step = (run.get("loss") or {}).get("first_nonfinite_step")
    start = clock.span(int(step)) if step else None
    if start is None:
        return "the loss turned NaN or Inf", []
    return f"the loss NaN or Inf from step {step} on", [[start[0], clock.end]]


def _failure(run: dict[str, Any], failure: dict[str, Any] | None,
             clock: StepClock) -> tuple[str, list[Span]]:
    timeline = run.get("timeline") or {}
    oom = timeline.get("oom_times") or []
    at = oom[-1] if oom else clock.end
    last = clock.ends[-1] if clock.ends and clock.ends[-1] <= at else None
    if last is not None and at - last <= 0.2 * max(clock.end, at):
        return "from the last step to the failure", [[last, at]]
    return "the failure", [[max(0.0, at - 0.01 * max(clock.end, at, 0.1)), at]]


def _whole_run(run: dict[str, Any], failure: dict[str, Any] | None,
               clock: StepClock) -> tuple[str, list[Span]]:
    return "every step", [[0.0, clock.end]] if clock.end else []


UTIL, MEMORY, CLOCKS, POWER, TEMPERATURE, STEPS = (
    "util", "memory", "clock", "power", "temperature", "steps")
# code -> (the lanes it is about, how its moments are found); a code not listed gets none.
KINDS: dict[str, tuple[tuple[str, ...], Reader]] = {
    "GT102": ((STEPS, UTIL), _loader_waits),
    "GT113": ((STEPS, UTIL), _loader_waits),
    "GT103": ((STEPS, UTIL), _window),
    "GT104": ((STEPS, UTIL), _window),
    "GT105": ((UTIL, STEPS), _window),
    "GT106": ((UTIL, STEPS), _window),
    "GT117": ((UTIL, STEPS), _window),
    "GT126": ((UTIL, STEPS), _window),
    "GT127": ((UTIL, STEPS), _window),
    "GT128": ((UTIL, STEPS), _window),
    "GT129": ((UTIL, STEPS), _window),
    "GT130": ((UTIL, STEPS), _window),
    "GT137": ((UTIL, STEPS), _window),
    "GT139": ((UTIL, STEPS), _window),
    "GT143": ((UTIL, STEPS), _window),
    "GT311": ((UTIL, STEPS), _window),
    "GT107": ((MEMORY,), _whole_run),
    "GT108": ((MEMORY,), _growth),
    "GT110": ((MEMORY,), _whole_run),
    "GT135": ((MEMORY, STEPS), _whole_run),
    "GT119": ((MEMORY, STEPS), _whole_run),
    "GT112": ((CLOCKS, POWER, TEMPERATURE, STEPS), _throttled),
    "GT115": ((STEPS,), _whole_run),
    "GT116": ((STEPS,), _whole_run),
    "GT118": ((STEPS,), _stalls),
    "GT120": ((STEPS,), _whole_run),
    "GT131": ((STEPS,), _compiles),
    "GT132": ((STEPS,), _compiles),
    "GT134": ((MEMORY,), _others),
    "GT140": ((STEPS, UTIL), _saves),
    "GT142": ((STEPS,), _nonfinite),
    "GT201": ((MEMORY,), _failure),
    "GT207": ((MEMORY,), _failure),
    "GT208": ((MEMORY,), _failure),
    "GT209": ((MEMORY,), _failure),
    "GT219": ((MEMORY,), _failure),
}


def finding_moments(findings: list[Finding], run: dict[str, Any],
                    failure: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per finding of a test (in order): its label, spans and lanes; an entry with
    no lane for a finding the timeline cannot show."""
    clock = StepClock(run)
    gap = max(clock.end, 1e-3) / 400  # spans closer than a pixel or two on a wide chart
    moments: list[dict[str, Any]] = []
    for finding in findings:
        kind = KINDS.get(finding.code)
        if kind is None:
            moments.append({"code": finding.code, "label": "", "spans": [], "lanes": []})
            continue
        lanes, reader = kind
        label, spans = reader(run, failure, clock)
        moments.append({"code": finding.code, "label": f"{finding.code}: {label}",
                        "spans": merge(spans, gap), "lanes": list(lanes)})
    return moments
