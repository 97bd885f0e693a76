"""What the run probe reads of torch's CUDA state: allocator counters, the device's memory
budget and the backend flags. Plain reads with no probe state; callers guard them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def allocated_reader(torch: Any, index: int) -> Callable[[], int]:
    """A per-step read of the bytes allocated on cuda:index: the allocator's host-side counter
    (no synchronisation), through the raw binding where it answers."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        def read_raw() -> int:
            return int(raw(index)["allocated_bytes"]["all"]["current"])
        try:
            read_raw()
        except Exception:
            pass
        else:
            return read_raw

    def read() -> int:
        return int(torch.cuda.memory_allocated(index))
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


DEVICE_CALL_KEYS = ("num_device_alloc", "num_device_free")


def device_calls(torch: Any, index: int) -> dict[str, int] | None:
    """The caching allocator's cudaMalloc / cudaFree call counters (None where this torch or
    allocator backend has none, e.g. cudaMallocAsync)."""
    stats = torch.cuda.memory_stats(index)
    if not all(key in stats for key in DEVICE_CALL_KEYS):
        return None
    return {key: int(stats[key]) for key in DEVICE_CALL_KEYS}
