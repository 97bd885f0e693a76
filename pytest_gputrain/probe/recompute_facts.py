"""``run.recompute.*``: activation (gradient) checkpointing in force, what its recomputation cost
and the memory it kept from being held (``recompute_readings.py``)."""

from __future__ import annotations

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact
from pytest_gputrain.probe.recompute_record import RecomputeReadings
from pytest_gputrain.probe.run_record import StepFlag, StepSeries


class RecomputeFacts(FactGroup):
    """``torch.utils.checkpoint`` in the test's training: its segments are run forward without
    keeping their activations, and run forward again inside the backward."""

    calls: int = fact(doc="segments run through torch.utils.checkpoint (checkpoint_sequential's "
                          "and the frameworks' included)", default=0, count=True)
    reentrant_calls: int = fact(doc="of those, with use_reentrant=True", default=0, count=True)
    recomputes: int = fact(doc="segments whose forward ran again inside a backward", default=0,
                           count=True)
    recomputes_per_step: float | None = fact(doc="recomputes / optimizer steps")
    segments: list[str] = Field(
        default_factory=list,
        description="the checkpointed functions (a module's class, else the function's name)")
    site: str | None = fact(doc="the line that called checkpoint first (the test's or a "
                                "framework's)")
    setting: str | None = fact(
        doc="the framework's setting that turned it on: TrainingArguments(gradient_checkpointing"
            "=True), Model.gradient_checkpointing_enable(); None for a checkpoint call of the "
            "test's own")
    timed_steps: int = fact(doc="steady steps whose recomputations were timed", default=0,
                            count=True)
    clock: str | None = fact(doc="how they were timed: CUDA events (the GPU stream's time "
                                 "between two events around each), or the host clock on the "
                                 "CPU")
    time_per_step: float | None = fact("s", "recomputation time per timed step")
    step_time: float | None = fact(
        "s", "the timed steps' own time: on CUDA between events at the step boundaries before "
             "and after each (the GPU stream's time, which the host's clock misses where it "
             "runs ahead of the GPU), else the median steady step's time")
    step_percent: float | None = fact(
        "%", "recomputation time per timed step / step_time: the cost of checkpointing, its "
             "saved-tensor hooks' host time left out")
    activation_bytes: int | None = fact(
        "bytes", "allocated bytes the recomputed segments of one backward added, summed (the "
                 "largest backward timed): the activations checkpointing keeps from being held "
                 "at once (CUDA only)")
    peak_without: int | None = fact(
        "bytes", "estimated peak without checkpointing: run.memory.peak_memory + "
                 "activation_bytes (an upper estimate: every segment's activations held at once "
                 "on top of the measured peak)")
    peak_without_percent: float | None = fact("%", "peak_without / run.memory.budget")


def recompute_facts(readings: RecomputeReadings, steps: StepSeries, peak: int | None,
                    budget: int | None, warmup: int = 0) -> RecomputeFacts:
    """The facts of the readings; ``peak`` and ``budget`` are run.memory's peak_memory and
    budget, ``warmup`` the steps the pace leaves out."""
    facts = RecomputeFacts(calls=readings.calls, reentrant_calls=readings.reentrant_calls,
                           recomputes=readings.recomputes, segments=list(readings.segments),
                           site=readings.site, setting=readings.setting, clock=readings.clock)
    if not readings.recomputes:
        return facts
    count = len(steps.times)
    if count:
        facts.recomputes_per_step = round(readings.recomputes / count, 2)
    timed = [step for step in readings.timed_steps
             if step < count and step != readings.cut and step in readings.seconds
             and steps.flags[step] is StepFlag.STEADY]
    if readings.unread is not None:
        for name in ("time_per_step", "step_percent", "activation_bytes"):
            facts.mark_unknown(name, readings.unread)
        return facts
    if timed:
        total = sum(readings.seconds[step] for step in timed)
        facts.timed_steps = len(timed)
        facts.time_per_step = round(total / len(timed), 6)
        # What the recomputation is a share of: the same steps' time on the GPU stream. On a
        # GPU-bound step without a sync the host runs ahead of the GPU, and its step times can
        # be far shorter than the GPU time of what they queued (an 8 x 4096 MLP at batch 8192
        # on the H200: its recomputation alone "took" over 100 % of the host's step).
        on_gpu = [step for step in timed if step in readings.step_seconds]
        if on_gpu:
            facts.step_time = round(
                sum(readings.step_seconds[step] for step in on_gpu) / len(on_gpu), 6)
            share = sum(readings.seconds[step] for step in on_gpu) / len(on_gpu)
        else:  # the host clock (the CPU, or steps whose boundaries had no events)
            steady = sorted(steps.times[step] for step in range(count)
                            if step >= warmup and steps.flags[step] is StepFlag.STEADY)
            facts.step_time = steady[len(steady) // 2] if steady else None
            share = facts.time_per_step
        if facts.step_time:
            facts.step_percent = round(min(100.0, 100.0 * share / facts.step_time), 2)
    else:
        why = (f"no steady step after the warm-up recomputed a segment ({count} steps, "
               "the profiler window's left out)")
        facts.mark_unknown("time_per_step", why)
        facts.mark_unknown("step_time", why)
        facts.mark_unknown("step_percent", why)
    backwards = [grown for (step, _), grown in readings.activations.items() if step in timed]
    if not backwards:
        facts.mark_unknown("activation_bytes", "the allocator's counters are read on CUDA, at "
                           "timed recomputations only" if readings.clock != "CUDA events" else
                           "no timed step ended as a steady step")
        return facts
    facts.activation_bytes = max(backwards)
    if peak is not None:
        facts.peak_without = peak + facts.activation_bytes
        if budget:
            facts.peak_without_percent = round(100.0 * facts.peak_without / budget, 2)
    return facts
