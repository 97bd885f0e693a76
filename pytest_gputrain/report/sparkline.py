"""Compact, static pictures in plain SVG, for where no script of ours runs or a table row has
room for a line only.

- ``timeline_svg``: a test's timeline for pytest-html's report, where a test's extras are
  inserted as HTML (the HTML report's charts are drawn by uPlot). Each row is the first series
  of one lane (GPU utilisation, memory, clock, power, temperature, step time), scaled to its
  own range, with its range in words; the profiler window is shaded and the failure marked
  across all rows.
- ``series_svg``: one series as a sparkline, with marks at some of its points (the history
  site's index: a test's step time across sessions, its steps marked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_gputrain.report.visible_text import html_text

WIDTH, ROW, LABEL = 640, 34, 14


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def timeline_svg(timeline: dict[str, Any]) -> str:
    """The SVG of one ``timeline.run_timeline`` payload; "" when it has no chart."""
    rows = []
    shared = timeline.get("x") or {}
    for lane in timeline.get("lanes", []):
        if lane.get("kind") == "bars":
            series = {"label": "step time", "unit": "ms"}
            xs, values = lane["x"], [round(w * 1000, 3) for w in lane["width"]]
        else:
            table = lane["tables"][0]
            series = table["series"][0]
            xs = shared.get(table["x"], []) if isinstance(table["x"], str) else table["x"]
            values = series["values"]
        points = [(x, y) for x, y in zip(xs, values, strict=True) if y is not None]
        if points:
            rows.append((series, points))
    if not rows:
        return ""
    end = max(float(timeline.get("end") or 0.0), 1e-3)
    height = len(rows) * (ROW + LABEL)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height + 14}" '
             f'viewBox="0 0 {WIDTH} {height + 14}" font-family="sans-serif" font-size="11" '
             f'role="img" aria-label="timeline">']

    def x_of(t: float) -> float:
        return round(t / end * (WIDTH - 2) + 1, 1)

    markers = timeline.get("markers", {})
    if markers.get("window"):
        a, b = (x_of(t) for t in markers["window"])
        parts.append(f'<rect x="{a}" y="0" width="{max(1.0, b - a)}" height="{height}" '
                     'fill="#888" fill-opacity="0.18"><title>profiler window</title></rect>')
    for index, (series, points) in enumerate(rows):
        top = index * (ROW + LABEL) + LABEL
        values = [y for _, y in points]
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        line = " ".join(f"{x_of(x)},{round(top + ROW - (y - low) / span * ROW, 1)}"
                        for x, y in points)
        words = (f"{series['label']}: {_fmt(low)}–{_fmt(high)} {series['unit']}"
                 if low != high else f"{series['label']}: {_fmt(low)} {series['unit']}")
        parts.append(f'<text x="2" y="{top - 3}">{html_text(words)}</text>')
        parts.append(f'<polyline points="{line}" fill="none" stroke="#1f5fa8" '
                     'stroke-width="1.2"/>')
    failure = markers.get("failure")
    if failure:
        x = x_of(float(failure["t"]))
        parts.append(f'<line x1="{x}" y1="0" x2="{x}" y2="{height}" stroke="#b42318" '
                     'stroke-width="2"/>')
        parts.append(f'<text x="{min(x + 3, WIDTH - 120)}" y="{height + 11}" fill="#b42318">'
                     f'failure: {html_text(str(failure["label"]))}</text>')
    parts.append(f'<text x="{WIDTH - 2}" y="{height + 11}" text-anchor="end">'
                 f'{_fmt(end)} s</text></svg>')
    return "".join(parts)


def series_svg(values: Sequence[float], marks: Sequence[int] = (), *, label: str = "",
               width: int = 160, height: int = 28) -> str:
    """A sparkline of ``values`` (one point each, scaled to their own range), with a red tick
    at each index in ``marks``; "" with no value. ``label`` is its accessible name."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = (width - 4) / max(1, len(values) - 1)

    def x_of(index: int) -> float:
        return round(2 + index * step, 1)

    def y_of(value: float) -> float:
        return round(height - 3 - (value - low) / span * (height - 6), 1)

    line = " ".join(f"{x_of(i)},{y_of(v)}" for i, v in enumerate(values))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="sparkline" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{html_text(label)}">']
    for index in marks:
        if 0 <= index < len(values):
            parts.append(f'<line x1="{x_of(index)}" y1="0" x2="{x_of(index)}" y2="{height}" '
                         'stroke="#b42318" stroke-width="1.5"/>')
    parts.append(f'<polyline points="{line}" fill="none" stroke="#1f5fa8" '
                 'stroke-width="1.2"/></svg>')
    return "".join(parts)
