"""GPU failures: classify the exception, read what can still be read, never touch a dead context.

Classification works on the exception's type name and text alone, so a recorded failure (or a
synthetic ``RuntimeError("CUDA out of memory ...")``) is classified the same way anywhere. After
a *sticky* error (illegal memory access, device-side assert, launch failure, any unrecognised
CUDA error) the CUDA context is unusable and every further CUDA call fails or hangs: nothing is
asked of CUDA then; NVML (a separate library) may still be read.
"""

from __future__ import annotations

import os
import re
from types import TracebackType
from typing import Any

from pytest_gputrain.probe.memory_peaks import own_peaks
from pytest_gputrain.probe.oom_message import parse_oom as parse_oom  # re-exported
from pytest_gputrain.run_facts import FailureFacts, FailureKind

# (kind, patterns); the first kind with a matching pattern wins, so the order matters.
_PATTERNS: tuple[tuple[FailureKind, tuple[str, ...]], ...] = (
    ("oom", ("cuda out of memory", "outofmemoryerror", "cublas_status_alloc_failed",
             "cudaerrormemoryallocation", "cuda error: out of memory",
             "cudnn_status_alloc_failed", "hip out of memory")),
    ("device_mismatch", ("expected all tensors to be on the same device",
                         "should be the same or input should be a mkldnn tensor",
                         "but expected it to be on gpu", "expected object of device type",
                         "to be on the same device", "is on cpu, different from other tensors",
                         "different from other tensors on cuda",
                         "indices should be either on cpu or on the same device")),
    ("no_kernel_image", ("no kernel image is available", "cudaerrornokernelimagefordevice",
                         "invalid device function")),
    ("driver_too_old", ("driver on your system is too old",
                        "cuda driver version is insufficient", "cudaerrorinsufficientdriver",
                        "driver version is insufficient")),
    ("device_side_assert", ("device-side assert triggered", "cudaerrorassert",
                            "device-side assertion")),
    ("illegal_memory_access", ("illegal memory access", "cudaerrorillegaladdress",
                               "misaligned address", "illegal instruction",
                               "cudaerrormisalignedaddress")),
    ("launch_failure", ("unspecified launch failure", "cudaerrorlaunchfailure",
                        "the launch timed out", "launch timeout", "uncorrectable ecc error",
                        "gpu has fallen off the bus")),
    ("nccl", ("nccl", "processgroupnccl", "distbackenderror",
              "watchdog caught collective operation timeout")),
    ("cudnn", ("cudnn_status", "cudnn error")),
    ("cublas", ("cublas_status", "cublas error")),
    ("cuda_other", ("cuda error", "cuda driver error", "cudaerror", "cuda kernel errors",
                    "cuda runtime error")),
)

# After these the context is dead: no CUDA call may be made (it would fail or hang).
STICKY: frozenset[str] = frozenset(
    {"illegal_memory_access", "device_side_assert", "launch_failure", "cuda_other", "nccl"})



def classify(exc_type: str, message: str) -> FailureKind:
    """The kind of GPU failure an exception is ('not_gpu' when it is none)."""
    text = f"{exc_type}: {message}".lower()
    if exc_type.rsplit(".", 1)[-1] in ("RankFailure", "RankTimeout"):
        return "not_gpu"  # the distributed launcher's own diagnosis (GT308) has the rank detail
    if exc_type.rsplit(".", 1)[-1] == "OutOfMemoryError" and "cuda" in text:
        return "oom"
    for kind, patterns in _PATTERNS:
        if any(pattern in text for pattern in patterns):
            if kind == "nccl" and not _looks_nccl(text):
                continue
            return kind
    return "not_gpu"


def _looks_nccl(text: str) -> bool:
    # NCCL as a word or an NCCL error name, not "nccl" inside a file name.
    return re.search(r"\bnccl\b|nccl(?:unhandled|system|internal|invalid|remote)"
                     r"|processgroupnccl|distbackenderror|watchdog caught collective",
                     text) is not None


def parse_devices(message: str) -> list[str]:
    """Devices an error message names, in order (cuda:0, cpu; torch.cuda.FloatTensor -> cuda)."""
    devices: list[str] = []
    for match in re.finditer(
            r"\b(cuda:\d+|cuda|cpu|mps|meta|xpu:\d+|xpu)\b|torch\.(cuda\.)?\w*Tensor",
            message, re.IGNORECASE):
        device = match.group(1).lower() if match.group(1) else (
            "cuda" if match.group(2) else "cpu")
        if device not in devices:
            devices.append(device)
    return devices


def nccl_error(message: str) -> str | None:
    text = message.lower()
    for needle, label in (("unhandled cuda error", "unhandled cuda error"),
                          ("unhandledcudaerror", "unhandled cuda error"),
                          ("system error", "system error"), ("systemerror", "system error"),
                          ("internal error", "internal error"), ("internalerror", "internal error"),
                          ("invalid usage", "invalid usage"), ("invalidusage", "invalid usage"),
                          ("remote error", "remote error"), ("remoteerror", "remote error"),
                          ("timeout", "timeout"), ("timed out", "timeout")):
        if needle in text:
            return label
    return None


def _devices_of(tensors: list[Any]) -> list[str]:
    devices: list[str] = []
    for tensor in tensors:
        try:
            device = str(tensor.device)
        except Exception:
            continue
        if device not in devices:
            devices.append(device)
    return devices


def _tensors_in(value: Any, depth: int = 0) -> list[Any]:
    if hasattr(value, "device") and hasattr(value, "dtype") and hasattr(value, "shape"):
        return [value]
    if depth >= 2:
        return []
    items: list[Any] = []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, list | tuple):
        items = list(value)
    found: list[Any] = []
    for item in items[:32]:
        found.extend(_tensors_in(item, depth + 1))
    return found


def traceback_module(tb: TracebackType | None, torch: Any) -> dict[str, Any]:
    """The innermost nn.Module in the traceback: class, path in the outermost, devices."""
    if tb is None or torch is None:
        return {}
    module_type = torch.nn.Module
    modules: list[tuple[Any, Any]] = []  # (module, frame)
    while tb is not None:
        frame = tb.tb_frame
        candidate = frame.f_locals.get("self")
        name = frame.f_code.co_name
        # Keep one entry per module call; its forward frame (which holds the arguments) wins.
        if isinstance(candidate, module_type) and name in (
                "forward", "_call_impl", "_wrapped_call_impl", "_conv_forward") and (
                not modules or modules[-1][0] is not candidate
                or name in ("forward", "_conv_forward")):
            modules.append((candidate, frame))
        tb = tb.tb_next
    if not modules:
        return {}
    inner, frame = modules[-1]
    outer = modules[0][0]
    code = frame.f_code
    arguments = [frame.f_locals.get(name) for name in code.co_varnames[:code.co_argcount]
                 if name != "self"]
    if code.co_name in ("_call_impl", "_wrapped_call_impl"):
        arguments = [frame.f_locals.get("args"), frame.f_locals.get("kwargs")]
    inputs = [t for value in arguments for t in _tensors_in(value)]
    params = list(inner.parameters(recurse=False)) or list(inner.parameters())
    path = type(inner).__name__
    if outer is not inner:
        for name, sub in outer.named_modules():
            if sub is inner:
                path = f"{type(outer).__name__}.{name} ({type(inner).__name__})"
                break
    return {
        "module": type(inner).__name__,
        "module_path": path,
        "module_param_devices": _devices_of(params),
        "module_input_devices": _devices_of(inputs),
    }


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def expandable_segments(conf: str | None = None) -> bool:
    text = conf if conf is not None else (os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
                                          or os.environ.get("PYTORCH_ALLOC_CONF") or "")
    return re.search(r"expandable_segments\s*:\s*true", text, re.IGNORECASE) is not None


def allocator_state(torch: Any, index: int) -> dict[str, Any]:
    """Allocator and device memory of cuda:index; only call while the context is usable."""
    state: dict[str, Any] = {}
    if torch is None or not torch.cuda.is_initialized():
        return state
    stats = torch.cuda.memory_stats(index)
    state["allocated"] = int(stats.get("allocated_bytes.all.current", 0))
    state["reserved"] = int(stats.get("reserved_bytes.all.current", 0))
    state["peak_allocated"] = int(stats.get("allocated_bytes.all.peak", 0))
    state["peak_reserved"] = int(stats.get("reserved_bytes.all.peak", 0))
    state["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
    state["num_ooms"] = int(stats.get("num_ooms", 0))
    free, total = torch.cuda.mem_get_info(index)
    state["free"], state["total"] = int(free), int(total)
    fraction = memory_fraction(torch, index)
    if fraction is not None:
        state["fraction"] = fraction
    return state


def memory_fraction(torch: Any, index: int) -> float | None:
    """set_per_process_memory_fraction in force (torch >= 2.8 can read it back)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is None:
        getter = getattr(getattr(torch.cuda, "memory", None), "get_per_process_memory_fraction",
                         None)
    if getter is not None:
        return float(getter(index))
    raw = getattr(torch._C, "_cuda_getMemoryFraction", None)
    return float(raw(index)) if raw is not None else None


def build_failure(nodeid: str, when: str, exc: BaseException, tb: TracebackType | None,
                  probe: Any = None, torch: Any = None,
                  state: dict[str, Any] | None = None) -> FailureFacts | None:
    """FailureFacts for a GPU failure, or None when the exception is not a GPU error.

    ``state`` is the allocator state taken right after the failure (``snapshot``); the rest
    comes from the message, the traceback, the probe's records and NVML.
    """
    exc_type = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    message = str(exc)
    kind = classify(exc_type, message)
    if kind == "not_gpu":
        return None
    facts = FailureFacts(nodeid=nodeid, when=when, exc_type=exc_type, message=message[:2000],
                         kind=kind, sticky=kind in STICKY)
    facts.launch_blocking = _env_flag("CUDA_LAUNCH_BLOCKING")
    facts.dsa_enabled = _env_flag("TORCH_USE_CUDA_DSA")
    facts.expandable_segments = expandable_segments()
    facts.world_size = _env_int("WORLD_SIZE")
    facts.rank = _env_int("RANK")
    facts.local_world_size = _env_int("LOCAL_WORLD_SIZE")
    facts.devices = parse_devices(message) if kind == "device_mismatch" else []
    if kind == "nccl":
        facts.nccl_error = nccl_error(message)
    if kind == "oom":
        _fill_oom(facts, message, state or {}, probe)
    if kind == "device_mismatch":
        _fill_mismatch(facts, tb, probe, torch)
    if kind == "no_kernel_image":
        _fill_arch(facts, probe, torch)
    if facts.sticky:
        facts.unknown["allocated"] = f"the CUDA context is unusable after a {kind} error"
    return facts


def _fill_oom(facts: FailureFacts, message: str, state: dict[str, Any], probe: Any) -> None:
    """The out-of-memory figures of the failure's own moment.

    In order of trust: the allocator's out-of-memory observer and PyTorch's message (both
    written at the failure), then what the probe read while the test trained (the last memory
    fraction read at a step, other processes in the last NVML samples), and only then the
    allocator read after the test unwound (``state``: its ``finally:`` blocks have run by then;
    peaks and counters come from there). Figures that describe the test's own use are reported
    against what it found when it started (``reserved_start``).
    """
    parsed = parse_oom(message)
    context = _probe_context(probe)
    for key in ("requested", "device_index", "total", "free", "process_in_use", "allocated",
                "reserved", "reserved_unallocated", "private_pools", "fraction_limit",
                "allocator_backend"):
        if key in parsed:
            setattr(facts, key, parsed[key])
    if parsed.get("processes_listed") and "other_processes" in parsed:
        facts.other_processes = parsed["other_processes"]
        facts.other_process_count = parsed["other_process_count"]
    moment = _matching_moment(context.get("oom_moments", []), facts.requested)
    facts.oom_observed = moment is not None
    if moment is not None:
        _fill_from_moment(facts, moment, state)
    # Read after the failure: fill what the moment left unknown; peaks and counters.
    for key in ("allocated", "reserved", "free", "total"):
        if getattr(facts, key) is None and state.get(key) is not None:
            setattr(facts, key, state[key])
    for key in ("num_alloc_retries", "num_ooms"):
        if state.get(key) is not None:
            setattr(facts, key, state[key])
    _fill_fraction(facts, context, state)
    _fill_own_peaks(facts, context, state)
    if facts.other_processes is None:
        before = context.get("other_processes_before")
        after = state.get("other_processes")
        facts.other_processes = before if before is not None else after
    if facts.reserved is not None and facts.allocated is not None and \
            facts.reserved_unallocated is None:
        facts.reserved_unallocated = max(0, facts.reserved - facts.allocated)
    if facts.reserved_unallocated is not None and facts.reserved:
        facts.reserved_unallocated_percent = round(
            100.0 * facts.reserved_unallocated / facts.reserved, 2)
    if facts.total is not None:
        if facts.fraction_limit is None:
            fraction = facts.fraction if facts.fraction is not None else 1.0
            facts.fraction_limit = int(facts.total * fraction)
        others = facts.other_processes or 0
        facts.budget = min(facts.fraction_limit, facts.total - others)
    batch = getattr(probe, "batch_size", None) if probe is not None else None
    if isinstance(batch, int):
        facts.batch_size = batch
    for key, reason in (("fraction", "not readable (torch < 2.8) or CUDA not initialised"),
                        ("other_processes", "NVML could not list processes")):
        if getattr(facts, key) is None:
            facts.unknown[key] = reason


def _probe_context(probe: Any) -> dict[str, Any]:
    reader = getattr(probe, "failure_context", None) if probe is not None else None
    if reader is None:
        return {}
    try:
        return dict(reader())
    except Exception:
        return {}


def _matching_moment(moments: list[Any], requested: int | None) -> Any:
    """The observed out-of-memory moment of this failure: the last one, if its request is the
    message's (which torch rounds to two decimals of its unit)."""
    if not moments:
        return None
    last = moments[-1]
    if requested is None or abs(last.requested - requested) <= max(0.01 * requested, 1024):
        return last
    return None


def _fill_from_moment(facts: FailureFacts, moment: Any, state: dict[str, Any]) -> None:
    facts.requested = moment.requested
    facts.device_index = moment.device_index
    facts.free = moment.free
    total = facts.total if facts.total is not None else state.get("total")
    if total is not None and moment.limit < total:
        facts.fraction_limit = moment.limit
    elif total is not None:
        facts.fraction_limit = total  # no fraction, or 1.0: the device's total is the limit
    if facts.other_processes is None and moment.other_processes is not None:
        facts.other_processes = moment.other_processes
        facts.other_process_count = moment.other_process_count


def _fill_fraction(facts: FailureFacts, context: dict[str, Any], state: dict[str, Any]) -> None:
    """The memory fraction in force at the failure: from the limit the allocator or the message
    gave, else the last read while the test trained, else one read after the failure, else the
    allocator configuration."""
    total = facts.total if facts.total is not None else state.get("total")
    if facts.fraction_limit is not None and total:
        facts.fraction = round(min(1.0, facts.fraction_limit / total), 4)
        return
    trained = context.get("settings", {}).get("memory_fraction")
    for value in (trained, state.get("fraction"), configured_fraction()):
        if value is not None:
            facts.fraction = float(value)
            return


def configured_fraction(conf: str | None = None) -> float | None:
    """``per_process_memory_fraction:`` in the allocator configuration (recent torch)."""
    text = conf if conf is not None else (os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
                                          or os.environ.get("PYTORCH_ALLOC_CONF") or "")
    match = re.search(r"per_process_memory_fraction\s*:\s*([0-9.]+)", text, re.IGNORECASE)
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if 0.0 < value <= 1.0 else None


def _fill_own_peaks(facts: FailureFacts, context: dict[str, Any], state: dict[str, Any]) -> None:
    """The test's own peaks (``own_peaks``): not the cache earlier tests left reserved."""
    end = {key: state[name] for key, name in (("allocated_bytes.all.peak", "peak_allocated"),
                                              ("reserved_bytes.all.peak", "peak_reserved"))
           if state.get(name) is not None}
    found = own_peaks(context.get("allocator_start", {}), end,
                      context.get("peaks_before_reset", {}))
    for name, value in found.items():
        setattr(facts, name, value)


def read_other_processes(nvml_index: int, session_pids: set[int]) -> tuple[int, int] | None:
    """(memory, count) of the processes outside ``session_pids`` on GPU ``nvml_index``; None
    when NVML cannot list them, or lists others but not this process (another PID namespace:
    this process would be counted among the others)."""
    from pytest_gputrain.collect import nvml

    listed = nvml.read_processes(nvml_index)
    if not listed.ok:
        return None
    processes: list[nvml.ProcessMemory] = listed.value
    if processes and not any(process.pid == os.getpid() for process in processes):
        return None
    holders = nvml.MemoryHolders.split(processes, session_pids | {os.getpid()})
    return int(holders.other_memory), int(holders.other_count)


def _fill_mismatch(facts: FailureFacts, tb: TracebackType | None, probe: Any,
                   torch: Any) -> None:
    try:
        found = traceback_module(tb, torch)
    except Exception as exc:
        found = {}
        facts.unknown["module"] = f"traceback not readable: {exc}"
    last = getattr(probe, "last_forward", None) if probe is not None else None
    if not found and last is not None:
        found = {"module": last.module, "module_path": last.module,
                 "module_param_devices": list(last.param_devices),
                 "module_input_devices": list(last.input_devices)}
    for key, value in found.items():
        setattr(facts, key, value)


def _fill_arch(facts: FailureFacts, probe: Any, torch: Any) -> None:
    # "no kernel image" is not sticky: the context still answers.
    index = facts.device_index or 0
    if torch is not None:
        try:
            facts.arch_list = list(torch.cuda.get_arch_list())
        except Exception as exc:
            facts.unknown["arch_list"] = str(exc)
    capability = getattr(probe, "compute_capability", None) if probe is not None else None
    if capability is None and torch is not None:
        try:
            major, minor = torch.cuda.get_device_capability(index)
            capability = f"{major}.{minor}"
        except Exception:
            capability = None
    if capability is None:
        capability = nvml_capability(index)
    facts.compute_capability = capability


def nvml_capability(cuda_index: int) -> str | None:
    """Compute capability via NVML (no new CUDA context), mapping through CUDA_VISIBLE_DEVICES."""
    from pytest_gputrain.collect import nvml

    index = nvml.index_for_cuda_device(cuda_index)
    if index is None:
        return None
    reading = nvml.read_compute_capability(index)
    return f"{reading.value[0]}.{reading.value[1]}" if reading.ok else None


def snapshot(torch: Any, kind: FailureKind, index: int | None) -> dict[str, Any]:
    """Allocator state right after a failure; empty unless it is an OOM (safe to read)."""
    if kind != "oom" or torch is None:
        return {}
    try:
        if not torch.cuda.is_initialized():
            return {}
        if index is None:
            index = int(torch.cuda.current_device())
        state = allocator_state(torch, index)
        state["other_processes"] = other_process_memory(index)
        return state
    except Exception:
        return {}


def other_process_memory(cuda_index: int) -> int | None:
    """Memory other processes hold on cuda:index, via NVML (None when NVML cannot say)."""
    from pytest_gputrain.collect import nvml

    index = nvml.index_for_cuda_device(cuda_index)
    if index is None:
        return None
    others = read_other_processes(index, nvml.session_process_ids())
    return others[0] if others is not None else None
