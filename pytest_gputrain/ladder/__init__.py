"""The readiness ladder (driver, CUDA, one batch, short run, mixed precision, batch headroom)."""

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
