"""``requires_cuda``: decide from facts whether a GPU test can run, and say precisely why not.

The decision is a pure function of an ``Inventory`` (gathered once per session by the backend)
and of the free memory read at the moment the test starts, so it is tested on any machine with
made-up inventories. Plain dataclasses: nothing here imports torch or pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_gputrain.assertions.markers import RequiresCuda, describe_size
from pytest_gputrain.versions import version_at_least


@dataclass
class CudaDevice:
    """One device as torch numbers it (``cuda:<index>``), described from NVML where possible."""

    index: int
    name: str | None = None
    nvml_index: int | None = None
    capability: tuple[int, int] | None = None
    memory_total: int | None = None
    unknown: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"cuda:{self.index} ({self.name})" if self.name else f"cuda:{self.index}"


@dataclass(frozen=True)
class FreeMemory:
    """Free memory of a device now, and who holds the rest."""

    free: int | None
    total: int | None = None
    other_processes: int | None = None  # processes outside this test session
    other_memory: int | None = None
    own_memory: int | None = None  # held by this session's processes (xdist workers, children)
    source: str = "NVML"
    reason: str | None = None  # why ``free`` is unknown


@dataclass
class Inventory:
    """What ``requires_cuda`` decides on; ``None`` means unknown (see the ``*_error`` fields)."""

    torch_version: str | None = None
    torch_error: str | None = None  # why torch cannot be imported
    cuda_build: str | None = None  # torch.version.cuda
    hip_build: str | None = None  # torch.version.hip
    cuda_available: bool = False
    cuda_error: str | None = None  # what torch said when CUDA did not initialise
    driver_version: str | None = None
    nvml_error: str | None = None  # why NVML is not available (no driver, ...)
    nvml_device_count: int | None = None
    cuda_visible_devices: str | None = None
    devices: list[CudaDevice] = field(default_factory=list)

    @property
    def device_count(self) -> int:
        return len(self.devices) if self.cuda_available else 0


# How the reason a test skips for want of any usable GPU starts (the tally refers to the
# diagnosis's finding instead of repeating the rest).
NO_GPU = "no CUDA GPU"


def no_gpu_reason(inventory: Inventory) -> str | None:
    """Why no CUDA GPU can be used at all, or None when at least one can."""
    inv = inventory
    if inv.cuda_available and inv.devices:
        return None
    reasons: list[str] = []
    if inv.torch_version is None:
        reasons.append(f"torch is not importable ({inv.torch_error or 'not installed'})")
    elif inv.cuda_build is None and inv.hip_build is None:
        text = f"torch {inv.torch_version} is a CPU-only build"
        if inv.nvml_device_count:
            text += (f" although NVML sees {inv.nvml_device_count} GPU"
                     f"{'s' if inv.nvml_device_count != 1 else ''}: install a CUDA build of torch")
        reasons.append(text)
    if inv.nvml_error and inv.hip_build is None:
        reasons.append(_driver_text(inv.nvml_error))
    if not reasons:
        visible = inv.cuda_visible_devices
        blank = visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles")
        # No device although NVML sees some, and torch gave no other reason: the variable.
        hidden = bool(visible is not None and inv.nvml_device_count and not inv.devices
                      and not inv.cuda_error)
        if blank or hidden:
            count = inv.nvml_device_count
            seen = f" all {count} GPU{'s' if count != 1 else ''}" if count else " every GPU"
            reasons.append(f"CUDA_VISIBLE_DEVICES={visible!r} hides{seen}")
        elif not inv.cuda_available:
            text = "torch.cuda.is_available() is False"
            if inv.cuda_build:
                text += f" (torch {inv.torch_version}, CUDA {inv.cuda_build})"
            if inv.cuda_error:
                text += f": {inv.cuda_error}"
            reasons.append(text)
        else:
            reasons.append("torch sees no CUDA device")
    return f"{NO_GPU}: " + "; ".join(reasons)


def _driver_text(nvml_error: str) -> str:
    """NVML's reason, phrased for a skip: "NVIDIA driver not installed (libnvidia-ml.so ...)"."""
    text = nvml_error.strip()
    prefix = "the NVIDIA driver is not installed"
    if text.lower().startswith(prefix.lower()):
        detail = text[len(prefix):].strip()
        if detail.startswith("(") and ")" in detail:
            inner, _, rest = detail[1:].partition(")")
            detail = f"{inner}{rest}"
        return f"NVIDIA driver not installed ({detail.strip(' :')})" if detail else \
            "NVIDIA driver not installed"
    lowered = text.lower()
    if "not found" in lowered and "nvml" in lowered:
        return f"NVIDIA driver not installed ({text})"
    return text.removeprefix("the ")


FreeReader = Callable[[int], FreeMemory]


def unmet(spec: RequiresCuda, inventory: Inventory, free_memory: FreeReader) -> list[str]:
    """The conditions of ``spec`` that do not hold, each as a sentence with the numbers.

    ``free_memory(cuda_index)`` is called only when the spec has ``min_free_vram``, so that the
    free memory is read when the test starts, not when the session started.
    """
    inv = inventory
    reasons: list[str] = []
    if spec.min_torch is not None and inv.torch_version is not None:
        ok = version_at_least(inv.torch_version, spec.min_torch)
        if not ok:
            reasons.append(f"needs torch >= {spec.min_torch}, have {inv.torch_version}")
    if spec.min_driver is not None:
        if inv.driver_version is None:
            why = _driver_text(inv.nvml_error) if inv.nvml_error else "unknown"
            reasons.append(f"needs NVIDIA driver >= {spec.min_driver}, driver version: {why}")
        elif not version_at_least(inv.driver_version, spec.min_driver):
            reasons.append(f"needs NVIDIA driver >= {spec.min_driver}, have {inv.driver_version}")
    missing = no_gpu_reason(inv)
    if missing is not None:
        return [missing, *reasons]
    count = inv.device_count
    if count < spec.min_devices:
        text = f"needs {spec.min_devices} CUDA GPUs, {count} visible"
        if inv.cuda_visible_devices is not None:
            text += f" (CUDA_VISIBLE_DEVICES={inv.cuda_visible_devices!r})"
        elif inv.nvml_device_count is not None and inv.nvml_device_count != count:
            text += f" (NVML sees {inv.nvml_device_count})"
        reasons.append(text)
    for device in inv.devices[:spec.min_devices]:
        reasons.extend(_device_unmet(spec, device, free_memory))
    return reasons


def _device_unmet(spec: RequiresCuda, device: CudaDevice, free_memory: FreeReader) -> list[str]:
    reasons: list[str] = []
    capability = device.capability
    cap_why = device.unknown.get("capability", "unknown")
    if spec.min_capability is not None:
        need = spec.min_capability
        if capability is None:
            reasons.append(f"needs compute capability >= {need[0]}.{need[1]}, "
                           f"{device.label} has an unknown capability ({cap_why})")
        elif capability < need:
            reasons.append(f"needs compute capability >= {need[0]}.{need[1]}, {device.label} "
                           f"has {capability[0]}.{capability[1]}")
    if spec.bf16:
        if capability is None:
            reasons.append(f"needs bf16, {device.label} has an unknown compute capability "
                           f"({cap_why})")
        elif capability < (8, 0):
            reasons.append(f"needs bf16: {device.label} has compute capability "
                           f"{capability[0]}.{capability[1]} (bf16 needs >= 8.0)")
    if spec.min_total_vram is not None:
        total = device.memory_total
        if total is None:
            reasons.append(f"needs {describe_size(spec.min_total_vram)} total on cuda:"
                           f"{device.index}, total memory unknown "
                           f"({device.unknown.get('memory_total', 'unknown')})")
        elif total < spec.min_total_vram:
            reasons.append(f"needs {describe_size(spec.min_total_vram)} total on cuda:"
                           f"{device.index}, {device.name or 'it'} has {describe_size(total)}")
    if spec.min_free_vram is not None:
        reasons.extend(_free_unmet(spec.min_free_vram, device, free_memory(device.index)))
    return reasons


def _free_unmet(need: int, device: CudaDevice, free: FreeMemory) -> list[str]:
    where = f"cuda:{device.index}"
    if free.free is None:
        return [f"needs {describe_size(need)} free on {where}, free memory unknown "
                f"({free.reason or 'unknown'})"]
    if free.free >= need:
        return []
    text = f"needs {describe_size(need)} free on {where}, {describe_size(free.free)} free"
    holders = []
    if free.other_processes:
        plural = "es" if free.other_processes != 1 else ""
        holders.append(f"{free.other_processes} other process{plural} hold "
                       f"{describe_size(free.other_memory or 0)}")
    if free.own_memory:
        holders.append(f"this test session's processes hold {describe_size(free.own_memory)}")
    if holders:
        text += ": " + "; ".join(holders)
    elif free.other_processes == 0 and not free.own_memory:
        text += " (no other compute process is listed: see nvidia-smi)"
    return [text]
