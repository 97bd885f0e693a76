"""The terminal view: a header with the nvidia-smi essentials, and the findings, each once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_gputrain.facts import DeviceFacts, EnvironmentFacts
from pytest_gputrain.findings import Finding
from pytest_gputrain.report.text import MAX_HEADLINE, MAX_PARAGRAPH, shorten, wrap
from pytest_gputrain.severity import SEVERITY_RANK
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


def _device_parts(device: DeviceFacts) -> list[str]:
    if device.lost:
        return [f"GPU {device.index}: LOST (fell off the bus / not answering)"]
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
    return parts


_PREFIX = "gputrain: "
_INDENT = "    "  # of every line of a finding after its headline
EXPLAIN = "details: python -m pytest_gputrain explain CODE"


def _fit(parts: list[str], separator: str, width: int | None) -> list[str]:
    """``gputrain: `` and the parts joined by ``separator``: on one line, or, with a
    ``width``, on lines of at most that width broken between parts (a part longer than a line
    is wrapped at its spaces). Each part is capped at ``MAX_HEADLINE`` characters."""
    parts = [shorten(part, MAX_HEADLINE) for part in parts]
    if width is None:
        return [_PREFIX + separator.join(parts)]
    end = separator.rstrip()  # " | " -> " |": a broken line ends with it
    indent = " " * (len(_PREFIX) + 2)
    lines: list[str] = []
    line, fresh = _PREFIX, True
    for index, part in enumerate(parts):
        piece = part + (end if index < len(parts) - 1 else "")
        if not fresh and len(line) + 1 + len(piece) <= width:
            line += " " + piece
            continue
        if not fresh:
            lines.append(line)
            line = indent
        if len(line) + len(piece) <= width:
            line += piece
        else:
            *whole, line = wrap(piece, width, indent, first=line)
            lines += whole
        fresh = False
    lines.append(line)
    return lines


def header_lines(env: EnvironmentFacts, width: int | None = None,
                 no_gpu_explained_by: str | None = None) -> list[str]:
    """The machine in a few lines: each on one line, or, with a ``width``, fitted to it. Why
    no GPU is visible is said here, or, where a finding of the diagnosis says it
    (``no_gpu_explained_by``: its code), that finding is named instead."""
    nvml = env.nvml
    if not nvml.available:
        why = (f"see {no_gpu_explained_by} in the diagnosis below" if no_gpu_explained_by
               else nvml.reason)
        lines = _fit([f"no NVIDIA GPU visible: {why}"], "", width)
        lines += _fit([_torch_line(env)], "", width)
    else:
        lines = _fit([f"NVIDIA driver {nvml.driver_version} (CUDA {nvml.cuda_driver_version}), "
                      f"{nvml.device_count} GPU(s)", _torch_line(env)], " | ", width)
        for device in env.devices:
            lines += _fit(_device_parts(device), " | ", width)
    if env.env.variables:
        shown = [f"{name}={value!r}" for name, value in env.env.variables.items()]
        lines += _fit([f"environment: {shown[0]}", *shown[1:]], ", ", width)
    return [printable(line) for line in lines]  # facts may come from an edited facts file


def headline(finding: Finding) -> str:
    """``ERROR GT216 cuda-unavailable-at-use: <title>``: how a finding starts wherever it is
    printed (the summary, a test's report section)."""
    return f"{_label(finding)}: {shorten(finding.title, MAX_HEADLINE)}"


def _label(finding: Finding) -> str:
    return f"{finding.severity.upper()} {finding.code} {finding.name}"


def finding_lines(finding: Finding, width: int, verbose: bool = False, where: bool = True,
                  shown_above: str | None = None) -> list[str]:
    """One finding: its headline, where (``where``), what was seen and the fix (for warnings
    and errors; for every finding with ``verbose``, which adds why and the evidence). A finding
    printed above in a test's report is only named, with a pointer to that report
    (``shown_above``: what it is called, "failure report" or "report")."""
    subject = shorten(finding.subject, MAX_HEADLINE)
    lines = wrap(headline(finding), width, _INDENT, first="")
    if shown_above:
        lines += wrap(f"see the {shown_above} of {subject} above", width, _INDENT)
        return lines
    if where:
        lines += wrap(subject, width, _INDENT, first=f"{_INDENT}where: ")
    lines += wrap(shorten(finding.message, MAX_PARAGRAPH), width, _INDENT)
    if verbose or finding.severity != "info":
        lines += wrap(shorten(finding.fix, MAX_PARAGRAPH), width, _INDENT,
                      first=f"{_INDENT}fix: ")
    if verbose:
        lines += wrap(shorten(finding.why, MAX_PARAGRAPH), width, _INDENT,
                      first=f"{_INDENT}why: ")
        for item in finding.evidence:
            reason = f" ({item.why_unknown})" if item.why_unknown else ""
            lines += wrap(shorten(f"{item.display}{reason}", MAX_PARAGRAPH), width,
                          _INDENT * 2, first=f"{_INDENT}- {item.name} = ")
    return lines


def findings_lines(findings: list[Finding], width: int = 80, verbose: bool = False,
                   printed: Mapping[str, PrintedReport] | None = None) -> list[str]:
    """Every finding once, in the order given, each in at most ``width`` columns (but a URL
    longer than a line). ``printed``: the tests' reports pytest printed above the summary, by
    test (``shown_in_reports``); the findings their diagnosis sections hold are only named."""
    if not findings:
        return ["no findings: the GPU environment looks healthy"]
    lines: list[str] = []
    for finding in findings:
        if lines:
            lines.append("")
        lines += finding_lines(finding, width, verbose,
                               shown_above=_shown_in(finding, printed or {}))
    lines += ["", EXPLAIN]
    return [printable(line) for line in lines]


def section_text(findings: list[Finding], width: int = 80, details: Sequence[str] = ()) -> str:
    """The diagnosis section of a test's report: its findings (the test goes without saying),
    then the lines describing the test's records (its launches), then where to read more.
    Empty when there is nothing to say."""
    lines: list[str] = []
    for finding in findings:
        lines += [*finding_lines(finding, width, where=False), ""]
    lines.extend(details)
    if findings:
        if details:
            lines.append("")
        lines.append(EXPLAIN)
    return printable("\n".join(lines))


# The title under which features add findings to a test's report (pytest prints the section
# with a failed test's report); each finding in it starts with its headline.
REPORT_SECTION = "gputrain diagnosis"


@dataclass(frozen=True)
class PrintedReport:
    """A test's report that pytest printed above the summary."""

    name: str  # what the pointer to it calls it: "failure report", "report"
    labels: frozenset[str]  # 'ERROR GT216 cuda-unavailable-at-use' of each finding it holds


def shown_in_reports(reports: Iterable[tuple[str, str, Iterable[tuple[str, str]]]]
                     ) -> dict[str, PrintedReport]:
    """The ``(nodeid, name, sections)`` of each report pytest printed, by test, with the
    findings its diagnosis section holds (their headlines start the section's lines)."""
    shown: dict[str, PrintedReport] = {}
    for nodeid, name, sections in reports:
        labels = set()
        for title, content in sections:
            if title == REPORT_SECTION:
                for line in content.splitlines():
                    words = line.split(" ", 3)
                    if len(words) >= 3 and words[0] in _SEVERITY_WORDS:
                        labels.add(f"{words[0]} {words[1]} {words[2].rstrip(':')}")
        if labels:
            known = shown.get(nodeid)
            shown[nodeid] = PrintedReport(known.name if known else name,
                                          frozenset(labels).union(known.labels if known else ()))
    return shown


_SEVERITY_WORDS = frozenset(severity.upper() for severity in SEVERITY_RANK)


def _shown_in(finding: Finding, reports: Mapping[str, PrintedReport]) -> str | None:
    """The name of the printed report that holds ``finding``, if one does."""
    report = reports.get(finding.subject)
    if report is None and finding.subject.endswith("]") and " [" in finding.subject:
        # A launch's subject is its test and what it launched: 'tests/t.py::test [2 ranks, nccl]'
        report = reports.get(finding.subject.rsplit(" [", 1)[0])
    return report.name if report is not None and _label(finding) in report.labels else None
