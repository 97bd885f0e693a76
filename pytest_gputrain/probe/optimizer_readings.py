"""What the run probe reads of an optimizer when it first steps, and when the test ends: its
configured implementation (``foreach`` / ``fused`` in its defaults), its parameter tensors and
its learning rate (a scheduler may change it: read again at the end). Plain reads, no sync."""

from __future__ import annotations

from typing import Any


def optimizer_setup(optimizer: Any) -> tuple[bool | None, bool | None, int]:
    """(foreach, fused) as configured (None: torch's default) and the parameter tensors."""
    defaults = getattr(optimizer, "defaults", None) or {}
    foreach = defaults.get("foreach")
    fused = defaults.get("fused")
    tensors = sum(len(group.get("params", ())) for group in optimizer.param_groups)
    return (bool(foreach) if foreach is not None else None,
            bool(fused) if fused is not None else None, tensors)


def largest_lr(optimizer: Any) -> float | None:
    """The largest learning rate of the optimizer's groups; None where one is a tensor on a
    GPU (reading it would synchronise) or not a number."""
    rates = []
    for group in getattr(optimizer, "param_groups", ()):
        lr = group.get("lr")
        if hasattr(lr, "is_cuda"):
            if lr.is_cuda or lr.numel() != 1:
                return None
            lr = lr.item()
        if not isinstance(lr, int | float):
            return None
        rates.append(float(lr))
    return max(rates) if rates else None
