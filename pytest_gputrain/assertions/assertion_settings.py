"""The GPU assertions' settings, read from their options by ``plugin.py`` and used by
``gpu_checks.py``: kept apart so that neither module imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_gputrain.assertions.markers import MaxVram

DEFAULT_HISTORY = 20000  # allocation-history entries recorded for a max_vram failure


@dataclass(frozen=True)
class AssertionSettings:
    required: bool = False
    default_max_vram: MaxVram | None = None
    history_entries: int = DEFAULT_HISTORY
    per_worker: int | None = None
    share: bool = False
