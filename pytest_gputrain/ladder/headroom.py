"""Largest batch that fits, predicted from a few measured batch sizes instead of trial-and-OOM.

Peak memory of a training step is close to affine in the batch size: a fixed part (parameters,
gradients, optimizer state, workspaces) plus a per-sample part (activations). Three probes far
below the budget pin the line down; the prediction is where it meets the budget. One run at the
predicted batch then verifies it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LinearFit:
    intercept: float  # bytes that do not depend on the batch
    per_sample: float  # bytes per sample

    def at(self, batch: float) -> float:
        return self.intercept + self.per_sample * batch


def fit_line(points: Sequence[tuple[int, int]]) -> LinearFit:
    """Least-squares line through (batch size, peak bytes)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("need peaks at two or more different batch sizes")
    batches, peaks = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(batches, peaks)
    return LinearFit(intercept=intercept, per_sample=slope)


def predict_largest(fit: LinearFit, budget: int, safety: float = 0.01) -> int | None:
    """Largest batch whose predicted peak stays under ``budget`` (less a safety fraction)."""
    if fit.per_sample <= 0:
        return None  # memory does not grow with the batch: nothing to extrapolate
    usable = budget * (1 - safety) - fit.intercept
    return max(0, math.floor(usable / fit.per_sample))


def plan_probes(first: int, first_peak: int, fixed: int, budget: int, count: int = 3
                ) -> list[int]:
    """Batch sizes for the remaining probes: spread out, yet kept near half the budget or below.

    ``first`` was measured at ``first_peak`` with ``fixed`` bytes held before the step; a rough
    per-sample cost from it says where a quarter and a half of the budget lie.
    """
    per_sample = max(1.0, (first_peak - fixed) / max(first, 1))
    reachable = max(first, (budget - fixed) / per_sample)
    wanted = [reachable * share for share in (0.25, 0.5)][: count - 1]
    probes: list[int] = []
    for target in wanted:
        batch = max(first + 1, int(target))
        if batch not in probes:
            probes.append(batch)
    if reachable * 0.5 < first:
        # The first batch is already past half the budget: probe below it instead.
        probes = [b for b in (first // 2, first // 4) if b >= 1 and b != first]
    return probes
