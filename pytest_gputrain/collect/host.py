"""The host: CPUs, RAM and /dev/shm (DataLoader workers pass batches through shared memory)."""

from __future__ import annotations

import os
import platform
import shutil

from pytest_gputrain.facts import HostFacts


def read_host(shm_path: str = "/dev/shm") -> HostFacts:
    facts = HostFacts(
        os=f"{platform.system()} {platform.release()}",
        python_version=platform.python_version(),
        cpu_count_logical=os.cpu_count(),
    )
    try:
        import psutil

        facts.cpu_count_physical = psutil.cpu_count(logical=False)
        memory = psutil.virtual_memory()
        facts.memory_total = int(memory.total)
        facts.memory_available = int(memory.available)
    except Exception as exc:
        for field in ("cpu_count_physical", "memory_total", "memory_available"):
            facts.mark_unknown(field, f"psutil failed: {exc}")
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        facts.cpu_affinity_count = len(affinity(0))
    else:
        facts.mark_unknown("cpu_affinity_count", "no sched_getaffinity on this OS")
    if os.path.isdir(shm_path):
        usage = shutil.disk_usage(shm_path)
        facts.shm_total, facts.shm_free = int(usage.total), int(usage.free)
    else:
        facts.mark_unknown("shm_total", f"{shm_path} does not exist on this OS")
        facts.mark_unknown("shm_free", f"{shm_path} does not exist on this OS")
    facts.in_container = os.path.exists("/.dockerenv") or bool(
        os.environ.get("KUBERNETES_SERVICE_HOST"))
    return facts
