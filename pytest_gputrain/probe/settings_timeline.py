"""Settings a test may change inside itself, read while it trains.

A test can turn cuDNN off, or its benchmark mode, TF32, deterministic algorithms, anomaly
detection or a debugging instrument (``instrument_readings.py``) on, or cap its memory with
``set_per_process_memory_fraction``, and put everything
back in a ``finally:`` block. Read at teardown, such a test looks like it trained with the
defaults. So the probe reads these settings at step boundaries: the first two optimizer steps,
the steps of the profiler window and every ``EVERY``-th step after (a few microseconds per
read, so well under one microsecond per step on average), and keeps a snapshot only when
something changed.
Grad mode and autocast are thread-local and scoped to the forward pass; the probe reads them at
each top-level forward instead (``run.grad_forwards``, ``run.autocast_forwards``).

``in_force`` turns the snapshots into what the facts report: for each setting the value in force
for most of the training steps, and one line per change.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

from pytest_gputrain.probe.cuda_readings import read_backend_flags
from pytest_gputrain.probe.instrument_readings import read_instruments

EVERY = 32  # steps between reads after the first steps and the profiler window
FRACTION = "memory_fraction"
ANOMALY = "anomaly_detection"


def fraction_reader(torch: Any, index: int) -> Callable[[], float] | None:
    """A reader of the memory fraction in force on cuda:index, or None when this torch cannot
    read it back (torch < 2.8 has no getter). Uses the raw binding where it exists: the public
    getter also initialises CUDA and looks up the current device on every call."""
    raw = getattr(torch._C, "_cuda_getMemoryFraction", None)
    if raw is not None:
        return lambda: float(raw(index))
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        return lambda: float(getter(index))
    return None


def read_settings(torch: Any, fraction: Callable[[], float] | None) -> dict[str, Any]:
    """The settings now: the backend flags (``read_backend_flags``), anomaly detection, the
    debugging instruments (``read_instruments``) and, with a reader, the memory fraction.
    Unreadable settings are left out."""
    settings = read_backend_flags(torch)
    settings.update(read_instruments(torch))
    with contextlib.suppress(Exception):
        settings[ANOMALY] = bool(torch.is_anomaly_enabled())
    if fraction is not None:
        with contextlib.suppress(Exception):
            # torch gives back limit / total: round off the limit's integer truncation
            settings[FRACTION] = round(fraction(), 6)
    return settings


def in_force(snapshots: list[tuple[int, dict[str, Any]]], steps: int
             ) -> tuple[dict[str, Any], list[str]]:
    """For each setting, the value in force over most of the steps; and the changes.

    ``snapshots`` holds (step, settings) where the settings differ from the previous snapshot,
    in step order; a snapshot holds from its step until the next one (the last until ``steps``).
    A value's steps are counted from the snapshots, so a change between two reads is dated at
    the read that saw it.
    """
    if not snapshots:
        return {}, []
    end = max(steps, snapshots[-1][0]) + 1
    weights: dict[str, dict[Any, int]] = {}
    for i, (step, settings) in enumerate(snapshots):
        until = snapshots[i + 1][0] if i + 1 < len(snapshots) else end
        for key, value in settings.items():
            counts = weights.setdefault(key, {})
            counts[value] = counts.get(value, 0) + max(1, until - step)
    chosen = {key: max(counts.items(), key=lambda item: item[1])[0]
              for key, counts in weights.items()}
    changes: list[str] = []
    for (_, before), (step, after) in itertools.pairwise(snapshots):
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                changes.append(f"{key}: {_shown(before.get(key))} -> {_shown(after.get(key))} "
                               f"(seen at step {step})")
    return chosen, changes


def values_of(snapshots: list[tuple[int, dict[str, Any]]], key: str) -> list[Any]:
    """Every value ``key`` had in the snapshots, in order (unreadable ones left out)."""
    return [settings[key] for _, settings in snapshots if key in settings]


def _shown(value: Any) -> str:
    return "unread" if value is None else str(value)
