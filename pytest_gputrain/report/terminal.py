"""The terminal view: a header with the nvidia-smi essentials, and the findings table."""

from __future__ import annotations

import textwrap

from tabulate import tabulate

from pytest_gputrain.facts import DeviceFacts, EnvironmentFacts
from pytest_gputrain.findings import Finding
from pytest_gputrain.units import format_bytes, printable


def _torch_line(env: EnvironmentFacts) -> str:
    torch = env.torch
    if not torch.installed:
        return f"torch not importable ({torch.reason})"
    if torch.cuda_version is None and torch.hip_version is None:
        return f"torch {torch.version} (CPU-only build)"
    parts = [f"CUDA {torch.cuda_version}" if torch.cuda_version else f"HIP {torch.hip_version}"]
    if torch.cudnn_version:
        parts.append(f"cuDNN {torch.cudnn_version}")
    visible = "sees no GPU" if not torch.cuda_available else f"sees {torch.device_count} GPU(s)"
    return f"torch {torch.version} ({', '.join(parts)}; {visible})"


def _device_line(device: DeviceFacts) -> str:
    if device.lost:
        return f"GPU {device.index}: LOST (fell off the bus / not answering)"
    name = device.name or "unknown GPU"
    parts = [f"GPU {device.index} {name}"]
    if device.torch_index is not None and device.torch_index != device.index:
        parts[0] += f" (cuda:{device.torch_index})"
    if device.compute_capability:
        parts.append(f"cc {device.compute_capability}")
    if device.memory_total is not None:
        used, total = format_bytes(device.memory_used), format_bytes(device.memory_total)
        parts.append(f"mem {used} / {total}")
    if device.temperature is not None:
        parts.append(f"{device.temperature:.0f} °C")
    if device.power_draw is not None:
        limit = f" / {device.power_limit:.0f} W" if device.power_limit is not None else ""
        parts.append(f"{device.power_draw:.0f} W{limit}")
    if device.utilization_gpu is not None:
        parts.append(f"util {device.utilization_gpu:.0f} %")
    if device.processes is not None:
        others = [p for p in device.processes if not p.own]
        if others:
            held = sum(p.used_memory or 0 for p in others)
            parts.append(f"{len(others)} other process(es) hold {format_bytes(held)}")
        else:
            parts.append("no other processes")
    return " | ".join(parts)


def header_lines(env: EnvironmentFacts) -> list[str]:
    nvml = env.nvml
    if not nvml.available:
        lines = [f"gputrain: no NVIDIA GPU visible: {nvml.reason}", f"gputrain: {_torch_line(env)}"]
    else:
        lines = [
            f"gputrain: NVIDIA driver {nvml.driver_version} (CUDA {nvml.cuda_driver_version}), "
            f"{nvml.device_count} GPU(s) | {_torch_line(env)}"
        ]
        lines.extend(f"gputrain: {_device_line(device)}" for device in env.devices)
    if env.env.variables:
        shown = ", ".join(f"{k}={v!r}" for k, v in env.env.variables.items())
        lines.append(f"gputrain: environment: {shown}")
    return [printable(line) for line in lines]  # facts may come from an edited facts file


def _wrap(text: str, width: int, indent: str) -> str:
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent)


def findings_lines(findings: list[Finding], width: int = 100, verbose: bool = False) -> list[str]:
    """A table of all findings, then each finding's evidence and fix."""
    if not findings:
        return ["no findings: the GPU environment looks healthy"]
    rows = [(f.severity.upper(), f.code, f.subject, f.title) for f in findings]
    table = tabulate(rows, headers=("severity", "code", "where", "finding"), tablefmt="simple",
                     maxcolwidths=[None, None, 28, max(30, width - 50)])
    lines = table.splitlines()
    for finding in findings:
        lines.append("")
        lines.append(f"{finding.code} {finding.name} [{finding.severity}] {finding.subject}")
        lines.append(_wrap(finding.message, width, "    "))
        if verbose or finding.severity != "info":
            lines.append(_wrap("fix: " + finding.fix, width, "    "))
        if verbose:
            lines.append(_wrap("why: " + finding.why, width, "    "))
            for item in finding.evidence:
                reason = f" ({item.why_unknown})" if item.why_unknown else ""
                lines.append(f"    - {item.name} = {item.display}{reason}")
    lines.append("")
    lines.append("details: python -m pytest_gputrain explain CODE")
    return [printable(line) for line in lines]


def section_for_test(findings: list[Finding], details: list[str], width: int = 100) -> str:
    """A test report's "gputrain diagnosis" section: each finding (title, message, fix), then
    the lines describing the test's records (its launches), then where to read more. Empty
    when there is nothing to say."""
    lines: list[str] = []
    for finding in findings:
        lines.append(f"{finding.severity.upper()} {finding.code} {finding.name}: {finding.title}")
        lines.append(_wrap(finding.message, width, "    "))
        lines.append(_wrap("fix: " + finding.fix, width, "    "))
        lines.append("")
    lines.extend(details)
    if findings:
        if details:
            lines.append("")
        lines.append("details: python -m pytest_gputrain explain CODE")
    return "\n".join(lines)
