"""What the run probe reads of torch's CUDA state: allocator counters, the device's memory
budget, the backend flags and autocast (plain reads with no probe state; callers guard them); and
``CallReadings``, what the test's own calls into torch that the probe wraps tell (empty_cache,
reset_peak_memory_stats, gradcheck, torch.save, GradScaler.scale, gradient clipping) with the
allocator's out-of-memory moments."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_gputrain.probe.run_record import MAX_OOM_MOMENTS, REQUEST_KEYS, Forwards, OomMoment

if TYPE_CHECKING:
    from pytest_gputrain.probe.callbacks import ProbeCallbacks

MEMORY_STATS_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                     "reserved_bytes.all.current", "reserved_bytes.all.peak",
                     "num_alloc_retries", "num_ooms", "inactive_split_bytes.all.current")


def memory_stats(torch: Any, index: int) -> dict[str, Any]:
    """The caching allocator's counters that the memory facts use (0 where torch has none),
    and the pinned host allocator's (``pinned_host.*``, where torch has them)."""
    stats = torch.cuda.memory_stats(index)
    readings = {key: int(stats.get(key, 0)) for key in MEMORY_STATS_KEYS}
    readings.update(pinned_host_stats(torch))
    return readings


def pinned_host_stats(torch: Any) -> dict[str, int]:
    """Bytes of pinned host memory torch's caching host allocator holds (in use and cached)
    now and at its peak: ``pinned_host.current`` / ``pinned_host.peak``; empty where torch has
    no ``host_memory_stats`` (before 2.7) or it cannot answer (CUDA not initialised).

    torch 2.7-2.9 count the pool as ``reserved_bytes`` (``allocated_bytes``: blocks in use);
    from 2.10 ``allocated_bytes`` is the pool and ``reserved_bytes`` is gone."""
    read = getattr(getattr(torch.cuda, "memory", None), "host_memory_stats", None)
    if read is None:
        return {}
    try:
        stats = read()
        pool = "reserved_bytes" if "reserved_bytes.current" in stats else "allocated_bytes"
        return {"pinned_host.current": int(stats[f"{pool}.current"]),
                "pinned_host.peak": int(stats[f"{pool}.peak"])}
    except Exception:
        return {}


def memory_reader(torch: Any, index: int) -> Callable[[], tuple[int, int]]:
    """A per-step read of the bytes allocated and reserved on cuda:index: the allocator's
    host-side counters (no synchronisation), both from one read of its statistics through the
    raw binding where it answers."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        def read_raw() -> tuple[int, int]:
            stats = raw(index)
            return (int(stats["allocated_bytes"]["all"]["current"]),
                    int(stats["reserved_bytes"]["all"]["current"]))
        try:
            read_raw()
        except Exception:
            pass
        else:
            return read_raw

    def read() -> tuple[int, int]:
        return int(torch.cuda.memory_allocated(index)), int(torch.cuda.memory_reserved(index))
    return read


def allocator_backend(torch: Any) -> str | None:
    """``native`` or ``cudaMallocAsync`` (PYTORCH_CUDA_ALLOC_CONF=backend:...), None when torch
    cannot say. Read once, at the first CUDA step: the backend is fixed when CUDA starts."""
    try:
        return str(torch.cuda.get_allocator_backend())
    except Exception:
        return None


def device_budget(torch: Any, index: int) -> dict[str, Any]:
    """The device's total memory, the process's memory fraction and what other processes hold
    (the last two only where readable)."""
    from pytest_gputrain.probe.failures import memory_fraction, other_process_memory

    budget: dict[str, Any] = {"total": int(torch.cuda.get_device_properties(index).total_memory)}
    try:
        fraction = memory_fraction(torch, index)
    except Exception:
        fraction = None
    if fraction is not None:
        budget["fraction"] = fraction
    others = other_process_memory(index)
    if others is not None:
        budget["other_processes"] = others
    return budget


def read_backend_flags(torch: Any) -> dict[str, Any]:
    """The cuDNN/TF32/determinism settings, named as RunFacts fields (empty when unreadable)."""
    flags: dict[str, Any] = {}
    try:
        backends = torch.backends
        flags["cudnn_enabled"] = bool(backends.cudnn.enabled)
        flags["cudnn_benchmark"] = bool(backends.cudnn.benchmark)
        flags["cudnn_deterministic"] = bool(backends.cudnn.deterministic)
        flags["deterministic_algorithms"] = bool(torch.are_deterministic_algorithms_enabled())
        precision = str(torch.get_float32_matmul_precision())
        flags["float32_matmul_precision"] = precision
        matmul = backends.cuda.matmul
        new_api = getattr(matmul, "fp32_precision", None)
        flags["tf32_matmul"] = bool(matmul.allow_tf32) or precision != "highest" or \
            new_api == "tf32"
        conv_api = getattr(getattr(backends.cudnn, "conv", None), "fp32_precision", None)
        flags["tf32_cudnn"] = bool(backends.cudnn.allow_tf32) if conv_api in (None, "none") \
            else conv_api == "tf32"
    except Exception:
        pass
    return flags


def autocast_check(torch: Any) -> Callable[[], bool]:
    """A call that tells whether CUDA autocast is on (torch < 2.4 takes no device)."""
    try:
        torch.is_autocast_enabled("cuda")
    except TypeError:
        return torch.is_autocast_enabled  # type: ignore[no-any-return]
    return functools.partial(torch.is_autocast_enabled, "cuda")


# Devices whose autocast a test may open instead of CUDA's (torch.autocast(device_type, ...)).
OTHER_AUTOCAST_DEVICES = ("cpu", "xpu", "mps", "hpu", "mtia")


def any_autocast_check(torch: Any) -> Callable[[], bool]:
    """A call that tells whether autocast is on for any device (one C call); False where this
    torch cannot say."""
    check = getattr(torch._C, "_is_any_autocast_enabled", None)
    return check if callable(check) else (lambda: False)


def other_autocast_devices(torch: Any) -> list[str]:
    """The devices other than CUDA whose autocast is on now (read only where some autocast is
    on and CUDA's is not: a forward of a test that opened the wrong device's context)."""
    found = []
    for device in OTHER_AUTOCAST_DEVICES:
        try:
            if torch.is_autocast_enabled(device):
                found.append(device)
        except Exception:  # a device type this torch does not know, or torch < 2.4
            if device == "cpu" and getattr(torch, "is_autocast_cpu_enabled", lambda: False)():
                found.append(device)
    return found


def note_other_autocast(torch: Any, forwards: Forwards) -> None:
    """A top-level forward under another device's autocast only: counted, with the devices."""
    forwards.autocast_other += 1
    for device in other_autocast_devices(torch):
        if device not in forwards.autocast_other_devices:
            forwards.autocast_other_devices.append(device)


def autocast_dtype(torch: Any) -> Callable[[], Any]:
    """A call that tells the dtype CUDA autocast casts to (``get_autocast_dtype("cuda")``,
    torch >= 2.4; ``get_autocast_gpu_dtype()`` before)."""
    getter = getattr(torch, "get_autocast_dtype", None)
    if callable(getter):
        return functools.partial(getter, "cuda")
    older = getattr(torch, "get_autocast_gpu_dtype", None)
    return older if callable(older) else (lambda: None)


DEVICE_CALL_KEYS = ("num_device_alloc", "num_device_free")


def device_calls(torch: Any, index: int) -> dict[str, int] | None:
    """The caching allocator's cudaMalloc / cudaFree call counters, and the allocations and
    frees it served where this torch counts them (None where this torch or allocator backend
    has no cudaMalloc counters, e.g. cudaMallocAsync)."""
    stats = torch.cuda.memory_stats(index)
    if not all(key in stats for key in DEVICE_CALL_KEYS):
        return None
    return {key: int(stats[key]) for key in DEVICE_CALL_KEYS + REQUEST_KEYS if key in stats}


class CallReadings:
    """What the test's own calls into torch tell, through the wrappers the probe puts on them
    (hook callbacks of ``ProbeCallbacks``): ``torch.cuda.empty_cache()`` and the cudaFree calls
    it makes, ``reset_peak_memory_stats`` (the peaks so far are kept first),
    ``gradcheck`` while training, the step and time of each ``torch.save`` and the loss
    scaling of a ``GradScaler``; and the
    allocator's: its out-of-memory observer (``on_oom``) and its cudaMalloc/cudaFree counters
    once the steady counting begins (``mark``) and at the end (``read_end``)."""

    def __init__(self, torch: Any, probe: ProbeCallbacks) -> None:
        self.torch = torch
        self.probe = probe
        self.record = probe.record

    def on_empty_cache_start(self) -> dict[str, int] | None:
        """``torch.cuda.empty_cache()`` is about to free the cache; returns the allocator's call
        counters when the frees it makes must be told apart from the allocator's own."""
        if self.probe.disabled:
            return None
        try:
            cache = self.record.cache
            cache.empty_cache_calls += 1
            cache.empty_cache_steps.append(len(self.record.steps.times))
            index = self.record.devices.cuda_index
            if cache.mark is not None and index is not None:
                return device_calls(self.torch, index)
        except Exception as exc:
            self.probe.fail("empty_cache wrapper", exc)
        return None

    def on_empty_cache_end(self, before: dict[str, int] | None) -> None:
        if before is None or self.probe.disabled:
            return
        try:
            index = self.record.devices.cuda_index
            after = device_calls(self.torch, index) if index is not None else None
            if after is not None:
                self.record.cache.frees_by_empty_cache += max(
                    0, after["num_device_free"] - before["num_device_free"])
        except Exception as exc:
            self.probe.fail("empty_cache wrapper", exc)

    def on_reset_peak(self, device: Any) -> None:
        """Before the test resets the allocator's peak statistics itself: keep the peaks so far
        (the test's own, since the probe reset them when it started)."""
        index = self.record.devices.cuda_index
        torch = self.torch
        if index is None or not torch.cuda.is_initialized():
            return
        wanted = torch.cuda.current_device() if device is None else \
            torch.cuda._utils._get_device_index(device, optional=True)
        if int(wanted) != index:
            return
        stats = memory_stats(torch, index)
        kept = self.record.allocator.peaks_before_reset
        for key in ("allocated_bytes.all.peak", "reserved_bytes.all.peak"):
            kept[key] = max(kept.get(key, 0), int(stats.get(key, 0)))

    def on_gradcheck(self) -> None:
        if self.record.steps.times:
            self.record.settings.gradcheck_calls += 1

    def on_save(self, seconds: float, writer: str) -> None:
        """A checkpoint save that took ``seconds`` (``wrap_save``, which guards it), by
        ``writer``: the step it falls in saved a checkpoint (GT118 leaves it alone; GT140
        weighs the time)."""
        steps = self.record.steps
        steps.saves.append(len(steps.times))
        steps.save_times.append(seconds)
        steps.save_writers.add(writer)

    def on_scale(self, scaler: Any) -> None:
        """``GradScaler.scale`` (through ``wrap_before``): loss scaling, when the scaler is on
        (``GradScaler(enabled=False)`` returns the loss as it is)."""
        if getattr(scaler, "_enabled", True):
            readings = self.record.optimizer
            readings.scaler_scales += 1
            readings.scaled_pending = True
            init_scale = getattr(scaler, "_init_scale", None)  # a float: no sync
            if isinstance(init_scale, int | float):
                readings.init_scale = float(init_scale)

    def on_unscale(self, scaler: Any) -> None:
        """``GradScaler.unscale_`` (through ``wrap_before``; ``scaler.step`` calls it too when
        the test did not): the gradients are divided by the scale from here on."""
        self.record.optimizer.scaled_pending = False

    def on_clip(self, kind: str, limit: Any) -> None:
        """``torch.nn.utils.clip_grad_norm_`` (kind "norm") or ``clip_grad_value_`` ("value")
        with its ``max_norm`` / ``clip_value`` (through ``wrap_before``)."""
        readings = self.record.optimizer
        readings.clip_calls += 1
        if readings.scaled_pending:  # clipping the scaled gradients: the limit means nothing
            readings.clip_scaled += 1
        if kind not in readings.clip_kinds:
            readings.clip_kinds.append(kind)
        if isinstance(limit, int | float):
            readings.clip_limit = float(limit)

    def on_oom(self, device: int, requested: int, limit: int, free: int) -> None:
        """The allocator's out-of-memory observer (``oom_observer.py``), at the failure itself:
        on the failing thread, before the test's ``finally:`` blocks run. Reads the allocator's
        bytes (its lock is released before the observers are called) and NVML's processes."""
        record = self.record
        moment = OomMoment(t=time.perf_counter(), step=len(record.steps.times),
                           device_index=device, requested=requested, limit=limit, free=free)
        try:
            moment.allocated, moment.reserved = memory_reader(self.torch, device)()
        except Exception as exc:
            record.errors.append(f"the allocator at the out-of-memory error: {exc}")
        try:
            from pytest_gputrain.collect import nvml
            from pytest_gputrain.probe.failures import read_other_processes

            index = record.nvml.index if device == record.devices.cuda_index else None
            if index is None:
                index = nvml.index_for_cuda_device(device)
            pids = record.nvml.session_pids or nvml.session_process_ids()
            others = read_other_processes(index, pids) if index is not None else None
            if others is not None:
                moment.other_processes, moment.other_process_count = others
        except Exception as exc:
            record.errors.append(f"NVML at the out-of-memory error: {exc}")
        del record.oom_moments[:-MAX_OOM_MOMENTS + 1]
        record.oom_moments.append(moment)

    def mark(self) -> None:
        """The steady counting of cudaMalloc/cudaFree calls begins (after the warm-up steps and
        the profiler window)."""
        record = self.record
        if record.devices.cuda_index is not None:
            record.cache.mark = device_calls(self.torch, record.devices.cuda_index)

    def read_end(self, cuda_ok: bool) -> None:
        record = self.record
        cache = record.cache
        if cuda_ok and cache.mark is not None and record.devices.cuda_index is not None:
            try:
                cache.end = device_calls(self.torch, record.devices.cuda_index)
            except Exception as exc:
                record.errors.append(f"reading the allocator's call counters: {exc}")
