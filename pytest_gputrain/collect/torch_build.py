"""The torch build and what it sees: version, CUDA runtime, arch list, cuDNN, global modes.

torch is imported through ``torch_import.py`` only (which the features use too), and only when a
collector is asked for (never at plugin load). No CUDA context is created: device properties
come through the runtime, memory through NVML.
"""

from __future__ import annotations

import warnings
from typing import Any

from pytest_gputrain.collect.torch_import import try_import_torch
from pytest_gputrain.facts import TorchFacts


def read_torch() -> TorchFacts:
    facts = TorchFacts()
    torch, reason = try_import_torch()
    if torch is None:
        facts.reason = reason
        for field in ("version", "cuda_version", "cuda_available", "device_count", "arch_list"):
            facts.mark_unknown(field, reason or "torch not installed")
        return facts
    facts.installed = True
    facts.version = str(torch.__version__)
    facts.cuda_version = getattr(torch.version, "cuda", None)
    if facts.cuda_version is None:
        facts.unknown["cuda_version"] = "this torch build has no CUDA (CPU-only build)"
    facts.hip_version = getattr(torch.version, "hip", None)
    _read_cuda(torch, facts)
    _read_backends(torch, facts)
    return facts


def _read_cuda(torch: Any, facts: TorchFacts) -> None:
    # is_available() reports why CUDA failed only as a warning ("driver too old", "CUDA
    # unknown error"...): record it, the rules tell the causes apart.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            facts.cuda_available = bool(torch.cuda.is_available())
        except Exception as exc:
            facts.cuda_available = False
            facts.cuda_init_error = f"{type(exc).__name__}: {exc}"
    messages = [str(w.message) for w in caught if "cuda" in str(w.message).lower()]
    if messages and not facts.cuda_init_error:
        facts.cuda_init_error = messages[0].strip()
    try:
        facts.device_count = int(torch.cuda.device_count()) if facts.cuda_available else 0
    except Exception as exc:
        facts.mark_unknown("device_count", str(exc))
    if facts.cuda_version is None:
        facts.arch_list = []
    else:
        try:
            facts.arch_list = list(torch.cuda.get_arch_list())
        except Exception as exc:
            facts.mark_unknown("arch_list", str(exc))
        if not facts.arch_list and not facts.cuda_available:
            # get_arch_list() answers [] before CUDA initialises; unknown, not "no arch".
            facts.mark_unknown("arch_list", "CUDA did not initialise, arch list not readable")
    nccl = getattr(torch.cuda, "nccl", None)
    try:
        version = nccl.version() if nccl is not None and facts.cuda_version else None
        facts.nccl_version = ".".join(str(v) for v in version) if isinstance(version, tuple) \
            else (str(version) if version else None)
    except Exception as exc:
        facts.mark_unknown("nccl_version", str(exc))
    if facts.cuda_available:
        try:
            facts.bf16_supported = bool(torch.cuda.is_bf16_supported())
        except Exception as exc:
            facts.mark_unknown("bf16_supported", str(exc))


def _read_backends(torch: Any, facts: TorchFacts) -> None:
    cudnn = torch.backends.cudnn
    try:
        facts.cudnn_version = cudnn.version() if facts.cuda_version else None
    except Exception as exc:
        facts.mark_unknown("cudnn_version", str(exc))
    facts.cudnn_enabled = bool(cudnn.enabled)
    facts.cudnn_benchmark = bool(cudnn.benchmark)
    facts.cudnn_deterministic = bool(cudnn.deterministic)
    facts.deterministic_algorithms = bool(torch.are_deterministic_algorithms_enabled())
    facts.anomaly_detection = bool(torch.is_anomaly_enabled())
    facts.tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32)
    facts.float32_matmul_precision = str(torch.get_float32_matmul_precision())


def torch_device_uuids() -> dict[int, str]:
    """``{cuda index: uuid}`` for the devices torch sees (used to map them to NVML indices)."""
    torch, _ = try_import_torch()
    if torch is None:
        return {}
    result: dict[int, str] = {}
    try:
        if not torch.cuda.is_available():
            return {}
        for index in range(torch.cuda.device_count()):
            uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
            if uuid is not None:
                result[index] = str(uuid).removeprefix("GPU-")
    except Exception:
        return result
    return result
