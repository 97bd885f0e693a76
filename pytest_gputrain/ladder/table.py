"""The ladder's table, as practitioners quote it: step time, speed-up, peak VRAM, utilization,
temperature and validation accuracy per rung, then the largest batch that fits."""

from __future__ import annotations

from tabulate import tabulate

from pytest_gputrain.ladder.rungs import LadderResults, RungRecord
from pytest_gputrain.units import format_bytes, format_duration, printable

HEADERS = ("run", "batch", "step time", "speed-up", "peak VRAM", "util", "temp", "val acc")


def _range(low: float | None, high: float | None, unit: str) -> str:
    if low is None or high is None:
        return "–"
    return f"{low:.0f}–{high:.0f} {unit}"


def _label(record: RungRecord) -> str:
    where = "GPU" if record.device == "cuda" else "CPU"
    return f"{where} {record.precision} {record.rung}"


def rows(results: LadderResults) -> list[tuple[str, ...]]:
    runs = [r for r in results.rungs if r.rung == "short run"]
    cpu = next((r.seconds_per_step for r in runs if r.device == "cpu"), None)
    out: list[tuple[str, ...]] = []
    for record in results.rungs:
        speedup = "–"
        if record.rung == "short run" and cpu and record.seconds_per_step:
            speedup = f"{cpu / record.seconds_per_step:.1f}×"
        out.append((
            _label(record),
            str(record.batch_size or "–"),
            format_duration(record.seconds_per_step),
            speedup,
            format_bytes(record.peak_allocated) if record.peak_allocated is not None else "–",
            _range(record.utilization_p10, record.utilization_p90, "%"),
            _range(record.temperature_min, record.temperature_max, "°C"),
            f"{record.val_accuracy * 100:.1f} %" if record.val_accuracy is not None else "–",
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
        verdict = (f"verified: peak {format_bytes(item.verified_peak)}{note}" if item.verified
                   else f"NOT verified{note}")
        lines.append(
            f"largest batch that fits ({item.precision}, budget {format_bytes(item.budget)}): "
            f"{item.predicted} — predicted from {len(item.probes)} probes [{probes}]{update}, "
            f"{verdict}"
        )
    return lines


def render(results: LadderResults, tablefmt: str = "simple") -> str:
    table = tabulate(rows(results), headers=HEADERS, tablefmt=tablefmt)
    return printable("\n".join([table, *summary_lines(results)]))  # the test's own names
