"""A compact table of the probed training runs (terminal summary and JSON report section)."""

from __future__ import annotations

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
    ("peak reserved", "memory.peak_reserved", "bytes"),
)


def runs_section(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per probed test, for the JSON report's ``sections["runs"]``."""
    return [{path: _get(run, path) for _, path, _ in COLUMNS} for run in runs]


def _short_test(nodeid: str) -> str:
    # "path/to/test_file.py::test_name[param]" -> "test_file.py::test_name[param]"
    path, sep, name = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1]}{sep}{name}"


def runs_lines(runs: list[dict[str, Any]], width: int = 100, limit: int = 30) -> list[str]:
    """The tests that trained (took at least one step), one row each."""
    trained = [run for run in runs if (run.get("steps") or 0) > 0]
    rows = []
    for run in trained[:limit]:
        row = []
        for _, path, unit in COLUMNS:
            value = _get(run, path)
            if path == "nodeid":
                row.append(_short_test(str(value)))
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
        table = tabulate(rows, headers=[title for title, _, _ in COLUMNS], tablefmt="simple",
                         maxcolwidths=[max(28, width - 75)] + [None] * (len(COLUMNS) - 1))
        lines.extend(table.splitlines())
    return lines
