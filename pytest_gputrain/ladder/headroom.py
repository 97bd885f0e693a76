"""Largest batch that fits, predicted from a few measured batch sizes instead of trial-and-OOM.

Peak memory of a training step is close to affine in the batch size: a fixed part (parameters,
gradients, optimizer state, workspaces) plus a per-sample part (activations). Three probes pin
the line down; the prediction is where it meets the budget. One run at the predicted batch then
verifies it.

Where the probes go decides how far the line is extrapolated. The second probe sits at a third
of the reachable batch, estimated from the first probe alone; the third at two thirds, estimated
from the line through the first two, so the last stretch to the budget is short and the slope
is measured at the batch sizes that matter (small batches pick other kernels and workspaces).
Where the two largest probes are still flat (gradients or workspaces, not activations, make
their peak), more probes climb, up to six, each no further than a bound set by the largest
probe alone.

A step has two phases, and each gets its own line. Outside ``optimizer.step`` (the forward and
the backward) memory grows with the batch. Inside it (parameters, gradients, the optimizer's
state and the temporaries of its update) it does not. With AdamW the update can peak above the
forward and backward of small batches: a line through whole-step peaks is then flat there, and
predicts nothing. The batch must fit under both lines; a phase that does not grow bounds
nothing.

What must fit under the budget is not the live bytes but the segments they pin: the caching
allocator's fragmentation. Each probe's allocations are replayed through the allocator's policy
(allocator_model.py) to find the least limit under which they all run: its ``room``. The room
above the whole step's peak, the allocator's waste, gets a line of its own through the two
largest probes that measured it, and is added to each phase's line; what is left of the budget
(MARGIN) is for what a line through probes cannot see. Where no probe was replayed, a fixed
share of the budget (UNREPLAYED_MARGIN) stands for the waste, as it did before the replay.

The waste need not grow in step with the batch (which block a request splits, which segment a
live block pins, changes with the sizes). Where the probes made the same allocations in the
same order, only of other sizes, the predicted batch's own allocations are forecast from them
and replayed (allocation_forecast.py): the prediction is then the largest batch whose forecast
fits, and the waste line is not used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Shares of the reachable batch where the second and third probes go: far enough apart for a
# steady slope, the third still a third of the way below the budget if the estimate is off.
PROBE_SHARES = (1 / 3, 2 / 3)
# What the prediction leaves of the budget beyond the allocator's replayed waste: the lines'
# own error at the prediction (on the H200, fresh processes near the limit peaked up to 1.0 %
# of the budget above the line through the probes: ViT-B/16, AdamW, 8 GiB).
MARGIN = 0.01
# Where no probe was replayed: the waste too. On the H200 the true largest batches of ResNet-50
# and of the sample project came to 98.9 % and 99.9 % of the budget in allocated bytes; those of
# ViT-B/16 (AdamW) and of a GPT-style language model to 97.2 % and 95.6 %: not covered.
UNREPLAYED_MARGIN = 0.02
# How far below where the phase lines alone meet the budget a forecast is looked for: the
# waste, in samples (on the H200 the GPT-style model's 8 samples, 364 MiB at 46 MiB each).
MAX_FORECAST = 64
# The retry's margin where the verification's shortfall could not be measured.
FALLBACK_MARGIN = 0.06
# Past the three planned probes, more (up to MAX_PROBES) while the two largest are still flat:
# their peak above what was held grew by less than FLAT times the share their batch grew by.
# Activations grow in proportion with the batch (1.0); gradients and workspaces do not (0.0).
MAX_PROBES = 6
FLAT = 0.5
# How much further than the largest probe alone says (its bytes above what was held, per
# sample: an overstated cost) a line through two probes may place the next one.
BEYOND_ALONE = 4.0


@dataclass(frozen=True)
class StepPeaks:
    """Peak allocated bytes over a few training steps, split at the optimizer's step, and the
    least memory limit their allocations need, fragmentation included."""

    outside: int  # outside optimizer.step: the forward and backward, what grows with the batch
    optimizer: int | None = None  # inside it; None when it never ran (``outside`` is then all)
    room: int | None = None  # the replayed allocator's least limit; None: not replayed

    @property
    def whole(self) -> int:
        return self.outside if self.optimizer is None else max(self.outside, self.optimizer)


Probe = tuple[int, StepPeaks]  # (batch size, its peaks)
Fits = Callable[[int, int], bool]  # (batch, limit): whether its forecast allocations fit


@dataclass(frozen=True)
class LinearFit:
    intercept: float  # bytes that do not depend on the batch
    per_sample: float  # bytes per sample

    def at(self, batch: float) -> float:
        return self.intercept + self.per_sample * batch

    def __add__(self, other: LinearFit) -> LinearFit:
        return LinearFit(self.intercept + other.intercept, self.per_sample + other.per_sample)


def fit_line(points: Sequence[tuple[int, int]]) -> LinearFit:
    """Least-squares line through (batch size, peak bytes)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("need peaks at two or more different batch sizes")
    batches, peaks = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(batches, peaks)
    return LinearFit(intercept=intercept, per_sample=slope)


def fit_upper_line(points: Sequence[tuple[int, int]]) -> LinearFit:
    """The line through the two largest probes: the slope where the prediction lands."""
    return fit_line(sorted(points)[-2:])


def predict_largest(fit: LinearFit, budget: int, safety: float = MARGIN) -> int | None:
    """Largest batch whose predicted peak stays under ``budget`` (less a safety fraction)."""
    if fit.per_sample <= 0:
        return None  # memory does not grow with the batch: nothing to extrapolate
    usable = budget * (1 - safety) - fit.intercept
    return max(0, math.floor(usable / fit.per_sample))


def phase_lines(probes: Sequence[Probe]) -> list[LinearFit]:
    """A line per phase of the step (outside the optimizer's step, inside it), each through the
    two largest probes that measured that phase."""
    outside = [(batch, peaks.outside) for batch, peaks in probes]
    inside = [(batch, peaks.optimizer) for batch, peaks in probes if peaks.optimizer is not None]
    return [fit_upper_line(points) for points in (outside, inside)
            if len({batch for batch, _ in points}) >= 2]


def waste_line(probes: Sequence[Probe]) -> LinearFit | None:
    """The allocator's waste (each probe's replayed room over its whole step's peak) against
    the batch, through the two largest probes that were replayed; None with fewer than two.
    Waste that shrinks with the batch is not extrapolated: the larger of the two stands."""
    points = sorted((batch, peaks.room - peaks.whole) for batch, peaks in probes
                    if peaks.room is not None)
    if len({batch for batch, _ in points}) < 2:
        return None
    fit = fit_upper_line(points)
    if fit.per_sample < 0:
        return LinearFit(intercept=max(waste for _, waste in points[-2:]), per_sample=0.0)
    return fit


def requirement_lines(probes: Sequence[Probe]) -> list[LinearFit]:
    """Each phase's line with the allocator's waste added, where it was replayed."""
    waste = waste_line(probes)
    lines = phase_lines(probes)
    return lines if waste is None else [line + waste for line in lines]


def margin(probes: Sequence[Probe]) -> float:
    """The share of the budget a prediction leaves: MARGIN where the waste was replayed."""
    return MARGIN if waste_line(probes) is not None else UNREPLAYED_MARGIN


def predict(probes: Sequence[Probe], budget: int, safety: float | None = None) -> int | None:
    """Largest batch at which every phase's requirement stays under ``budget`` less ``safety``
    (default: ``margin(probes)``); None when no phase grows with the batch (nothing to
    extrapolate)."""
    safety = margin(probes) if safety is None else safety
    limits = [predict_largest(fit, budget, safety) for fit in requirement_lines(probes)]
    return min((limit for limit in limits if limit is not None), default=None)


def predict_by_forecast(probes: Sequence[Probe], budget: int, fits: Fits) -> int | None:
    """Largest batch whose forecast allocations fit under ``budget`` less MARGIN (``fits(batch,
    limit)``, allocation_forecast.py): the batch's own waste, where the waste line has only
    the probes'. Looked for from where the phase lines alone meet the budget less MARGIN down
    to MAX_FORECAST below it (never below the largest probe); None where none fits."""
    upper = predict(_without_rooms(probes), budget, MARGIN)
    if upper is None:
        return None
    lowest = max(max(batch for batch, _ in probes), upper - MAX_FORECAST)
    limit = math.floor(budget * (1 - MARGIN))
    return next((batch for batch in range(upper, lowest - 1, -1) if fits(batch, limit)), None)


def _without_rooms(probes: Sequence[Probe]) -> list[Probe]:
    return [(batch, StepPeaks(peaks.outside, peaks.optimizer)) for batch, peaks in probes]


def step_down(probes: Sequence[Probe], budget: int, attempt: int,
              short_by: int | None) -> int | None:
    """The batch to retry at after ``attempt`` needed ``short_by`` bytes more than ``budget``
    (ran out of memory, or peaked over it): lower by that and the margin, at the cost per
    sample of the line that bounds the prediction. Unmeasured: the prediction at
    FALLBACK_MARGIN."""
    if short_by is None:
        return predict(probes, budget, FALLBACK_MARGIN)
    growing = [fit for fit in requirement_lines(probes) if fit.per_sample > 0]
    if not growing:
        return None
    bound = min(growing, key=lambda fit: (budget - fit.intercept) / fit.per_sample)
    fewer = math.ceil((short_by + margin(probes) * budget) / bound.per_sample)
    return max(0, attempt - max(1, fewer))


def reachable_batch(probes: Sequence[Probe], fixed: int, budget: int) -> float:
    """Where the peak would meet the budget, from what the probes so far say.

    One probe: its bytes above ``fixed`` (what was held before the step) over its batch, a cost
    per sample that overstates (the step's workspaces and the update count as per-sample), so
    the estimate errs low. Two or more: the least batch at which a phase's line meets it, and
    no further than BEYOND_ALONE times what the largest probe alone says. On a model whose
    gradients outweigh the activations of small batches, the forward and backward's peak is
    flat there (the gradients make it), and a line through two such probes understates the cost
    per sample many times: the next probe would land far past the budget."""
    batch, peaks = max(probes, key=lambda probe: probe[0])
    per_sample = max(1.0, (peaks.whole - fixed) / max(batch, 1))
    alone = max(float(batch), (budget - fixed) / per_sample)
    if len(probes) == 1:
        return alone
    reach = [(budget - fit.intercept) / fit.per_sample
             for fit in phase_lines(probes) if fit.per_sample > 0]
    return min([*reach, BEYOND_ALONE * alone]) if reach else float(batch)


def still_flat(probes: Sequence[Probe], fixed: int) -> bool:
    """Whether the two largest probes' peaks outside the update grew much less than in
    proportion with their batch: gradients or workspaces, not activations, still make them, and
    the line through them would understate the cost per sample."""
    (low, low_peaks), (high, high_peaks) = sorted(probes, key=lambda probe: probe[0])[-2:]
    above = low_peaks.outside - fixed
    if above <= 0 or high <= low:
        return False
    return (high_peaks.outside - low_peaks.outside) / above < FLAT * (high - low) / low


def next_probe(probes: Sequence[Probe], fixed: int, budget: int) -> int | None:
    """The next probe's batch size, or None when the probes are done (three taken and the two
    largest not flat, or six taken, or the line says the next would come too close to the
    budget)."""
    taken = len(probes)
    if taken >= MAX_PROBES or (taken > len(PROBE_SHARES) and not still_flat(probes, fixed)):
        return None
    largest = max(b for b, _ in probes)
    share = PROBE_SHARES[min(taken, len(PROBE_SHARES)) - 1]
    batch = int(reachable_batch(probes, fixed, budget) * share)
    if batch <= largest:
        return None
    return batch


def probes_below(first: int, first_peaks: StepPeaks, fixed: int, budget: int) -> list[int]:
    """When the first batch is already past a third of the budget, the other probes go below
    it (half and a quarter of it), so that no probe risks the budget."""
    reach = reachable_batch([(first, first_peaks)], fixed, budget)
    if reach * PROBE_SHARES[0] >= first:
        return []
    return [b for b in (first // 2, first // 4) if b >= 1 and b != first]


def take_probes(first: int, first_peaks: StepPeaks, fixed: int, budget: int,
                peaks_of: Callable[[int], StepPeaks]) -> list[Probe]:
    """The probes, (batch size, peaks) each: ``first`` as measured, then below it or up to two
    thirds of the budget, each measured with ``peaks_of`` before the next is placed."""
    probes = [(first, first_peaks)]
    below = probes_below(first, first_peaks, fixed, budget)
    probes += [(batch, peaks_of(batch)) for batch in below]
    while not below and (batch := next_probe(probes, fixed, budget)) is not None:
        probes.append((batch, peaks_of(batch)))
    return probes
