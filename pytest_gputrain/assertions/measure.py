"""The measurements of one GPU test, from the start of its setup to the end of its call phase.

One ``TestRun`` per GPU test: the caching allocator's peak counters (reset when the setup
starts, read when the call ends), one background NVML sampler (utilization, memory, power,
clocks; the ``gpu_monitor`` fixture hands it to the test), and, for an explicit ``max_vram``
marker, a bounded allocation history. Nothing here raises into pytest: a measurement that fails
leaves a reason, and the assertion that needed it reports that reason.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pytest_gputrain.assertions.backend import GpuBackend, MemoryReading
from pytest_gputrain.assertions.markers import GpuTestSpec
from pytest_gputrain.assertions.memory import MemoryResult, top_allocations
from pytest_gputrain.assertions.utilization import UtilizationResult

if TYPE_CHECKING:
    from pytest_gputrain.collect.sampler import NvmlSampler

CUDA_INDEX = 0  # a test's device is cuda:0: the first GPU its process sees (see docs)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class TestRun:
    """Measurements of one GPU test."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, backend: GpuBackend, spec: GpuTestSpec, history_entries: int = 0,
                 cuda_index: int = CUDA_INDEX) -> None:
        self.backend = backend
        self.spec = spec
        self.cuda_index = cuda_index
        self.history_entries = history_entries
        self.sampler: NvmlSampler | None = None
        self.sampler_error: str | None = None
        self.nvml_index: int | None = None
        self.start_memory: MemoryReading | None = None  # None: CUDA not initialised yet
        self.end_memory: MemoryReading | None = None
        self.memory_error: str | None = None
        self.recording = False
        self.history_note: str | None = None
        self.trace: list[dict[str, Any]] | None = None
        self.call_start: float | None = None
        self.call_end: float | None = None
        self._t0 = time.monotonic()
        self.finished = False

    def clock(self) -> float:
        """Seconds since the setup started, on the sampler's clock when there is one."""
        if self.sampler is not None:
            return self.sampler.elapsed()
        return time.monotonic() - self._t0

    # -- phases ----------------------------------------------------------------------------------

    def start(self) -> None:
        backend, index = self.backend, self.cuda_index
        max_vram = self.spec.max_vram
        if max_vram is not None and max_vram.explicit and self.history_entries > 0:
            note = backend.start_history(index, self.history_entries)
            self.recording = note is None
            self.history_note = None if note is None else f"not recorded: {note}"
        elif max_vram is not None and not max_vram.explicit:
            self.history_note = ("not recorded for the gpu_max_vram default: put "
                                 "@pytest.mark.max_vram on the test to see them")
        elif max_vram is not None:
            self.history_note = "not recorded (gpu_vram_history = 0)"
        try:
            if backend.cuda_initialized():
                if "gpu" in self.spec.fixtures:
                    # Start from a clean cache (cuBLAS workspaces included), as the fixture
                    # leaves it after the test: "left allocated" then compares like with like.
                    backend.release(index)
                backend.reset_peak(index)
                self.start_memory = backend.memory(index)
        except Exception as exc:
            self.memory_error = _why(exc)
        try:
            self.nvml_index = backend.nvml_index(index)
        except Exception as exc:
            self.sampler_error = f"no NVML index for cuda:{index}: {_why(exc)}"
            return
        if self.nvml_index is None:
            count, nvml_error = backend.nvml_device_count()
            # Without NVML no device has an index: say why NVML is missing instead.
            self.sampler_error = nvml_error if count is None and nvml_error else \
                f"cuda:{index} has no NVML index (MIG, or CUDA_VISIBLE_DEVICES)"
            return
        device_measure = max_vram is not None and max_vram.measure == "device"
        try:
            pids = backend.own_pids() if device_measure else None
            self.sampler = backend.sampler(self.nvml_index, self.spec.sample_interval, pids)
            self.sampler.start()
            self._t0 = time.monotonic() - self.sampler.elapsed()
        except Exception as exc:
            self.sampler = None
            self.sampler_error = str(exc) or _why(exc)

    def ensure_cuda(self) -> None:
        """For the ``gpu`` fixture: peak counters fresh from here if CUDA was not up yet."""
        if self.start_memory is None:
            self.backend.reset_peak(self.cuda_index)
            self.start_memory = self.backend.memory(self.cuda_index)

    def call_started(self) -> None:
        self.call_start = self.clock()

    def call_finished(self) -> None:
        self.call_end = self.clock()
        self.stop()

    def stop(self) -> None:
        """End every measurement (idempotent; the teardown calls it if the call never ran)."""
        if self.finished:
            return
        self.finished = True
        if self.sampler is not None:
            self.sampler.stop()
        try:
            if self.backend.cuda_initialized():
                self.end_memory = self.backend.memory(self.cuda_index)
        except Exception as exc:
            self.memory_error = _why(exc)
        if self.recording:
            self.recording = False
            try:
                self.trace = self.backend.stop_history(self.cuda_index)
            except Exception as exc:
                self.history_note = f"not readable: {_why(exc)}"
            if self.trace is None and self.history_note is None:
                self.history_note = "torch returned no allocation trace"

    # -- results ---------------------------------------------------------------------------------

    def memory_result(self, measure: str) -> MemoryResult:
        result = MemoryResult(measure=measure, cuda_index=self.cuda_index)
        start, end = self.start_memory, self.end_memory
        result.allocated_at_start = start.allocated if start is not None else 0
        if end is not None:
            result.allocated_at_end = end.allocated
            result.peak_allocated = end.peak_allocated
            result.peak_reserved = end.peak_reserved
        if measure in ("allocated", "reserved"):
            if self.memory_error and end is None:
                result.reason = self.memory_error
            elif end is None:
                result.peak = 0  # CUDA never initialised in this process: nothing allocated
            else:
                result.peak = end.peak_allocated if measure == "allocated" else end.peak_reserved
        else:
            self._device_peak(result)
        if self.trace:
            result.top = top_allocations(self.trace)
            if not result.top:
                result.history_note = "the trace holds no allocation live at the peak"
        if not result.top:
            result.history_note = result.history_note or self.history_note
        return result

    def _device_peak(self, result: MemoryResult) -> None:
        sampler = self.sampler
        if sampler is None:
            result.reason = f"NVML sampling unavailable: {self.sampler_error}"
            return
        result.sample_interval = sampler.requested_interval
        own = sampler.peak("process_memory")
        reserved = result.peak_reserved or 0
        if own is not None and (own > 0 or reserved == 0):
            result.peak = int(own)
            return
        used = sampler.peak("memory_used")
        if used is None:
            result.reason = ("NVML reported neither this process's memory nor the device's "
                             f"({sampler.last_error or 'no sample'})")
            return
        result.peak = int(used)
        result.device_fallback = ("this process is not in NVML's process list (another PID "
                                  "namespace?), so the peak is the whole device's, other "
                                  "processes included")

    def utilization_result(self) -> UtilizationResult:
        interval = self.sampler.requested_interval if self.sampler else self.spec.sample_interval
        result = UtilizationResult(cuda_index=self.cuda_index, nvml_index=self.nvml_index,
                                   interval=interval)
        start = self.call_start or 0.0
        end = self.call_end if self.call_end is not None else self.clock()
        result.duration = max(0.0, end - start)
        if self.sampler is None:
            result.reason = self.sampler_error or "no sampler"
            return result
        samples = [s for s in self.sampler.samples if s.t >= start]
        result.points = [(s.t - start, float(s.utilization_gpu)) for s in samples
                         if s.utilization_gpu is not None]
        if not result.points:
            if samples:
                result.reason = "NVML does not report utilization for this GPU"
            elif self.sampler.last_error or self.sampler.misses:
                result.reason = (f"every NVML read failed "
                                 f"({self.sampler.last_error or 'no answer'})")
        return result

    def peak_vram(self) -> int | None:
        measure = self.spec.max_vram.measure if self.spec.max_vram else "allocated"
        return self.memory_result(measure).peak

    def properties(self) -> list[tuple[str, object]]:
        """JUnit XML properties: ``gpu_peak_vram_bytes``, ``gpu_mean_utilization``."""
        found: list[tuple[str, object]] = []
        peak = self.peak_vram()
        if peak is not None:
            found.append(("gpu_peak_vram_bytes", peak))
        warmup = self.spec.min_utilization.warmup if self.spec.min_utilization else 0.0
        mean = self.utilization_result().mean(warmup)
        if mean is not None:
            found.append(("gpu_mean_utilization", round(mean, 1)))
        return found
