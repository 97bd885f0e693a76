"""The GPU assertions' options (``options.py``) read into ``AssertionSettings``, every value
checked: a bad one is a usage error that names it. Used by ``plugin.py`` and ``gpu_checks.py``:
kept apart so that neither module imports the other for it.

Loaded where an option of the assertions is set, or when the run-time part or the pinning of
workers needs the settings; a plain run does not load it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_gputrain.assertions.options import DEFAULT_HISTORY
from pytest_gputrain.option_errors import usage_error
from pytest_gputrain.options import read

if TYPE_CHECKING:
    from pytest_gputrain.assertions.markers import MaxVram


@dataclass(frozen=True)
class AssertionSettings:
    required: bool = False
    default_max_vram: MaxVram | None = None
    history_entries: int = DEFAULT_HISTORY
    per_worker: int | None = None
    share: bool = False


def read_settings(config: pytest.Config) -> AssertionSettings:
    """The assertion options, validated; a bad value is a usage error that names it."""
    default_text = read(config, "gpu_max_vram")
    default = None
    if default_text not in (None, ""):
        from pytest_gputrain.assertions import markers

        try:
            default = markers.parse_default_max_vram(str(default_text))
        except markers.MarkerError as exc:
            raise usage_error(config, "gpu_max_vram", str(exc)) from None
    history_text = str(read(config, "gpu_vram_history") or "0").strip()
    # ASCII digits only (int() refuses some that isdigit() accepts), and few of them.
    if not re.fullmatch(r"[0-9]{1,9}", history_text):
        from pytest_gputrain.units import shown

        raise usage_error(
            config, "gpu_vram_history", f"{shown(history_text)} is not a whole number of "
            f"entries from 0 to 999999999 (e.g. {DEFAULT_HISTORY}; 0 turns it off)")
    return AssertionSettings(
        required=bool(read(config, "gpu_required")),
        default_max_vram=default,
        history_entries=int(history_text),
        per_worker=_per_worker(config),
        share=bool(read(config, "gpu_share")),
    )


def _per_worker(config: pytest.Config) -> int | None:
    value = read(config, "gpu_per_worker")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None  # the usual case: the pinning's module is not even imported
    from pytest_gputrain.assertions.worker_gpus import parse_per_worker

    try:
        return parse_per_worker(value)
    except ValueError as exc:
        raise usage_error(config, "gpu_per_worker", str(exc)) from None
