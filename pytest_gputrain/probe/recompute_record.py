"""``RecomputeReadings``: the ``RunRecord`` group of ``recompute_readings.RecomputeWatch``
(activation checkpointing), kept apart from ``run_record.py`` as ``LayerScan`` is."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RecomputeReadings:
    """``torch.utils.checkpoint``'s segments and their recomputation in the backward."""

    calls: int = 0  # segments run forward through checkpoint (checkpoint_sequential's included)
    reentrant_calls: int = 0  # of those, with use_reentrant=True
    recomputes: int = 0  # segments whose forward ran again inside a backward
    segments: list[str] = field(default_factory=list)  # the checkpointed functions, first few
    site: str | None = None  # the line that called checkpoint first: the test's or a framework's
    setting: str | None = None  # the framework's setting that turned it on, when one did
    timed_steps: list[int] = field(default_factory=list)  # indices of the steps timed
    cut: int | None = None  # a timed step whose timing stopped at the cap (left out)
    clock: str | None = None  # "CUDA events" or "host clock"
    seconds: dict[int, float] = field(default_factory=dict)  # step index -> recomputation time
    # step index -> the whole step's time on the GPU stream (CUDA events at the step boundaries
    # before and after it): what the recomputation is a share of, where the host runs ahead
    step_seconds: dict[int, float] = field(default_factory=dict)
    # (step index, grad-mode top-level forwards so far) -> bytes the allocator held more after
    # the step's recomputations than before: one backward's recomputed activations (CUDA only)
    activations: dict[tuple[int, int], int] = field(default_factory=dict)
    unread: str | None = None  # why the CUDA timings could not be read at the end
