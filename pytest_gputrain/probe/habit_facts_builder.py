"""``RunRecord`` -> the facts of training habits (pure): train/eval mode, ``empty_cache()``, the
optimizer's implementation and host time, torch.compile, DistributedDataParallel, checkpoints
written with ``torch.save``, the loss each backward started from, mixed precision, and the
debugging instruments left on while training.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from pytest_gputrain.probe import compile_readings
from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.gradient_readings import unused_by_module
from pytest_gputrain.probe.habit_facts import CompileFacts, DdpFacts, OptimizerFacts
from pytest_gputrain.probe.loop_facts import AmpFacts, CheckpointFacts, GradFacts, LossFacts
from pytest_gputrain.probe.run_record import RunRecord
from pytest_gputrain.units import format_bytes


def mode_and_cache_facts(run: RunFacts, record: RunRecord) -> None:
    """Forwards whose train/eval mode does not fit their use, and empty_cache() calls."""
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


def optimizer_facts(record: RunRecord, steady: list[int], step_time: float | None
                    ) -> OptimizerFacts:
    readings = record.optimizer
    facts = OptimizerFacts(name=readings.name, foreach=readings.foreach, fused=readings.fused,
                           param_tensors=readings.param_tensors,
                           zero_grad_calls=readings.zero_grad_calls,
                           zero_grad_to_zeros=readings.zero_grad_to_zeros,
                           lr=readings.lr_first, lr_last=readings.lr_last,
                           clip_calls=readings.clip_calls, clip_kinds=list(readings.clip_kinds),
                           clip_limit=readings.clip_limit)
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


def compile_facts(record: RunRecord) -> CompileFacts:
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


def ddp_facts(record: RunRecord, steady: list[int]) -> DdpFacts:
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


def checkpoint_facts(record: RunRecord) -> CheckpointFacts:
    """The checkpoint saves, and their share of the steps after warm-up: in how many of those
    steps one was saved, and how much of those steps' wall time went into it."""
    series = record.steps
    facts = CheckpointFacts(saves=len(series.saves), writers=sorted(series.save_writers))
    steps = len(series.times)
    judged = range(record.warmup, steps)
    if not judged:
        facts.mark_unknown("steps_percent", f"{steps} step(s): none after warm-up")
        return facts
    timed = len(series.save_times) == len(series.saves)  # recorded before saves were timed
    in_judged = [(step, series.save_times[i] if timed else None)
                 for i, step in enumerate(series.saves) if record.warmup <= step < steps]
    facts.save_steps = len({step for step, _ in in_judged})
    facts.steps_percent = round(100.0 * facts.save_steps / len(judged), 2)
    times = [seconds for _, seconds in in_judged if seconds is not None]
    if not in_judged:
        facts.time_percent = 0.0
        return facts
    if not times:
        facts.mark_unknown("time_percent", "the saves were not timed")
        return facts
    facts.time_per_save = round(statistics.median(times), 6)
    wall = sum(series.times[i] for i in judged)
    if wall > 0:
        facts.time_percent = round(min(100.0, 100.0 * sum(times) / wall), 2)
    return facts


def loss_facts(record: RunRecord) -> LossFacts:
    """Where the loss lived, and what the finiteness checks read at the end found."""
    readings = record.loss
    facts = LossFacts(backwards=readings.backwards, cpu_backwards=readings.cpu)
    if not readings.backwards:
        for name in ("cpu_percent", "checks"):
            facts.mark_unknown(name, "no backward started from a tensor")
        return facts
    facts.cpu_percent = round(100.0 * readings.cpu / readings.backwards, 2)
    if not readings.finite:
        facts.mark_unknown("checks", readings.unread or "no check was read")
        return facts
    facts.checks = len(readings.finite)
    bad = [step for step, finite in readings.finite if not finite]
    facts.nonfinite_checks = len(bad)
    facts.first_nonfinite_step = bad[0] + 1 if bad else None
    facts.last_finite = readings.finite[-1][1]
    _loss_values(facts, readings.values)
    return facts


MAX_VALUES_SHOWN = 8


def _loss_values(facts: LossFacts, values: list[tuple[int, float]]) -> None:
    """How the loss moved between the finite checks: first, last, largest, growth."""
    if not values:
        facts.mark_unknown("first_value", "no finite check of the loss was read")
        return
    (first_step, first), (last_step, last) = values[0], values[-1]
    facts.first_value, facts.first_value_step = first, first_step + 1
    facts.last_value, facts.last_value_step = last, last_step + 1
    facts.max_value = max(value for _, value in values)
    if len(values) < 2:
        facts.mark_unknown("growth", "one finite check: nothing to compare")
    elif first <= 0.0:  # an objective driven below zero (out.mean()) is no loss that explodes
        facts.mark_unknown("growth", "the first loss checked was not positive")
    else:
        facts.growth = last / first
        if facts.growth > 0:
            facts.growth_orders = round(math.log10(facts.growth), 3)
        else:
            facts.mark_unknown("growth_orders", "the loss fell to zero or below")
    stride = max(1, math.ceil(len(values) / (MAX_VALUES_SHOWN - 1)))
    shown = values[::stride]
    if shown[-1] != values[-1]:
        shown.append(values[-1])
    facts.values = [f"{step + 1}: {value:.4g}" for step, value in shown]


def amp_facts(record: RunRecord) -> AmpFacts:
    """fp16 autocast in training forwards, and the loss scaling that must come with it."""
    forwards = record.forwards
    readings = record.optimizer
    facts = AmpFacts(fp16_forwards=forwards.autocast_fp16, scaler_scales=readings.scaler_scales,
                     clip_scaled=readings.clip_scaled, init_scale=readings.init_scale)
    if readings.clip_calls:
        facts.clip_scaled_percent = round(100.0 * readings.clip_scaled / readings.clip_calls, 2)
    if readings.clip_scaled and readings.init_scale and readings.clip_limit is not None:
        facts.clip_effective_limit = readings.clip_limit / readings.init_scale
    if forwards.grad:
        facts.fp16_percent = round(100.0 * forwards.autocast_fp16 / forwards.grad, 2)
    else:
        facts.mark_unknown("fp16_percent", "no grad-mode forward of a top-level module")
    return facts


# How each instrument is named in run.instruments: the switch's fact, the value that means on,
# the words.
INSTRUMENT_NAMES = (
    ("memory_history", True,
     "allocator history recording (torch.cuda.memory._record_memory_history)"),
    ("sync_debug_mode", "warn", "the sync debug mode 'warn' (torch.cuda.set_sync_debug_mode)"),
    ("sync_debug_mode", "error", "the sync debug mode 'error' (torch.cuda.set_sync_debug_mode)"),
)
MIN_PROFILED_STEPS = 3  # steps on each side of a profiler's slowdown


def instrument_facts(run: RunFacts, record: RunRecord, steady: list[int]) -> None:
    """The instruments on while training (their switches are settings, in force over most
    steps: ``run_facts_builder._settings``), and what a profiler of the test's own cost: the
    steps it recorded against the others, and the time its start and stop took."""
    for name, on, words in INSTRUMENT_NAMES:
        if getattr(run, name) == on:
            run.instruments.append(f"{words}: {_instrument_work(name, run)}")
    if run.compile_logs and run.compile.used:  # logs cost nothing where nothing compiles
        run.instruments.append(
            f"verbose torch.compile logging ({run.compile_logs}): whole graphs and generated "
            f"code printed at each compilation, {_count(run.compile.compiles)} compilation(s) "
            "in the test")
    settings = record.settings
    run.user_profiler_kinds = list(settings.user_profiler_kinds)
    times = record.steps.times
    for name, marked, what in (
            ("user_profiler_slowdown", set(settings.user_profiled), "the test's profiler"),
            ("anomaly_slowdown", set(settings.anomaly_steps), "anomaly detection"),
            ("instrument_slowdown", _instrumented_steps(settings.snapshots, len(times)),
             "allocator history recording or the sync debug mode")):
        _slowdown(run, name, times, steady, marked, what)
    if settings.user_profiler_setup_time or settings.user_profiler_steps:
        run.user_profiler_setup_time = round(settings.user_profiler_setup_time, 6)
        if record.duration:
            run.user_profiler_setup_percent = round(
                min(100.0, 100.0 * settings.user_profiler_setup_time / record.duration), 2)


def _slowdown(run: RunFacts, name: str, times: list[float], steady: list[int],
              marked: set[int], what: str) -> None:
    """The median steady step with ``what`` on (``marked``) against the others: the measured
    cost of a debugging tool on for part of the test."""
    inside = [times[i] for i in steady if i in marked]
    outside = [times[i] for i in steady if i not in marked]
    if min(len(inside), len(outside)) >= MIN_PROFILED_STEPS:
        setattr(run, name, round(statistics.median(inside) / statistics.median(outside), 3))
    elif inside:
        run.mark_unknown(name, f"{len(outside)} steady step(s) ran without {what}: too few "
                               "to compare")


PER_STEP_INSTRUMENTS = (("memory_history", True), ("sync_debug_mode", "warn"),
                        ("sync_debug_mode", "error"))


def _instrumented_steps(snapshots: list[tuple[int, dict[str, Any]]], steps: int) -> set[int]:
    """The step indices during which a per-step instrument was on, from the settings read at
    step boundaries (a snapshot read after step n holds from that step on, to the next)."""
    marked: set[int] = set()
    for k, (count, settings) in enumerate(snapshots):
        if any(settings.get(key) == on for key, on in PER_STEP_INSTRUMENTS):
            until = snapshots[k + 1][0] if k + 1 < len(snapshots) else steps + 1
            marked.update(range(count - 1, min(until - 1, steps)))
    return marked


def _instrument_work(name: str, run: RunFacts) -> str:
    """The work an instrument adds, in the counts the run measured."""
    if name == "memory_history":
        return (f"a stack trace at each of {_count(run.memory.allocator_calls_per_step)} "
                "allocations and frees per step, kept in host memory")
    return (f"a Python warning (or an error) at each of {_count(run.sync.per_step)} "
            "synchronising calls per step")


def _count(value: float | int | None) -> str:
    if value is None:
        return "an unknown number of"
    return f"{value:g}" if isinstance(value, float) else str(value)


MAX_MODULES_NAMED = 8
# Share of a step's work in the backward pass: input and weight gradients, each about as much
# work as the forward (so 2 of 3 parts of a training step's arithmetic), and the weight
# gradients alone (1 of 3).
BACKWARD_SHARE, WEIGHT_GRADIENT_SHARE = 2 / 3, 1 / 3


def grad_facts(record: RunRecord, kernel_time_per_step: float | None,
               step_time: float | None) -> GradFacts:
    """The gradients no optimizer uses: exact counts and memory; the GPU time they cost per
    step estimated from their share of the parameters (stated as an estimate in the facts)."""
    readings = record.grads
    facts = GradFacts()
    if readings.read_at is None:
        facts.mark_unknown("unused_params", "the parameters were not read (no optimizer step)")
        return facts
    facts.read_at_step = readings.read_at
    if not readings.model_params:
        facts.mark_unknown("unused_params", "no called module has a parameter an optimizer "
                           "holds")
        return facts
    unused = readings.unused
    facts.model_params, facts.trained_params = readings.model_params, readings.trained_params
    facts.unused_params = sum(entry.params for entry in unused)
    facts.unused_tensors = len(unused)
    facts.unused_bytes = sum(entry.grad_bytes for entry in unused)
    facts.unused_percent = round(100.0 * facts.unused_params / readings.model_params, 2)
    if not unused:
        return facts
    facts.unused_modules = [
        f"{name}: {params:,} parameters, {format_bytes(size)} of gradients"
        for name, (params, size) in list(unused_by_module(unused).items())[:MAX_MODULES_NAMED]]
    facts.unused_ahead = all(entry.ahead for entry in unused)
    if kernel_time_per_step is None or not step_time:
        facts.mark_unknown("backward_time_estimate",
                           "no GPU time per step (the profiler window did not run)")
        return facts
    share = BACKWARD_SHARE if facts.unused_ahead else WEIGHT_GRADIENT_SHARE
    estimate = kernel_time_per_step * facts.unused_params / readings.model_params * share
    facts.backward_time_estimate = round(estimate, 7)
    facts.step_percent_estimate = round(min(100.0, 100.0 * estimate / step_time), 2)
    return facts
