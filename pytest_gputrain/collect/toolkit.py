"""The system CUDA toolkit (nvcc): it matters for building extensions, not for training."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from pytest_gputrain.facts import ToolFacts

_VERSION_RE = re.compile(r"release (\d+\.\d+)")


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidate = os.path.join(root, "bin", "nvcc")
            if os.access(candidate, os.X_OK):
                return candidate
    return None


def read_toolkit() -> ToolFacts:
    facts = ToolFacts()
    path = find_nvcc()
    if path is None:
        facts.mark_unknown("nvcc_version", "nvcc not found on PATH, CUDA_HOME or /usr/local/cuda")
        facts.mark_unknown("nvcc_path", "nvcc not found")
        return facts
    facts.nvcc_path = path
    try:
        output = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        facts.mark_unknown("nvcc_version", f"{path} --version failed: {exc}")
        return facts
    match = _VERSION_RE.search(output)
    if match:
        facts.nvcc_version = match.group(1)
    else:
        facts.mark_unknown("nvcc_version", f"no version in the output of {path} --version")
    return facts
