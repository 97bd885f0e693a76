"""A compact table of the probed training runs (terminal summary and JSON report section)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from pytest_gputrain.report.markdown import markdown_cell
from pytest_gputrain.report.text import MAX_HEADLINE, nodeid_segments, shorten, wrap_test_id
from pytest_gputrain.units import format_bytes, format_value


def _get(data: dict[str, Any], path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


COLUMNS: tuple[tuple[str, str, str | None], ...] = (
    ("test", "nodeid", None),
    ("device", "device", None),
    ("steps", "steps", None),
    ("step", "step_time", "s"),
    ("loader wait", "loader.wait_percent", "%"),
    ("GPU busy", "profile.busy_percent", "%"),
    ("syncs/step", "sync.per_step", None),
    # The test's own peak: a cache earlier tests left reserved is not this test's figure.
    ("peak memory", "memory.peak_memory", "bytes"),
)


def runs_section(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per probed test, for the JSON report's ``sections["runs"]``."""
    return [{path: _get(run, path) for _, path, _ in COLUMNS} for run in runs]


def _cells(run: dict[str, Any]) -> list[str]:
    """The run's figures, one per column after the test."""
    cells = []
    for _, path, unit in COLUMNS[1:]:
        value = _get(run, path)
        if value is None:
            cells.append("-")
        elif unit == "bytes":
            cells.append(format_bytes(value))
        else:
            cells.append(format_value(value, unit))
    return cells


# Two-line headings keep the figures narrow enough for an 80-column terminal.
_HEADINGS = ["device", "steps", "step", "loader\nwait", "GPU\nbusy", "syncs\n/step",
             "peak\nmemory"]
_GAP = "  "


def runs_lines(runs: list[dict[str, Any]], width: int = 80, limit: int = 30) -> list[str]:
    """The tests that trained (took at least one step), one row each, in ``width`` columns.

    Test ids wrap between their segments, never inside one: in the first column when what the
    figures leave of the width holds every id's longest segment and the table is shorter that
    way; otherwise each id is on the line(s) above its figures, whole where it fits."""
    trained = [run for run in runs if (run.get("steps") or 0) > 0]
    shown = trained[:limit]
    lines = [f"gputrain: {len(trained)} training run(s) probed"
             + (f" (first {limit} shown)" if len(trained) > limit else "")]
    if not shown:
        return lines
    ids = [shorten(str(run.get("nodeid")), MAX_HEADLINE) for run in shown]
    figures = tabulate([_cells(run) for run in shown], headers=_HEADINGS,
                       tablefmt="simple").splitlines()
    heading, rows = figures[:-len(shown)], figures[-len(shown):]
    room = width - len(_GAP) - max(len(line) for line in figures)
    longest = max(len(segment) for nodeid in ids for segment in nodeid_segments(nodeid))
    above = [wrap_test_id(nodeid, width) for nodeid in ids]
    if room >= max(longest, len("test")):
        beside = [wrap_test_id(nodeid, room) for nodeid in ids]
        if sum(map(len, beside)) < sum(len(wrapped) + 1 for wrapped in above):
            test = [""] * (len(heading) - 2) + ["test", "-" * room]  # by the last heading line
            lines += [name.ljust(room) + _GAP + line
                      for name, line in zip(test, heading, strict=True)]
            for wrapped, row in zip(beside, rows, strict=True):
                lines += [wrapped[0].ljust(room) + _GAP + row, *wrapped[1:]]
            return lines
    lines += ["test", *(_GAP + line for line in heading)]
    for wrapped, row in zip(above, rows, strict=True):
        lines += [*wrapped, _GAP + row]
    return lines


def runs_markdown(runs: list[dict[str, Any]], limit: int = 100) -> str | None:
    """The runs table in Markdown (GitHub's tables), or None when no test trained."""
    trained = [run for run in runs if (run.get("steps") or 0) > 0]
    if not trained:
        return None
    headings = [title for title, _, _ in COLUMNS]
    lines = [f"{len(trained)} training run(s) probed"
             + (f" (first {limit} shown; all in the JSON report)" if len(trained) > limit
                else ""), "",
             "| " + " | ".join(headings) + " |",
             "|" + "---|" * len(headings)]
    for run in trained[:limit]:
        nodeid = markdown_cell(shorten(str(run.get("nodeid")), MAX_HEADLINE))
        lines.append("| " + " | ".join([nodeid, *map(markdown_cell, _cells(run))]) + " |")
    return "\n".join(lines)
