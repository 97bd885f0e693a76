"""Timing a training step: the ``gpu_benchmark`` fixture's engine.

On CUDA each round is bracketed by two CUDA events recorded on the current stream, so the time
is the GPU's time between them; rounds are not synchronised one by one (a training loop does not
synchronise either, so the steady-state step time is what gets measured). The host waits twice:
once after ``min_rounds`` to size the rest of the run from ``max_time``, and once at the end,
on the last end event, before reading ``elapsed_time`` of every pair. Per round the fixture also
records the peak allocated memory (``torch.cuda.max_memory_allocated``, its peak reset before
each round) and an NVML sample taken as the round's work is queued: utilization, SM clock and
clock event reasons, from which throttled rounds are flagged.

On the CPU (no CUDA, or ``device="cpu"``) the host timer ``time.perf_counter`` brackets each call.

Import is light: torch and NVML are imported on first use.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gputrain.regression import stats

_clock: Callable[[], float] = time.perf_counter  # tests may replace it (a fake clock)

METRICS = ("step_time", "peak_vram")
METRIC_UNITS = {"step_time": "s", "peak_vram": "bytes"}


@dataclass(frozen=True)
class BenchmarkOptions:
    """How many rounds: ``warmup`` untimed calls, then at least ``min_rounds`` timed ones and
    more, up to ``max_rounds``, while the timed rounds fit in ``max_time`` seconds."""

    warmup: int = 5
    min_rounds: int = 30
    max_rounds: int = 100
    max_time: float = 5.0

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} must be >= 0 (e.g. warmup=5)")
        if self.min_rounds < 1:
            raise ValueError(f"min_rounds={self.min_rounds!r} must be >= 1 (e.g. min_rounds=30)")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds={self.max_rounds!r} is below min_rounds="
                             f"{self.min_rounds!r} (e.g. min_rounds=30, max_rounds=100)")
        if not self.max_time > 0:
            raise ValueError(f"max_time={self.max_time!r} must be > 0 seconds (e.g. 5.0)")

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
    ``throttled[i]`` marks rounds left out of step-time comparisons.
    """

    nodeid: str
    device: str
    timer: str  # "cuda_event" | "perf_counter"
    warmup: int
    step_time: list[float]
    peak_vram: list[int] | None = None
    utilization: list[float | None] | None = None
    sm_clock: list[float | None] | None = None
    clock_event_reasons: list[int | None] | None = None
    throttled: list[bool] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    returned: Any = field(default=None, repr=False, compare=False)  # the step's last value

    @property
    def rounds(self) -> int:
        return len(self.step_time)

    @property
    def throttled_count(self) -> int:
        return sum(self.throttled)

    def clean_step_times(self) -> list[float]:
        """Step times of the rounds that were not throttled."""
        if not self.throttled:
            return list(self.step_time)
        return [t for t, bad in zip(self.step_time, self.throttled, strict=False) if not bad]

    @property
    def median(self) -> float:
        return stats.median(self.step_time)

    @property
    def mean(self) -> float:
        return stats.mean(self.step_time)

    @property
    def stdev(self) -> float:
        return stats.stdev(self.step_time)

    @property
    def min(self) -> float:
        return min(self.step_time)

    @property
    def max(self) -> float:
        return max(self.step_time)

    @property
    def iqr(self) -> float:
        return stats.quantile(self.step_time, 0.75) - stats.quantile(self.step_time, 0.25)

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
            return self.clean_step_times() if clean else list(self.step_time)
        if name == "peak_vram":
            return [float(v) for v in self.peak_vram] if self.peak_vram else None
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
        }
        if self.peak_vram:
            out["peak_vram"] = {"median": stats.median([float(v) for v in self.peak_vram]),
                                "max": self.peak_vram_max}
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
        }

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict (what workers send and the store keeps)."""
        return {"nodeid": self.nodeid, "device": self.device, "timer": self.timer,
                "warmup": self.warmup, "fingerprint": self.fingerprint,
                "metrics": self.metrics(), "summary": self.summary()}

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
            fingerprint=dict(record.get("fingerprint") or {}),
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
    try:
        import torch
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


class _NvmlRounds:
    """Per-round NVML samples of one GPU; silent (all None) when NVML cannot answer."""

    def __init__(self, cuda_index: int, enabled: bool) -> None:
        self.utilization: list[float | None] = []
        self.sm_clock: list[float | None] = []
        self.reasons: list[int | None] = []
        self._read: Callable[[], Any] | None = None
        if not enabled:
            return
        try:
            from pytest_gputrain.collect.nvml import index_for_cuda_device, read_sample
        except Exception:
            return
        nvml_index = index_for_cuda_device(cuda_index)
        if nvml_index is not None and read_sample(nvml_index) is not None:
            self._read = lambda: read_sample(nvml_index)

    def sample(self) -> None:
        reading = self._read() if self._read is not None else None
        self.utilization.append(getattr(reading, "utilization_gpu", None))
        self.sm_clock.append(getattr(reading, "sm_clock", None))
        self.reasons.append(getattr(reading, "clock_event_reasons", None))

    @property
    def active(self) -> bool:
        return self._read is not None


def measure(fn: Callable[..., Any], args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None, *, options: BenchmarkOptions | None = None,
            device: object = None, nvml: bool = True, nodeid: str = "",
            fingerprint: bool = True) -> BenchmarkResult:
    """Run ``fn(*args, **kwargs)``: warm-up, then timed rounds; see the module docstring."""
    options = options or BenchmarkOptions()
    kwargs = kwargs or {}
    name, torch = resolve_device(device)
    if torch is None:
        result = _measure_host(fn, args, kwargs, options, nodeid)
    else:
        result = _measure_cuda(torch, int(name.split(":")[1]), fn, args, kwargs, options, nvml,
                               nodeid)
    if fingerprint:
        from pytest_gputrain.regression.fingerprint import collect

        result.fingerprint = collect(name)
    return result


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
        sampler = _NvmlRounds(index, nvml)
        starts = [cuda.Event(enable_timing=True) for _ in range(options.max_rounds)]
        ends = [cuda.Event(enable_timing=True) for _ in range(options.max_rounds)]
        peaks: list[int] = []

        def one_round(i: int) -> Any:
            cuda.reset_peak_memory_stats(index)
            starts[i].record()
            value = fn(*args, **kwargs)
            ends[i].record()
            peaks.append(int(cuda.max_memory_allocated(index)))
            sampler.sample()
            return value

        started = _clock()
        for i in range(options.min_rounds):
            returned = one_round(i)
        ends[options.min_rounds - 1].synchronize()
        spent = _clock() - started
        extra = 0
        if options.max_rounds > options.min_rounds:
            per_round = max(spent / options.min_rounds, 1e-9)
            extra = int(max(options.max_time - spent, 0.0) / per_round)
            extra = min(extra, options.max_rounds - options.min_rounds)
        for i in range(options.min_rounds, options.min_rounds + extra):
            returned = one_round(i)
        count = options.min_rounds + extra
        ends[count - 1].synchronize()
        times = [starts[i].elapsed_time(ends[i]) / 1000.0 for i in range(count)]
    reasons = sampler.reasons if sampler.active else []
    clocks = sampler.sm_clock if sampler.active else []
    throttled = stats.throttled_rounds(reasons, clocks) if sampler.active else [False] * count
    return BenchmarkResult(
        nodeid=nodeid, device=f"cuda:{index}", timer="cuda_event", warmup=options.warmup,
        step_time=times, peak_vram=peaks,
        utilization=sampler.utilization if sampler.active else None,
        sm_clock=clocks or None, clock_event_reasons=reasons or None,
        throttled=throttled, returned=returned,
    )


class GpuBenchmark:
    """The ``gpu_benchmark`` fixture: call it once with the step to time.

    ``gpu_benchmark(step, *args, rounds=50, warmup=5)`` returns a ``BenchmarkResult``; the
    result is kept for the session's table, ``--gpu-save`` and ``--gpu-compare``.
    """

    def __init__(self, nodeid: str, defaults: BenchmarkOptions | None = None) -> None:
        self.nodeid = nodeid
        self.defaults = defaults or BenchmarkOptions()
        self.result: BenchmarkResult | None = None

    def __call__(self, fn: Callable[..., Any], *args: Any, rounds: int | None = None,
                 warmup: int | None = None, min_rounds: int | None = None,
                 max_rounds: int | None = None, max_time: float | None = None,
                 device: object = None, nvml: bool = True,
                 kwargs: dict[str, Any] | None = None) -> BenchmarkResult:
        if self.result is not None:
            raise RuntimeError("gpu_benchmark can time one step per test; split the test or "
                               "parametrize it to time several")
        if not callable(fn):
            raise TypeError(f"gpu_benchmark: {fn!r} is not callable; pass the step function "
                            "itself, e.g. gpu_benchmark(train_step, batch)")
        options = self.defaults.override(rounds=rounds, warmup=warmup, min_rounds=min_rounds,
                                         max_rounds=max_rounds, max_time=max_time)
        self.result = measure(fn, args, kwargs, options=options, device=device, nvml=nvml,
                              nodeid=self.nodeid)
        return self.result
