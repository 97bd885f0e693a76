"""GPU failures: classify the exception, read what can still be read, never touch a dead context.

Classification (``failure_kinds.py``) works on the exception's type name and text alone, so a
recorded failure (or a synthetic ``RuntimeError("CUDA out of memory ...")``) is classified the
same way anywhere; this module adds what the traceback, the allocator and NVML tell. After
a *sticky* error (illegal memory access, device-side assert, launch failure, any unrecognised
CUDA error) the CUDA context is unusable and every further CUDA call fails or hangs: nothing is
asked of CUDA then; NVML (a separate library) may still be read.
"""

from __future__ import annotations

import os
import re
from types import TracebackType
from typing import Any

from pytest_gputrain.probe.failure_facts import FailureFacts, FailureKind
from pytest_gputrain.probe.failure_kinds import (
    MEMORY_KINDS,
    NO_CUDA_CALLS,
    STICKY,
    chain_text,
    classify,
    classify_exception,
    compile_stage,
    cuda_unavailable_cause,
    dead_worker_signal,
    driver_problem,
    failing_exception,
    in_loader_worker,
    library_status,
    loader_crash,
    nccl_error,
    nondeterministic_operation,
    parse_devices,
    parse_dtypes,
    parse_input_size,
    type_name,
)
from pytest_gputrain.probe.memory_peaks import own_peaks
from pytest_gputrain.probe.oom_message import parse_oom as parse_oom  # re-exported

# The classifier lives in failure_kinds.py; its names stay importable from here.
__all__ = [
    "MEMORY_KINDS", "NO_CUDA_CALLS", "STICKY", "allocator_state", "build_failure", "classify",
    "classify_exception", "expandable_segments", "memory_fraction", "nccl_error",
    "nvml_capability", "other_process_memory", "parse_devices", "parse_oom", "snapshot",
    "traceback_module",
]


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
    kind, source = failing_exception(exc)
    if kind == "not_gpu":
        return None
    if source is not exc:  # a GPU error wrapped in another exception: describe the GPU error
        tb = source.__traceback__
    exc_type = type_name(source)
    message = str(source)
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
    _fill_details(facts, chain_text(source), tb if tb is not None else source.__traceback__,
                  probe, torch, state or {})
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


def _fill_details(facts: FailureFacts, message: str, tb: TracebackType | None, probe: Any,
                  torch: Any, state: dict[str, Any]) -> None:
    """What the message (and its causes') names for the kinds with their own rule (GT204,
    GT210-GT220)."""
    kind = facts.kind
    if kind == "driver_too_old":
        facts.driver_problem = driver_problem(message)
    elif kind == "nondeterministic_op":
        facts.operation = nondeterministic_operation(message)
        facts.cublas_workspace_config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    elif kind == "loader_worker":
        facts.loader_cause, facts.signal = loader_crash(message, dead_worker_signal(tb))
    elif kind == "compile":
        facts.compile_stage = compile_stage(facts.exc_type, message)
    elif kind == "numpy_on_cuda":
        facts.devices = parse_devices(message)
    elif kind == "cuda_unavailable":
        build = getattr(getattr(torch, "version", None), "cuda", None) if torch else None
        facts.cuda_unavailable_cause = cuda_unavailable_cause(
            message, os.environ.get("CUDA_VISIBLE_DEVICES"), build)
    elif kind == "dtype_mismatch":
        facts.dtypes = parse_dtypes(message)
        _fill_mismatch(facts, tb, probe, torch)  # the module, and whether it ran on CUDA
        devices = facts.module_param_devices + facts.module_input_devices
        facts.cuda_involved = "cuda" in message.lower() or any(
            device.startswith("cuda") for device in devices)
    elif kind == "batch_norm_single":
        facts.input_shape = parse_input_size(message)
        _fill_mismatch(facts, tb, probe, torch)  # the batch-norm layer that refused the batch
    if kind in ("cuda_fork", "loader_worker"):
        facts.in_loader_worker = in_loader_worker(message)
    if kind in ("cudnn", "cublas", "cuda_other", "cudnn_no_algorithm", "library_init"):
        facts.status = library_status(message)
    if kind in MEMORY_KINDS and kind != "oom":
        for key in ("allocated", "reserved", "peak_reserved", "free", "total",
                    "other_processes"):
            if state.get(key) is not None:
                setattr(facts, key, state[key])


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
    """Allocator state right after a failure; empty unless the failure is about memory (an OOM,
    or a cuDNN / cuBLAS error that often is one) and the state is safe to read."""
    if kind not in MEMORY_KINDS or torch is None:
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
