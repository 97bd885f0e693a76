"""A fake GPU for testing the GPU markers and fixtures on a CPU machine.

Return a ``FakeBackend`` from the ``pytest_gputrain_backend`` hook in a conftest, and every
marker, fixture and xdist pinning decision runs against it instead of torch and NVML::

    # conftest.py
    import pytest
    from pytest_gputrain.assertions.testing import FakeBackend, gpu_inventory

    FAKE = FakeBackend(gpu_inventory(count=2))

    def pytest_gputrain_backend(config):
        return FAKE

    @pytest.fixture
    def fake_gpu():
        return FAKE

    # test_model.py
    @pytest.mark.max_vram("1GiB")
    def test_fits(fake_gpu):
        fake_gpu.allocate("2GiB")   # recorded with this line as its origin
        fake_gpu.free("2GiB")       # -> fails: peak 2 GiB > 1 GiB

The fake's allocator keeps allocated/reserved counters and their peaks, records an allocation
trace (like torch's memory history) while a ``max_vram`` marker asks for it, and its NVML
sampler reports ``utilization`` (a number, or a callable of the seconds since sampling began).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from pytest_gputrain.assertions.backend import MemoryReading
from pytest_gputrain.assertions.requirements import CudaDevice, FreeMemory, Inventory
from pytest_gputrain.units import parse_size

if TYPE_CHECKING:
    from pytest_gputrain.collect.sampler import NvmlSampler
    from pytest_gputrain.facts import DeviceSample

CONTEXT_BYTES = 512 * 2**20  # what a CUDA context costs on the device, roughly


class FakeOutOfMemoryError(RuntimeError):
    """Raised by ``FakeBackend.allocate`` past ``budget``; the fake's ``is_oom`` knows it."""


def gpu_inventory(count: int = 1, *, name: str = "NVIDIA H200",
                  capability: tuple[int, int] = (9, 0), total: object = "141GiB",
                  torch_version: str = "2.11.0+cu130", cuda_build: str = "13.0",
                  driver_version: str = "580.159.04", visible: str | None = None) -> Inventory:
    """An inventory of ``count`` identical GPUs, all visible to torch."""
    size = parse_size(total)
    return Inventory(
        torch_version=torch_version, cuda_build=cuda_build, cuda_available=count > 0,
        driver_version=driver_version, nvml_device_count=count, cuda_visible_devices=visible,
        devices=[CudaDevice(index=i, name=name, nvml_index=i, capability=capability,
                            memory_total=size) for i in range(count)],
    )


def cpu_inventory(torch_version: str = "2.13.0+cpu") -> Inventory:
    """A CPU-only torch build on a machine without the NVIDIA driver."""
    return Inventory(
        torch_version=torch_version,
        nvml_error=("the NVIDIA driver is not installed (libnvidia-ml.so not found): "
                    "NVML Shared Library Not Found"),
    )


class FakeTensor:
    """A block of the fake allocator that is freed when the object goes away (like a tensor)."""

    def __init__(self, backend: FakeBackend, addr: int, nbytes: int) -> None:
        self.backend = backend
        self.addr = addr
        self.nbytes = nbytes

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.backend.free_block(self.addr)


class FakeBackend:
    """Implements ``backend.GpuBackend`` from plain, settable values."""

    def __init__(self, inventory: Inventory | None = None, *,
                 free: FreeMemory | None = None,
                 utilization: float | Callable[[float], float | None] = 0.0,
                 budget: object | None = None, initialized: bool = True,
                 nvml_available: bool = True, process_visible: bool = True) -> None:
        self.inventory_value = inventory if inventory is not None else gpu_inventory()
        self.free_override = free
        self.utilization = utilization
        self.budget = parse_size(budget) if budget is not None else None
        self.initialized = initialized
        self.nvml_available = nvml_available
        self.process_visible = process_visible
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.other_memory = 0
        self.calls: list[str] = []
        self.inventory_calls = 0
        self.recording = False
        self.trace: list[dict[str, Any]] = []
        self._blocks: list[tuple[int, int]] = []  # (addr, size), newest last
        self._next_addr = 0x7F0000000000

    # -- the allocator, driven by tests ----------------------------------------------------------

    def allocate(self, size: object, _frame: Any = None) -> int:
        """Allocate ``size`` (``"2GiB"``, bytes) from the calling line; returns the block id."""
        nbytes = parse_size(size)
        if self.budget is not None and self.allocated + nbytes > self.budget:
            raise FakeOutOfMemoryError(
                f"CUDA out of memory (fake). Tried to allocate {nbytes} bytes")
        self.initialized = True
        addr = self._next_addr
        self._next_addr += max(nbytes, 512)
        self._blocks.append((addr, nbytes))
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if self.recording:
            caller = _frame or sys._getframe(1)
            self.trace.append({
                "action": "alloc", "addr": addr, "size": nbytes,
                "frames": [{"filename": caller.f_code.co_filename, "line": caller.f_lineno,
                            "name": caller.f_code.co_name}],
            })
        return addr

    def tensor(self, size: object) -> FakeTensor:
        """Allocate ``size`` held by the returned object: freed when it is garbage."""
        nbytes = parse_size(size)
        caller = sys._getframe(1)
        addr = self.allocate(nbytes, _frame=caller)
        return FakeTensor(self, addr, nbytes)

    def free_block(self, addr: int) -> None:
        for position, (block, nbytes) in enumerate(self._blocks):
            if block == addr:
                del self._blocks[position]
                self.allocated -= nbytes
                if self.recording:
                    self.trace.append({"action": "free_requested", "addr": addr,
                                       "size": nbytes})
                return
        raise KeyError(f"no fake block {addr:#x}")

    def free(self, size: object | None = None) -> None:
        """Free the newest blocks adding up to ``size`` (everything when None)."""
        remaining = parse_size(size) if size is not None else self.allocated
        while remaining > 0 and self._blocks:
            addr, nbytes = self._blocks[-1]
            self.free_block(addr)
            remaining -= nbytes

    @property
    def process_memory(self) -> int:
        return self.reserved + (CONTEXT_BYTES if self.initialized else 0)

    # -- GpuBackend ------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        self.inventory_calls += 1
        return self.inventory_value

    def free_memory(self, cuda_index: int) -> FreeMemory:
        if self.free_override is not None:
            return self.free_override
        device = self.inventory_value.devices[cuda_index]
        total = device.memory_total or 0
        used = self.process_memory + self.other_memory
        return FreeMemory(free=max(0, total - used), total=total,
                          other_processes=1 if self.other_memory else 0,
                          other_memory=self.other_memory, own_memory=self.process_memory)

    def nvml_device_count(self) -> tuple[int | None, str | None]:
        inv = self.inventory_value
        if inv.nvml_error:
            return None, inv.nvml_error
        return inv.nvml_device_count, None

    def nvml_index(self, cuda_index: int) -> int | None:
        devices = self.inventory_value.devices
        return devices[cuda_index].nvml_index if cuda_index < len(devices) else None

    def device(self, cuda_index: int) -> Any:
        self.initialized = True
        return f"cuda:{cuda_index}"

    def cuda_initialized(self) -> bool:
        return self.initialized

    def reset_peak(self, cuda_index: int) -> None:
        self.calls.append("reset_peak")
        self.initialized = True
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def memory(self, cuda_index: int) -> MemoryReading:
        if not self.initialized:
            return MemoryReading()
        return MemoryReading(self.allocated, self.reserved, self.peak_allocated,
                             self.peak_reserved)

    def start_history(self, cuda_index: int, max_entries: int) -> str | None:
        self.calls.append("start_history")
        self.initialized = True
        self.recording = True
        self.trace = []
        return None

    def stop_history(self, cuda_index: int) -> list[dict[str, Any]] | None:
        self.calls.append("stop_history")
        self.recording = False
        return list(self.trace)

    def release(self, cuda_index: int) -> None:
        self.calls.append("release")
        gc.collect()
        self.reserved = self.allocated

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, FakeOutOfMemoryError)

    def sampler(self, nvml_index: int, interval: float,
                pids: Collection[int] | None = None) -> NvmlSampler:
        from pytest_gputrain.collect.sampler import NvmlSampler

        if not self.nvml_available:
            from pytest_gputrain.assertions.backend import BackendError

            raise BackendError("NVML not available (fake)")
        started = time.monotonic()
        follow = pids is not None

        def read(index: int) -> DeviceSample | None:
            from pytest_gputrain.facts import DeviceSample

            source = self.utilization
            value = source(time.monotonic() - started) if callable(source) else source
            return DeviceSample(
                utilization_gpu=value,
                memory_used=self.process_memory + self.other_memory,
                process_memory=(self.process_memory if self.process_visible else 0)
                if follow else None,
                power_draw=120.0, temperature=40.0, sm_clock=1980.0, clock_event_reasons=0,
            )

        return NvmlSampler(nvml_index, interval, read=read)

    def own_pids(self) -> set[int]:
        return {1}
