"""``max_vram``: the peak GPU memory of a test against its limit, and where the memory went.

The peak is measured by the plugin (see ``measure.py``) in one of three ways:

- ``allocated`` (default): ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
  at the start of the test's setup: memory held by tensors, exact, from setup to the end of the
  call phase. It counts tensors alive when the test started (the report shows how much).
- ``reserved``: ``torch.cuda.max_memory_reserved``: what the caching allocator took from the
  device (what another process can no longer use).
- ``device``: this process's GPU memory as NVML reports it, sampled in the background: includes
  the CUDA context, cuBLAS/cuDNN workspaces and allocations outside torch; may miss a peak
  shorter than the sampling interval.

With an explicit marker, the allocations are recorded (``torch.cuda.memory._record_memory_history``,
bounded by ``gpu_vram_history`` entries, Python stacks only) and a failure lists the code that
held the most memory at the peak.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.assertions.failure import AssertionFailure
from pytest_gputrain.assertions.markers import MAX_VRAM, MaxVram, describe_size

TOP_SITES = 5

MEASURE_LABELS = {
    "allocated": "allocated (torch.cuda.max_memory_allocated)",
    "reserved": "reserved (torch.cuda.max_memory_reserved, the caching allocator's pool)",
    "device": "device memory of this process (NVML, sampled)",
}

# Frames from these places are not "where the memory went": the first frame outside them is.
_INTERNAL_PARTS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}_pytest{os.sep}",
    f"{os.sep}pluggy{os.sep}",
    f"{os.sep}pytest_gputrain{os.sep}",
    f"{os.sep}pytest{os.sep}",
    "<frozen ",
)


@dataclass(frozen=True)
class AllocationSite:
    """Memory live at the peak, grouped by the line of code that allocated it."""

    filename: str
    line: int
    function: str
    size: int
    count: int

    def describe(self, base: str | None = None) -> str:
        path = self.filename
        if base:
            try:
                relative = os.path.relpath(path, base)
                if not relative.startswith(".."):
                    path = relative
            except ValueError:
                pass
        plural = "s" if self.count != 1 else ""
        return (f"{describe_size(self.size):>10}  {path}:{self.line} in {self.function} "
                f"({self.count} block{plural})")


@dataclass
class MemoryResult:
    """The peak of one test in the measure its limit asks for, with context for the report."""

    measure: str
    cuda_index: int = 0
    peak: int | None = None
    reason: str | None = None  # why ``peak`` is unknown
    allocated_at_start: int | None = None
    allocated_at_end: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    device_fallback: str | None = None  # device measure: why the device-wide value was used
    sample_interval: float | None = None
    top: list[AllocationSite] = field(default_factory=list)
    history_note: str | None = None  # why there are no top allocations


def _frame_site(frames: Sequence[Mapping[str, Any]]) -> tuple[str, int, str] | None:
    chosen: Mapping[str, Any] | None = None
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if not filename or filename.startswith("??"):
            continue
        if any(part in filename for part in _INTERNAL_PARTS):
            chosen = chosen or frame  # keep the innermost as a last resort
            continue
        chosen = frame
        break
    if chosen is None:
        return None
    return str(chosen.get("filename")), int(chosen.get("line", 0)), str(chosen.get("name", "?"))


def top_allocations(trace: Iterable[Mapping[str, Any]], limit: int = TOP_SITES
                    ) -> list[AllocationSite]:
    """Replay an allocator trace (``_snapshot()["device_traces"][i]``); group what was live at
    the highest point by allocating line, largest first."""
    entries = list(trace)
    live: dict[Any, int] = {}
    total = peak = 0
    peak_at = -1
    for position, entry in enumerate(entries):
        action, addr, size = entry.get("action"), entry.get("addr"), int(entry.get("size", 0))
        if action == "alloc":
            live[addr] = size
            total += size
            if total > peak:
                peak, peak_at = total, position
        elif action in ("free_requested", "free_completed") and addr in live:
            total -= live.pop(addr)
    if peak_at < 0:
        return []
    alive: dict[Any, Mapping[str, Any]] = {}
    for entry in entries[:peak_at + 1]:
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            alive[addr] = entry
        elif action in ("free_requested", "free_completed"):
            alive.pop(addr, None)
    sites: dict[tuple[str, int, str], list[int]] = {}
    for entry in alive.values():
        site = _frame_site(entry.get("frames") or []) or ("<unknown>", 0, "?")
        bucket = sites.setdefault(site, [0, 0])
        bucket[0] += int(entry.get("size", 0))
        bucket[1] += 1
    ranked = sorted(sites.items(), key=lambda item: item[1][0], reverse=True)
    return [AllocationSite(filename=f, line=ln, function=fn, size=size, count=count)
            for (f, ln, fn), (size, count) in ranked[:limit]]


def check_max_vram(spec: MaxVram, result: MemoryResult, base: str | None = None
                   ) -> AssertionFailure | None:
    """None when the peak is within the limit; else the failure with its evidence."""
    where = f"cuda:{result.cuda_index}"
    limit = describe_size(spec.limit)
    origin = "" if spec.explicit else " (the session default gpu_max_vram)"
    if result.peak is None:
        return AssertionFailure(
            MAX_VRAM,
            f"max_vram: cannot measure the {spec.measure} peak on {where}: "
            f"{result.reason or 'unknown reason'} (limit {limit}{origin})",
        )
    if result.peak <= spec.limit:
        return None
    excess = result.peak - spec.limit
    share = 100 * excess / spec.limit
    summary = (f"max_vram: peak {spec.measure} GPU memory {describe_size(result.peak)} exceeds "
               f"the {limit} limit{origin} by {describe_size(excess)} (+{share:.0f} %) on {where}")
    return AssertionFailure(MAX_VRAM, summary, describe(spec, result, base))


def describe(spec: MaxVram, result: MemoryResult, base: str | None = None) -> str:
    """The report section: how it was measured, the context, the top allocations, a fix."""
    lines = [f"limit:    {describe_size(spec.limit)}"
             f"{'' if spec.explicit else ' (gpu_max_vram default)'}"]
    if result.peak is not None:
        lines.append(f"peak:     {describe_size(result.peak)}  "
                     f"{MEASURE_LABELS.get(spec.measure, spec.measure)}")
        excess = result.peak - spec.limit
        if excess > 0:
            lines.append(f"over by:  {describe_size(excess)} (+{100 * excess / spec.limit:.0f} %)")
    if result.device_fallback:
        lines.append(f"note:     device-wide memory used: {result.device_fallback}")
    if spec.measure == "device" and result.sample_interval:
        lines.append(f"sampled:  every {result.sample_interval * 1000:.0f} ms from setup to "
                     "the end of the call (a shorter peak can be missed)")
    context = []
    if result.allocated_at_start is not None:
        context.append(f"allocated at start {describe_size(result.allocated_at_start)}")
    if result.peak_allocated is not None and spec.measure != "allocated":
        context.append(f"peak allocated {describe_size(result.peak_allocated)}")
    if result.peak_reserved is not None and spec.measure != "reserved":
        context.append(f"peak reserved {describe_size(result.peak_reserved)}")
    if result.allocated_at_end is not None:
        context.append(f"allocated at end {describe_size(result.allocated_at_end)}")
    if context:
        lines.append("context:  " + ", ".join(context))
    if result.top:
        lines.append("live at the peak, by allocating line:")
        lines.extend(f"  {site.describe(base)}" for site in result.top)
    elif result.history_note:
        lines.append(f"allocations: {result.history_note}")
    lines.append("fix:      lower the batch size, train in bf16/fp16 autocast, accumulate "
                 "gradients, checkpoint activations, free tensors you keep (loss.item(), "
                 ".detach()); or raise the limit if the growth is expected")
    return "\n".join(lines)
