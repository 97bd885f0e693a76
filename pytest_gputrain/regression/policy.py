"""The gate's default policy (``--gpu-regression=auto``, the default): what each test is gated
on, by the kind of step it times.

The kind is judged in the benchmark's own counting pass (``classify``), from what it measured:

- **launch-bound** (``"launch"``): the host sets, or can set, the pace: the GPU is busy for
  less than ``BUSY_SHARE`` of the step, or the host's CPU time per step is at least
  ``HOST_SHARE`` of the GPU's busy time (a little more host work, or a busier host, and the
  GPU waits). Its wall-clock time follows the host's load, which no number of sessions on a
  busy CI runner pins down; what its host does per step is exact. Gated on the step time and
  the counters: kernels, syncs, copies and bytes each way, allocations, cudaMalloc calls (any
  rise), the Python bytecodes its thread executes (1 %: a DataLoader whose workers deliver out
  of order runs its reordering loop a few more times), the host's instructions (1 %) and CPU
  time per step (2 %, over sessions).
- **GPU-bound** (``"gpu"``): the GPU's own work sets the pace; more host work hides behind it
  and costs nothing. Gated on the step time, the GPU's time per step (1 %, which the host's
  noise does not reach), and the two things host work cannot hide behind: a synchronisation
  (the queue runs dry while the host catches up) and a cudaMalloc call (any rise of either).
  A step with a sync has no queued GPU time to compare, so without them a pageable copy that
  cost the H200's GPU-bound conv net 4.3 % (under the 5 % step-time threshold) went unseen.
- **a CPU step** (``"host"``): gated on the step time, its ATen operators (any rise), its
  Python bytecodes (1 %) and its instructions (its step time is the host's time already: the
  CPU time adds only noise).
- a step whose kind could not be judged gets the launch-bound and the GPU-bound metrics.

Every test keeps ``BASE`` (step time 5 %, peak VRAM 2 %). ``--gpu-regression`` overrides: a
spec without ``auto`` gates exactly its metrics; ``auto,step_time:2%,host_cpu:off`` keeps the
policy with those changes. Metrics a session did not measure are not gated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

AUTO = "auto"
BASE = {"step_time": 0.05, "peak_vram": 0.02}
_COUNTERS = {"kernels": 0.0, "syncs": 0.0, "h2d_copies": 0.0, "h2d_bytes": 0.0,
             "d2h_copies": 0.0, "d2h_bytes": 0.0, "allocs": 0.0, "cuda_mallocs": 0.0,
             "bytecodes": 0.01}
_HOST = {"instructions": 0.01, "host_cpu": 0.02}
BY_KIND: dict[str | None, dict[str, float]] = {
    "launch": {**_COUNTERS, **_HOST},
    "gpu": {"gpu_time": 0.01, "syncs": 0.0, "cuda_mallocs": 0.0},
    "host": {"ops": 0.0, "bytecodes": 0.01, "instructions": 0.01},
}
BY_KIND[None] = {**BY_KIND["launch"], **BY_KIND["gpu"]}
KIND_WORDS = {"launch": "launch-bound", "gpu": "GPU-bound", "host": "a CPU step",
              None: "kind unknown"}
# launch-bound below this share of the step with the GPU busy...
BUSY_SHARE = 0.5
# ...or where the host's CPU time per step is at least this share of the GPU's busy time.
HOST_SHARE = 0.5
BOUNDS = ("launch", "gpu")  # what gpu_benchmark(bound=...) accepts


def check_bound(bound: str | None) -> None:
    """``ValueError`` unless ``bound`` is a kind a test may state (or None: judged)."""
    if bound is not None and bound not in BOUNDS:
        raise ValueError(f"gpu_benchmark: bound={bound!r} is not a kind of step; use "
                         f"{' or '.join(repr(b) for b in BOUNDS)} (or leave it out: the "
                         "counting pass judges it)")


def classify(device: str, step_time: float | None, gpu_busy: float | None,
             gpu_time: float | None, host_cpu: float | None) -> dict[str, Any]:
    """The kind of a step, with the evidence: ``{"kind", "busy_share", "host_share", "why"}``.
    ``gpu_busy`` is the GPU's busy time per step from the profiler, ``gpu_time`` the queued
    rounds' GPU time (used when the profiler could not count); times in seconds."""
    if device == "cpu":
        return {"kind": "host", "why": "a CPU step"}
    gpu = gpu_busy if gpu_busy else gpu_time
    if not gpu or not step_time:
        return {"kind": None, "why": "neither the GPU's busy time nor its time per step was "
                                     "measured"}
    busy_share = gpu / step_time
    host_share = host_cpu / gpu if host_cpu else None
    evidence = (f"the GPU busy {min(busy_share, 1.0) * 100:.0f} % of the step"
                + (f", the host's CPU time {host_share * 100:.0f} % of the GPU's"
                   if host_share is not None else ""))
    launch = busy_share < BUSY_SHARE or (host_share is not None and host_share >= HOST_SHARE)
    return {"kind": "launch" if launch else "gpu", "busy_share": round(busy_share, 4),
            "host_share": None if host_share is None else round(host_share, 4),
            "why": evidence}


def gated(thresholds: Mapping[str, float], auto: bool, off: Iterable[str],
          kinds: Iterable[str | None]) -> dict[str, float]:
    """The metrics one test is gated on: the explicit ``thresholds``, and under ``auto`` the
    policy's for each kind its sessions were judged (explicit thresholds win; ``off`` ones are
    left out)."""
    found = dict(thresholds)
    if not auto:
        return found
    dropped = set(off)
    for kind in dict.fromkeys(kinds):
        for metric, threshold in BY_KIND.get(kind, BY_KIND[None]).items():
            if metric not in found and metric not in dropped:
                found[metric] = threshold
    return found
