"""The ladder's table, as practitioners quote it: step time, speed-up, peak VRAM, utilization,
temperature and validation accuracy per rung, then the largest batch that fits.

A column that no rung measured (peak VRAM, utilization and temperature where no GPU rung ran,
on a machine without a GPU) is left out, and a line under the table says which and why: a
column of dashes only widens the table past the terminal.
"""

from __future__ import annotations

from tabulate import tabulate

from pytest_gputrain.ladder.rungs import LadderResults, RungRecord
from pytest_gputrain.units import format_bytes, format_duration, printable

HEADERS = ("run", "batch", "step time", "speed-up", "peak VRAM", "util", "temp", "val acc")
NONE = "–"
# What a column needs, said when no rung measured it.
MEASURED_BY = {"speed-up": "a CPU and a GPU short run", "peak VRAM": "a GPU rung",
               "util": "a GPU rung", "temp": "a GPU rung", "val acc": "a short run"}


def _range(low: float | None, high: float | None, unit: str) -> str:
    if low is None or high is None:
        return NONE
    return f"{low:.0f}–{high:.0f} {unit}"


def _label(record: RungRecord) -> str:
    where = "GPU" if record.device == "cuda" else "CPU"
    return f"{where} {record.precision} {record.rung}"


def rows(results: LadderResults) -> list[tuple[str, ...]]:
    runs = [r for r in results.rungs if r.rung == "short run"]
    cpu = next((r.seconds_per_step for r in runs if r.device == "cpu"), None)
    out: list[tuple[str, ...]] = []
    for record in results.rungs:
        speedup = NONE
        if record.rung == "short run" and cpu and record.seconds_per_step:
            speedup = f"{cpu / record.seconds_per_step:.1f}×"
        out.append((
            _label(record),
            str(record.batch_size or NONE),
            format_duration(record.seconds_per_step),
            speedup,
            format_bytes(record.peak_allocated) if record.peak_allocated is not None else NONE,
            _range(record.utilization_p10, record.utilization_p90, "%"),
            _range(record.temperature_min, record.temperature_max, "°C"),
            f"{record.val_accuracy * 100:.1f} %" if record.val_accuracy is not None else NONE,
        ))
    return out


def summary_lines(results: LadderResults) -> list[str]:
    lines = []
    runs = {(r.device, r.precision, r.batch_size): r
            for r in results.rungs if r.rung == "short run"}
    for (device, precision, batch), record in sorted(runs.items(), key=str):
        base = runs.get((device, "fp32", batch))
        if precision != "fp32" and base and base.seconds_per_step and record.seconds_per_step:
            change = base.seconds_per_step / record.seconds_per_step
            accuracy = ""
            if base.val_accuracy is not None and record.val_accuracy is not None:
                accuracy = (f"; val acc {record.val_accuracy * 100:.1f} % vs "
                            f"{base.val_accuracy * 100:.1f} % fp32")
            lines.append(f"{precision} vs fp32 at batch {batch}: {change:.2f}× the speed{accuracy}")
    for item in results.headroom:
        probes = ", ".join(f"{b} ({format_bytes(p)})" for b, p in item.probes)
        inside = [peak for peak in item.optimizer_peaks if peak is not None]
        update = f", optimizer step up to {format_bytes(max(inside))}" if inside else ""
        note = f"{'; ' if item.verified else ': '}{item.note}" if item.note else ""
        pinned = (f" ({format_bytes(item.verified_room)} of segments, fragmentation included)"
                  if item.verified_room is not None else "")
        verdict = (f"verified: peak {format_bytes(item.verified_peak)}{pinned}{note}"
                   if item.verified else f"NOT verified{note}")
        if item.replay_note:
            verdict += f" (the allocator's waste not replayed: {item.replay_note})"
        elif item.waste_by == "forecast":
            verdict += " (the allocator's waste: this batch's allocations forecast and replayed)"
        lines.append(
            f"largest batch that fits ({item.precision}, budget {format_bytes(item.budget)}): "
            f"{item.predicted} — predicted from {len(item.probes)} probes [{probes}]{update}, "
            f"{verdict}"
        )
    return lines


def render(results: LadderResults, tablefmt: str = "simple", width: int | None = None) -> str:
    """The table and its summary lines (each wrapped to ``width`` when given)."""
    table_rows = rows(results)
    shown = [column for column, header in enumerate(HEADERS)
             if header not in MEASURED_BY or any(row[column] != NONE for row in table_rows)]
    table = tabulate([[row[column] for column in shown] for row in table_rows],
                     headers=[HEADERS[column] for column in shown], tablefmt=tablefmt)
    lines = [*summary_lines(results), *_left_out(shown)]
    if width is not None:
        from pytest_gputrain.report.text import wrap

        lines = [part for line in lines for part in wrap(line, width, "  ", first="")]
    blank = [""] if tablefmt == "github" and lines else []  # Markdown: a paragraph after it
    return printable("\n".join([table, *blank, *lines]))  # the test's own names


def _left_out(shown: list[int]) -> list[str]:
    """The line that says which columns no rung measured, grouped by what they need."""
    needs: dict[str, list[str]] = {}
    for column, header in enumerate(HEADERS):
        if column not in shown and header in MEASURED_BY:
            needs.setdefault(MEASURED_BY[header], []).append(header)
    if not needs:
        return []
    parts = [f"{_listed(headers)} ({'needs' if len(headers) == 1 else 'need'} {need})"
             for need, headers in needs.items()]
    return [f"not shown, as no rung measured them: {'; '.join(parts)}"]


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
