"""Markdown for CI summaries (e.g. appended to $GITHUB_STEP_SUMMARY).

Tables are written row by row, unpadded: a padded table (tabulate's) is as wide as its longest
cell on every row, so one long message made the file grow with rows × that length. Cells are
capped as in the terminal (``report.text``); the JSON report keeps the whole text.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_gputrain.report.model import Report
from pytest_gputrain.report.terminal import header_lines
from pytest_gputrain.report.text import MAX_HEADLINE, MAX_PARAGRAPH, shorten
from pytest_gputrain.report.visible_text import markdown_document

_ICON = {"error": "🔴 error", "warning": "🟠 warning", "info": "🔵 info"}


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def report_markdown(report: Report, sections: Mapping[str, str] | None = None) -> str:
    """The report in Markdown; ``sections``: more Markdown, by title, after the findings (the
    report's own sections that carry a ``markdown`` string are printed too)."""
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
        lines.append(markdown_row(["severity", "code", "where", "seen", "fix"]))
        lines.append("|---|---|---|---|---|")
        lines.extend(markdown_row([_ICON[f.severity], f"`{f.code}`",
                                   shorten(f.subject, MAX_HEADLINE),
                                   shorten(f.message, MAX_PARAGRAPH),
                                   shorten(f.fix, MAX_PARAGRAPH)])
                     for f in report.findings)
    else:
        lines.append("No findings: the GPU environment looks healthy.")
    for name, section in report.sections.items():
        if isinstance(section, dict) and "markdown" in section:
            lines.extend(["", f"### {name}", "", str(section["markdown"])])
    for name, text in (sections or {}).items():
        lines.extend(["", f"### {name}", "", text])
    return markdown_document("\n".join(lines) + "\n")
