"""The environment fingerprint that says which saved timings may be compared with which.

A fingerprint is a flat dict of strings. *Strict* fields decide comparability: a different GPU
model, driver, torch, CUDA runtime, cuDNN, Python or platform makes timings incomparable, and
the gate says which fields differ instead of comparing silently. *Informational* fields are
recorded and shown but don't block: the host (hashed, never the name itself: CI runners are
ephemeral, and the same GPU model on another host is the normal case), the number of GPUs, the
driver's CUDA version (implied by the driver), torch's CPU threads. For CPU benchmarks the CPU
model is strict too. The commit is kept on the run, not in the fingerprint: comparing commits
is the point.

Nothing sensitive is stored: no host name, no user, no paths, no environment variables.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Fingerprint = dict[str, Any]

STRICT_FIELDS = ("device_type", "gpu_name", "driver_version", "torch_version", "torch_cuda",
                 "cudnn_version", "python", "platform")
CPU_STRICT_FIELDS = ("cpu_model",)
INFO_FIELDS = ("host", "gpu_count", "cuda_driver_version", "cpu_model", "cpu_count",
               "torch_threads")

_cache: dict[str, Fingerprint] = {}


def strict_fields(fingerprint: Fingerprint) -> tuple[str, ...]:
    if fingerprint.get("device_type") == "cpu":
        return STRICT_FIELDS + CPU_STRICT_FIELDS
    return STRICT_FIELDS


def fingerprint_hash(fingerprint: Fingerprint) -> str:
    """A short stable hash of the strict fields (equal hashes: comparable environments)."""
    strict = {name: fingerprint.get(name) for name in strict_fields(fingerprint)}
    text = json.dumps(strict, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FieldDifference:
    field: str
    baseline: Any
    current: Any
    strict: bool

    def describe(self) -> str:
        return f"{self.field}: {self.baseline!r} -> {self.current!r}"

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "baseline": self.baseline, "current": self.current,
                "strict": self.strict}


def differences(baseline: Fingerprint, current: Fingerprint) -> list[FieldDifference]:
    """Every field whose value differs, strict ones first."""
    strict = set(strict_fields(baseline)) | set(strict_fields(current))
    found = []
    for name in (*STRICT_FIELDS, *INFO_FIELDS):
        if baseline.get(name) != current.get(name):
            found.append(FieldDifference(name, baseline.get(name), current.get(name),
                                         name in strict))
    found.sort(key=lambda d: not d.strict)
    return found


def host_hash() -> str:
    """A salted, truncated hash of the host name: tells hosts apart without naming them."""
    name = socket.gethostname()
    return hashlib.sha256(f"pytest-gputrain host {name}".encode()).hexdigest()[:12]


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def collect(device: str) -> Fingerprint:
    """The fingerprint of the process that runs benchmarks on ``device`` ("cuda:N" or "cpu").

    torch is not imported for CPU devices (its version comes from the package metadata); NVML
    is read only for CUDA devices. Cached per device.
    """
    if device in _cache:
        return dict(_cache[device])
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    fingerprint: Fingerprint = {
        "device_type": device_type,
        "gpu_name": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "gpu_count": None,
        "torch_version": None,
        "torch_cuda": None,
        "cudnn_version": None,
        "torch_threads": None,
        "python": f"{platform.python_implementation()} {sys.version_info[0]}."
                  f"{sys.version_info[1]}",
        "platform": f"{sys.platform}-{platform.machine()}",
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "host": host_hash(),
    }
    _read_torch(fingerprint, device)
    if device_type == "cuda":
        _read_nvml(fingerprint)
    _cache[device] = fingerprint
    return dict(fingerprint)


def _torch_distribution_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def _read_torch(fingerprint: Fingerprint, device: str) -> None:
    """torch's version from its distribution metadata (no import); CUDA details only for CUDA
    devices, where torch is imported already. A CPU benchmark never imports torch here."""
    fingerprint["torch_version"] = _torch_distribution_version()
    torch = sys.modules.get("torch")
    if torch is None and device.startswith("cuda"):
        from pytest_gputrain.collect.torch_import import import_torch

        try:
            torch = import_torch()
        except Exception:
            return
    if torch is None:
        return
    if fingerprint["torch_version"] is None:
        fingerprint["torch_version"] = str(getattr(torch, "__version__", "")) or None
    with contextlib.suppress(Exception):
        fingerprint["torch_threads"] = int(torch.get_num_threads())
    if not device.startswith("cuda"):
        return
    fingerprint["torch_cuda"] = getattr(torch.version, "cuda", None)
    try:
        cudnn = torch.backends.cudnn.version()
        fingerprint["cudnn_version"] = str(cudnn) if cudnn else None
    except Exception:
        pass
    try:
        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        fingerprint["gpu_name"] = str(torch.cuda.get_device_name(index))
        fingerprint["gpu_count"] = int(torch.cuda.device_count())
    except Exception:
        pass


def _read_nvml(fingerprint: Fingerprint) -> None:
    from pytest_gputrain.collect.nvml import read_system

    system = read_system()  # None where NVML cannot say
    fingerprint["driver_version"] = system.driver_version
    fingerprint["cuda_driver_version"] = system.cuda_driver_version


def git_commit(directory: Path) -> str | None:
    """``git rev-parse HEAD`` in ``directory``, else the commit CI names, else None."""
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
            timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        completed = None
    if completed is not None and completed.returncode == 0:
        commit = completed.stdout.strip()
        if commit:
            return commit
    for variable in ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return None
