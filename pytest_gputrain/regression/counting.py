"""The counting pass of a benchmark: what its step does, counted after its timed rounds.

``count`` runs ``collect.step_counters`` over the step (the host's CPU time and instructions
over plain steps, ATen operators and call sites under a dispatch mode, and on CUDA kernels,
copies and syncs under torch's profiler: docs/regression.md, "Per-step counters"), then judges
the kind of step it timed (``policy.classify``: launch-bound, GPU-bound or a CPU step), which
chooses what the default policy gates. It runs after the warm-up and the timed rounds, so
cuDNN's autotuning and the caching allocator have settled, and none of the timed rounds pays
for it: its profiler is asked to detach CUPTI when it stops (``collect.cupti``), and where that
is unsafe nothing is profiled. A pass that fails (a step that runs only so often) fails no test
that timed fine: the counters then say why nothing was counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pytest_gputrain.regression import policy, stats
from pytest_gputrain.regression.options import COUNTER_METRICS

# The plain steps (host CPU time, instructions): as many as min_rounds, but no more than take
# this long, and never fewer than a session's summary needs.
COUNTING_TIME_S = 2.0


def counting_rounds(min_rounds: int, seconds_per_step: float) -> int:
    """The counting pass's plain steps: ``min_rounds``, as many as fit in ``COUNTING_TIME_S``,
    and at least the ``stats.MIN_ROUNDS`` a session's summary needs."""
    fit = int(COUNTING_TIME_S / max(seconds_per_step, 1e-9))
    return max(stats.MIN_ROUNDS, min(min_rounds, fit))


def count(step: Callable[[], Any], *, torch: Any, device: str, step_time: float,
          gpu_time: float | None, min_rounds: int, bound: str | None) -> dict[str, Any]:
    """The counters of ``step`` (``collect.step_counters``' dict) with ``bound``: the kind of
    step, judged from them and the timed rounds (``step_time``, ``gpu_time``: medians in
    seconds), unless ``bound`` ("launch" or "gpu") states it. ``device`` is "cpu" or
    "cuda:N"; ``torch`` the module where the step runs on CUDA (a CPU step's operators are
    counted where torch is loaded)."""
    from pytest_gputrain.collect.step_counters import count_step
    from pytest_gputrain.regression import process_state

    cuda_index = int(device.split(":")[1]) if device.startswith("cuda") else None
    host_torch = torch if torch is not None else sys.modules.get("torch")
    try:
        with process_state.own_profiler():
            counted = count_step(step, torch=host_torch, cuda_index=cuda_index,
                                 host_rounds=counting_rounds(min_rounds, step_time))
    except Exception as exc:  # the step timed fine: its test does not fail for the counting
        why = f"the counting pass failed: {type(exc).__name__}: {exc}"[:500]
        return {"version": 1, "per_step": {}, "varies": {},
                "unavailable": {name: why for name in COUNTER_METRICS}}
    host = counted.get("host_cpu") or []
    kind = policy.classify(device if cuda_index is not None else "cpu", step_time,
                           counted.get("gpu_busy"), gpu_time, min(host) if host else None)
    if bound is not None:
        kind = {**kind, "kind": bound, "why": f"stated by the test (bound={bound!r}); judged "
                                              f"{policy.KIND_WORDS.get(kind['kind'])}: "
                                              f"{kind['why']}"}
    counted["bound"] = kind
    return counted
