"""The probe's options read into ``ProbeSettings``, every value checked: a bad one is a usage error
that names it, with or without the diagnosis. (What the test itself sets while it trains, cuDNN
and TF32 flags and the like, is ``settings_timeline.py``'s.)

Loaded where an option of the probe is set or the diagnosis runs, not by a plain run.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_gputrain.option_errors import usage_error
from pytest_gputrain.options import read
from pytest_gputrain.probe.options import DEFAULT_PROFILE_STEPS


@dataclass(frozen=True)
class ProbeSettings:
    enabled: bool = True
    profile_steps: tuple[int, int] | None = (3, 6)


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """``"3-6"`` -> (3, 6); ``"5"`` -> (5, 5); ``"off"`` -> None. Raises ValueError."""
    value = (text if text is not None else DEFAULT_PROFILE_STEPS).strip().lower()
    if value in ("", "off", "none", "no", "false", "0"):
        return None
    first, sep, last = value.partition("-")
    try:
        start = int(first)
        end = int(last) if sep else start
    except ValueError:
        raise ValueError(f"{text!r} is not a step range (e.g. 3-6, or off)") from None
    if start < 2 or end < start:
        raise ValueError(f"{text!r}: the window must start at step 2 or later and end at or "
                         "after its start (e.g. 3-6)")
    return start, end


def read_probe_settings(config: pytest.Config) -> ProbeSettings:
    probe = str(read(config, "gpu_probe") or "on").strip().lower()
    if probe not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
        raise usage_error(config, "gpu_probe", f"{probe!r} must be on or off")
    try:
        steps = parse_profile_steps(read(config, "gpu_profile_steps"))
    except ValueError as exc:
        raise usage_error(config, "gpu_profile_steps", str(exc)) from None
    return ProbeSettings(enabled=probe in ("on", "true", "1", "yes"), profile_steps=steps)
