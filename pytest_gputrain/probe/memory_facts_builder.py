"""``RunRecord`` -> ``MemoryFacts``: the caching allocator while one test trained (pure).

The budget (the device's total times the memory fraction in force, less other processes), the
test's own peaks, pinned host memory, the growth of the allocated bytes over the steps, the
per-sample model of the batch, and the allocator's cudaMalloc/cudaFree churn after warm-up.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from pytest_gputrain.probe import settings_timeline as settings_reads
from pytest_gputrain.probe.facts import MemoryFacts
from pytest_gputrain.probe.memory_peaks import own_peaks
from pytest_gputrain.probe.run_record import REQUEST_KEYS, RunRecord


def memory_facts(record: RunRecord, expandable_segments: bool, batch: int | None) -> MemoryFacts:
    """The allocator's facts (CUDA runs only): ``expandable_segments`` as the allocator
    configuration asks, ``batch`` the run's batch size (the per-sample model)."""
    facts = MemoryFacts()
    index = record.devices.cuda_index
    if index is None:
        for name in ("total", "budget", "peak_allocated", "peak_reserved"):
            facts.mark_unknown(name, "the run did not train on CUDA")
        return facts
    facts.device = f"cuda:{index}"
    readings = record.allocator
    allocated = record.steps.allocated
    stride = max(1, record.steps.allocated_stride)
    start = readings.start.get(index, {})
    end = readings.end
    steady = readings.window or end
    facts.expandable_segments = expandable_segments
    facts.allocator_backend = readings.backend
    if readings.backend is None:
        facts.unknown["allocator_backend"] = "not readable at the first CUDA step"
    _pinned_host(facts, start, readings.window, end)
    facts.total = end.get("total")
    _budget(facts, record)
    facts.allocated_start = start.get("allocated_bytes.all.current")
    facts.allocated_end = allocated[-1] if allocated else end.get("allocated_bytes.all.current")
    if allocated:
        facts.steady_allocated = int(statistics.median(
            allocated[_first_reading_at(record.warmup, stride):] or allocated))
    facts.reserved_end = steady.get("reserved_bytes.all.current")
    _own_peaks(facts, record)
    demand = facts.peak_memory
    if demand is not None and facts.budget:
        facts.peak_reserved_percent = round(100.0 * demand / facts.budget, 2)
    for key, name in (("num_alloc_retries", "num_alloc_retries"), ("num_ooms", "num_ooms")):
        if key in end:
            setattr(facts, name, max(0, end[key] - start.get(key, 0)))
    facts.inactive_split = steady.get("inactive_split_bytes.all.current")
    if facts.inactive_split is not None and facts.reserved_end:
        facts.inactive_split_percent = round(
            100.0 * facts.inactive_split / facts.reserved_end, 2)
    facts.allocated_per_step = list(allocated)
    facts.allocated_stride = stride
    _growth(facts, allocated, stride, record.warmup, demand)
    _batch_model(facts, batch, demand)
    _churn(facts, record)
    return facts


def _budget(facts: MemoryFacts, record: RunRecord) -> None:
    """The memory this process could get while the test trained: the device's total times the
    smallest memory fraction read at a step (else the one read at the end), less the most
    memory other processes held in any NVML sample (else at the end)."""
    end = record.allocator.end
    fractions = settings_reads.values_of(record.settings.snapshots, settings_reads.FRACTION)
    facts.fraction = min(fractions) if fractions else end.get("fraction")
    if facts.fraction is None:
        facts.unknown["fraction"] = "torch cannot read set_per_process_memory_fraction back"
    others = [s.other_process_memory for s in record.nvml.samples
              if s.other_process_memory is not None]
    facts.other_processes = max(others) if others else end.get("other_processes")
    if facts.total is not None:
        limit = int(facts.total * (facts.fraction if facts.fraction is not None else 1.0))
        facts.budget = min(limit, facts.total - (facts.other_processes or 0))


def _own_peaks(facts: MemoryFacts, record: RunRecord) -> None:
    """Peaks of this test alone (``own_peaks``), from the allocator at the start and the end and
    the peaks kept before a reset the test made itself."""
    index = record.devices.cuda_index
    start = record.allocator.start.get(index, {}) if index is not None else {}
    found = own_peaks(start, record.allocator.end, record.allocator.peaks_before_reset)
    for name, value in found.items():
        setattr(facts, name, value)


def _pinned_host(facts: MemoryFacts, start: dict[str, Any], window: dict[str, Any],
                 end: dict[str, Any]) -> None:
    """Pinned host memory during the test (GT138): the most of the readings at the window and
    the end, or the allocator's peak when that peak was set during the test."""
    readings = [r["pinned_host.current"] for r in (window, end) if "pinned_host.current" in r]
    if not readings:
        facts.unknown["pinned_host"] = "torch has no host_memory_stats, or CUDA was not read"
        return
    facts.pinned_host_start = start.get("pinned_host.current", 0)
    most = max(readings)
    peak = end.get("pinned_host.peak")
    if peak is not None and peak > start.get("pinned_host.peak", 0):
        most = max(most, peak)  # the peak rose during this test: it is this test's
    facts.pinned_host = most


def _first_reading_at(step: int, stride: int) -> int:
    """The first allocator reading taken at 0-based step ``step`` or later."""
    return -(-step // stride)


def _growth(facts: MemoryFacts, allocated: list[int], stride: int, warmup: int,
            demand: int | None) -> None:
    """Least-squares slope of the allocated bytes over the steps after warm-up (readings are
    ``stride`` steps apart)."""
    points = allocated[_first_reading_at(warmup + 1, stride):]
    facts.growth_steps = (len(points) - 1) * stride + 1 if points else 0
    if len(points) < 3:
        facts.unknown["growth_per_step"] = f"{len(allocated)} reading(s): too few to fit"
        return
    n = len(points)
    slope = _slope(points) / stride
    facts.growth_per_step = round(slope, 1)
    late = points[n // 2:]
    if len(late) >= 3:
        facts.growth_late_per_step = round(_slope(late) / stride, 1)
    else:
        facts.unknown["growth_late_per_step"] = f"{len(late)} reading(s) in the second half"
    facts.growth_total = points[-1] - points[0]
    rises = sum(1 for a, b in itertools.pairwise(points) if b > a)
    facts.growth_rising_percent = round(100.0 * rises / (n - 1), 2)
    if slope > 0 and facts.budget:
        used = max(demand or 0, facts.reserved_end or 0, points[-1])
        facts.steps_to_exhaust = round(max(0.0, (facts.budget - used) / slope), 1)


def _slope(points: list[int]) -> float:
    """Least-squares slope per reading of evenly spaced readings 0, 1, 2, ..."""
    return statistics.linear_regression(range(len(points)), points).slope


def _batch_model(facts: MemoryFacts, batch: int | None, demand: int | None) -> None:
    """Memory per sample (peak demand above the steady allocation) and the batch that fills
    the budget."""
    facts.batch_size = batch
    if not batch or demand is None or facts.steady_allocated is None or not facts.budget:
        return
    per_sample = (demand - facts.steady_allocated) / batch
    if per_sample <= 0:
        return
    facts.per_sample = round(per_sample, 1)
    facts.oom_batch_estimate = int((facts.budget - facts.steady_allocated) / per_sample)


def _churn(facts: MemoryFacts, record: RunRecord) -> None:
    """cudaMalloc/cudaFree calls between the mark (after warm-up and the profiler window) and
    the end of the test, less the frees empty_cache() made."""
    cache = record.cache
    steps = len(record.steps.times)
    after = steps - cache.mark_step if cache.mark_step is not None else 0
    if cache.mark is None or cache.end is None or after <= 0:
        why = ("the allocator has no cudaMalloc/cudaFree counters (num_device_alloc)"
               if cache.mark is None and after > 0 else
               f"{steps} step(s): too few after warm-up and the profiler window")
        facts.unknown["device_allocs_per_step"] = why
        return
    allocs = cache.end["num_device_alloc"] - cache.mark["num_device_alloc"]
    frees = (cache.end["num_device_free"] - cache.mark["num_device_free"]
             - cache.frees_by_empty_cache)
    facts.device_allocs_steady = max(0, allocs)
    facts.device_frees_steady = max(0, frees)
    facts.device_allocs_per_step = round(max(0, allocs) / after, 3)
    if all(key in cache.mark and key in cache.end for key in REQUEST_KEYS):
        served = sum(cache.end[key] - cache.mark[key] for key in REQUEST_KEYS)
        facts.allocator_calls_per_step = round(max(0, served) / after, 2)
    else:
        facts.unknown["allocator_calls_per_step"] = "this torch does not count allocations"
