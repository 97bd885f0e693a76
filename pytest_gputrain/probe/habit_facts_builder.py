"""``RunRecord`` -> the facts of training habits (pure): train/eval mode, ``empty_cache()``, the
optimizer's implementation and host time, torch.compile, DistributedDataParallel, checkpoints
written with ``torch.save``, the loss each backward started from, and mixed precision.
"""

from __future__ import annotations

import statistics

from pytest_gputrain.probe import compile_readings
from pytest_gputrain.probe.facts import CompileFacts, DdpFacts, OptimizerFacts, RunFacts
from pytest_gputrain.probe.loop_facts import AmpFacts, CheckpointFacts, LossFacts
from pytest_gputrain.probe.run_record import RunRecord


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
    return facts


def amp_facts(record: RunRecord) -> AmpFacts:
    """fp16 autocast in training forwards, and the loss scaling that must come with it."""
    forwards = record.forwards
    facts = AmpFacts(fp16_forwards=forwards.autocast_fp16,
                     scaler_scales=record.optimizer.scaler_scales)
    if forwards.grad:
        facts.fp16_percent = round(100.0 * forwards.autocast_fp16 / forwards.grad, 2)
    else:
        facts.mark_unknown("fp16_percent", "no grad-mode forward of a top-level module")
    return facts
