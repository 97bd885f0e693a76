"""A training step's peak memory on each side of ``optimizer.step``, read through the
optimizer's step hooks (``register_step_pre_hook`` / ``register_step_post_hook``).

The allocator's peak is host-side bookkeeping, exact in stream order without a synchronisation,
so reading it and resetting it in the hooks costs nothing on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from pytest_gputrain.ladder.headroom import StepPeaks


class PeaksAroundOptimizerStep:
    """Around some training steps: the peak outside the optimizer's step and inside it.

        with PeaksAroundOptimizerStep(optimizer, read_peak, reset_peak) as peaks:
            ...  # the steps
        peaks.result()

    An optimizer without step hooks, or steps that never call its ``step`` (a GradScaler that
    skipped it), leave ``optimizer`` None and the whole peak in ``outside``. A subclass whose
    ``step`` calls ``super().step()`` fires the hooks twice, nested: only the outer pair
    counts, so what the subclass does before calling its parent is inside."""

    def __init__(self, optimizer: Any, read_peak: Callable[[], int],
                 reset_peak: Callable[[], None]) -> None:
        self._optimizer = optimizer
        self._read, self._reset = read_peak, reset_peak
        self._outside = 0
        self._inside: int | None = None
        self._handles: list[Any] = []
        self._depth = 0  # optimizer steps entered and not yet left

    def __enter__(self) -> PeaksAroundOptimizerStep:
        self._reset()
        before = getattr(self._optimizer, "register_step_pre_hook", None)
        after = getattr(self._optimizer, "register_step_post_hook", None)
        if callable(before) and callable(after):
            self._handles = [before(self._before_step), after(self._after_step)]
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._outside = max(self._outside, self._read())

    def _before_step(self, *_: Any) -> None:
        self._depth += 1
        if self._depth == 1:
            self._outside = max(self._outside, self._read())
            self._reset()

    def _after_step(self, *_: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._inside = max(self._inside or 0, self._read())
            self._reset()

    def result(self) -> StepPeaks:
        return StepPeaks(outside=self._outside, optimizer=self._inside)
