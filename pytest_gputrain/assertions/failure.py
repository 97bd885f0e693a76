"""What a failed GPU assertion puts on the test report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AssertionFailure:
    """``summary`` becomes the failure text (longrepr); ``details`` its own report section."""

    marker: str
    summary: str
    details: str = ""

    @property
    def section_title(self) -> str:
        return f"gputrain {self.marker}"

    def longrepr(self) -> str:
        return self.summary if not self.details else f"{self.summary}\n{self.details}"


class GpuMemoryWarning(UserWarning):
    """A GPU test left memory allocated after its teardown (``gpu`` fixture)."""


class GpuTrainWarning(UserWarning):
    """pytest-gputrain could not do something it tried (the message says what)."""
