"""``RunRecord`` -> the facts of the profiler window and those judged against it (pure).

The window's own facts (``ProfileFacts``), its kernel time per step against the step time
measured outside it, the host work it saw; the syncs the Python code asked for beside those the
window counted (``SyncFacts``); and the long steps nothing in the loop explains
(``StallFacts``, GT118), which the window's GPU time per step can account for.
"""

from __future__ import annotations

import itertools
import statistics

from pytest_gputrain.probe.facts import ProfileFacts, RunFacts, StallFacts, SyncFacts
from pytest_gputrain.probe.run_record import RunRecord, StepFlag

MAX_SITES_SHOWN = 8  # call sites named in the facts, most frequent first


def sync_facts(record: RunRecord, steady: list[int]) -> SyncFacts:
    facts = SyncFacts()
    by_kind = sorted(record.syncs.by_kind.items(), key=lambda item: (-item[1], item[0]))
    facts.by_call = [f"{name}: {count}" for name, count in by_kind]
    facts.kinds = [name for name, _ in by_kind]
    facts.by_site = record.syncs.sites()[:MAX_SITES_SHOWN]
    facts.total = sum(count for _, count in by_kind)
    stopped = record.syncs.stopped_at
    counted = steady if stopped is None else [i for i in steady if i < stopped]
    if stopped is not None:
        facts.method = (f"python-wrappers until torch.compile began in step {stopped + 1} "
                        "(taken out then: dynamo cannot trace them); the profiler window after")
    if counted:
        counts = [record.steps.syncs[i] for i in counted]
        facts.per_step = float(statistics.median(counts))
        facts.max_per_step = max(counts)
        _framework_syncs(facts, record, counted)
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
        elif _saved_in_window(record):
            facts.mark_unknown("profiled_readbacks_per_step", (
                "a step in the profiler window called torch.save: it copies each CUDA tensor "
                "of the checkpoint to the host, one read-back each (GT140)"))
        else:
            facts.profiled_readbacks_per_step = readbacks
    return facts


def _framework_syncs(facts: SyncFacts, record: RunRecord, counted: list[int]) -> None:
    """The syncs a framework's own code made (its habit, judged apart from the test's code),
    and the share of the steps the host spent inside all syncing calls (their cost)."""
    series = record.steps
    by_framework = record.syncs.by_framework
    facts.framework_calls = [f"{key}: {count}" for key, count in
                             sorted(by_framework.items(), key=lambda item: (-item[1], item[0]))]
    if len(series.framework_syncs) == len(series.syncs):
        facts.framework_per_step = float(statistics.median(
            series.framework_syncs[i] for i in counted))
    totals: dict[str, int] = {}
    for key, count in by_framework.items():
        name = key.partition(":")[0]
        totals[name] = totals.get(name, 0) + count
    if totals:
        facts.framework = max(sorted(totals), key=lambda name: totals[name])
    if len(series.sync_waits) == len(series.times):
        total = sum(series.times[i] for i in counted)
        if total > 0:
            facts.wait_percent = round(
                100.0 * sum(series.sync_waits[i] for i in counted) / total, 2)


def profile_facts(record: RunRecord, steps: int) -> ProfileFacts:
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


def busy_outside_window(run: RunFacts) -> None:
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


STALL_MIN_S = 0.1  # a stall is a step longer than max(STALL_MIN_S, STALL_RATIO x median step)
STALL_RATIO = 5.0
# Long steps explained by queued GPU work may exceed the lag measured from the window's kernel
# time per step by this factor (the window's steps are few and early).
QUEUED_WORK_TOLERANCE = 1.25


def stall_facts(record: RunRecord) -> StallFacts:
    """Steps far longer than the median step, split into those the loop explains (a later
    epoch's first batch, more top-level forwards than usual: validation, a torch.save, a new
    input shape, a read-back that waited for the GPU
    work queued since the last one, any other call that waited for queued work the GPU's lag
    accounts for) and stalls (GT118). Judged over the steps after warm-up outside the profiler
    window."""
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
    # Steps in which a module first met an input shape: a long one did one-time work for that
    # shape, not a stall: cuDNN autotuning or a recompile (GT120, GT131), and in eager mode too
    # the libraries' choice or build of kernels for it (cuBLAS's heuristics, cuDNN's attention
    # graphs): a Trainer fine-tune padded per batch spent 174 ms, 8 median steps, at each new
    # sequence length on an H200, then ran at the median.
    new_shapes = {step for state in record.forwards.modules.values()
                  for step in state.new_shape_steps}
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
    # The wrappers time only the read-backs they count. A host waits for queued GPU work in
    # other calls too: torch.cuda.synchronize() (throughput logging), .to("cpu"), a blocking
    # copy, a kernel launch into a full queue, or any read-back once torch.compile took the
    # wrappers out. The GPU's own time per step tells those waits whatever the call: when it
    # exceeds the host's median step, the host runs ahead and must wait for the GPU somewhere,
    # and long steps whose extra time the lag accounts for (less the waits already timed) are
    # those waits.
    gpu_step = record.window_facts.get("kernel_time_per_step")
    if stalls and isinstance(gpu_step, float | int) and gpu_step > median:
        timed = sum(waited[i] for i in judged) if waited is not None else 0.0
        lag = (gpu_step - median) * len(judged) - timed
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


def _saved_in_window(record: RunRecord) -> bool:
    """A step inside the profiler window called torch.save."""
    flags = record.steps.flags
    return any(step < len(flags) and flags[step] is StepFlag.IN_WINDOW
               for step in record.steps.saves)


def _forwards_per_step(cumulative: list[int]) -> list[int]:
    """Top-level forwards in each step from the running totals at the step boundaries."""
    return [count - (cumulative[i - 1] if i else 0) for i, count in enumerate(cumulative)]
