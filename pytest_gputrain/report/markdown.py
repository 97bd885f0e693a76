"""Markdown for CI summaries (e.g. appended to $GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from tabulate import tabulate

from pytest_gputrain.report.model import Report
from pytest_gputrain.report.terminal import header_lines
from pytest_gputrain.units import printable

_ICON = {"error": "🔴 error", "warning": "🟠 warning", "info": "🔵 info"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report_markdown(report: Report) -> str:
    lines = ["## GPU diagnosis (pytest-gputrain)", ""]
    lines.extend(f"- {line.removeprefix('gputrain: ')}"
                 for line in header_lines(report.environment))
    lines.append("")
    s = report.summary
    verdict = "**failed**" if report.failed else "passed"
    lines.append(f"{s.error} error(s), {s.warning} warning(s), {s.info} info — {verdict} "
                 f"(fail on: {report.fail_on})")
    lines.append("")
    if report.findings:
        rows = [(_ICON[f.severity], f"`{f.code}`", _cell(f.subject), _cell(f.message),
                 _cell(f.fix)) for f in report.findings]
        lines.append(tabulate(rows, headers=("severity", "code", "where", "seen", "fix"),
                              tablefmt="github"))
    else:
        lines.append("No findings: the GPU environment looks healthy.")
    for name, section in report.sections.items():
        if isinstance(section, dict) and "markdown" in section:
            lines.extend(["", f"### {name}", "", str(section["markdown"])])
    return printable("\n".join(lines) + "\n")
