"""A training function run under the probe as a test would be (``RunProbe`` started and
stopped around it), for the tests that read the probe's facts directly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def probed(train: Callable[[], Any], profile_steps: tuple[int, int] | None = None
           ) -> tuple[Any, Any]:
    """``train()``'s result and the run's facts (``RunFacts``). The probe must leave no hook of
    its own behind and record no error of its own."""
    import torch

    from pytest_gputrain.probe import run, torch_hooks

    probe = run.RunProbe(torch, "t::x", profile_steps=profile_steps, sampler=False)
    probe.start()
    try:
        result = train()
    finally:
        probe.stop()
    counts = torch_hooks.global_hook_counts(torch)
    assert counts == dict.fromkeys(counts, 0), counts
    assert probe.record.errors == []
    return result, probe.facts()
