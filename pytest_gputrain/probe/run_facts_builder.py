"""``RunRecord`` -> ``RunFacts``: the statistics of one test's training, as pure functions.

Nothing here reads torch, CUDA or NVML: what the facts need of the process at build time (CPUs,
the allocator configuration, ...) arrives as ``ProcessReadings``, so a hand-made record builds
the same facts on any machine.

Steady statistics leave out the warm-up steps and every step that is not ``StepFlag.STEADY``
(the profiler window, the step right after it, a step that began a later epoch).

Here: the steps, forwards and modules, the settings in force, the DataLoader, the layers and the
NVML timeline's statistics. The series for pictures are built in ``timeline_facts_builder.py``,
the allocator's facts are built in ``memory_facts_builder.py``, the profiler
window's (and the syncs and stalls judged against it) in ``window_facts_builder.py``, the
training habits' (train/eval mode, empty_cache, optimizer, compile, DDP, checkpoints, the
loss, mixed precision) in ``habit_facts_builder.py``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.probe import settings_timeline as settings_reads
from pytest_gputrain.probe.attention_facts import attention_facts
from pytest_gputrain.probe.evaluation_facts import evaluation_facts
from pytest_gputrain.probe.facts import (
    ForwardRecord,
    LayerFacts,
    LoaderFacts,
    LoaderRecord,
    ModuleRecord,
    NvmlRunFacts,
    RunFacts,
)
from pytest_gputrain.probe.habit_facts_builder import (
    amp_facts,
    checkpoint_facts,
    compile_facts,
    ddp_facts,
    grad_facts,
    instrument_facts,
    loss_facts,
    mode_and_cache_facts,
    optimizer_facts,
)
from pytest_gputrain.probe.host_facts_builder import host_facts
from pytest_gputrain.probe.loader import LoaderState, LoaderTracker
from pytest_gputrain.probe.memory_facts_builder import memory_facts
from pytest_gputrain.probe.recompute_facts import recompute_facts
from pytest_gputrain.probe.run_record import (
    Forwards,
    ModuleState,
    RunRecord,
    StepFlag,
)
from pytest_gputrain.probe.timeline_facts_builder import no_samples_reason, timeline_facts
from pytest_gputrain.probe.update_facts_builder import update_facts
from pytest_gputrain.probe.warning_facts_builder import warning_facts
from pytest_gputrain.probe.window_facts_builder import (
    busy_outside_window,
    profile_facts,
    stall_facts,
    sync_facts,
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
    run.autocast_other_forwards = forwards.autocast_other
    run.autocast_other_devices = list(forwards.autocast_other_devices)
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
    run.sync = sync_facts(record, steady)
    run.batch_tokens = batch_tokens(record)
    if record.framework is not None:
        run.framework = record.framework
    else:
        run.mark_unknown("framework", "no optimizer step")
    run.memory = memory_facts(record, process.expandable_segments, batch_size(record))
    run.profile = profile_facts(record, steps)
    busy_outside_window(run)
    run.layers = _layer_facts(forwards)
    run.stalls = stall_facts(record)
    run.host = host_facts(record, steady, [number - 1 for number in run.stalls.step_numbers])
    run.warnings = warning_facts(record)
    run.updates = update_facts(record)
    run.attention = attention_facts(record.attention)
    run.recompute = recompute_facts(record.recompute, record.steps, run.memory.peak_memory,
                                    run.memory.budget, record.warmup)
    run.evaluation = evaluation_facts(record.evaluation, len(record.steps.times),
                                      record.duration)
    run.nvml = _nvml_facts(record)
    run.timeline = timeline_facts(record, THROTTLE_BITS)
    mode_and_cache_facts(run, record)
    run.compile = compile_facts(record)
    run.optimizer = optimizer_facts(record, steady, run.step_time)
    run.ddp = ddp_facts(record, steady)
    run.checkpoint = checkpoint_facts(record)
    run.loss = loss_facts(record)
    run.amp = amp_facts(record)
    instrument_facts(run, record, steady)
    run.grads = grad_facts(record, run.profile.kernel_time_per_step, run.step_time)
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
    run.anomaly_backwards = len(timeline.anomaly_steps)
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


def batch_tokens(record: RunRecord) -> int | None:
    """Tokens in the main DataLoader's batches, else in the first input seen (None: not token
    ids)."""
    main = main_loader(record.loader.tracker)
    if main is not None and main.batch_size is not None:
        return main.batch_tokens
    return record.forwards.input_tokens


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
        batch_size=loader.batch_size, drop_last=loader.drop_last, samples=loader.samples,
        iterators=loader.iterators, batches=loader.batches,
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
        facts.drop_last = main.drop_last
        facts.samples = main.samples
        _last_batch(facts)
        facts.batch_pinned = main.batch_pinned
        facts.batch_small_tensors = main.batch_small_tensors
        if main.padding:
            padded = sum(part[0] for part in main.padding)
            positions = sum(part[1] for part in main.padding)
            facts.pad_percent = round(100.0 * padded / positions, 2) if positions else None
            lengths = {length for _, _, length in main.padding}
            facts.padded_length, facts.padded_lengths = max(lengths), len(lengths)
            facts.padding_batches = len(main.padding)
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


def _last_batch(facts: LoaderFacts) -> None:
    """The size of an epoch's last batch: what is left of the samples after the full batches
    (a batch norm fails on a last batch of one sample in training mode, GT220)."""
    if facts.drop_last:
        facts.mark_unknown("last_batch_size", "drop_last=True: a partial last batch is dropped")
    elif facts.samples is None or not facts.batch_size:
        facts.mark_unknown("last_batch_size", "the sampler or the batch size has no length")
    else:
        facts.last_batch_size = facts.samples % facts.batch_size or facts.batch_size


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


def _nvml_facts(record: RunRecord) -> NvmlRunFacts:
    from pytest_gputrain.collect.sampler import summarise

    timeline = record.nvml
    facts = NvmlRunFacts(index=timeline.index)
    facts.power_limit = timeline.power_limit
    facts.power_limit_default = timeline.power_limit_default
    samples = timeline.samples
    facts.samples = len(samples)
    if not samples:
        facts.unknown["utilization_mean"] = no_samples_reason(record)
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
