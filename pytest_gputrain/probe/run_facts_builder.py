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

from pytest_gputrain.probe import compile_readings
from pytest_gputrain.probe import settings as settings_reads
from pytest_gputrain.probe.facts import (
    CompileFacts,
    DdpFacts,
    ForwardRecord,
    LayerFacts,
    LoaderFacts,
    LoaderRecord,
    MemoryFacts,
    ModuleRecord,
    NvmlRunFacts,
    OptimizerFacts,
    ProfileFacts,
    RunFacts,
    StallFacts,
    SyncFacts,
)
from pytest_gputrain.probe.loader import LoaderState, LoaderTracker
from pytest_gputrain.probe.memory_peaks import own_peaks
from pytest_gputrain.probe.run_record import (
    Forwards,
    ModuleState,
    NvmlTimeline,
    RunRecord,
    StepFlag,
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
    run.cpu_parametrized = record.cpu_parametrized
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
        _new_shapes(run, main, record, steady)
    _settings(run, record, process)
    run.loader = _loader_facts(record, steady, process)
    run.sync = _sync_facts(record, steady)
    run.memory = _memory_facts(record, process)
    run.profile = _profile_facts(record, steps)
    _busy_outside_window(run)
    run.layers = _layer_facts(forwards)
    run.stalls = _stall_facts(record)
    run.nvml = _nvml_facts(record.nvml)
    _habit_facts(run, record)
    run.compile = _compile_facts(record)
    run.optimizer = _optimizer_facts(record, steady, run.step_time)
    run.ddp = _ddp_facts(record, steady)
    run.probe_errors = list(record.errors)
    return run


def _settings(run: RunFacts, record: RunRecord, process: ProcessReadings) -> None:
    """The settings in force while the test trained (read at steps), else at its first step,
    else now; the debugging switches counted while it trained."""
    timeline = record.settings
    chosen, changes = settings_reads.in_force(timeline.snapshots, len(record.steps.times))
    flags = dict(process.backend_flags)
    flags.update(record.devices.backend_flags)
    flags.update(chosen)
    for key, value in flags.items():
        if key in RunFacts.model_fields and key != settings_reads.FRACTION:
            setattr(run, key, value)
    run.settings_reads = timeline.reads
    run.settings_changes = changes
    run.anomaly_backwards = timeline.anomaly_backwards
    run.gradcheck_calls = timeline.gradcheck_calls
    run.user_profiler_steps = timeline.user_profiler_steps
    if record.steps.times:
        run.user_profiler_percent = round(
            100.0 * timeline.user_profiler_steps / len(record.steps.times), 2)


def _new_shapes(run: RunFacts, main: ModuleState, record: RunRecord, steady: list[int]) -> None:
    """How much of the training time went to steps that met an input shape for the first time
    (with cuDNN benchmark mode, each such step times every algorithm for it)."""
    run.input_shape_count_all = len(main.shapes_seen) or None
    if not steady:
        return
    times = record.steps.times
    counted = set(steady)
    new = [i for i in main.new_shape_steps if i in counted]
    run.new_shape_steps = len(new)
    total = sum(times[i] for i in steady)
    fresh = set(new)
    seen = [times[i] for i in steady if i not in fresh]
    if seen:
        run.seen_shape_step_time = round(statistics.median(seen), 6)
    if new:
        run.new_shape_step_time = round(statistics.median(times[i] for i in new), 6)
        if total > 0:
            run.new_shape_time_percent = round(100.0 * sum(times[i] for i in new) / total, 2)
    else:
        run.new_shape_time_percent = 0.0


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
        facts.batch_small_tensors = main.batch_small_tensors
        facts.epochs = main.epochs
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
    stopped = record.syncs.stopped_at
    counted = steady if stopped is None else [i for i in steady if i < stopped]
    if stopped is not None:
        facts.method = (f"python-wrappers until torch.compile began in step {stopped + 1} "
                        "(taken out then: dynamo cannot trace them); the profiler window after")
    if counted:
        counts = [record.steps.syncs[i] for i in counted]
        facts.per_step = float(statistics.median(counts))
        facts.max_per_step = max(counts)
    else:
        facts.mark_unknown("per_step", "no optimizer steps" if stopped is None else
                           "torch.compile began before the steady steps: the profiler window "
                           "counts the syncs (profiled_per_step)")
    profiled = record.window_facts.get("syncs_per_step")
    if profiled is not None:
        facts.profiled_per_step = profiled
    readbacks = record.window_facts.get("readback_syncs_per_step")
    if readbacks is not None:
        if _autotuned_in_window(record):
            facts.mark_unknown("profiled_readbacks_per_step", (
                "a step in the profiler window fed a convolution a new input shape with cuDNN "
                "benchmark mode on: cuDNN's algorithm search reads its timings back (GT120)"))
        else:
            facts.profiled_readbacks_per_step = readbacks
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
    _batch_model(facts, batch_size(record), demand)
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
    n = len(points)
    mean_x = (n - 1) / 2
    mean_y = statistics.fmean(points)
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    sxy = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(points))
    return sxy / sxx


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
    else:
        _window_host_work(facts, record)
    return facts


def _busy_outside_window(run: RunFacts) -> None:
    """The window's kernel time per step against the step time measured outside it.

    The profiler adds host time to every launch, so a launch-bound step is slower inside the
    window than outside; kernels run about as long either way. The loader wait and the GPU
    time of pageable copies are then taken out of the step, to tell how busy the GPU would be
    without them and how much idle time they leave unexplained: GT105 fires beside GT102 and
    GT103 when that rest of the step is launch-bound on its own."""
    profile = run.profile
    kernel, step = profile.kernel_time_per_step, run.step_time
    if kernel is None or not step:
        reason = (profile.reason or "no profiler window") if kernel is None else "no steady steps"
        for name in ("busy_percent_unprofiled", "busy_percent_without_waits",
                     "idle_without_waits_percent"):
            profile.mark_unknown(name, reason)
        return
    profile.busy_percent_unprofiled = round(min(100.0, 100.0 * kernel / step), 2)
    _steady_host_work(profile, step)
    wait = run.loader.wait_per_step or 0.0
    copies = (profile.h2d_pageable_percent or 0.0) / 100.0 * (profile.step_time or 0.0)
    rest = step - wait - copies
    if rest <= 0:
        profile.mark_unknown("busy_percent_without_waits",
                             "the loader wait and pageable copies fill the whole step")
        profile.idle_without_waits_percent = 0.0
        return
    profile.busy_percent_without_waits = round(min(100.0, 100.0 * kernel / rest), 2)
    profile.idle_without_waits_percent = round(100.0 * max(0.0, rest - kernel) / step, 2)


def _steady_host_work(profile: ProfileFacts, step: float) -> None:
    """The window's host work as a share of a steady step. The window opens early (steps 3-6
    by default), where steps still do one-time work on the host (lazy initialisation, the
    optimizer's first states, the allocator growing): in a run of short steps that work fills
    most of the window. Time the profiled steps took beyond a steady step cannot be work that
    every step does, so it is taken out of the silence before comparing with a steady step."""
    if profile.host_work_percent is None or not profile.step_time:
        return
    work = profile.host_work_percent / 100.0 * profile.step_time
    extra = max(0.0, profile.step_time - step)
    profile.host_work_percent_steady = round(min(100.0, 100.0 * max(0.0, work - extra) / step), 2)


def _window_host_work(facts: ProfileFacts, record: RunRecord) -> None:
    """The loader's share of the profiled steps, and the host-side silence left when it is
    taken out: time the GPU waited for host work that is neither CUDA calls nor the loader."""
    series = record.steps
    window_waits = [wait for wait, flag in zip(series.waits, series.flags, strict=False)
                    if flag is StepFlag.IN_WINDOW]
    if not facts.wall:
        return
    facts.loader_wait_percent = round(100.0 * sum(window_waits) / facts.wall, 2)
    if facts.host_silent_percent is not None:
        facts.host_work_percent = round(
            max(0.0, facts.host_silent_percent - facts.loader_wait_percent), 2)


def _layer_facts(forwards: Forwards) -> LayerFacts:
    """The layers of every top-level module the test called, summed; the conv layouts of the
    module with the most Conv2d layers."""
    facts = LayerFacts()
    scans = [state.layers for state in forwards.modules.values() if state.layers is not None]
    if not scans:
        for name in ("conv2d", "conv_bias_before_bn", "misaligned_percent"):
            facts.mark_unknown(name, "no top-level module was called")
        return facts
    facts.conv2d = sum(scan.conv2d for scan in scans)
    facts.conv_bias_before_bn = sum(scan.conv_bias_pairs for scan in scans)
    facts.conv_bias_pairs = [name for scan in scans for name in scan.conv_bias_names][:8]
    convnet = max(scans, key=lambda scan: scan.conv2d)
    if convnet.conv2d:
        facts.channels_last_weights = convnet.channels_last_weights
        facts.channels_last_input = convnet.channels_last_input
        if convnet.channels_last_weights is None:
            facts.unknown["channels_last_weights"] = (
                "every Conv2d weight has 1 input channel or a 1x1 kernel: both layouts agree")
    facts.linear_weights = sum(scan.linear_weights for scan in scans)
    misaligned = sorted((layer for scan in scans for layer in scan.misaligned),
                        key=lambda layer: -layer[1])
    facts.misaligned = [label for label, _ in misaligned[:8]]
    if facts.linear_weights:
        facts.misaligned_percent = round(
            100.0 * sum(scan.misaligned_weights for scan in scans) / facts.linear_weights, 2)
    else:
        facts.unknown["misaligned_percent"] = "no Linear or Embedding layers"
    return facts


STALL_MIN_S = 0.1  # a stall is a step longer than max(STALL_MIN_S, STALL_RATIO x median step)
STALL_RATIO = 5.0
# Long steps explained by queued GPU work may exceed the lag measured from the window's kernel
# time per step by this factor (the window's steps are few and early).
QUEUED_WORK_TOLERANCE = 1.25


def _stall_facts(record: RunRecord) -> StallFacts:
    """Steps far longer than the median step, split into those the loop explains (a later
    epoch's first batch, more top-level forwards than usual: validation, a torch.save, a new
    input shape under cuDNN autotuning or torch.compile, a read-back that waited for the GPU
    work queued since the last one) and stalls (GT118). Judged over the steps after warm-up
    outside the profiler window."""
    series = record.steps
    facts = StallFacts()
    judged = [i for i in range(record.warmup, len(series.times))
              if series.flags[i] not in (StepFlag.IN_WINDOW, StepFlag.AFTER_WINDOW)]
    if len(judged) < 3:
        facts.mark_unknown("steps", f"{len(judged)} step(s) after warm-up: too few to judge")
        return facts
    times = [series.times[i] for i in judged]
    median = statistics.median(times)
    facts.threshold = round(max(STALL_MIN_S, STALL_RATIO * median), 6)
    forwards = (_forwards_per_step(series.forwards)
                if len(series.forwards) == len(series.times) else [])
    usual_forwards = statistics.median(forwards[i] for i in judged) if forwards else None
    saves = set(series.saves)
    # Steps in which a module first met an input shape: a long one is cuDNN autotuning or a
    # recompile (GT120, GT131), not a stall.
    new_shapes = {step for state in record.forwards.modules.values()
                  for step in state.new_shape_steps} if _shape_sensitive(record) else set()
    new_shapes.update(record.compile.compile_steps)  # steps in which torch.compile compiled
    # A loop that reads a value back every N steps (``loss.item()`` for logging) and never
    # synchronises otherwise runs ahead of the GPU; the read-back then waits for all the work
    # queued since. Such a step is long by the GPU's time, not stalled: what is left of it once
    # the time inside read-backs is taken out is an ordinary step.
    waited = series.sync_waits if len(series.sync_waits) == len(series.times) else None
    stalls: list[int] = []
    explained = 0
    for i in judged:
        if series.times[i] <= facts.threshold:
            continue
        if series.flags[i] is StepFlag.EPOCH_START or i in saves or i in new_shapes or (
                usual_forwards is not None and forwards[i] > usual_forwards) or (
                waited is not None and series.times[i] - waited[i] <= facts.threshold):
            explained += 1
        else:
            stalls.append(i)
    excess = sum(series.times[i] - median for i in stalls)
    # Where the sync wrappers are gone (torch.compile took them out) the read-backs are not
    # timed. The GPU's own time per step says the same: when it exceeds the host's step, the
    # host runs ahead and must wait for the GPU somewhere; long steps whose extra time that lag
    # accounts for are those waits.
    untimed = waited is None or record.syncs.stopped_at is not None
    gpu_step = record.window_facts.get("kernel_time_per_step")
    if stalls and untimed and isinstance(gpu_step, float | int) and gpu_step > median:
        lag = (gpu_step - median) * len(judged)
        if excess <= QUEUED_WORK_TOLERANCE * lag:
            explained += len(stalls)
            stalls, excess = [], 0.0
    facts.steps = len(stalls)
    facts.explained = explained
    facts.time = round(excess, 6)
    total = sum(times)
    facts.time_percent = round(100.0 * excess / total, 2) if total > 0 else None
    if stalls:
        facts.longest = round(max(series.times[i] for i in stalls), 6)
        facts.step_numbers = [i + 1 for i in stalls[:10]]
        if len(stalls) >= 2:
            facts.every = int(statistics.median(b - a for a, b in itertools.pairwise(stalls)))
    return facts


def _autotuned_in_window(record: RunRecord) -> bool:
    """cuDNN benchmark mode met a new input shape in a step inside the profiler window."""
    if not record.devices.backend_flags.get("cudnn_benchmark"):
        return False
    window = {i for i, flag in enumerate(record.steps.flags) if flag is StepFlag.IN_WINDOW}
    return any(step in window for state in record.forwards.modules.values()
               if state.conv_layers for step in state.new_shape_steps)


def _shape_sensitive(record: RunRecord) -> bool:
    """A new input shape costs time here: cuDNN autotunes each new shape, torch.compile
    recompiles for it."""
    benchmark = record.devices.backend_flags.get("cudnn_benchmark")
    compiled = any(state.name == "OptimizedModule" for state in record.forwards.modules.values())
    return bool(benchmark) or compiled


def _forwards_per_step(cumulative: list[int]) -> list[int]:
    """Top-level forwards in each step from the running totals at the step boundaries."""
    return [count - (cumulative[i - 1] if i else 0) for i, count in enumerate(cumulative)]


def _nvml_facts(timeline: NvmlTimeline) -> NvmlRunFacts:
    from pytest_gputrain.collect.sampler import summarise

    facts = NvmlRunFacts(index=timeline.index)
    facts.power_limit = timeline.power_limit
    facts.power_limit_default = timeline.power_limit_default
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
                         ("process_memory", "process_memory_max"),
                         ("other_process_memory", "other_process_memory_max"),
                         ("other_process_count", "other_process_count_max")):
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


# -- habits: train/eval mode, empty_cache and allocator churn, optimizer, compile, DDP ----------

def _habit_facts(run: RunFacts, record: RunRecord) -> None:
    modules = record.forwards.modules.values()
    if modules:
        run.mode_layers = sum(s.checks.mode_layers for s in modules if s.checks is not None)
        run.eval_forwards_in_train_mode = record.modes.eval_in_train
        run.trained_forwards_in_eval_mode = record.modes.trained_in_eval
    else:
        for name in ("mode_layers", "eval_forwards_in_train_mode",
                     "trained_forwards_in_eval_mode"):
            run.mark_unknown(name, "no top-level module was called")
    cache = record.cache
    steps = len(record.steps.times)
    run.empty_cache_calls = cache.empty_cache_calls
    after_warmup = steps - record.warmup
    if after_warmup > 0:
        called = {i for i in cache.empty_cache_steps if record.warmup <= i < steps}
        run.empty_cache_steps_percent = round(100.0 * len(called) / after_warmup, 2)
    else:
        run.mark_unknown("empty_cache_steps_percent", f"{steps} step(s): none after warm-up")
    _churn(run.memory, record, steps)


def _churn(facts: MemoryFacts, record: RunRecord, steps: int) -> None:
    """cudaMalloc/cudaFree calls between the mark (after warm-up and the profiler window) and
    the end of the test, less the frees empty_cache() made."""
    cache = record.cache
    if record.devices.cuda_index is None:
        return  # the memory group already says the run did not train on CUDA
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


def _optimizer_facts(record: RunRecord, steady: list[int], step_time: float | None
                     ) -> OptimizerFacts:
    readings = record.optimizer
    facts = OptimizerFacts(name=readings.name, foreach=readings.foreach, fused=readings.fused,
                           param_tensors=readings.param_tensors,
                           zero_grad_calls=readings.zero_grad_calls,
                           zero_grad_to_zeros=readings.zero_grad_to_zeros)
    if readings.name is None:
        for name in ("name", "param_tensors", "step_host_time"):
            facts.unknown[name] = "no optimizer stepped"
        return facts
    host = [readings.host_times[i] for i in steady if i < len(readings.host_times)]
    if not host:
        facts.unknown["step_host_time"] = "no steady steps"
        return facts
    facts.step_host_time = round(statistics.median(host), 7)
    if step_time:
        facts.step_host_percent = round(min(100.0, 100.0 * facts.step_host_time / step_time), 2)
    return facts


def _compile_facts(record: RunRecord) -> CompileFacts:
    readings = record.compile
    facts = CompileFacts(wrapped_modules=list(readings.wrapped), wraps_ddp=readings.wraps_ddp)
    facts.compiled_calls = sum(state.calls for state in record.forwards.modules.values()
                               if state.name == "OptimizedModule")
    steps = len(record.steps.times)
    after_warmup = steps - record.warmup
    if readings.callback:
        facts.compiles = len(readings.compile_steps)
        if after_warmup > 0:
            compiled = {i for i in readings.compile_steps if record.warmup <= i < steps}
            facts.steps_with_compile = len(compiled)
            facts.recompile_steps_percent = round(100.0 * len(compiled) / after_warmup, 2)
    else:
        facts.unknown["steps_with_compile"] = (
            "dynamo's compile callbacks are not available (not imported, or torch < 2.6)")
    end = readings.end
    if end is None:
        facts.used = bool(facts.compiled_calls)
        for name in ("frames_compiled", "graph_breaks", "recompile_limit_hits"):
            facts.unknown[name] = "torch._dynamo was not imported"
        return facts
    resets = readings.reset_steps
    start = end.since(readings.start, reset=bool(resets))
    warm = (end.since(readings.warm, reset=any(step >= record.warmup for step in resets))
            if readings.warm is not None else start)
    facts.frames_compiled = max(0, end.frames_total - start.frames_total)
    facts.frames_after_warmup = max(0, end.frames_total - warm.frames_total)
    facts.frames_failed = max(0, (end.frames_total - end.frames_ok)
                              - (start.frames_total - start.frames_ok))
    facts.unique_graphs = max(0, end.unique_graphs - start.unique_graphs)
    breaks = compile_readings.increase(start.graph_breaks, end.graph_breaks)
    facts.graph_breaks = sum(breaks.values())
    reasons: list[str] = []
    for text, _ in sorted(breaks.items(), key=lambda item: -item[1]):
        line = compile_readings.first_line(text)
        if line not in reasons:
            reasons.append(line)
    facts.graph_break_reasons = reasons[:compile_readings.MAX_REASONS]
    unimplemented = compile_readings.increase(start.unimplemented, end.unimplemented)
    facts.recompile_limit_hits = sum(count for text, count in unimplemented.items()
                                     if compile_readings.is_recompile_limit(text))
    facts.recompile_reasons = list(readings.new_recompile_reasons)
    facts.compile_time = round(max(0.0, end.compile_time - start.compile_time), 3)
    flags = [r.suppress_errors for r in (readings.start, readings.warm, end)
             if r is not None and r.suppress_errors is not None]
    facts.suppress_errors = any(flags) if flags else None
    facts.used = bool(facts.compiled_calls or facts.frames_compiled or facts.compiles)
    return facts


def _ddp_facts(record: RunRecord, steady: list[int]) -> DdpFacts:
    readings = record.ddp
    logging = readings.logging
    facts = DdpFacts(used=bool(readings.steps))
    if not readings.steps:
        return facts
    facts.world_size = readings.world_size or logging.get("world_size")
    if steady:
        counts = [readings.steps.get(i, [0, 0]) for i in steady]
        facts.forwards_per_step = float(statistics.median(c[0] for c in counts))
        facts.synced_forwards_per_step = float(statistics.median(c[1] for c in counts))
    else:
        facts.unknown["forwards_per_step"] = "no steady steps"
    if "find_unused_parameters" in logging:
        facts.find_unused_parameters = bool(logging["find_unused_parameters"])
    iteration = logging.get("iteration")
    facts.logged_iteration = iteration
    if iteration and "unused_parameter_size" in logging:
        facts.unused_parameter_size = int(logging["unused_parameter_size"])
    elif facts.find_unused_parameters:
        facts.unknown["unused_parameter_size"] = "DDP had not sampled an iteration yet"
    for key, name in (("avg_backward_comm_time", "comm_time"),
                      ("avg_backward_compute_comm_overlap_time", "comm_overlap_time")):
        if logging.get(key):
            setattr(facts, name, round(logging[key] / 1e9, 6))  # nanoseconds
    return facts
