"""``min_utilization``: mean GPU utilization over the call phase, with a text timeline.

NVML's ``utilization.gpu`` is the share of the last sample period (1/6 s to 1 s depending on
the GPU) in which any kernel ran: a busy-or-idle measure, not SM occupancy. The plugin samples
it in the background (``collect.sampler.NvmlSampler``) and this module judges the samples taken
after the warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_gputrain.assertions.failure import AssertionFailure
from pytest_gputrain.assertions.markers import MIN_UTILIZATION, MinUtilization
from pytest_gputrain.percentiles import percentiles

BLOCKS = "▁▂▃▄▅▆▇█"
TIMELINE_WIDTH = 60


@dataclass
class UtilizationResult:
    """Utilization samples of a test's call phase: ``(seconds since the call began, %)``."""

    points: list[tuple[float, float]] = field(default_factory=list)
    duration: float = 0.0  # length of the call phase in seconds
    interval: float = 0.05
    cuda_index: int = 0
    nvml_index: int | None = None
    reason: str | None = None  # why there are no samples at all

    def measured(self, warmup: float) -> list[float]:
        return [value for t, value in self.points if t >= warmup]

    def mean(self, warmup: float = 0.0) -> float | None:
        values = self.measured(warmup)
        return sum(values) / len(values) if values else None


def _block(value: float, low: float = 0.0, high: float = 100.0) -> str:
    share = 0.0 if high <= low else (value - low) / (high - low)
    share = min(1.0, max(0.0, share))
    return BLOCKS[round(share * (len(BLOCKS) - 1))]


def sparkline(values: Sequence[float], width: int = TIMELINE_WIDTH, low: float = 0.0,
              high: float = 100.0) -> str:
    """Values as blocks (▁ = low, █ = high), averaged into at most ``width`` buckets."""
    if not values:
        return ""
    buckets = min(width, len(values))
    out = []
    for b in range(buckets):
        chunk = values[b * len(values) // buckets:(b + 1) * len(values) // buckets]
        out.append(_block(sum(chunk) / len(chunk), low, high) if chunk else " ")
    return "".join(out)


def timeline(points: Sequence[tuple[float, float]], duration: float, warmup: float = 0.0,
             width: int = TIMELINE_WIDTH) -> tuple[str, float]:
    """Blocks per equal time bucket over ``[0, duration]``, ``|`` where the warm-up ends.

    Returns the line and the seconds per block. A bucket with no sample is a space.
    """
    if not points:
        return "", 0.0
    span = max(duration, max(t for t, _ in points), 1e-9)
    # About two samples per block, so that sampling jitter leaves no block empty.
    buckets = max(1, min(width, len(points) // 2))
    step = span / buckets
    sums = [0.0] * buckets
    counts = [0] * buckets
    for t, value in points:
        index = min(buckets - 1, max(0, int(t / step)))
        sums[index] += value
        counts[index] += 1
    cells = [_block(sums[i] / counts[i]) if counts[i] else " " for i in range(buckets)]
    if 0 < warmup < span:
        cut = min(buckets, max(0, round(warmup / step)))
        cells.insert(cut, "|")
    return "".join(cells), step


def check_min_utilization(spec: MinUtilization, result: UtilizationResult
                          ) -> AssertionFailure | None:
    """None when the mean after the warm-up reaches ``spec.percent``; else the failure."""
    where = f"cuda:{result.cuda_index}"
    if result.nvml_index is not None:
        where += f" (NVML GPU {result.nvml_index})"
    need = f"{spec.percent:g} %"
    if result.reason is not None:
        return AssertionFailure(MIN_UTILIZATION, f"min_utilization: cannot sample GPU "
                                f"utilization on {where}: {result.reason} (needs {need})")
    values = result.measured(spec.warmup)
    if not values:
        return AssertionFailure(
            MIN_UTILIZATION,
            f"min_utilization: no utilization sample after the {spec.warmup:g} s warm-up on "
            f"{where}: the call phase lasted {result.duration:.2f} s; lower warmup= or make "
            f"the test run longer (needs {need})",
            describe(spec, result),
        )
    mean = sum(values) / len(values)
    if mean >= spec.percent:
        return None
    summary = (f"min_utilization: mean GPU utilization {mean:.1f} % is below the {need} "
               f"minimum on {where}")
    return AssertionFailure(MIN_UTILIZATION, summary, describe(spec, result))


def describe(spec: MinUtilization, result: UtilizationResult) -> str:
    values = sorted(result.measured(spec.warmup))
    measured_for = max(0.0, result.duration - spec.warmup)
    lines = [f"window:   {measured_for:.2f} s of the call phase"
             + (f" after a {spec.warmup:g} s warm-up" if spec.warmup else "")
             + f": {len(values)} samples, one every {result.interval * 1000:.0f} ms"]
    if values:
        p10, p50, p90 = percentiles(values, 10, 50, 90)
        lines.append(f"stats:    mean {sum(values) / len(values):.1f} %, "
                     f"p10 {p10:.0f} %, p50 {p50:.0f} %, p90 {p90:.0f} %, max {values[-1]:.0f} %")
    line, step = timeline(result.points, result.duration, spec.warmup)
    if line:
        marker = ", | = end of warm-up" if "|" in line else ""
        lines.append(f"timeline: ▁ 0 % … █ 100 %, {step:.2f} s per block{marker}")
        lines.append(f"          {line}")
    lines.append("fix:      low or spiky utilization means the GPU waits for the host: feed it "
                 "faster (DataLoader num_workers, pin_memory=True, persistent_workers), avoid "
                 "per-step syncs (.item(), .cpu(), print), raise the batch size or use CUDA "
                 "graphs / torch.compile for launch-bound steps")
    return "\n".join(lines)
