"""The seam between the assertions and the GPU: facts in, measurements out.

``GpuBackend`` is what the plugin asks (an inventory for ``requires_cuda``, free memory now,
allocator peaks, an NVML sampler, OOM clean-up); ``RealBackend`` answers from torch and NVML;
``testing.FakeBackend`` answers from plain values, so every marker path runs on a CPU machine.
A conftest picks the backend through the ``pytest_gputrain_backend`` hook.

``RealBackend`` imports torch lazily and avoids creating a CUDA context where it can: the
inventory comes from NVML plus ``torch.cuda.is_available()``/``device_count()``, which read
``CUDA_VISIBLE_DEVICES`` but create no context; allocator readings are skipped while CUDA is
not initialised (nothing can have been allocated yet).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pytest_gputrain.assertions.requirements import CudaDevice, FreeMemory, Inventory

if TYPE_CHECKING:
    from pytest_gputrain.collect.sampler import NvmlSampler


class BackendError(RuntimeError):
    """A measurement the backend cannot make (the message says why)."""


@dataclass(frozen=True)
class MemoryReading:
    """The caching allocator's counters for one device (all zero before CUDA initialises)."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0


class GpuBackend(Protocol):
    """What the assertions need from the GPU stack."""

    def inventory(self) -> Inventory: ...

    def free_memory(self, cuda_index: int) -> FreeMemory: ...

    def nvml_device_count(self) -> tuple[int | None, str | None]: ...

    def nvml_index(self, cuda_index: int) -> int | None: ...

    def device(self, cuda_index: int) -> Any: ...

    def cuda_initialized(self) -> bool: ...

    def reset_peak(self, cuda_index: int) -> None: ...

    def memory(self, cuda_index: int) -> MemoryReading: ...

    def start_history(self, cuda_index: int, max_entries: int) -> str | None: ...

    def stop_history(self, cuda_index: int) -> list[dict[str, Any]] | None: ...

    def release(self, cuda_index: int) -> None: ...

    def is_oom(self, exc: BaseException) -> bool: ...

    def sampler(self, nvml_index: int, interval: float,
                pids: Collection[int] | None = None) -> NvmlSampler: ...

    def own_pids(self) -> set[int]: ...


class RealBackend:
    """torch + NVML."""

    def __init__(self) -> None:
        self._nvml_index: dict[int, int | None] = {}

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _torch() -> Any:
        from pytest_gputrain.collect.torch_import import import_torch

        return import_torch()

    @staticmethod
    def _torch_if_imported() -> Any:
        return sys.modules.get("torch")

    @staticmethod
    def _nvml() -> Any:
        from pytest_gputrain.collect import nvml

        return nvml

    # -- facts -----------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        system = self._nvml().read_system()
        inv = Inventory(cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        if system.available:
            inv.driver_version = system.driver_version
            inv.nvml_device_count = system.device_count
        else:
            inv.nvml_error = system.reason or "NVML not available"
        try:
            torch = self._torch()
        except Exception as exc:  # ImportError, or a broken install raising OSError
            inv.torch_error = f"{type(exc).__name__}: {exc}"
            return inv
        inv.torch_version = str(torch.__version__)
        inv.cuda_build = getattr(torch.version, "cuda", None)
        inv.hip_build = getattr(torch.version, "hip", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                inv.cuda_available = bool(torch.cuda.is_available())
                count = int(torch.cuda.device_count()) if inv.cuda_available else 0
            except Exception as exc:
                inv.cuda_available = False
                inv.cuda_error = f"{type(exc).__name__}: {exc}"
                count = 0
        said = [str(w.message).strip() for w in caught if "cuda" in str(w.message).lower()]
        if said and inv.cuda_error is None:
            inv.cuda_error = said[0]
        inv.devices = [self._describe(torch, index) for index in range(count)]
        return inv

    def _describe(self, torch: Any, cuda_index: int) -> CudaDevice:
        device = CudaDevice(index=cuda_index, nvml_index=self.nvml_index(cuda_index))
        nvml = self._nvml()
        if device.nvml_index is not None and nvml.shared().available:
            name = nvml.read_name(device.nvml_index)
            if name.ok:
                device.name = name.value
            capability = nvml.read_compute_capability(device.nvml_index)
            if capability.ok:
                device.capability = capability.value
            else:
                device.unknown["capability"] = capability.error or "unknown"
            memory = nvml.read_memory_info(device.nvml_index)
            if memory.ok:
                device.memory_total = memory.value.total
            else:
                device.unknown["memory_total"] = memory.error or "unknown"
        if device.name is None or device.capability is None or device.memory_total is None:
            # Not readable through NVML (no NVML, MIG, ROCm): ask torch (creates the context).
            try:
                props = torch.cuda.get_device_properties(cuda_index)
            except Exception as exc:
                device.unknown.setdefault("capability", f"{type(exc).__name__}: {exc}")
            else:
                device.name = device.name or str(props.name)
                device.capability = device.capability or (int(props.major), int(props.minor))
                device.memory_total = device.memory_total or int(props.total_memory)
                device.unknown.pop("capability", None)
                device.unknown.pop("memory_total", None)
        return device

    def free_memory(self, cuda_index: int) -> FreeMemory:
        nvml = self._nvml()
        session = nvml.shared()
        index = self.nvml_index(cuda_index)
        if index is not None and session.available:
            memory = nvml.read_memory_info(index)
            if memory.ok:
                # None when NVML cannot list the processes on the GPU.
                holders = nvml.read_memory_holders(index, self.own_pids()).value
                return FreeMemory(free=memory.value.free, total=memory.value.total,
                                  other_processes=holders.other_count if holders else None,
                                  other_memory=holders.other_memory if holders else None,
                                  own_memory=holders.own_memory if holders else None)
            nvml_reason = memory.error
        else:
            nvml_reason = session.reason if not session.available else \
                f"cuda:{cuda_index} has no NVML index"
        try:
            free, total = self._torch().cuda.mem_get_info(cuda_index)
        except Exception as exc:
            return FreeMemory(free=None, reason=f"NVML: {nvml_reason}; torch: {exc}")
        return FreeMemory(free=int(free), total=int(total), source="torch.cuda.mem_get_info")

    def nvml_device_count(self) -> tuple[int | None, str | None]:
        count = self._nvml().read_device_count()
        return (count.value, None) if count.ok else (None, count.error)

    def nvml_index(self, cuda_index: int) -> int | None:
        """NVML index of ``cuda:<cuda_index>`` (creates no CUDA context)."""
        if cuda_index not in self._nvml_index:
            self._nvml_index[cuda_index] = self._nvml().index_for_cuda_device(cuda_index)
        return self._nvml_index[cuda_index]

    # -- allocator -------------------------------------------------------------------------------

    def device(self, cuda_index: int) -> Any:
        return self._torch().device("cuda", cuda_index)

    def cuda_initialized(self) -> bool:
        torch = self._torch_if_imported()
        try:
            return bool(torch is not None and torch.cuda.is_initialized())
        except Exception:
            return False

    def reset_peak(self, cuda_index: int) -> None:
        cuda = self._torch().cuda
        if not cuda.is_initialized():
            cuda.init()
        cuda.reset_peak_memory_stats(cuda_index)

    def memory(self, cuda_index: int) -> MemoryReading:
        if not self.cuda_initialized():
            return MemoryReading()
        cuda = self._torch().cuda
        return MemoryReading(
            allocated=int(cuda.memory_allocated(cuda_index)),
            reserved=int(cuda.memory_reserved(cuda_index)),
            peak_allocated=int(cuda.max_memory_allocated(cuda_index)),
            peak_reserved=int(cuda.max_memory_reserved(cuda_index)),
        )

    def start_history(self, cuda_index: int, max_entries: int) -> str | None:
        torch = self._torch()
        memory = getattr(torch.cuda, "memory", None)
        record = getattr(memory, "_record_memory_history", None)
        if record is None:
            return "this torch has no torch.cuda.memory._record_memory_history"
        try:
            torch.cuda.init()  # the allocator must exist before it can record
            try:
                record(enabled="all", context="alloc", stacks="python",
                       max_entries=max_entries, clear_history=True)
            except TypeError:  # torch without clear_history
                record(enabled="all", context="alloc", stacks="python", max_entries=max_entries)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def stop_history(self, cuda_index: int) -> list[dict[str, Any]] | None:
        memory = self._torch().cuda.memory
        try:
            snapshot = memory._snapshot()
        except Exception:
            snapshot = None
        finally:
            with contextlib.suppress(Exception):
                memory._record_memory_history(enabled=None)
        if not isinstance(snapshot, dict):
            return None
        traces = snapshot.get("device_traces") or []
        if cuda_index < len(traces) and isinstance(traces[cuda_index], list):
            return list(traces[cuda_index])
        return None

    def release(self, cuda_index: int) -> None:
        gc.collect()
        if not self.cuda_initialized():
            return
        torch = self._torch()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            with contextlib.suppress(Exception):
                clear()
        torch.cuda.empty_cache()

    def is_oom(self, exc: BaseException) -> bool:
        torch = self._torch_if_imported()
        if torch is None:
            return False
        oom = getattr(torch, "OutOfMemoryError", None) or \
            getattr(torch.cuda, "OutOfMemoryError", None)
        if oom is not None and isinstance(exc, oom):
            return True
        return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)

    # -- sampling --------------------------------------------------------------------------------

    def sampler(self, nvml_index: int, interval: float,
                pids: Collection[int] | None = None) -> NvmlSampler:
        session = self._nvml().shared()
        if not session.available:
            raise BackendError(session.reason or "NVML not available")
        from pytest_gputrain.collect.sampler import NvmlSampler

        return NvmlSampler(nvml_index, interval, pids=pids)

    def own_pids(self) -> set[int]:
        return set(self._nvml().own_process_ids())
