"""CPU sets for benchmark processes. A host-bound training step runs as fast as the cores it
lands on, so processes that are compared run on fixed CPUs (``os.sched_setaffinity``)."""

from __future__ import annotations

import os


def cpu_sets(count: int, per_set: int) -> list[list[int]]:
    """``count`` disjoint sets of ``per_set`` of the CPUs this process may use (fewer when the
    machine has fewer); empty sets, meaning no pinning, for ``per_set`` 0 or where the platform
    cannot pin."""
    if not hasattr(os, "sched_getaffinity"):
        return [[] for _ in range(count)]
    allowed = sorted(os.sched_getaffinity(0))
    per_set = min(per_set, len(allowed) // count)
    if per_set < 1:
        return [[] for _ in range(count)]
    return [allowed[i * per_set:(i + 1) * per_set] for i in range(count)]


def describe(cpus: list[int]) -> str:
    """'CPUs 0-7', 'CPUs 0,2,4' or 'not pinned to CPUs'."""
    if not cpus:
        return "not pinned to CPUs"
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"CPUs {cpus[0]}-{cpus[-1]}"
    return "CPUs " + ",".join(map(str, cpus))
