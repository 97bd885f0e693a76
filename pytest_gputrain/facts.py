"""Facts: the one vocabulary between measuring (collect/) and judging (engine/, rules/).

Every fact is a typed field with a unit and a description. ``None`` is the legal "unknown" value,
and the model's ``unknown`` mapping says *why* a field is unknown ("NotSupported", "no driver",
...). Facts serialise to JSON, so a run recorded on a GPU host replays through the rules anywhere.

Rules address facts by dotted names (``device.memory_used``, ``torch.cuda_version``); see
``namespace`` below for how a fact set becomes those names.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from pytest_gputrain import scopes

SCHEMA_VERSION = 1

ComputeMode = Literal["default", "exclusive_thread", "prohibited", "exclusive_process"]


# Sizes and counts are never negative: a facts file that says so is refused, not judged. A
# field of these units that is a difference (a growth) says ``signed=True``; a count without a
# unit (GPUs, processes, an index, a version number, a bitmask) says ``count=True``.
NON_NEGATIVE_UNITS = ("bytes", "CPUs", "lanes")


def fact(unit: str | None = None, doc: str = "", default: Any = None,
         signed: bool = False, count: bool = False) -> Any:
    """A fact field: unknown (``None``) by default, with its unit recorded in the JSON schema.

    A number of a unit in ``NON_NEGATIVE_UNITS``, or a ``count``, must be 0 or more unless
    ``signed`` (only for a single number: a list of them is not checked).
    """
    extra: dict[str, Any] | None = {"unit": unit} if unit else None
    non_negative = (count or unit in NON_NEGATIVE_UNITS) and not signed
    bounds: dict[str, Any] = {"ge": 0} if non_negative else {}
    return Field(default=default, description=doc, json_schema_extra=extra, **bounds)


class FactGroup(BaseModel):
    """A group of facts; ``unknown`` maps a field name to why that field has no value."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    unknown: dict[str, str] = Field(default_factory=dict, description="field -> why unknown")

    def mark_unknown(self, field: str, reason: str) -> None:
        setattr(self, field, None)
        self.unknown[field] = reason

    @classmethod
    def unit_of(cls, field: str) -> str | None:
        info = cls.model_fields.get(field)
        extra = info.json_schema_extra if info else None
        if isinstance(extra, dict):
            unit = extra.get("unit")
            return unit if isinstance(unit, str) else None
        return None


class NvmlFacts(FactGroup):
    available: bool = fact(doc="NVML initialised and answered", default=False)
    reason: str | None = fact(doc="why NVML is not available (library missing, no driver, ...)")
    driver_version: str | None = fact(doc="NVIDIA driver version, e.g. 580.159.04")
    cuda_driver_version: str | None = fact(doc="highest CUDA version the driver supports, '13.0'")
    nvml_version: str | None = fact(doc="NVML library version")
    device_count: int | None = fact(doc="GPUs NVML sees (ignores CUDA_VISIBLE_DEVICES)", count=True)


class GpuProcess(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pid: int = Field(ge=0)
    name: str | None = None
    used_memory: int | None = fact("bytes", "GPU memory held by the process")
    own: bool = fact(doc="this test session's process (or one of its children)", default=False)


class DeviceFacts(FactGroup):
    index: int = fact(
        doc="NVML index (physical order, not CUDA_VISIBLE_DEVICES order)", default=0, count=True)
    torch_index: int | None = fact(
        doc="index as torch numbers it (cuda:N), if visible to torch", count=True)
    name: str | None = fact(doc="product name")
    uuid: str | None = fact(doc="GPU UUID")
    pci_bus_id: str | None = fact(doc="PCI bus id")
    lost: bool = fact(doc="the GPU fell off the bus / stopped answering", default=False)
    compute_capability: str | None = fact(doc="compute capability, '9.0'")
    memory_total: int | None = fact("bytes", "total device memory")
    memory_used: int | None = fact("bytes", "device memory in use (all processes)")
    memory_free: int | None = fact("bytes", "device memory free")
    temperature: float | None = fact("°C", "GPU core temperature")
    temperature_slowdown: float | None = fact("°C", "temperature at which the GPU slows down")
    power_draw: float | None = fact("W", "power draw")
    power_limit: float | None = fact("W", "enforced power limit")
    power_limit_default: float | None = fact("W", "default power limit of the board")
    utilization_gpu: float | None = fact("%", "time with a kernel running, last sample period")
    sm_clock: float | None = fact("MHz", "current SM clock")
    sm_clock_max: float | None = fact("MHz", "maximum SM clock")
    clock_event_reasons: int | None = fact(
        doc="NVML clock event (throttle) reason bitmask", count=True)
    throttle_reasons: list[str] | None = fact(doc="decoded active clock event reasons")
    throttle_sw_power_cap: bool | None = fact(doc="clocks held down by the software power cap")
    throttle_hw_slowdown: bool | None = fact(doc="hardware slowdown (power brake or overheating)")
    throttle_sw_thermal: bool | None = fact(doc="software thermal slowdown")
    throttle_hw_thermal: bool | None = fact(doc="hardware thermal slowdown")
    throttle_hw_power_brake: bool | None = fact(doc="hardware power brake (external signal)")
    pcie_gen: int | None = fact(doc="current PCIe link generation", count=True)
    pcie_gen_max: int | None = fact(
        doc="maximum PCIe generation of GPU and slot together", count=True)
    pcie_width: int | None = fact("lanes", "current PCIe link width")
    pcie_width_max: int | None = fact("lanes", "maximum PCIe link width")
    ecc_enabled: bool | None = fact(doc="ECC mode on")
    ecc_uncorrected_volatile: int | None = fact(
        doc="uncorrectable ECC errors since driver load", count=True)
    retired_pages: int | None = fact(doc="pages retired for ECC errors (older GPUs)", count=True)
    retired_pages_pending: bool | None = fact(doc="a page retirement waits for a GPU reset")
    remapped_rows_pending: bool | None = fact(doc="a row remap waits for a GPU reset")
    remapped_rows_failed: bool | None = fact(doc="a row remap failed")
    compute_mode: ComputeMode | None = fact(doc="compute mode")
    mig_enabled: bool | None = fact(doc="MIG mode on")
    persistence_mode: bool | None = fact(doc="persistence mode on")
    processes: list[GpuProcess] | None = fact(doc="compute processes on the GPU")
    other_process_count: int | None = fact(
        doc="compute processes other than this session's", count=True)
    other_process_memory: int | None = fact("bytes", "memory held by other processes")


class DeviceSample(BaseModel):
    """One timed NVML sample of a GPU, taken by samplers (cheap: six NVML calls)."""

    model_config = ConfigDict(extra="forbid")

    t: float = fact("s", "seconds since the sampler started", default=0.0)
    utilization_gpu: float | None = fact("%", "time with a kernel running")
    memory_used: int | None = fact("bytes", "device memory in use")
    power_draw: float | None = fact("W", "power draw")
    temperature: float | None = fact("°C", "GPU temperature")
    sm_clock: float | None = fact("MHz", "SM clock")
    clock_event_reasons: int | None = fact(doc="NVML clock event reason bitmask", count=True)
    process_memory: int | None = fact(
        "bytes", "GPU memory held by the processes a sampler was asked to follow (else unknown)")
    other_process_memory: int | None = fact(
        "bytes", "GPU memory held by processes outside the session a sampler was given (else "
                 "unknown; also unknown when NVML lists this process under another PID)")
    other_process_count: int | None = fact(
        doc="processes outside that session on the GPU", count=True)


class TorchFacts(FactGroup):
    installed: bool = fact(doc="torch importable", default=False)
    reason: str | None = fact(doc="why torch could not be imported")
    version: str | None = fact(doc="torch version")
    cuda_version: str | None = fact(doc="CUDA runtime torch was built with; None on CPU builds")
    hip_version: str | None = fact(doc="ROCm/HIP version for ROCm builds")
    cuda_available: bool | None = fact(doc="torch.cuda.is_available()")
    cuda_init_error: str | None = fact(doc="what torch said when CUDA did not initialise")
    device_count: int | None = fact(
        doc="devices torch sees (after CUDA_VISIBLE_DEVICES)", count=True)
    arch_list: list[str] | None = fact(doc="architectures the build has kernels for, sm_90 ...")
    cudnn_version: int | None = fact(doc="cuDNN version, e.g. 91002", count=True)
    cudnn_enabled: bool | None = fact(doc="torch.backends.cudnn.enabled")
    cudnn_benchmark: bool | None = fact(doc="torch.backends.cudnn.benchmark")
    cudnn_deterministic: bool | None = fact(doc="torch.backends.cudnn.deterministic")
    deterministic_algorithms: bool | None = fact(doc="torch.are_deterministic_algorithms_enabled")
    anomaly_detection: bool | None = fact(doc="torch.is_anomaly_enabled()")
    tf32_matmul: bool | None = fact(doc="torch.backends.cuda.matmul.allow_tf32")
    float32_matmul_precision: str | None = fact(doc="torch.get_float32_matmul_precision()")
    bf16_supported: bool | None = fact(doc="torch.cuda.is_bf16_supported() on cuda:0")
    nccl_version: str | None = fact(doc="NCCL version torch bundles")


class HostFacts(FactGroup):
    os: str | None = fact(doc="operating system and kernel")
    python_version: str | None = fact(doc="Python version")
    cpu_count_logical: int | None = fact("CPUs", "logical CPUs")
    cpu_count_physical: int | None = fact("CPUs", "physical cores")
    cpu_affinity_count: int | None = fact("CPUs", "CPUs this process may run on")
    memory_total: int | None = fact("bytes", "host RAM")
    memory_available: int | None = fact("bytes", "host RAM available")
    shm_total: int | None = fact("bytes", "size of /dev/shm")
    shm_free: int | None = fact("bytes", "free space in /dev/shm")
    in_container: bool | None = fact(doc="running in a container")


class EnvFacts(FactGroup):
    """Only the variables that matter to GPU training; nothing else is read (no secrets leak)."""

    variables: dict[str, str] = Field(default_factory=dict, description="relevant variables set")
    cuda_visible_devices: str | None = fact(doc="CUDA_VISIBLE_DEVICES, None when unset")
    cuda_launch_blocking: bool = fact(doc="CUDA_LAUNCH_BLOCKING=1", default=False)
    pytorch_cuda_alloc_conf: str | None = fact(doc="PYTORCH_CUDA_ALLOC_CONF")
    nccl_variables: dict[str, str] = Field(default_factory=dict, description="NCCL_* variables")
    cuda_memory_caching_disabled: bool = fact(
        doc="PYTORCH_NO_CUDA_MEMORY_CACHING is set (not 0): every allocation is a cudaMalloc",
        default=False)
    compile_debug_settings: list[str] = Field(
        default_factory=list,
        description="torch.compile debugging switches that are on (TORCH_COMPILE_DEBUG=1, "
                    "TORCH_LOGS=+dynamo, TORCH_TRACE, ...), as NAME=value")


class ToolFacts(FactGroup):
    nvcc_version: str | None = fact(doc="CUDA toolkit (nvcc) version on PATH / CUDA_HOME")
    nvcc_path: str | None = fact(doc="where nvcc was found")


TopologyLevel = Literal["internal", "single", "multiple", "hostbridge", "node", "system"]


class GpuPairFacts(FactGroup):
    """How two GPUs reach each other (NVML indices)."""

    a: int = Field(ge=0)
    b: int = Field(ge=0)
    common_ancestor: TopologyLevel | None = fact(
        doc="closest common PCIe ancestor: internal (same board), single / multiple (PCIe "
            "switches), hostbridge (a CPU's PCIe host bridge), node (host bridges of one NUMA "
            "node), system (across CPU sockets)")
    p2p_read: str | None = fact(doc="NVML P2P read status: ok, not_supported, "
                                    "chipset_not_supported, gpu_not_supported, "
                                    "ioh_topology_not_supported, disabled_by_regkey, unknown")
    p2p_nvlink: bool | None = fact(doc="peer-to-peer over NVLink is possible")


class TopologyFacts(FactGroup):
    """How the GPUs are linked (NVML topology and P2P status), over the GPUs torch can use."""

    gpu_count: int | None = fact(
        doc="GPUs the topology covers (those torch sees, else all)", count=True)
    pair_count: int | None = fact(doc="GPU pairs examined", count=True)
    pairs: list[GpuPairFacts] | None = fact(doc="every GPU pair")
    nvlink_pair_count: int | None = fact(
        doc="pairs that can talk peer-to-peer over NVLink", count=True)
    nvlink_active_links: list[int | None] | None = fact(
        doc="active NVLink links per GPU (None where NVML answers NotSupported)")
    gpu_pairs_without_p2p: list[str] | None = fact(
        doc="pairs ('0-1') for which NVML reports no peer-to-peer access")
    gpu_pairs_over_system: list[str] | None = fact(
        doc="pairs without NVLink whose traffic crosses CPU host bridges or sockets (NODE/SYS)")
    gpu_pairs_without_nvlink: list[str] | None = fact(doc="pairs with no NVLink path")


class EnvironmentFacts(BaseModel):
    """Everything collected about the machine once per session."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    collected_at: str = ""
    collector_seconds: float | None = None
    nvml: NvmlFacts = Field(default_factory=NvmlFacts)
    devices: list[DeviceFacts] = Field(default_factory=list)
    torch: TorchFacts = Field(default_factory=TorchFacts)
    host: HostFacts = Field(default_factory=HostFacts)
    env: EnvFacts = Field(default_factory=EnvFacts)
    tools: ToolFacts = Field(default_factory=ToolFacts)
    topology: TopologyFacts = Field(default_factory=TopologyFacts)


class FactsFile(BaseModel):
    """What ``--gpu-facts-out`` writes and ``python -m pytest_gputrain replay`` reads.

    ``records`` holds what the features recorded, by scope name, as plain JSON objects (so that
    this module depends on no feature's models). In the file each recorded scope keeps its
    records under its own key (``runs``, ``failures``, ``distributed``), as it always has.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    kind: Literal["pytest-gputrain-facts"] = "pytest-gputrain-facts"
    environment: EnvironmentFacts
    records: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description="scope name -> the records features added")

    @model_validator(mode="before")
    @classmethod
    def _records_from_their_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "records" in data:
            return data
        data = dict(data)
        data["records"] = {scope.name: data.pop(scope.records_key)
                           for scope in scopes.recorded() if scope.records_key in data}
        return data

    @field_validator("records")
    @classmethod
    def _recorded_scopes_only(cls, records: dict[str, list[dict[str, Any]]]
                              ) -> dict[str, list[dict[str, Any]]]:
        for name in records:
            try:
                scope = scopes.get(name)
            except scopes.UnknownScopeError as exc:
                raise ValueError(str(exc)) from None
            if not scope.recorded:
                raise ValueError(f"scope {name!r} records nothing: its facts come from the "
                                 "environment")
        return records

    @model_serializer(mode="wrap")
    def _records_under_their_keys(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        records = data.pop("records")
        for scope in scopes.recorded():  # every recorded scope, empty or not, in a stable order
            data[scope.records_key] = records.pop(scope.name, [])
        if records:
            raise ValueError(f"records of unregistered scope(s) {', '.join(sorted(records))}")
        return data


@functools.cache
def _names_of(model: type[BaseModel], prefix: str
              ) -> tuple[tuple[str, str, str | None], ...]:
    """(dotted name, field, unit) of each field of ``model`` but ``unknown``: worked out once
    per model and prefix, since a replay flattens thousands of records of the same models."""
    names = []
    for name, info in model.model_fields.items():
        if name == "unknown":
            continue
        extra = info.json_schema_extra
        unit = extra.get("unit") if isinstance(extra, dict) else None
        names.append((f"{prefix}.{name}", name, unit if isinstance(unit, str) else None))
    return tuple(names)


def group_namespace(prefix: str, group: BaseModel) -> dict[str, tuple[Any, str | None, str | None]]:
    """Flatten a model into ``{"prefix.field": (value, unit, why_unknown)}``."""
    result: dict[str, tuple[Any, str | None, str | None]] = {}
    unknown = getattr(group, "unknown", {})
    values = group.__dict__
    for dotted, name, unit in _names_of(type(group), prefix):
        value = values[name]
        if isinstance(value, BaseModel):
            result.update(group_namespace(dotted, value))
            continue
        if isinstance(value, list) and value and isinstance(value[0], BaseModel):
            value = [item.model_dump() for item in value]
        result[dotted] = (value, unit, unknown.get(name))
    return result


# While a recording is judged, the session's names are those of one environment that does not
# change: built once (session_namespace_of), not once per record.
_SESSION_NAMES: contextvars.ContextVar[
    tuple[EnvironmentFacts, dict[str, tuple[Any, str | None, str | None]]] | None
] = contextvars.ContextVar("gputrain_session_names", default=None)


@contextlib.contextmanager
def session_namespace_of(env: EnvironmentFacts) -> Iterator[None]:
    """Within the block, ``session_namespace(env)`` is built once and copied (a block inside
    another one for the same environment builds nothing more)."""
    cached = _SESSION_NAMES.get()
    if cached is not None and cached[0] is env:
        yield
        return
    token = _SESSION_NAMES.set((env, _build_session_namespace(env)))
    try:
        yield
    finally:
        _SESSION_NAMES.reset(token)


def session_namespace(env: EnvironmentFacts) -> dict[str, tuple[Any, str | None, str | None]]:
    """The names a session-scope rule can use: nvml.*, torch.*, host.*, env.*, tools.*."""
    cached = _SESSION_NAMES.get()
    if cached is not None and cached[0] is env:
        return dict(cached[1])  # callers add their own names to it
    return _build_session_namespace(env)


def _build_session_namespace(env: EnvironmentFacts
                             ) -> dict[str, tuple[Any, str | None, str | None]]:
    names: dict[str, tuple[Any, str | None, str | None]] = {}
    for prefix in ("nvml", "torch", "host", "env", "tools", "topology"):
        names.update(group_namespace(prefix, getattr(env, prefix)))
    # Aggregates over devices that session rules need without a loop construct.
    names["devices.count"] = (len(env.devices), None, None)
    names["devices.names"] = (sorted({d.name for d in env.devices if d.name}), None, None)
    names["devices.torch_names"] = (
        sorted({d.name for d in env.devices if d.name and d.torch_index is not None}), None, None)
    names["env.nccl_fast_paths_disabled"] = (
        nccl_fast_paths_disabled(env.env.nccl_variables), None, None)
    return names


# NCCL variables that switch off a transport or GPUDirect path when set as shown (NCCL's
# environment variable documentation). NCCL_NVLS_ENABLE=0 is left out on purpose: turning NVLink
# SHARP off is a common, deliberate setting (some hosts and VMs must keep it off).
_NCCL_DISABLING: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("NCCL_P2P_DISABLE", ("nonzero",), "GPU peer-to-peer (NVLink/PCIe) off"),
    ("NCCL_SHM_DISABLE", ("nonzero",), "shared-memory transport off"),
    ("NCCL_IB_DISABLE", ("nonzero",), "InfiniBand/RoCE off: sockets between hosts"),
    ("NCCL_P2P_LEVEL", ("LOC", "0"), "peer-to-peer never used"),
    ("NCCL_NET_GDR_LEVEL", ("LOC", "0"), "GPUDirect RDMA off"),
    ("NCCL_IB_GDR_LEVEL", ("LOC", "0"), "GPUDirect RDMA off"),
)


def nccl_fast_paths_disabled(variables: dict[str, str]) -> list[str]:
    """``["NCCL_P2P_DISABLE=1 (GPU peer-to-peer (NVLink/PCIe) off)", ...]`` from NCCL_* values."""
    found = []
    for name, values, meaning in _NCCL_DISABLING:
        if name not in variables:
            continue
        raw = variables[name].strip()
        if values == ("nonzero",):
            try:
                hit = int(raw, 0) != 0
            except ValueError:
                hit = False  # NCCL reads these with strtol: "true" counts as 0
        else:
            hit = raw.upper() in values
        if hit:
            found.append(f"{name}={raw} ({meaning})")
    return found


def device_namespace(
    env: EnvironmentFacts, device: DeviceFacts
) -> dict[str, tuple[Any, str | None, str | None]]:
    """Session names plus ``device.*`` for one GPU."""
    names = session_namespace(env)
    names.update(group_namespace("device", device))
    return names


def device_subject(device: DeviceFacts) -> str:
    """'GPU 0 NVIDIA H200', with torch's number when it differs: 'GPU 3 NVIDIA H200 (cuda:0)'."""
    subject = f"GPU {device.index}" + (f" {device.name}" if device.name else "")
    if device.torch_index is not None and device.torch_index != device.index:
        subject += f" (cuda:{device.torch_index})"
    return subject


# The core's scopes: the machine once per session, and each GPU.
scopes.register(scopes.Scope(
    name="session",
    model=EnvironmentFacts,
    namespace=lambda env, record, related: session_namespace(record),
    subject=lambda record: "session",
    from_environment=lambda env: [env],
))
scopes.register(scopes.Scope(
    name="device",
    model=DeviceFacts,
    namespace=lambda env, device, related: device_namespace(env, device),
    subject=device_subject,
    from_environment=lambda env: env.devices,
))
