"""A batch no probe ran, forecast allocation by allocation from the probes' recorded histories,
and replayed through the caching allocator (allocator_model.py) under the budget.

    forecast = AllocationForecast.of([(32, recording), (50, recording), (107, recording)])
    if forecast is not None:
        forecast.fits(155, limit)  # do the allocations of batch 155 all fit under limit?

Where the allocator's waste near the limit comes from is the order and the sizes of the step's
allocations: which freed block a request splits, which segment a block left alive pins. A line
through the probes' waste cannot follow it: on the H200 (2026-12-02) the GPT-style model
wasted 121 MiB at its probe of 50 and 593 MiB at 107; the line through them said 883 MiB at
142, where a fresh process at 155 wasted 364 MiB, and the prediction fell to 0.916 of the
largest batch. Replaying the batch itself needs its allocations, and a step of another batch
makes the same ones in the same order, only larger: the forward and backward's activations grow
with the batch, the parameters, gradients, optimizer state and most workspaces do not.

So where every probe made the same sequence of allocations and frees (the same count, each of
the same kind on the same stream), each allocation's size at another batch is read off the
probes: the same in all of them stays; sizes on one line through all the probes (to 1 %; two
probes make a line of any two sizes) follow it; any other (a library's workspace that changes
its plan with the shape) takes the largest the probes saw. Frees follow the largest probe's.
Where the probes' sequences differ (cuDNN's convolutions pick plans, and make workspaces, by
shape), there is no forecast and the waste line stands (headroom.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gputrain.ladder.allocator_model import Event, Recording, replay

# Sizes on one line through every probe, each within this share of it (and 512 bytes: the
# allocator's rounding): an allocation that grows with the batch.
ON_LINE = 0.01
# The longest recording forecast. A replay takes about 3.5 µs an event (15 ms for the GPT-style
# model's 3,714), one per batch looked at (a few; at most headroom.MAX_FORECAST): 0.7 s each
# at this length.
MAX_EVENTS = 200_000


@dataclass(frozen=True)
class _Size:
    """One allocation's size against the batch: ``at_batch`` bytes at ``batch`` plus
    ``per_sample`` bytes per sample more (0 for a size that does not grow)."""

    batch: int
    at_batch: int
    per_sample: float = 0.0

    def at(self, batch: int) -> int:
        return max(1, round(self.at_batch + self.per_sample * (batch - self.batch)))


class AllocationForecast:
    """The allocations of a training step at any batch, from probes that made the same ones."""

    def __init__(self, template: Recording, sizes: Sequence[_Size | None]) -> None:
        self._template = template  # the largest probe's: its frees, streams and addresses
        self._sizes = sizes  # per event: the allocation's size line (None for a free)

    @classmethod
    def of(cls, probes: Sequence[tuple[int, Recording]]) -> AllocationForecast | None:
        """From ``(batch, recording)`` of two or more probes at different batches; None where
        they did not make the same sequence of allocations and frees, or one ran out of
        memory, or a recording is too long."""
        probes = sorted(probes, key=lambda probe: probe[0])
        if len({batch for batch, _ in probes}) < 2 or len(probes) != len(
                {batch for batch, _ in probes}):
            return None
        recordings = [recording for _, recording in probes]
        if any(r.out_of_memory is not None or len(r.events) > MAX_EVENTS for r in recordings):
            return None
        if not _same_sequence(recordings):
            return None
        batches = [batch for batch, _ in probes]
        (low, low_run), (high, high_run) = probes[-2:]
        sizes: list[_Size | None] = []
        for index, event in enumerate(high_run.events):
            if event.action != "alloc":
                sizes.append(None)
                continue
            seen = [recording.events[index].size for recording in recordings]
            sizes.append(_size_line(batches, seen, low_run.events[index].size, low, high))
        return cls(high_run, sizes)

    def recording(self, batch: int) -> Recording:
        """The forecast allocations of one run at ``batch``, as a recording to replay."""
        events = tuple(
            event if size is None else Event("alloc", event.address, size.at(batch),
                                              event.stream)
            for event, size in zip(self._template.events, self._sizes, strict=True))
        return Recording(initial=self._template.initial, events=events)

    def fits(self, batch: int, limit: int) -> bool:
        """Whether every forecast allocation of ``batch`` is served under ``limit`` bytes."""
        return replay(self.recording(batch), limit).fits


def _same_sequence(recordings: Sequence[Recording]) -> bool:
    first = recordings[0].events
    return all(len(r.events) == len(first) and all(
        (a.action, a.stream) == (b.action, b.stream) for a, b in zip(r.events, first, strict=True))
        for r in recordings[1:])


def _size_line(batches: Sequence[int], seen: Sequence[int], low_size: int, low: int,
               high: int) -> _Size:
    """One allocation's size against the batch, from its size at each probe (``seen``, in the
    order of ``batches``; ``low`` and ``high`` are the two largest)."""
    high_size = seen[-1]
    if all(size == high_size for size in seen):
        return _Size(high, high_size)
    per_sample = (high_size - low_size) / (high - low)
    on_line = per_sample > 0 and all(
        abs(size - (high_size + per_sample * (batch - high))) <= ON_LINE * high_size + 512
        for batch, size in zip(batches, seen, strict=True))
    if on_line:
        return _Size(high, high_size, per_sample)
    return _Size(high, max(seen))  # a size that changes but not with the batch: the largest

