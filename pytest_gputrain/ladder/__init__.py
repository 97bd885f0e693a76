"""The readiness ladder (driver, CUDA, one batch, short run, mixed precision, batch headroom).

The rungs load only when one of these names is used (pytest imports this package at start-up,
for the ``gpu_ladder`` fixture).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_gputrain.ladder.rungs import (
        HeadroomRecord,
        Ladder,
        LadderError,
        LadderResults,
        LadderSpec,
        RungRecord,
        memory_budget,
    )

__all__ = ["HeadroomRecord", "Ladder", "LadderError", "LadderResults", "LadderSpec",
           "RungRecord", "memory_budget"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("pytest_gputrain.ladder.rungs"), name)
    raise AttributeError(f"module 'pytest_gputrain.ladder' has no attribute {name!r}")
