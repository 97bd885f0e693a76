"""``RunRecord`` -> ``TimelineFacts``: the run's series on one clock, thinned for pictures.

Every moment is turned into seconds since the test's call began (``RunRecord.started``): step
ends are the running sum of the step times (the first step began at the start), the allocator
readings sit at the end of the step they followed, NVML samples are shifted by the moment the
sampler started, and out-of-memory moments (with the allocator's bytes read at each) by the
probe clock they were read on. Pure functions, like the other builders.
"""

from __future__ import annotations

import itertools

from pytest_gputrain.probe.run_record import RunRecord
from pytest_gputrain.probe.timeline_facts import TimelineFacts
from pytest_gputrain.series import keep_extremes, take

TIMELINE_POINTS = 600  # at most this many points per series in the facts


def _r(value: float) -> float:
    return round(value, 4)  # 0.1 ms: finer than any step or sample the pictures show


def timeline_facts(record: RunRecord, throttle_bits: int) -> TimelineFacts:
    """The series of ``record``; ``throttle_bits``: the clock event reasons that count as a
    throttle."""
    timeline = TimelineFacts()
    steps = record.steps
    ends = list(itertools.accumulate(steps.times))
    timeline.steps = len(ends)
    if ends:
        waits = steps.waits if len(steps.waits) == len(ends) else [0.0] * len(ends)
        kept = keep_extremes([steps.times, waits], TIMELINE_POINTS)
        timeline.step_end = [_r(t) for t in take(ends, kept)]
        timeline.step_number = [index + 1 for index in kept]
        timeline.step_time = [_r(t) for t in take(steps.times, kept)]
        timeline.loader_wait = [_r(t) for t in take(waits, kept)]
        if len(steps.sync_waits) == len(ends):
            timeline.sync_wait = [_r(t) for t in take(steps.sync_waits, kept)]
    # Moments of the loop's own work, for the pictures of the findings about them.
    timeline.save_steps = [index + 1 for index in steps.saves[:TIMELINE_POINTS]]
    if record.compile.callback:
        timeline.compile_steps = [index + 1 for index in
                                  record.compile.compile_steps[:TIMELINE_POINTS]]
    _memory(timeline, record, ends)
    _window(timeline, record, ends)
    _nvml(timeline, record, throttle_bits)
    timeline.oom_times = [_r(moment.t - record.started) for moment in record.oom_moments]
    return timeline


def _memory(timeline: TimelineFacts, record: RunRecord, ends: list[float]) -> None:
    """The allocator's readings, after steps 1, 1 + s, 1 + 2s, ... (s: the stride), then at
    each out-of-memory error; a test that failed before its first step's reading starts from
    the allocator as the test found it."""
    steps = record.steps
    stride = max(1, steps.allocated_stride)
    count = min(len(steps.allocated), (len(ends) - 1) // stride + 1 if ends else 0)
    times = [_r(ends[i * stride]) for i in range(count)]
    allocated = list(steps.allocated[:count])
    reserved: list[int] | None = list(steps.reserved[:count]) \
        if len(steps.reserved) >= count else None
    failures = [m for m in record.oom_moments if m.allocated is not None]
    if failures and not times:
        start = _start_reading(record, failures[0].device_index)
        if start is not None:
            times.append(0.0)
            allocated.append(start[0])
            if reserved is not None:
                reserved.append(start[1])
    for moment in failures:
        times.append(_r(moment.t - record.started))
        allocated.append(int(moment.allocated or 0))
        if reserved is not None and moment.reserved is not None:
            reserved.append(moment.reserved)
        else:
            reserved = None
    timeline.memory_time, timeline.allocated = times, allocated
    if reserved is not None:
        timeline.reserved = reserved


def _start_reading(record: RunRecord, index: int) -> tuple[int, int] | None:
    """Allocated and reserved bytes when the test began: read then where CUDA was initialised,
    none where it was not (no context, nothing allocated); None where the reading failed."""
    readings = record.allocator.start
    stats = readings.get(index)
    if stats and "allocated_bytes.all.current" in stats:
        return (int(stats["allocated_bytes.all.current"]),
                int(stats.get("reserved_bytes.all.current", 0)))
    if any(error.startswith("reading the allocator at the start") for error in record.errors):
        return None
    return 0, 0


def _window(timeline: TimelineFacts, record: RunRecord, ends: list[float]) -> None:
    """The profiler window: from the end of the step before its first to the end of its last."""
    first, last = record.window_facts.get("first_step"), record.window_facts.get("last_step")
    if not isinstance(first, int) or not isinstance(last, int) or not 1 <= first <= last:
        why = "no profiler window ran" if not record.window_facts else "the window's steps "\
            "are not known"
        timeline.mark_unknown("window_start", why)
        timeline.mark_unknown("window_end", why)
        return
    if last > len(ends):
        timeline.mark_unknown("window_start", "the window ended after the last step seen")
        return
    timeline.window_start = _r(ends[first - 2]) if first >= 2 else 0.0
    timeline.window_end = _r(ends[last - 1])


def no_samples_reason(record: RunRecord) -> str:
    """Why a run has no NVML samples, in the words of what it did: sampling starts at the main
    optimizer's first step on a CUDA device."""
    devices = record.devices
    if devices.cuda_index is None and record.steps.times:
        return f"no NVML samples: the test trained on {devices.device or 'the CPU'}, not CUDA"
    if devices.cuda_index is None:
        failed = " (an out-of-memory error came first)" if record.oom_moments else ""
        return ("no NVML samples: sampling starts at the first optimizer step on a CUDA "
                f"device, and the test took none{failed}")
    why = [e for e in record.errors if e.startswith("NVML sampling")]
    return f"no NVML samples: {why[0]}" if why else \
        "no NVML samples: NVML is unavailable or no sample answered"


def _nvml(timeline: TimelineFacts, record: RunRecord, throttle_bits: int) -> None:
    nvml = record.nvml
    samples = nvml.samples
    if not samples or nvml.started is None:
        timeline.unknown["nvml_time"] = no_samples_reason(record)
        return
    shift = nvml.started - record.started
    throttled = [None if s.clock_event_reasons is None else bool(s.clock_event_reasons
                                                                  & throttle_bits)
                 for s in samples]
    columns: dict[str, list[float | int | None]] = {
        "utilization": [s.utilization_gpu for s in samples],
        "memory_used": [s.memory_used for s in samples],
        "process_memory": [s.process_memory for s in samples],
        "sm_clock": [s.sm_clock for s in samples],
        "power": [s.power_draw for s in samples],
        "temperature": [s.temperature for s in samples],
    }
    kept = keep_extremes([*columns.values(), throttled], TIMELINE_POINTS)
    timeline.nvml_time = [_r(samples[i].t + shift) for i in kept]
    for name, values in columns.items():
        picked = take(values, kept)
        if any(value is not None for value in picked):
            setattr(timeline, name, picked)
    if any(flag is not None for flag in throttled):
        timeline.throttled = take(throttled, kept)
