"""Who holds memory on a GPU: NVML's compute processes, and which of them are this session's.

NVML lists PIDs as the host sees them; in a container (another PID namespace) this process is
listed under a PID it does not know, so "the other processes" are told apart only when one of
ours is listed.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from pytest_gputrain.collect.nvml_session import Nvml, Reading, shared


@dataclass(frozen=True)
class ProcessMemory:
    """A compute process on a GPU and the bytes it holds there (None when NVML cannot say)."""

    pid: int
    used_memory: int | None


@dataclass(frozen=True)
class MemoryHolders:
    """The memory on one GPU held by a set of processes (``own``) and by every other one."""

    own_memory: int
    other_count: int
    other_memory: int

    @classmethod
    def split(cls, processes: Iterable[ProcessMemory], own_pids: Collection[int]
              ) -> MemoryHolders:
        own_memory = other_count = other_memory = 0
        for process in processes:
            used = process.used_memory or 0  # an unknown size counts as none
            if process.pid in own_pids:
                own_memory += used
            else:
                other_count += 1
                other_memory += used
        return cls(own_memory=own_memory, other_count=other_count, other_memory=other_memory)


def list_processes(nvml: Nvml, handle: Any) -> Reading:
    """The compute processes on a GPU (a ``list[ProcessMemory]``); the one place that lists them."""
    reading = nvml.first(("nvmlDeviceGetComputeRunningProcesses_v3",
                          "nvmlDeviceGetComputeRunningProcesses"), handle)

    def convert(infos: Iterable[Any]) -> list[ProcessMemory]:
        listed = []
        for info in infos:
            # pynvml gives None where NVML answers "not available" (WDDM, MIG, no permission).
            used = getattr(info, "usedGpuMemory", None)
            listed.append(ProcessMemory(
                pid=int(info.pid),
                used_memory=int(used) if isinstance(used, int) and used >= 0 else None))
        return listed

    return reading.map(convert)


def process_figures(nvml: Nvml, handle: Any, pids: Collection[int] | None,
                    session_pids: Collection[int] | None
                    ) -> tuple[int | None, int | None, int | None]:
    """``DeviceSample``'s process fields from one listing of the GPU's compute processes: the
    memory of ``pids``, and the memory and number of processes outside ``session_pids``."""
    if pids is None:
        return None, None, None
    reading = list_processes(nvml, handle)
    if not reading.ok:
        return None, None, None
    listed: list[ProcessMemory] = reading.value
    wanted = set(pids)
    own = MemoryHolders.split(listed, wanted).own_memory
    if session_pids is None or (listed and not any(p.pid in wanted for p in listed)):
        return own, None, None  # none asked, or another PID namespace: "others" unknown
    others = MemoryHolders.split(listed, wanted | set(session_pids))
    return own, others.other_memory, others.other_count


def read_processes(index: int, nvml: Nvml | None = None) -> Reading:
    """The compute processes on GPU ``index`` and their memory (a ``list[ProcessMemory]``)."""
    nvml = nvml or shared()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    return list_processes(nvml, handle.value) if handle.ok else handle


def read_memory_holders(index: int, own_pids: Collection[int], nvml: Nvml | None = None
                        ) -> Reading:
    """The memory ``own_pids`` and all other processes hold on GPU ``index`` (``MemoryHolders``)."""
    wanted = set(own_pids)
    return read_processes(index, nvml).map(lambda listed: MemoryHolders.split(listed, wanted))


def process_name(pid: int) -> str | None:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:
        return None  # another PID namespace, or the process ended


def own_process_ids() -> set[int]:
    """This process, its parent chain up to pytest's controller, and its children (xdist)."""
    pids = {os.getpid()}
    try:
        import psutil

        me = psutil.Process()
        pids.update(child.pid for child in me.children(recursive=True))
        parent = me.parent()
        # An xdist worker's parent is the controller; its siblings are the other workers.
        if parent is not None and os.environ.get("PYTEST_XDIST_WORKER"):
            pids.add(parent.pid)
            pids.update(child.pid for child in parent.children(recursive=True))
    except Exception:
        pass
    return pids


def session_process_ids() -> set[int]:
    """This process and, on a pytest-xdist worker, the controller and its other workers: the
    processes whose GPU memory is this test session's own while a test runs. Unlike
    ``own_process_ids`` it leaves out this process's children, so a process a test starts (a
    server, an evaluation worker) counts as another process on the GPU."""
    pids = {os.getpid()}
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return pids
    try:
        import psutil

        parent = psutil.Process().parent()
        if parent is not None:
            pids.add(parent.pid)
            pids.update(child.pid for child in parent.children(recursive=False))
    except Exception:
        pass
    return pids
