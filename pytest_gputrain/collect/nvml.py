"""Every NVML call goes through here.

NVML is initialised lazily, once per process, and every call is wrapped so that an error never
reaches pytest: NotSupported, NoPermission, a missing library or a GPU that fell off the bus all
become a ``Reading`` with no value and a reason. Module ``pynvml`` comes from nvidia-ml-py.

Code outside ``collect/`` asks the functions here (``read_name``, ``read_memory_info``,
``read_memory_holders``, ``index_for_cuda_device``, ...) and never names an NVML call itself.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.facts import DeviceFacts, DeviceSample, GpuProcess, NvmlFacts

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


@dataclass(frozen=True)
class Reading:
    """The outcome of one NVML call: a value, or why there is none."""

    value: Any = None
    error: str | None = None
    lost: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class Nvml:
    """A lazily initialised NVML session (one per process, see ``shared()``)."""

    def __init__(self, module: Any = None) -> None:
        """``module``: an initialised stand-in for ``pynvml`` (tests hand in a fake)."""
        self._lock = threading.Lock()
        self._initialised = module is not None
        self._module: Any = module
        self.reason: str | None = None

    @property
    def available(self) -> bool:
        self._ensure()
        return self._module is not None

    def _ensure(self) -> None:
        if self._initialised:
            return
        with self._lock:
            if self._initialised:
                return
            try:
                import pynvml
            except ImportError as exc:
                self.reason = f"the NVML bindings (nvidia-ml-py, module pynvml) are missing: {exc}"
            else:
                try:
                    pynvml.nvmlInit()
                except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                    self.reason = _describe_init_error(exc)
                else:
                    self._module = pynvml
            self._initialised = True

    def call(self, name: str, *args: Any) -> Reading:
        """Call ``pynvml.<name>(*args)``; never raises."""
        self._ensure()
        if self._module is None:
            return Reading(error=self.reason or "NVML not available")
        function: Callable[..., Any] | None = getattr(self._module, name, None)
        if function is None:
            return Reading(error=f"{name} is not in this nvidia-ml-py version")
        try:
            return Reading(value=function(*args))
        except Exception as exc:
            text = _error_text(exc)
            return Reading(error=text, lost="lost" in text.lower())

    def first(self, names: tuple[str, ...], *args: Any) -> Reading:
        """Try each name in turn (NVML renamed some calls); return the first that answers."""
        reading = Reading(error="no call tried")
        for name in names:
            reading = self.call(name, *args)
            if reading.ok or "not in this nvidia-ml-py" not in (reading.error or ""):
                return reading
        return reading


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.replace("NVML_ERROR_", "").strip()


def _describe_init_error(exc: BaseException) -> str:
    text = _error_text(exc)
    lowered = text.lower()
    if "library not found" in lowered or "libnvidia-ml" in lowered:
        return f"the NVIDIA driver is not installed (libnvidia-ml.so not found): {text}"
    if "driver not loaded" in lowered:
        return f"the NVIDIA kernel driver is not loaded: {text}"
    return f"NVML failed to initialise: {text}"


_shared: Nvml | None = None
_shared_lock = threading.Lock()


def shared() -> Nvml:
    """The process-wide NVML session."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Nvml()
        return _shared


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
    _set(facts, "driver_version", nvml.call("nvmlSystemGetDriverVersion"), _decode)
    _set(facts, "nvml_version", nvml.call("nvmlSystemGetNVMLVersion"), _decode)
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

    _set(facts, "name", nvml.call("nvmlDeviceGetName", handle), _decode)
    _set(facts, "uuid", nvml.call("nvmlDeviceGetUUID", handle), _decode)
    _set(facts, "pci_bus_id", nvml.call("nvmlDeviceGetPciInfo", handle),
         lambda v: _decode(v.busId))
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
    reading = _list_processes(nvml, handle)
    if not reading.ok:
        for field in ("processes", "other_process_count", "other_process_memory"):
            facts.mark_unknown(field, reading.error or "unknown")
        return
    listed: list[ProcessMemory] = reading.value
    facts.processes = [
        GpuProcess(pid=process.pid, name=_process_name(process.pid),
                   used_memory=process.used_memory, own=process.pid in own_pids)
        for process in listed
    ]
    holders = MemoryHolders.split(listed, own_pids)
    facts.other_process_count = holders.other_count
    facts.other_process_memory = holders.other_memory


def _process_name(pid: int) -> str | None:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:
        return None  # another PID namespace, or the process ended


def own_process_ids() -> set[int]:
    """This process, its parent chain up to pytest's controller, and its children (xdist)."""
    pids = {os.getpid()}
    try:
        import psutil

        me = psutil.Process()
        pids.update(child.pid for child in me.children(recursive=True))
        parent = me.parent()
        # An xdist worker's parent is the controller; its siblings are the other workers.
        if parent is not None and os.environ.get("PYTEST_XDIST_WORKER"):
            pids.add(parent.pid)
            pids.update(child.pid for child in parent.children(recursive=True))
    except Exception:
        pass
    return pids


def session_process_ids() -> set[int]:
    """This process and, on a pytest-xdist worker, the controller and its other workers: the
    processes whose GPU memory is this test session's own while a test runs. Unlike
    ``own_process_ids`` it leaves out this process's children, so a process a test starts (a
    server, an evaluation worker) counts as another process on the GPU."""
    pids = {os.getpid()}
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return pids
    try:
        import psutil

        parent = psutil.Process().parent()
        if parent is not None:
            pids.add(parent.pid)
            pids.update(child.pid for child in parent.children(recursive=False))
    except Exception:
        pass
    return pids


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
    own, others, other_count = _process_figures(nvml, h, pids, session_pids)
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


def _converted(reading: Reading, convert: Callable[[Any], Any]) -> Reading:
    """``reading`` with its value converted; an unexpected value becomes a reason too."""
    if not reading.ok:
        return reading
    try:
        return Reading(value=convert(reading.value))
    except Exception as exc:
        return Reading(error=f"unexpected value {reading.value!r}: {exc}")


def _device_call(nvml: Nvml, index: int, name: str, *args: Any) -> Reading:
    """``name(handle of GPU index, *args)``; a missing handle gives its reason."""
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    return nvml.call(name, handle.value, *args) if handle.ok else handle


def read_device_count(nvml: Nvml | None = None) -> Reading:
    """How many GPUs NVML sees (an ``int``), whatever ``CUDA_VISIBLE_DEVICES`` says."""
    return _converted((nvml or shared()).call("nvmlDeviceGetCount"), int)


def read_name(index: int, nvml: Nvml | None = None) -> Reading:
    """The product name of GPU ``index`` (a ``str``)."""
    return _converted(_device_call(nvml or shared(), index, "nvmlDeviceGetName"), _decode)


def read_power_limits(index: int, nvml: Nvml | None = None) -> tuple[Reading, Reading]:
    """The enforced and the default power limit of GPU ``index``, in watts.

    A software power cap is a fault only below the default limit: at the default, a fully
    loaded GPU running at its limit is GPU Boost doing its job."""
    nvml = nvml or shared()
    return (_converted(_device_call(nvml, index, "nvmlDeviceGetEnforcedPowerLimit"), _watts),
            _converted(_device_call(nvml, index, "nvmlDeviceGetPowerManagementDefaultLimit"),
                       _watts))


def _watts(milliwatts: Any) -> float:
    return float(milliwatts) / 1000


def read_compute_capability(index: int, nvml: Nvml | None = None) -> Reading:
    """The compute capability of GPU ``index`` as ``(major, minor)``."""
    return _converted(_device_call(nvml or shared(), index, "nvmlDeviceGetCudaComputeCapability"),
                      lambda v: (int(v[0]), int(v[1])))


def read_memory_info(index: int, nvml: Nvml | None = None) -> Reading:
    """Total, free and used memory of GPU ``index`` (a ``MemoryInfo``)."""
    return _converted(_device_call(nvml or shared(), index, "nvmlDeviceGetMemoryInfo"),
                      lambda v: MemoryInfo(total=int(v.total), free=int(v.free), used=int(v.used)))


# -- who holds memory on a GPU --------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessMemory:
    """A compute process on a GPU and the bytes it holds there (None when NVML cannot say)."""

    pid: int
    used_memory: int | None


@dataclass(frozen=True)
class MemoryHolders:
    """The memory on one GPU held by a set of processes (``own``) and by every other one."""

    own_memory: int
    other_count: int
    other_memory: int

    @classmethod
    def split(cls, processes: Iterable[ProcessMemory], own_pids: Collection[int]
              ) -> MemoryHolders:
        own_memory = other_count = other_memory = 0
        for process in processes:
            used = process.used_memory or 0  # an unknown size counts as none
            if process.pid in own_pids:
                own_memory += used
            else:
                other_count += 1
                other_memory += used
        return cls(own_memory=own_memory, other_count=other_count, other_memory=other_memory)


def _list_processes(nvml: Nvml, handle: Any) -> Reading:
    """The compute processes on a GPU (a ``list[ProcessMemory]``); the one place that lists them."""
    reading = nvml.first(("nvmlDeviceGetComputeRunningProcesses_v3",
                          "nvmlDeviceGetComputeRunningProcesses"), handle)

    def convert(infos: Iterable[Any]) -> list[ProcessMemory]:
        listed = []
        for info in infos:
            # pynvml gives None where NVML answers "not available" (WDDM, MIG, no permission).
            used = getattr(info, "usedGpuMemory", None)
            listed.append(ProcessMemory(
                pid=int(info.pid),
                used_memory=int(used) if isinstance(used, int) and used >= 0 else None))
        return listed

    return _converted(reading, convert)


def _process_figures(nvml: Nvml, handle: Any, pids: Collection[int] | None,
                     session_pids: Collection[int] | None
                     ) -> tuple[int | None, int | None, int | None]:
    """``DeviceSample``'s process fields from one listing of the GPU's compute processes: the
    memory of ``pids``, and the memory and number of processes outside ``session_pids``."""
    if pids is None:
        return None, None, None
    reading = _list_processes(nvml, handle)
    if not reading.ok:
        return None, None, None
    listed: list[ProcessMemory] = reading.value
    wanted = set(pids)
    own = MemoryHolders.split(listed, wanted).own_memory
    if session_pids is None or (listed and not any(p.pid in wanted for p in listed)):
        return own, None, None  # none asked, or another PID namespace: "others" unknown
    others = MemoryHolders.split(listed, wanted | set(session_pids))
    return own, others.other_memory, others.other_count


def read_processes(index: int, nvml: Nvml | None = None) -> Reading:
    """The compute processes on GPU ``index`` and their memory (a ``list[ProcessMemory]``)."""
    nvml = nvml or shared()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    return _list_processes(nvml, handle.value) if handle.ok else handle


def read_memory_holders(index: int, own_pids: Collection[int], nvml: Nvml | None = None
                        ) -> Reading:
    """The memory ``own_pids`` and all other processes hold on GPU ``index`` (``MemoryHolders``)."""
    nvml = nvml or shared()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    if not handle.ok:
        return handle
    wanted = set(own_pids)
    return _converted(_list_processes(nvml, handle.value),
                      lambda listed: MemoryHolders.split(listed, wanted))


# -- torch's cuda:N -> NVML index -----------------------------------------------------------------


def _bare_uuid(text: str) -> str:
    """A GPU UUID lower case without ``GPU-``: NVML says ``GPU-<hex>``, torch ``<hex>``."""
    text = text.strip().lower()
    return text[len("gpu-"):] if text.startswith("gpu-") else text


def _is_uuid_entry(entry: str) -> bool:
    return entry.upper().startswith("GPU-")


def _index_entry(entry: str, count: int) -> int | None:
    # CUDA reads an index like strtoul: its leading digits ("1gpu2" is 1).
    digits = re.match(r"\d+", entry)
    if digits is None:
        return None
    index = int(digits.group())
    return index if index < count else None


def _uuid_entry(entry: str, uuids: Sequence[str | None]) -> int | None:
    # A UUID entry may be any prefix that names exactly one GPU.
    if not _is_uuid_entry(entry):
        return None
    wanted = _bare_uuid(entry)
    if not wanted:
        return None
    matches = [index for index, uuid in enumerate(uuids)
               if uuid is not None and _bare_uuid(uuid).startswith(wanted)]
    return matches[0] if len(matches) == 1 else None


def visible_nvml_indices(visible: str | None, uuids: Sequence[str | None]) -> list[int]:
    """The NVML indices of cuda:0, cuda:1, ... under ``CUDA_VISIBLE_DEVICES=visible``.

    ``uuids`` holds every GPU's UUID in NVML order (None where NVML cannot read one). The variable
    is read as the CUDA driver reads it (and torch's ``_parse_visible_devices`` models it): unset
    shows every GPU; otherwise a list of indices, or of ``GPU-`` UUIDs where a unique prefix will
    do. The first entry that names no GPU (garbage, a negative or too large index, a ``MIG-``
    instance, an unknown or ambiguous UUID) hides itself and every entry after it, and a GPU
    named twice hides them all. Indices are taken in NVML (PCI bus) order, which is CUDA's order
    when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or the GPUs are all one model.
    """
    count = len(uuids)
    if visible is None:
        return list(range(count))
    entries = [entry.strip() for entry in visible.split(",")]
    by_uuid = _is_uuid_entry(entries[0])
    indices: list[int] = []
    for entry in entries:
        index = _uuid_entry(entry, uuids) if by_uuid else _index_entry(entry, count)
        if index is None:
            break
        if index in indices:
            return []
        indices.append(index)
    return indices


def _device_uuids(nvml: Nvml) -> list[str | None] | None:
    """Every GPU's UUID in NVML order (None for one NVML cannot read); None without NVML."""
    count = read_device_count(nvml)
    if not count.ok:
        return None
    uuids: list[str | None] = []
    for index in range(count.value):
        uuid = _converted(_device_call(nvml, index, "nvmlDeviceGetUUID"), _decode)
        uuids.append(uuid.value if uuid.ok else None)
    return uuids


def _torch_device_uuid(cuda_index: int) -> str | None:
    """torch's UUID for cuda:N, only where CUDA is initialised already (no new context)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return str(torch.cuda.get_device_properties(cuda_index).uuid) or None
    except Exception:  # a torch without .uuid, an index torch does not know, a broken context
        return None


def index_for_cuda_device(cuda_index: int, nvml: Nvml | None = None) -> int | None:
    """NVML index of torch's ``cuda:<cuda_index>``; None when NVML knows no such GPU.

    Once torch has initialised CUDA, the device's UUID settles it; before (or for a MIG
    instance, whose UUID no NVML GPU has), ``CUDA_VISIBLE_DEVICES`` does, read by
    ``visible_nvml_indices``. Creates no CUDA context and never raises.
    """
    nvml = nvml or shared()
    uuids = _device_uuids(nvml)
    if uuids is None or cuda_index < 0:
        return None
    torch_uuid = _torch_device_uuid(cuda_index)
    if torch_uuid is not None:
        wanted = _bare_uuid(torch_uuid)
        for index, uuid in enumerate(uuids):
            if uuid is not None and _bare_uuid(uuid) == wanted:
                return index
    visible = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
    return visible[cuda_index] if cuda_index < len(visible) else None
