"""A background NVML sampler: a GPU's utilization, memory, power, temperature, clocks over time.

Cheap by construction: one daemon thread, one ``read_sample`` (a handful of NVML calls, no torch)
per interval, and bounded memory. When the buffer reaches ``capacity`` samples it keeps every
second one and doubles the interval, so a long test is still covered from start to end, evenly,
at a coarser step (and the sampler gets cheaper as the test gets longer). Running maxima are kept
over every sample read, so a short peak is not lost to that thinning.

Reused by the assertions (``min_utilization``, ``max_vram(measure="device")``, the ``gpu_monitor``
fixture) and by anything else that wants a timeline of a GPU::

    with NvmlSampler(0, interval=0.05) as sampler:
        train()
    print(sampler.summary()["utilization_gpu"].mean)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from pytest_gputrain.collect import nvml
from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.percentiles import percentiles

#: The numeric metrics of a ``DeviceSample`` that ``summary()`` describes.
METRICS: tuple[str, ...] = (
    "utilization_gpu",
    "memory_used",
    "process_memory",
    "power_draw",
    "temperature",
    "sm_clock",
)

Reader = Callable[[int], "DeviceSample | None"]


@dataclass(frozen=True)
class MetricSummary:
    """Distribution of one metric over a window of samples."""

    count: int
    mean: float
    min: float
    p10: float
    p50: float
    p90: float
    max: float


def summarise(values: Iterable[float]) -> MetricSummary | None:
    """mean / min / p10 / p50 / p90 / max of the values; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    p10, p50, p90 = percentiles(ordered, 10, 50, 90)
    return MetricSummary(count=len(ordered), mean=sum(ordered) / len(ordered), min=ordered[0],
                         p10=p10, p50=p50, p90=p90, max=ordered[-1])


class NvmlSampler:
    """Samples one GPU (NVML index) every ``interval`` seconds on a daemon thread.

    ``read`` replaces the NVML reader (tests pass a fake); ``pids`` makes each sample also hold
    the memory those processes use on the GPU (``process_memory``). Never raises from the thread:
    a failed read counts in ``misses``. ``t`` of each sample is seconds since ``start()``.
    """

    def __init__(
        self,
        nvml_index: int,
        interval: float = 0.05,
        *,
        capacity: int = 4096,
        read: Reader | None = None,
        pids: Collection[int] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity!r}")
        self.nvml_index = nvml_index
        self.requested_interval = float(interval)
        self.capacity = capacity
        self._interval = float(interval)
        self._pids = frozenset(pids) if pids is not None else None
        self._read: Reader = read or self._read_nvml
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[DeviceSample] = []
        self._maxima: dict[str, float] = {}
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self.reads = 0
        self.misses = 0
        self.last_error: str | None = None

    def _read_nvml(self, index: int) -> DeviceSample | None:
        return nvml.read_sample(index, pids=self._pids)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> NvmlSampler:
        if self._started_at is not None:
            raise RuntimeError("an NvmlSampler can be started only once")
        self._started_at = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"gputrain-nvml-sampler-{self.nvml_index}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> NvmlSampler:
        """Stop the thread and take one last sample (so a short test has its end too)."""
        if self._started_at is None or self._stopped_at is not None:
            return self
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 4 * self._interval))
        self._take()
        self._stopped_at = time.monotonic()
        return self

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._started_at is not None and self._stopped_at is None

    @property
    def interval(self) -> float:
        """The current interval: ``requested_interval`` doubled once per thinning."""
        return self._interval

    def elapsed(self) -> float:
        """Seconds since ``start()`` (until ``stop()``), on the samples' ``t`` clock."""
        if self._started_at is None:
            return 0.0
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        return end - self._started_at

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            self._take()
            deadline += self._interval
            delay = deadline - time.monotonic()
            if delay < 0:  # a slow read: skip the missed ticks rather than burst
                deadline = time.monotonic()
                delay = 0.0
            if self._stop.wait(delay):
                break

    def _take(self) -> None:
        started = self._started_at
        if started is None:
            return
        try:
            sample = self._read(self.nvml_index)
        except Exception as exc:  # a reader must never kill the thread or reach pytest
            sample = None
            self.last_error = f"{type(exc).__name__}: {exc}"
        now = time.monotonic() - started
        with self._lock:
            self.reads += 1
            if sample is None:
                self.misses += 1
                return
            sample.t = now
            for metric in METRICS:
                value = getattr(sample, metric)
                if value is not None and value > self._maxima.get(metric, -math.inf):
                    self._maxima[metric] = float(value)
            self._samples.append(sample)
            if len(self._samples) >= self.capacity:
                self._samples = self._samples[::2]
                self._interval *= 2

    # -- reading ---------------------------------------------------------------------------------

    @property
    def samples(self) -> list[DeviceSample]:
        """A copy of the samples kept so far (safe to call while running)."""
        with self._lock:
            return list(self._samples)

    def window(self, start: float | None = None, end: float | None = None) -> list[DeviceSample]:
        """Samples with ``start <= t <= end`` (either bound optional)."""
        return [s for s in self.samples
                if (start is None or s.t >= start) and (end is None or s.t <= end)]

    def values(self, metric: str, start: float | None = None, end: float | None = None
               ) -> list[float]:
        if metric not in METRICS:
            raise KeyError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
        return [float(v) for s in self.window(start, end)
                if (v := getattr(s, metric)) is not None]

    def peak(self, metric: str) -> float | None:
        """The largest value of ``metric`` over every sample read, thinned or not."""
        if metric not in METRICS:
            raise KeyError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
        with self._lock:
            return self._maxima.get(metric)

    def summary(self, start: float | None = None, end: float | None = None
                ) -> dict[str, MetricSummary]:
        """``{metric: MetricSummary}`` for each metric that has values in the window.

        ``max`` is the window's maximum among kept samples; ``peak()`` is the exact maximum.
        """
        window = self.window(start, end)
        result: dict[str, MetricSummary] = {}
        for metric in METRICS:
            found = summarise(float(v) for s in window if (v := getattr(s, metric)) is not None)
            if found is not None:
                result[metric] = found
        return result

    def clock_event_fractions(self, start: float | None = None, end: float | None = None
                              ) -> dict[str, float]:
        """Fraction of samples in the window with each clock event (throttle) reason active."""
        masks = [s.clock_event_reasons for s in self.window(start, end)
                 if s.clock_event_reasons is not None]
        if not masks:
            return {}
        result: dict[str, float] = {}
        for bit, name in nvml.CLOCK_EVENT_REASONS.items():
            hits = sum(1 for mask in masks if mask & bit)
            if hits:
                result[name] = hits / len(masks)
        return result

    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self._stopped_at else "new")
        return (f"NvmlSampler(nvml_index={self.nvml_index}, interval={self._interval:g}, "
                f"{state}, {len(self._samples)} samples)")
