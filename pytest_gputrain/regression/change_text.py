"""How a step of a branch's history is written, in the ``--changes`` table and on the site."""

from __future__ import annotations

from pytest_gputrain.regression.branch_history import Change
from pytest_gputrain.units import format_bytes, format_duration


def format_value(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    return format_bytes(value) if metric == "peak_vram" else format_duration(value, precise=True)


def format_confidence(p_value: float) -> str:
    """1 - p as a percentage; past two decimals, a bound."""
    confidence = (1 - p_value) * 100
    return ">99.99 %" if confidence > 99.99 else f"{confidence:.2f} %"


def what_changed(change: Change) -> str:
    """The likely cause (the GPU, driver or torch changed at the step), another change of the
    environment there, or "–"."""
    if change.cause:
        return f"{change.cause} (likely cause)"
    if change.environment:
        return "environment: " + "; ".join(d.describe() for d in change.environment)
    return "–"
