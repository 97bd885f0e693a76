"""``RunRecord`` -> ``RunFacts``: the statistics of one test's training, as pure functions.

Nothing here reads torch, CUDA or NVML: what the facts need of the process at build time (CPUs,
the allocator configuration, ...) arrives as ``ProcessReadings``, so a hand-made record builds
the same facts on any machine.

Steady statistics leave out the warm-up steps and every step that is not ``StepFlag.STEADY``
(the profiler window, the step right after it, a step that began a later epoch).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.probe.loader import LoaderState, LoaderTracker
from pytest_gputrain.probe.run_record import (
    Forwards,
    ModuleState,
    NvmlTimeline,
    RunRecord,
    StepFlag,
)
from pytest_gputrain.run_facts import (
    ForwardRecord,
    LoaderFacts,
    LoaderRecord,
    MemoryFacts,
    ModuleRecord,
    NvmlRunFacts,
    ProfileFacts,
    RunFacts,
    SyncFacts,
)

MAX_SERIES = 4096  # per-step series are thinned beyond this
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW/HW thermal, HW power brake
POWER_CAP_BIT = 0x4


@dataclass(frozen=True)
class ProcessReadings:
    """What the facts read of the process when they are built, not while the test trained."""

    cpus: int | None = None
    processes_per_host: int = 1  # training processes sharing those CPUs
    expandable_segments: bool = False  # the allocator configuration asks for them
    # torch's backend flags now: for a run that never stepped (no flags read at a first step)
    backend_flags: dict[str, Any] = field(default_factory=dict)


def build_run_facts(record: RunRecord, process: ProcessReadings) -> RunFacts:
    steps_record, forwards, devices = record.steps, record.forwards, record.devices
    run = RunFacts(nodeid=record.nodeid)
    run.duration = round(record.duration, 6) if record.duration is not None else None
    if devices.cuda_available is None:
        run.mark_unknown("cuda_available", "not readable when the test started")
    else:
        run.cuda_available = devices.cuda_available
    run.cuda_used = devices.cuda_index is not None or any(
        d.startswith("cuda") for d in forwards.input_devices)
    run.device = devices.device
    run.device_name = devices.device_name
    run.compute_capability = devices.compute_capability
    steps = len(steps_record.times)
    run.steps = steps
    run.optimizer_steps = record.optimizers.steps
    run.optimizers = list(record.optimizers.names)
    run.warmup_steps = record.warmup
    steady = steady_indices(steps_record.flags, record.warmup)
    run.steady_steps = len(steady)
    if steady:
        times = [steps_record.times[i] for i in steady]
        run.step_time = statistics.median(times)
        run.step_time_mean = statistics.fmean(times)
    else:
        run.mark_unknown("step_time", f"{steps} optimizer step(s): no steady steps")
    run.step_times = [round(t, 6) for t in thin(steps_record.times)]
    run.forwards = forwards.calls
    run.grad_forwards = forwards.grad
    run.no_grad_forwards = forwards.no_grad
    run.autocast_forwards = forwards.autocast
    run.backwards = forwards.backwards
    run.forwards_without_backward = forwards.without_backward
    run.param_devices = list(devices.param_devices)
    run.param_dtypes = list(devices.param_dtypes)
    run.input_devices = list(forwards.input_devices)
    run.modules = [_module_record(state) for state in forwards.modules.values()]
    last = last_forward(forwards)
    if last is not None:
        run.last_forward = last
    if forwards.modules:
        convs = [s.conv_layers for s in forwards.modules.values() if s.conv_layers is not None]
        run.conv_layers = sum(convs) if convs else None
        main = max(forwards.modules.values(), key=lambda s: s.calls)
        if main.input_shapes:
            run.input_shape_count = len(main.input_shapes)
    for key, value in (devices.backend_flags or process.backend_flags).items():
        setattr(run, key, value)
    run.loader = _loader_facts(record, steady, process)
    run.sync = _sync_facts(record, steady)
    run.memory = _memory_facts(record, process)
    run.profile = _profile_facts(record, steps)
    run.nvml = _nvml_facts(record.nvml)
    run.probe_errors = list(record.errors)
    return run


def steady_indices(flags: list[StepFlag], warmup: int) -> list[int]:
    """Steps in the steady statistics; without any, fall back so that short runs still say
    something: epoch starts count, then every step but the first, then a lone step."""
    steps = len(flags)
    steady = [i for i in range(warmup, steps) if flags[i] is StepFlag.STEADY]
    if not steady and steps > 1:
        steady = [i for i in range(1, steps)
                  if flags[i] in (StepFlag.STEADY, StepFlag.EPOCH_START)] or list(range(1, steps))
    if not steady and steps == 1:
        steady = [0]
    return steady


def batch_size(record: RunRecord) -> int | None:
    """The main DataLoader's batch size, else the first dimension of the first input seen."""
    main = main_loader(record.loader.tracker)
    if main is not None and main.batch_size is not None:
        return int(main.batch_size)
    return record.forwards.input_batch


def last_forward(forwards: Forwards) -> ForwardRecord | None:
    if forwards.last is None:
        return None
    name, params, inputs, grad = forwards.last
    return ForwardRecord(module=name, param_devices=list(params), input_devices=list(inputs),
                         grad_enabled=grad)


def main_loader(tracker: LoaderTracker) -> LoaderState | None:
    """The loader that delivered the most batches."""
    loaders = list(tracker.loaders.values())
    return max(loaders, key=lambda loader: loader.batches) if loaders else None


def thin(values: list[Any]) -> list[Any]:
    """At most MAX_SERIES values, evenly spaced (first and last kept)."""
    if len(values) <= MAX_SERIES:
        return list(values)
    step = len(values) / MAX_SERIES
    picked = [values[int(i * step)] for i in range(MAX_SERIES - 1)]
    picked.append(values[-1])
    return picked


def _module_record(state: ModuleState) -> ModuleRecord:
    return ModuleRecord(
        name=state.name, calls=state.calls, grad_calls=state.grad_calls,
        inference_calls=state.inference_calls, autocast_calls=state.autocast_calls,
        training_calls=state.training_calls, param_devices=list(state.param_devices),
        param_dtypes=list(state.param_dtypes), input_devices=sorted(state.input_devices),
        input_shapes=[list(shape) for shape in state.input_shapes],
        parameters=state.parameters, conv_layers=state.conv_layers)


def _loader_facts(record: RunRecord, steady: list[int], process: ProcessReadings
                  ) -> LoaderFacts:
    facts = LoaderFacts()
    tracker = record.loader.tracker
    loaders = list(tracker.loaders.values())
    facts.count = len(loaders)
    facts.cpus = process.cpus
    facts.processes_per_host = process.processes_per_host
    if facts.cpus is not None:
        facts.cpus_per_process = max(1, facts.cpus // facts.processes_per_host)
    facts.batches = sum(loader.batches for loader in loaders)
    facts.wait_total = round(sum(loader.wait for loader in loaders), 6)
    facts.loaders = [LoaderRecord(
        dataset=loader.dataset, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor,
        batch_size=loader.batch_size, iterators=loader.iterators, batches=loader.batches,
        wait=round(loader.wait, 6), first_batch_wait=round(loader.first_batch_wait, 6),
        batch_pinned=loader.batch_pinned, batch_device=loader.batch_device)
        for loader in loaders]
    main = main_loader(tracker)
    if main is not None:
        facts.dataset = main.dataset
        facts.num_workers = main.num_workers
        facts.pin_memory = main.pin_memory
        facts.persistent_workers = main.persistent_workers
        facts.prefetch_factor = main.prefetch_factor
        facts.batch_size = main.batch_size
        facts.batch_pinned = main.batch_pinned
        facts.epochs = main.iterators
        facts.wait_max = round(max(loader.wait_max for loader in loaders), 6)
        later = sum(loader.later_first_batch_wait for loader in loaders)
        facts.epoch_start_wait = round(later, 6)
        if record.duration:
            facts.epoch_start_percent = round(100.0 * later / record.duration, 2)
    else:
        for name in ("dataset", "num_workers", "pin_memory", "persistent_workers",
                     "batch_size", "epochs"):
            facts.mark_unknown(name, "the test used no DataLoader")
    if steady:
        waits = [record.steps.waits[i] for i in steady]
        times = [record.steps.times[i] for i in steady]
        facts.wait_per_step = round(statistics.median(waits), 6)
        total = sum(times)
        facts.wait_percent = round(100.0 * sum(waits) / total, 2) if total > 0 else None
    elif facts.batches and record.duration:
        facts.wait_percent = round(100.0 * facts.wait_total / record.duration, 2)
    return facts


def _sync_facts(record: RunRecord, steady: list[int]) -> SyncFacts:
    facts = SyncFacts()
    by_call = record.syncs.by_call
    facts.by_call = [f"{name}: {count}" for name, count in
                     sorted(by_call.items(), key=lambda item: (-item[1], item[0]))]
    facts.total = sum(by_call.values())
    if steady:
        counts = [record.steps.syncs[i] for i in steady]
        facts.per_step = float(statistics.median(counts))
        facts.max_per_step = max(counts)
    else:
        facts.mark_unknown("per_step", "no optimizer steps")
    profiled = record.window_facts.get("syncs_per_step")
    if profiled is not None:
        facts.profiled_per_step = profiled
    return facts


def _memory_facts(record: RunRecord, process: ProcessReadings) -> MemoryFacts:
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
    facts.expandable_segments = process.expandable_segments
    facts.total = end.get("total")
    facts.fraction = end.get("fraction")
    if facts.fraction is None:
        facts.unknown["fraction"] = "torch cannot read set_per_process_memory_fraction back"
    facts.other_processes = end.get("other_processes")
    if facts.total is not None:
        limit = int(facts.total * (facts.fraction if facts.fraction is not None else 1.0))
        facts.budget = min(limit, facts.total - (facts.other_processes or 0))
    facts.allocated_start = start.get("allocated_bytes.all.current")
    facts.allocated_end = allocated[-1] if allocated else end.get("allocated_bytes.all.current")
    if allocated:
        facts.steady_allocated = int(statistics.median(
            allocated[_first_reading_at(record.warmup, stride):] or allocated))
    facts.peak_allocated = end.get("allocated_bytes.all.peak")
    facts.peak_reserved = end.get("reserved_bytes.all.peak")
    facts.reserved_end = steady.get("reserved_bytes.all.current")
    reserved_start = start.get("reserved_bytes.all.current", 0)
    demand = facts.peak_reserved
    if demand is not None and demand <= reserved_start and facts.peak_allocated is not None:
        # The cache held this much before the test: the test's own demand is what it
        # allocated, not what earlier tests left reserved.
        demand = facts.peak_allocated
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
    _batch_model(facts, batch_size(record), demand)
    return facts


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
    mean_x = (n - 1) / 2
    mean_y = statistics.fmean(points)
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    sxy = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(points))
    slope = sxy / sxx / stride
    facts.growth_per_step = round(slope, 1)
    facts.growth_total = points[-1] - points[0]
    rises = sum(1 for a, b in itertools.pairwise(points) if b > a)
    facts.growth_rising_percent = round(100.0 * rises / (n - 1), 2)
    if slope > 0 and facts.budget:
        used = max(demand or 0, facts.reserved_end or 0, points[-1])
        facts.steps_to_exhaust = round(max(0.0, (facts.budget - used) / slope), 1)


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


def _profile_facts(record: RunRecord, steps: int) -> ProfileFacts:
    profile_steps = record.profile_steps
    facts = ProfileFacts(enabled=profile_steps is not None)
    if profile_steps is None:
        facts.reason = "the profiler window is off (gpu_profile_steps = off)"
    elif record.window_facts:
        for key, value in record.window_facts.items():
            if key in ProfileFacts.model_fields:
                setattr(facts, key, value)
    elif record.devices.cuda_index is None:
        facts.reason = "the run did not train on CUDA"
    elif steps < profile_steps[0]:
        facts.reason = (f"the test ran {steps} optimizer step(s); the window starts at "
                        f"step {profile_steps[0]}")
    else:
        facts.reason = "the window did not run"
    if not facts.captured:
        for name in ("busy_percent", "kernel_mean", "tensor_core_percent",
                     "h2d_pageable_bytes_per_step"):
            facts.unknown[name] = facts.reason or "no profiler window"
    return facts


def _nvml_facts(timeline: NvmlTimeline) -> NvmlRunFacts:
    from pytest_gputrain.collect.sampler import summarise

    facts = NvmlRunFacts(index=timeline.index)
    samples = timeline.samples
    facts.samples = len(samples)
    if not samples:
        facts.unknown["utilization_mean"] = (
            "no NVML timeline (CPU run, NVML unavailable or no sample answered)")
        return facts

    def stats(metric: str) -> Any:
        return summarise(float(v) for s in samples if (v := getattr(s, metric)) is not None)

    util = stats("utilization_gpu")
    if util is not None:
        facts.utilization_mean = round(util.mean, 2)
        facts.utilization_p50 = round(util.p50, 2)
    for metric, name in (("memory_used", "memory_used_max"),
                         ("process_memory", "process_memory_max")):
        found = stats(metric)
        if found is not None:
            setattr(facts, name, int(found.max))
    for metric, name in (("temperature", "temperature_max"), ("power_draw", "power_max")):
        found = stats(metric)
        if found is not None:
            setattr(facts, name, round(found.max, 2))
    clock = stats("sm_clock")
    if clock is not None:
        facts.sm_clock_min, facts.sm_clock_max = clock.min, clock.max
    masks = [s.clock_event_reasons for s in samples if s.clock_event_reasons is not None]
    if masks:
        from pytest_gputrain.collect.nvml import decode_clock_events

        seen = 0
        for mask in masks:
            seen |= mask
        facts.throttle_reasons = decode_clock_events(seen)
        facts.throttle_percent = round(
            100.0 * sum(1 for m in masks if m & THROTTLE_BITS) / len(masks), 2)
        facts.power_cap_percent = round(
            100.0 * sum(1 for m in masks if m & POWER_CAP_BIT) / len(masks), 2)
    return facts
