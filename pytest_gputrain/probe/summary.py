"""A compact table of the probed training runs (terminal summary and JSON report section)."""

from __future__ import annotations

import re
from typing import Any

from tabulate import tabulate

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


# Where a test id may break: after a '/', before '::' or '['; inside the parameters, after '-'.
_PATH_BREAKS = re.compile(r"(?<=/)|(?=::)|(?=\[)")
_PARAM_BREAKS = re.compile(r"(?<=-)")


def wrap_test_id(nodeid: str, width: int) -> str:
    """``nodeid`` on lines of at most ``width`` characters, broken only between its segments,
    so that every line is a whole piece of the id and the lines joined give the id back (it
    can be pasted into ``pytest``). A segment longer than ``width`` keeps a line of its own."""
    base, bracket, params = nodeid.partition("[")
    segments = [part for part in _PATH_BREAKS.split(base) if part]
    if bracket:
        segments += [part for part in _PARAM_BREAKS.split(bracket + params) if part]
    lines: list[str] = []
    line = ""
    for segment in segments:
        if line and len(line) + len(segment) > width:
            lines.append(line)
            line = ""
        line += segment
    lines.append(line)
    return "\n".join(lines)


def runs_lines(runs: list[dict[str, Any]], width: int = 100, limit: int = 30) -> list[str]:
    """The tests that trained (took at least one step), one row each."""
    trained = [run for run in runs if (run.get("steps") or 0) > 0]
    test_width = max(28, width - 75)  # what the other columns leave of the terminal
    rows = []
    for run in trained[:limit]:
        row = []
        for _, path, unit in COLUMNS:
            value = _get(run, path)
            if path == "nodeid":
                row.append(wrap_test_id(str(value), test_width))
            elif value is None:
                row.append("-")
            elif unit == "bytes":
                row.append(format_bytes(value))
            else:
                row.append(format_value(value, unit))
        rows.append(row)
    lines = [f"gputrain: {len(trained)} training run(s) probed"
             + (f" (first {limit} shown)" if len(trained) > limit else "")]
    if rows:
        table = tabulate(rows, headers=[title for title, _, _ in COLUMNS], tablefmt="simple")
        lines.extend(table.splitlines())
    return lines
