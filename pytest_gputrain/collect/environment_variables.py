"""The environment variables that change how GPU training behaves, and no others.

Reports are pasted into CI logs and issues, so only an allow-list is read: nothing else from the
environment can leak (tokens, passwords).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pytest_gputrain.facts import EnvFacts

RELEVANT = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_NO_HIP_MEMORY_CACHING",
)
# torch.compile's debugging switches (troubleshooting docs): debug directories, full traces of
# the model code, disabled caches.
COMPILE_DEBUG = ("TORCH_COMPILE_DEBUG", "TORCH_TRACE", "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
                 "TORCHDYNAMO_VERBOSE", "TORCH_LOGS")
# TORCH_LOGS artifacts that print generated code or whole graphs (or "+" for debug verbosity).
_VERBOSE_LOGS = ("output_code", "graph_code", "bytecode", "trace_bytecode", "trace_source",
                 "aot_graphs", "aot_joint_graphs", "kernel_code", "schedule")
# NCCL_* is read by prefix, but a few NCCL variables may carry credentials or hosts' secrets.
_NCCL_DENY = ("NCCL_COMM_ID_PASSWORD",)
_SECRET_WORDS = ("PASS", "TOKEN", "SECRET")


def matching_variables(environ: Mapping[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """Variables with these prefixes, sorted, leaving out any that look like credentials."""
    return {
        name: value
        for name, value in sorted(environ.items())
        if name.startswith(prefixes) and name not in _NCCL_DENY
        and not any(word in name for word in _SECRET_WORDS)
    }


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def compile_debug_settings(environ: Mapping[str, str]) -> list[str]:
    """The torch.compile debugging switches that are on, as ``NAME=value``."""
    found = []
    for name in COMPILE_DEBUG:
        value = environ.get(name)
        if value is None:
            continue
        if name == "TORCH_TRACE":
            on = bool(value.strip())  # a directory: set means on
        elif name == "TORCH_LOGS":
            parts = [part.strip() for part in value.split(",")]
            on = any(part.startswith("+") or part.lstrip("+-") in _VERBOSE_LOGS
                     for part in parts if part and not part.startswith("-"))
        else:
            on = _truthy(value)
        if on:
            found.append(f"{name}={value}")
    return found


def read_environment(environ: Mapping[str, str] | None = None) -> EnvFacts:
    environ = os.environ if environ is None else environ
    variables = {name: environ[name] for name in (*RELEVANT, *COMPILE_DEBUG) if name in environ}
    nccl = matching_variables(environ, ("NCCL_",))
    variables.update(nccl)
    return EnvFacts(
        variables=dict(sorted(variables.items())),
        cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_launch_blocking=environ.get("CUDA_LAUNCH_BLOCKING", "").strip() not in ("", "0"),
        pytorch_cuda_alloc_conf=environ.get("PYTORCH_CUDA_ALLOC_CONF")
        or environ.get("PYTORCH_ALLOC_CONF"),
        nccl_variables=dict(sorted(nccl.items())),
        cuda_memory_caching_disabled=_truthy(environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"))
        or _truthy(environ.get("PYTORCH_NO_HIP_MEMORY_CACHING")),
        compile_debug_settings=compile_debug_settings(environ),
    )
