"""Timing a training step: the ``gpu_benchmark`` fixture's engine.

On CUDA each round is bracketed by two CUDA events recorded on the current stream, so the time
is the GPU's time between them; rounds are not synchronised one by one (a training loop does not
synchronise either, so the steady-state step time is what gets measured). The host waits twice:
once after ``min_rounds`` to size the rest of the run from ``max_time``, and once at the end,
on the last end event, before reading ``elapsed_time`` of every pair.

Nothing else happens between rounds: on a launch-bound step the host thread *is* the critical
path, so per-round bookkeeping would be measured as part of the step. NVML is read by a sampler
thread (utilization, SM clock, clock event reasons every ``SAMPLE_INTERVAL_S``), and each round
is given the sample nearest its place on the GPU's timeline afterwards (from the rounds'
durations counted back from each synchronisation); throttled rounds are flagged from those. Peak
allocated memory is read at the two synchronisations (``torch.cuda.max_memory_allocated``, reset
after the warm-up and after the first read), so ``peak_vram`` has one value per phase.

Each result also records the conditions of its process (``conditions``: cuDNN autotuning, TF32,
an earlier profiler, the SM clock) that make two sessions of the same code unlike.

**GPU time per step** (``gpu_time=True``; the gate's ``gpu_time`` metric). On a busy host a
launch-bound step runs at the host's pace, and that pace changes from one process to the next;
the GPU's own work for the step does not. After the timed rounds, ``min_rounds`` more rounds
each run behind a GPU spin kernel (``torch.cuda._sleep``) about twice as long as a round, so
that the host has queued the whole step before the GPU starts it: the step's kernels then run
back to back, and the CUDA events around it time the GPU's work without the gaps where it waited
for launches. Still no synchronisation per round: each round's host time when the step was
queued is kept, the events are read at the end, and a round counts only if the host had queued
it before the GPU began it (the events placed on the host's clock from one event synchronised
before the phase); a step that synchronises itself (``.item()``) is never queued, and has no
GPU time.

On the CPU (no CUDA, or ``device="cpu"``) the host timer ``time.perf_counter`` brackets each call.
Last, untimed, the counting pass (``counters=True``: ``counting.py``). Import is light: torch
and NVML are imported on first use.
"""

from __future__ import annotations

import bisect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pytest_gputrain.regression import policy, stats
from pytest_gputrain.regression.options import MAX_ROUNDS, MAX_TIME_S, MAX_WARMUP
from pytest_gputrain.units import shown

_clock: Callable[[], float] = time.perf_counter  # tests may replace it (a fake clock)

METRICS = ("step_time", "gpu_time", "peak_vram")
# The sampler thread holds the GIL briefly at every sample; on a launch-bound step that is
# time taken from the step, so samples stay few (13 rounds of a 7.5 ms step per sample).
SAMPLE_INTERVAL_S = 0.1
# GPU time: the spin before each queued round lasts this many rounds of the timed phase, and a
# round counts as queued when the host was done this long before the GPU began it (the slack
# covers the moment between the reference event and the host seeing it).
SPIN_ROUNDS = 2.0
QUEUE_SLACK_S = 200e-6
CALIBRATION_CYCLES = 1_000_000


class BenchmarkDisabledError(RuntimeError):
    """Timings were asked of a benchmark that ran untimed (``--gpu-benchmark-disable``)."""


@dataclass(frozen=True)
class BenchmarkOptions:
    """How many rounds: ``warmup`` untimed calls, then at least ``min_rounds`` timed ones and
    more, up to ``max_rounds``, while the timed rounds fit in ``max_time`` seconds."""

    warmup: int = 5
    min_rounds: int = 30
    max_rounds: int = 100
    max_time: float = 5.0

    def __post_init__(self) -> None:
        if not 0 <= self.warmup <= MAX_WARMUP:
            raise ValueError(f"warmup={shown(self.warmup)} must lie between 0 and {MAX_WARMUP} "
                             "(e.g. warmup=5)")
        if not 1 <= self.min_rounds <= MAX_ROUNDS:
            raise ValueError(f"min_rounds={shown(self.min_rounds)} must lie between 1 and "
                             f"{MAX_ROUNDS} (e.g. min_rounds=30)")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds={self.max_rounds!r} is below min_rounds="
                             f"{self.min_rounds!r} (e.g. min_rounds=30, max_rounds=100)")
        if self.max_rounds > MAX_ROUNDS:
            raise ValueError(f"max_rounds={shown(self.max_rounds)} must be at most {MAX_ROUNDS} "
                             "(e.g. max_rounds=100)")
        if not 0 < self.max_time <= MAX_TIME_S:
            raise ValueError(f"max_time={shown(self.max_time)} must be > 0 and at most "
                             f"{MAX_TIME_S:g} seconds (e.g. 5.0)")

    def override(self, *, rounds: int | None = None, warmup: int | None = None,
                 min_rounds: int | None = None, max_rounds: int | None = None,
                 max_time: float | None = None) -> BenchmarkOptions:
        """These options with the given ones replaced; ``rounds`` fixes min and max rounds."""
        changes: dict[str, Any] = {}
        if rounds is not None:
            changes["min_rounds"] = changes["max_rounds"] = int(rounds)
        if min_rounds is not None:
            changes["min_rounds"] = int(min_rounds)
            if max_rounds is None and rounds is None and int(min_rounds) > self.max_rounds:
                changes["max_rounds"] = int(min_rounds)
        if max_rounds is not None:
            changes["max_rounds"] = int(max_rounds)
            if min_rounds is None and rounds is None and int(max_rounds) < self.min_rounds:
                changes["min_rounds"] = int(max_rounds)
        if warmup is not None:
            changes["warmup"] = int(warmup)
        if max_time is not None:
            changes["max_time"] = float(max_time)
        return replace(self, **changes)


@dataclass
class BenchmarkResult:
    """One benchmark: per-round measurements plus summaries. Times in seconds, memory in bytes.

    Per-round lists have one entry a round; NVML values are ``None`` where no sample answered.
    ``throttled[i]`` marks rounds left out of step-time comparisons. ``peak_vram`` has one value
    per phase of the run (see the module docstring). ``gpu_time`` has one value per queued
    round (``None`` for a round the host had not queued in time), or is ``None`` when not
    measured. A ``disabled`` result (the step called once,
    untimed) has no rounds, and its statistics raise ``BenchmarkDisabledError``.
    """

    nodeid: str
    device: str
    timer: str  # "cuda_event" | "perf_counter" | "untimed"
    warmup: int
    step_time: list[float]
    peak_vram: list[int] | None = None
    utilization: list[float | None] | None = None
    sm_clock: list[float | None] | None = None
    clock_event_reasons: list[int | None] | None = None
    throttled: list[bool] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)
    gpu_time: list[float | None] | None = None
    counters: dict[str, Any] | None = None  # the counting pass (collect.step_counters)
    disabled: bool = False
    returned: Any = field(default=None, repr=False, compare=False)  # the step's last value

    @property
    def rounds(self) -> int:
        return len(self.step_time)

    @property
    def throttled_count(self) -> int:
        return sum(self.throttled)

    def _times(self) -> list[float]:
        if self.disabled:
            raise BenchmarkDisabledError(
                f"{self.nodeid or 'gpu_benchmark'}: the step ran once, untimed "
                "(--gpu-benchmark-disable), so there are no timings; check result.disabled "
                "before asserting on them")
        if not self.step_time:
            raise ValueError("the benchmark has no timed rounds")
        return self.step_time

    def clean_step_times(self) -> list[float]:
        """Step times of the rounds that were not throttled."""
        times = self._times()
        if not self.throttled:
            return list(times)
        return [t for t, bad in zip(times, self.throttled, strict=False) if not bad]

    @property
    def median(self) -> float:
        return stats.median(self._times())

    @property
    def mean(self) -> float:
        return stats.mean(self._times())

    @property
    def stdev(self) -> float:
        return stats.stdev(self._times())

    @property
    def min(self) -> float:
        return min(self._times())

    @property
    def max(self) -> float:
        return max(self._times())

    @property
    def iqr(self) -> float:
        low, _, high = stats.quartiles(self._times())
        return high - low

    @property
    def gpu_times(self) -> list[float]:
        """GPU time per step of the rounds that were queued in time (empty: not measured)."""
        return [t for t in self.gpu_time or [] if t is not None]

    @property
    def peak_vram_max(self) -> int | None:
        return max(self.peak_vram) if self.peak_vram else None

    @property
    def utilization_mean(self) -> float | None:
        known = [u for u in self.utilization or [] if u is not None]
        return stats.mean(known) if known else None

    def metric(self, name: str, *, clean: bool = True) -> list[float] | None:
        """A metric's per-round values (step times without throttled rounds when ``clean``)."""
        if name == "step_time":
            return self.clean_step_times() if clean else list(self._times())
        if name == "peak_vram":
            return [float(v) for v in self.peak_vram] if self.peak_vram else None
        if name == "gpu_time":
            return self.gpu_times or None
        raise KeyError(name)

    def summary(self) -> dict[str, Any]:
        clean = self.clean_step_times()
        out: dict[str, Any] = {
            "device": self.device,
            "timer": self.timer,
            "rounds": self.rounds,
            "warmup": self.warmup,
            "throttled": self.throttled_count,
            "step_time": {
                "median": self.median, "mean": self.mean, "stdev": self.stdev,
                "min": self.min, "max": self.max, "iqr": self.iqr,
                "median_unthrottled": stats.median(clean) if clean else None,
            },
            "peak_vram": None,
            "utilization_mean": self.utilization_mean,
            "conditions": dict(self.conditions),
        }
        if self.peak_vram:
            out["peak_vram"] = {"median": stats.median([float(v) for v in self.peak_vram]),
                                "max": self.peak_vram_max}
        if self.gpu_time is not None:
            queued = self.gpu_times
            out["gpu_time"] = {"rounds": len(self.gpu_time), "queued": len(queued),
                               "median": stats.median(queued) if queued else None,
                               "min": min(queued) if queued else None}
        clocks = [c for c in self.sm_clock or [] if c is not None]
        out["sm_clock_median"] = stats.median(clocks) if clocks else None
        return out

    def metrics(self) -> dict[str, Any]:
        return {
            "step_time": self.step_time,
            "peak_vram": self.peak_vram,
            "utilization": self.utilization,
            "sm_clock": self.sm_clock,
            "clock_event_reasons": self.clock_event_reasons,
            "throttled": self.throttled,
            "gpu_time": self.gpu_time,
        }

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict (what workers send and the store keeps)."""
        return {"nodeid": self.nodeid, "device": self.device, "timer": self.timer,
                "warmup": self.warmup, "fingerprint": self.fingerprint,
                "metrics": self.metrics(), "summary": self.summary(),
                "counters": self.counters}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> BenchmarkResult:
        metrics = record.get("metrics") or {}
        summary = record.get("summary") or {}
        return cls(
            nodeid=str(record["nodeid"]),
            device=str(record.get("device") or summary.get("device") or "cpu"),
            timer=str(record.get("timer") or summary.get("timer") or "perf_counter"),
            warmup=int(record.get("warmup") or summary.get("warmup") or 0),
            step_time=[float(v) for v in metrics.get("step_time") or []],
            peak_vram=metrics.get("peak_vram"),
            utilization=metrics.get("utilization"),
            sm_clock=metrics.get("sm_clock"),
            clock_event_reasons=metrics.get("clock_event_reasons"),
            throttled=[bool(v) for v in metrics.get("throttled") or []],
            gpu_time=metrics.get("gpu_time"),
            fingerprint=dict(record.get("fingerprint") or {}),
            conditions=dict(summary.get("conditions") or {}),
            counters=record.get("counters"),
        )


def resolve_device(device: object) -> tuple[str, Any]:
    """``("cuda:N", torch)`` or ``("cpu", None)``.

    ``None`` picks CUDA when torch is in use (imported) and CUDA is available, else the CPU: a
    benchmark of plain Python never pays for importing torch. ``"cuda"`` forces CUDA.
    """
    text = None if device is None else str(device)
    if text is not None and text.startswith("cpu"):
        return "cpu", None
    if text is None and "torch" not in sys.modules:
        return "cpu", None
    from pytest_gputrain.collect.torch_import import import_torch

    try:
        torch = import_torch()
    except Exception as exc:
        if text is not None:
            raise RuntimeError(f"gpu_benchmark: device={device!r} needs torch, which cannot be "
                               f"imported: {exc}") from None
        return "cpu", None
    if text is None:
        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}", torch
        return "cpu", None
    if not text.startswith("cuda"):
        raise ValueError(f"gpu_benchmark: device={device!r} is not supported; use 'cuda', "
                         "'cuda:N' or 'cpu'")
    if not torch.cuda.is_available():
        raise RuntimeError(f"gpu_benchmark: device={device!r} but torch.cuda.is_available() is "
                           "False (skip the test with a requires-CUDA marker)")
    index = torch.device(text).index
    return f"cuda:{torch.cuda.current_device() if index is None else index}", torch


class RoundSampler(Protocol):
    """What the CUDA timer needs of a sampler (``collect.sampler.NvmlSampler`` has it)."""

    def start(self) -> Any: ...

    def stop(self) -> Any: ...

    @property
    def samples(self) -> list[Any]: ...


def open_sampler(cuda_index: int, enabled: bool) -> RoundSampler | None:
    """An NVML sampler thread for torch's ``cuda:<cuda_index>``; None when NVML cannot answer."""
    if not enabled:
        return None
    try:
        from pytest_gputrain.collect import nvml
        from pytest_gputrain.collect.sampler import NvmlSampler
    except Exception:
        return None
    nvml_index = nvml.index_for_cuda_device(cuda_index)
    if nvml_index is None or nvml.read_sample(nvml_index) is None:
        return None
    return NvmlSampler(nvml_index, interval=SAMPLE_INTERVAL_S)


def samples_for_rounds(times: list[float], phases: list[tuple[int, int, float]],
                       samples: list[tuple[float, Any]]) -> list[Any]:
    """The sample nearest each round's place on the GPU's timeline.

    ``phases`` are ``(first round, round count, host time when the phase's last round was
    synchronised)``: within a phase the GPU ran the rounds back to back, so round ``i`` ended
    about the durations of the later rounds before that synchronisation. ``samples`` are
    ``(host time, sample)`` in time order. Each round gets the last sample taken before it ended
    (the first sample when none was), or None when there are no samples.
    """
    if not samples:
        return [None] * len(times)
    moments = [t for t, _ in samples]
    found: list[Any] = [None] * len(times)
    for first, count, synced in phases:
        end = synced
        for i in range(first + count - 1, first - 1, -1):
            index = bisect.bisect_right(moments, end) - 1
            found[i] = samples[max(index, 0)][1]
            end -= times[i]
    return found


def measure(fn: Callable[..., Any], args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None, *, options: BenchmarkOptions | None = None,
            device: object = None, nvml: bool = True, nodeid: str = "",
            fingerprint: bool = True, gpu_time: bool = False, counters: bool = False,
            bound: str | None = None) -> BenchmarkResult:
    """Run ``fn(*args, **kwargs)``: warm-up, timed rounds, with ``gpu_time`` (CUDA only) the
    queued rounds that time the GPU's work, with ``counters`` the counting pass (``bound``:
    the step's kind, stated instead of judged). See the module docstring."""
    from pytest_gputrain.regression import process_state

    options = options or BenchmarkOptions()
    kwargs = kwargs or {}
    name, torch = resolve_device(device)
    if torch is None:
        result = _measure_host(fn, args, kwargs, options, nodeid)
        result.conditions = process_state.read(sys.modules.get("torch"))
    else:
        result = _measure_cuda(torch, int(name.split(":")[1]), fn, args, kwargs, options, nvml,
                               nodeid)
        if gpu_time:
            with torch.cuda.device(int(name.split(":")[1])):
                result.gpu_time = queued_gpu_times(torch, fn, args, kwargs, options.min_rounds,
                                                   _host_seconds_per_round(result))
        clocks = [c for c in result.sm_clock or [] if c is not None]
        result.conditions = process_state.read(torch)
        result.conditions["sm_clock_median"] = stats.median(clocks) if clocks else None
    if counters:
        from pytest_gputrain.regression.counting import count

        gpu = stats.median(result.gpu_times) if result.gpu_times else None
        result.counters = count(lambda: fn(*args, **kwargs), torch=torch, device=name,
                                step_time=stats.median(result.step_time), gpu_time=gpu,
                                min_rounds=options.min_rounds, bound=bound)
    if fingerprint:
        from pytest_gputrain.regression.fingerprint import collect

        result.fingerprint = collect(name)
    return result


def run_untimed(fn: Callable[..., Any], args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None, *, nodeid: str = "") -> BenchmarkResult:
    """Call the step once, untimed (``--gpu-benchmark-disable``): the test still checks that
    its step runs, and returns what the step returned."""
    returned = fn(*args, **(kwargs or {}))
    return BenchmarkResult(nodeid=nodeid, device="untimed", timer="untimed", warmup=0,
                           step_time=[], disabled=True, returned=returned)


def _measure_host(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  options: BenchmarkOptions, nodeid: str) -> BenchmarkResult:
    returned = None
    for _ in range(options.warmup):
        returned = fn(*args, **kwargs)
    times: list[float] = []
    started = _clock()
    while len(times) < options.max_rounds:
        if len(times) >= options.min_rounds and _clock() - started >= options.max_time:
            break
        begin = _clock()
        returned = fn(*args, **kwargs)
        times.append(_clock() - begin)
    return BenchmarkResult(nodeid=nodeid, device="cpu", timer="perf_counter",
                           warmup=options.warmup, step_time=times,
                           throttled=[False] * len(times), returned=returned)


def _measure_cuda(torch: Any, index: int, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], options: BenchmarkOptions, nvml: bool,
                  nodeid: str) -> BenchmarkResult:
    cuda = torch.cuda
    returned = None
    with cuda.device(index):
        for _ in range(options.warmup):
            returned = fn(*args, **kwargs)
        cuda.synchronize()
        sampler = open_sampler(index, nvml)
        origin = _clock()
        if sampler is not None:
            sampler.start()
        starts = [cuda.Event(enable_timing=True) for _ in range(options.max_rounds)]
        ends = [cuda.Event(enable_timing=True) for _ in range(options.max_rounds)]
        cuda.reset_peak_memory_stats(index)

        started = _clock()
        for i in range(options.min_rounds):
            starts[i].record()
            returned = fn(*args, **kwargs)
            ends[i].record()
        ends[options.min_rounds - 1].synchronize()
        synced = _clock()
        phases = [(0, options.min_rounds, synced)]
        peaks = [int(cuda.max_memory_allocated(index))]
        spent = synced - started
        extra = 0
        if options.max_rounds > options.min_rounds:
            per_round = max(spent / options.min_rounds, 1e-9)
            extra = int(max(options.max_time - spent, 0.0) / per_round)
            extra = min(extra, options.max_rounds - options.min_rounds)
        if extra:
            cuda.reset_peak_memory_stats(index)
            for i in range(options.min_rounds, options.min_rounds + extra):
                starts[i].record()
                returned = fn(*args, **kwargs)
                ends[i].record()
            ends[options.min_rounds + extra - 1].synchronize()
            phases.append((options.min_rounds, extra, _clock()))
            peaks.append(int(cuda.max_memory_allocated(index)))
        count = options.min_rounds + extra
        times = [starts[i].elapsed_time(ends[i]) / 1000.0 for i in range(count)]
    samples: list[tuple[float, Any]] = []
    if sampler is not None:
        sampler.stop()
        samples = [(origin + float(s.t), s) for s in sampler.samples]
    round_samples = samples_for_rounds(times, phases, samples)
    active = bool(samples)
    reasons = [getattr(s, "clock_event_reasons", None) for s in round_samples]
    clocks = [getattr(s, "sm_clock", None) for s in round_samples]
    throttled = stats.throttled_rounds(reasons, clocks) if active else [False] * count
    return BenchmarkResult(
        nodeid=nodeid, device=f"cuda:{index}", timer="cuda_event", warmup=options.warmup,
        step_time=times, peak_vram=peaks,
        utilization=([getattr(s, "utilization_gpu", None) for s in round_samples] if active
                     else None),
        sm_clock=clocks if active else None,
        clock_event_reasons=reasons if active else None,
        throttled=throttled, returned=returned,
    )


def _host_seconds_per_round(result: BenchmarkResult) -> float:
    """The pace of the timed rounds (the slower of host and GPU), from their median."""
    return stats.median(result.step_time)


def spin_cycles_per_second(torch: Any) -> float | None:
    """How many ``torch.cuda._sleep`` cycles the GPU spins per second (one synchronisation);
    ``None`` when this torch has no ``_sleep``."""
    cuda = torch.cuda
    spin = getattr(cuda, "_sleep", None)
    if spin is None:
        return None
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    spin(CALIBRATION_CYCLES)  # the first launch of the kernel loads it
    start.record()
    spin(CALIBRATION_CYCLES)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000.0
    return CALIBRATION_CYCLES / seconds if seconds > 0 else None


def queued_gpu_times(torch: Any, fn: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any], rounds: int, round_seconds: float
                     ) -> list[float | None] | None:
    """GPU time per step of ``rounds`` rounds, each queued behind a spin kernel of
    ``SPIN_ROUNDS * round_seconds`` (see the module docstring); ``None`` per round the host had
    not queued before the GPU began it, and ``None`` altogether when the GPU cannot spin."""
    cuda = torch.cuda
    per_second = spin_cycles_per_second(torch)
    if per_second is None:
        return None
    cycles = max(int(SPIN_ROUNDS * round_seconds * per_second), 1)
    starts = [cuda.Event(enable_timing=True) for _ in range(rounds)]
    ends = [cuda.Event(enable_timing=True) for _ in range(rounds)]
    queued_at = [0.0] * rounds
    reference = cuda.Event(enable_timing=True)
    reference.record()
    reference.synchronize()
    origin = _clock()  # the GPU passed ``reference`` at or just before this moment
    for i in range(rounds):
        cuda._sleep(cycles)
        starts[i].record()
        fn(*args, **kwargs)
        queued_at[i] = _clock()
        ends[i].record()
    ends[rounds - 1].synchronize()
    times: list[float | None] = []
    for i in range(rounds):
        began = origin + reference.elapsed_time(starts[i]) / 1000.0
        queued = queued_at[i] + QUEUE_SLACK_S <= began
        times.append(starts[i].elapsed_time(ends[i]) / 1000.0 if queued else None)
    return times


class GpuBenchmark:
    """The ``gpu_benchmark`` fixture: call it once with the step to time.

    ``gpu_benchmark(step, *args, rounds=50, warmup=5)`` returns a ``BenchmarkResult``; the
    result is kept for the session's table, ``--gpu-save`` and ``--gpu-compare``. With
    ``disabled`` (``--gpu-benchmark-disable``) the step is called once, untimed. ``gpu_time``
    (default: whether the gate may gate ``gpu_time``) adds the queued rounds that time the
    GPU's work per step; ``counters`` the counting pass; ``bound`` ("launch", "gpu") states
    the step's kind for the default policy instead of judging it.
    """

    def __init__(self, nodeid: str, defaults: BenchmarkOptions | None = None, *,
                 disabled: bool = False, gpu_time: bool = False, counters: bool = True) -> None:
        self.nodeid = nodeid
        self.defaults = defaults or BenchmarkOptions()
        self.disabled = disabled
        self.gpu_time = gpu_time
        self.counters = counters
        self.result: BenchmarkResult | None = None

    def __call__(self, fn: Callable[..., Any], *args: Any, rounds: int | None = None,
                 warmup: int | None = None, min_rounds: int | None = None,
                 max_rounds: int | None = None, max_time: float | None = None,
                 device: object = None, nvml: bool = True, gpu_time: bool | None = None,
                 counters: bool | None = None, bound: str | None = None,
                 kwargs: dict[str, Any] | None = None) -> BenchmarkResult:
        if self.result is not None:
            raise RuntimeError("gpu_benchmark can time one step per test; split the test or "
                               "parametrize it to time several")
        if not callable(fn):
            raise TypeError(f"gpu_benchmark: {fn!r} is not callable; pass the step function "
                            "itself, e.g. gpu_benchmark(train_step, batch)")
        policy.check_bound(bound)
        options = self.defaults.override(rounds=rounds, warmup=warmup, min_rounds=min_rounds,
                                         max_rounds=max_rounds, max_time=max_time)
        if self.disabled:
            self.result = run_untimed(fn, args, kwargs, nodeid=self.nodeid)
        else:
            self.result = measure(fn, args, kwargs, options=options, device=device, nvml=nvml,
                                  nodeid=self.nodeid,
                                  gpu_time=self.gpu_time if gpu_time is None else gpu_time,
                                  counters=self.counters if counters is None else counters,
                                  bound=bound)
        return self.result
