"""What NVML says about the system and each GPU: the door the rest of the package reads NVML by.

Code outside ``collect/`` asks the functions here (``read_name``, ``read_memory_info``,
``read_memory_holders``, ``index_for_cuda_device``, ...) and never names an NVML call itself.
Every call goes through ``nvml_session`` (the safe-call wrapper: a ``Reading`` with a value or a
reason, never an exception); who holds memory is read in ``nvml_processes``, torch's cuda:N is
mapped to NVML's index in ``gpu_index``; their public names are importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.collect.gpu_index import (
    index_for_cuda_device,
    read_device_count,
    visible_nvml_indices,
)
from pytest_gputrain.collect.nvml_processes import (
    MemoryHolders,
    ProcessMemory,
    list_processes,
    own_process_ids,
    process_figures,
    process_name,
    read_memory_holders,
    read_processes,
    session_process_ids,
)
from pytest_gputrain.collect.nvml_session import Nvml, Reading, as_text, shared
from pytest_gputrain.facts import DeviceFacts, DeviceSample, GpuProcess, NvmlFacts

__all__ = [
    "CLOCK_EVENT_REASONS", "MemoryHolders", "MemoryInfo", "Nvml", "ProcessMemory", "Reading",
    "decode_clock_events", "index_for_cuda_device", "own_process_ids", "read_compute_capability",
    "read_device", "read_device_count", "read_memory_holders", "read_memory_info", "read_name",
    "read_power_limits", "read_processes", "read_sample", "read_system", "session_process_ids",
    "shared", "visible_nvml_indices",
]

# NVML clock event (throttle) reason bits: nvml.h, nvmlClocksEventReason*.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _cuda_version_text(value: int) -> str:
    # NVML gives the driver's CUDA as 1000 * major + 10 * minor.
    return f"{value // 1000}.{(value % 1000) // 10}"


def read_system(nvml: Nvml | None = None) -> NvmlFacts:
    nvml = nvml or shared()
    facts = NvmlFacts()
    if not nvml.available:
        facts.reason = nvml.reason
        for field in ("driver_version", "cuda_driver_version", "nvml_version", "device_count"):
            facts.mark_unknown(field, nvml.reason or "NVML not available")
        return facts
    facts.available = True
    _set(facts, "driver_version", nvml.call("nvmlSystemGetDriverVersion"), as_text)
    _set(facts, "nvml_version", nvml.call("nvmlSystemGetNVMLVersion"), as_text)
    _set(
        facts,
        "cuda_driver_version",
        nvml.first(("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")),
        _cuda_version_text,
    )
    _set(facts, "device_count", read_device_count(nvml))
    return facts


def _set(group: Any, field: str, reading: Reading, convert: Callable[[Any], Any] = lambda v: v
         ) -> None:
    if reading.ok:
        try:
            setattr(group, field, convert(reading.value))
            return
        except Exception as exc:
            group.mark_unknown(field, f"unexpected value {reading.value!r}: {exc}")
            return
    group.mark_unknown(field, reading.error or "unknown")


def read_device(index: int, own_pids: set[int] | None = None, nvml: Nvml | None = None
                ) -> DeviceFacts:
    """Everything the device rules need about one GPU (NVML index)."""
    nvml = nvml or shared()
    own_pids = own_pids if own_pids is not None else own_process_ids()
    facts = DeviceFacts(index=index)
    handle_reading = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if not handle_reading.ok:
        facts.lost = handle_reading.lost
        for field in ("name", "memory_total", "memory_used", "compute_capability"):
            facts.mark_unknown(field, handle_reading.error or "no handle")
        return facts
    handle = handle_reading.value

    _set(facts, "name", nvml.call("nvmlDeviceGetName", handle), as_text)
    _set(facts, "uuid", nvml.call("nvmlDeviceGetUUID", handle), as_text)
    _set(facts, "pci_bus_id", nvml.call("nvmlDeviceGetPciInfo", handle),
         lambda v: as_text(v.busId))
    _set(facts, "compute_capability", nvml.call("nvmlDeviceGetCudaComputeCapability", handle),
         lambda v: f"{v[0]}.{v[1]}")
    memory = nvml.call("nvmlDeviceGetMemoryInfo", handle)
    _set(facts, "memory_total", memory, lambda v: int(v.total))
    _set(facts, "memory_used", memory, lambda v: int(v.used))
    _set(facts, "memory_free", memory, lambda v: int(v.free))
    _set(facts, "temperature", nvml.call("nvmlDeviceGetTemperature", handle, 0), float)
    _set(facts, "temperature_slowdown",
         nvml.call("nvmlDeviceGetTemperatureThreshold", handle, 1), float)
    _set(facts, "power_draw", nvml.call("nvmlDeviceGetPowerUsage", handle), _watts)
    _set(facts, "power_limit", nvml.call("nvmlDeviceGetEnforcedPowerLimit", handle), _watts)
    _set(facts, "power_limit_default",
         nvml.call("nvmlDeviceGetPowerManagementDefaultLimit", handle), _watts)
    _set(facts, "utilization_gpu", nvml.call("nvmlDeviceGetUtilizationRates", handle),
         lambda v: float(v.gpu))
    _set(facts, "sm_clock", nvml.call("nvmlDeviceGetClockInfo", handle, 1), float)
    _set(facts, "sm_clock_max", nvml.call("nvmlDeviceGetMaxClockInfo", handle, 1), float)
    _set_clock_events(facts, nvml.first(
        ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        handle))
    _set(facts, "pcie_gen", nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", handle), int)
    _set(facts, "pcie_gen_max", nvml.call("nvmlDeviceGetMaxPcieLinkGeneration", handle), int)
    _set(facts, "pcie_width", nvml.call("nvmlDeviceGetCurrPcieLinkWidth", handle), int)
    _set(facts, "pcie_width_max", nvml.call("nvmlDeviceGetMaxPcieLinkWidth", handle), int)
    _set(facts, "ecc_enabled", nvml.call("nvmlDeviceGetEccMode", handle), lambda v: bool(v[0]))
    # MEMORY_ERROR_TYPE_UNCORRECTED = 1, VOLATILE_ECC = 0 (since driver load).
    _set(facts, "ecc_uncorrected_volatile",
         nvml.call("nvmlDeviceGetTotalEccErrors", handle, 1, 0), int)
    _set(facts, "retired_pages_pending",
         nvml.call("nvmlDeviceGetRetiredPagesPendingStatus", handle), lambda v: bool(v))
    _set_retired_pages(facts, nvml, handle)
    remapped = nvml.call("nvmlDeviceGetRemappedRows", handle)
    # (correctable rows, uncorrectable rows, is pending, failure occurred)
    _set(facts, "remapped_rows_pending", remapped, lambda v: bool(v[2]))
    _set(facts, "remapped_rows_failed", remapped, lambda v: bool(v[3]))
    _set(facts, "compute_mode", nvml.call("nvmlDeviceGetComputeMode", handle),
         lambda v: _COMPUTE_MODES[int(v)])
    _set(facts, "mig_enabled", nvml.call("nvmlDeviceGetMigMode", handle), lambda v: bool(v[0]))
    _set(facts, "persistence_mode", nvml.call("nvmlDeviceGetPersistenceMode", handle),
         lambda v: bool(v))
    _set_processes(facts, nvml, handle, own_pids)
    facts.lost = any("lost" in reason.lower() for reason in facts.unknown.values())
    return facts


def _set_clock_events(facts: DeviceFacts, reading: Reading) -> None:
    names = ("throttle_reasons", "throttle_sw_power_cap", "throttle_hw_slowdown",
             "throttle_sw_thermal", "throttle_hw_thermal", "throttle_hw_power_brake")
    if not reading.ok:
        facts.mark_unknown("clock_event_reasons", reading.error or "unknown")
        for name in names:
            facts.mark_unknown(name, reading.error or "unknown")
        return
    mask = int(reading.value)
    facts.clock_event_reasons = mask
    facts.throttle_reasons = decode_clock_events(mask)
    facts.throttle_sw_power_cap = bool(mask & 0x4)
    facts.throttle_hw_slowdown = bool(mask & 0x8)
    facts.throttle_sw_thermal = bool(mask & 0x20)
    facts.throttle_hw_thermal = bool(mask & 0x40)
    facts.throttle_hw_power_brake = bool(mask & 0x80)


def decode_clock_events(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]


def _set_retired_pages(facts: DeviceFacts, nvml: Nvml, handle: Any) -> None:
    total = 0
    # PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0, DOUBLE_BIT_ECC_ERROR = 1
    for cause in (0, 1):
        reading = nvml.call("nvmlDeviceGetRetiredPages", handle, cause)
        if not reading.ok:
            facts.mark_unknown("retired_pages", reading.error or "unknown")
            return
        total += len(reading.value)
    facts.retired_pages = total


def _set_processes(facts: DeviceFacts, nvml: Nvml, handle: Any, own_pids: set[int]) -> None:
    reading = list_processes(nvml, handle)
    if not reading.ok:
        for field in ("processes", "other_process_count", "other_process_memory"):
            facts.mark_unknown(field, reading.error or "unknown")
        return
    listed: list[ProcessMemory] = reading.value
    facts.processes = [
        GpuProcess(pid=process.pid, name=process_name(process.pid),
                   used_memory=process.used_memory, own=process.pid in own_pids)
        for process in listed
    ]
    holders = MemoryHolders.split(listed, own_pids)
    facts.other_process_count = holders.other_count
    facts.other_process_memory = holders.other_memory


def read_sample(index: int, nvml: Nvml | None = None, pids: Collection[int] | None = None,
                session_pids: Collection[int] | None = None) -> DeviceSample | None:
    """One cheap sample of a GPU's state (for samplers); None when NVML cannot answer.

    With ``pids``, the sample also holds the memory those processes use on the GPU
    (``process_memory``: one more NVML call, the compute process list). With ``session_pids``
    too (a superset of ``pids``: the test session's processes), the same list gives the memory
    and number of every other process (``other_process_memory``, ``other_process_count``);
    these stay unknown when none of ``pids`` is listed while others are (NVML reports PIDs of
    another namespace, so this process cannot be told from the others).
    """
    nvml = nvml or shared()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if not handle.ok:
        return None
    h = handle.value
    util = nvml.call("nvmlDeviceGetUtilizationRates", h)
    memory = nvml.call("nvmlDeviceGetMemoryInfo", h)
    power = nvml.call("nvmlDeviceGetPowerUsage", h)
    temperature = nvml.call("nvmlDeviceGetTemperature", h, 0)
    clock = nvml.call("nvmlDeviceGetClockInfo", h, 1)
    reasons = nvml.first(("nvmlDeviceGetCurrentClocksEventReasons",
                          "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
    own, others, other_count = process_figures(nvml, h, pids, session_pids)
    return DeviceSample(
        utilization_gpu=float(util.value.gpu) if util.ok else None,
        memory_used=int(memory.value.used) if memory.ok else None,
        power_draw=power.value / 1000 if power.ok else None,
        temperature=float(temperature.value) if temperature.ok else None,
        sm_clock=float(clock.value) if clock.ok else None,
        clock_event_reasons=int(reasons.value) if reasons.ok else None,
        process_memory=own, other_process_memory=others, other_process_count=other_count,
    )


# -- one device, by NVML index --------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryInfo:
    """A GPU's memory in bytes, as NVML counts it (every process, not only this one)."""

    total: int
    free: int
    used: int


def read_name(index: int, nvml: Nvml | None = None) -> Reading:
    """The product name of GPU ``index`` (a ``str``)."""
    return (nvml or shared()).device_call(index, "nvmlDeviceGetName").map(as_text)


def read_power_limits(index: int, nvml: Nvml | None = None) -> tuple[Reading, Reading]:
    """The enforced and the default power limit of GPU ``index``, in watts.

    A software power cap is a fault only below the default limit: at the default, a fully
    loaded GPU running at its limit is GPU Boost doing its job."""
    nvml = nvml or shared()
    return (nvml.device_call(index, "nvmlDeviceGetEnforcedPowerLimit").map(_watts),
            nvml.device_call(index, "nvmlDeviceGetPowerManagementDefaultLimit").map(_watts))


def _watts(milliwatts: Any) -> float:
    return float(milliwatts) / 1000


def read_compute_capability(index: int, nvml: Nvml | None = None) -> Reading:
    """The compute capability of GPU ``index`` as ``(major, minor)``."""
    return (nvml or shared()).device_call(index, "nvmlDeviceGetCudaComputeCapability").map(
        lambda v: (int(v[0]), int(v[1])))


def read_memory_info(index: int, nvml: Nvml | None = None) -> Reading:
    """Total, free and used memory of GPU ``index`` (a ``MemoryInfo``)."""
    return (nvml or shared()).device_call(index, "nvmlDeviceGetMemoryInfo").map(
        lambda v: MemoryInfo(total=int(v.total), free=int(v.free), used=int(v.used)))
