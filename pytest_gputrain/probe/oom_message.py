"""The numbers in PyTorch's out-of-memory messages, in every wording torch has used.

The message is written at the moment of the failure, so it is the best record of that moment:
the device's capacity and free memory, what this process and every other process held, the
limit a memory fraction set. Wordings handled (``SIZE`` is torch's ``format_size``: "20.00 MiB",
"1.05 GiB", "512 bytes"):

- torch 2.1-2.13, native allocator: "CUDA out of memory. Tried to allocate SIZE. GPU 0 has a
  total capacity of SIZE of which SIZE is free. [Process N has SIZE memory in use. ]...
  [Including non-PyTorch memory, this process has SIZE memory in use. ][SIZE allowed; ]Of the
  allocated memory SIZE is allocated by PyTorch, [with SIZE allocated in private pools (e.g.,
  CUDA Graphs), ]and SIZE is reserved by PyTorch but unallocated." (2.1 spells "capacty"; the
  process lines need torch to find NVML; "allowed" appears once a memory fraction was set, in
  the releases that print it; ROCm builds say "HIP out of memory");
- torch 1.x-2.0: "CUDA out of memory. Tried to allocate SIZE (GPU 0; SIZE total capacity; SIZE
  already allocated; SIZE free; [SIZE allowed; ]SIZE reserved in total by PyTorch)", and torch
  <= 1.3's "...; SIZE free; SIZE cached)";
- the ``cudaMallocAsync`` backend: "Allocation on device 0 would exceed allowed memory. (out of
  memory)" followed by "Currently allocated : SIZE", "Requested : SIZE", "Device limit : SIZE",
  "Free (according to CUDA): SIZE" and "PyTorch limit (set by user-supplied memory fraction) :
  SIZE" (17179869184.00 GiB there means no limit).

PyTorch lists each process on the GPU by PID and calls its own "this process". Where its PID is
not the one NVML reports (a container with its own PID namespace), it lists itself as another
"Process N"; then the entry that matches PyTorch's reserved memory plus a CUDA context is taken
as this process, or, when none does, other processes' memory is left unknown.
"""

from __future__ import annotations

import re
from typing import Any

SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)"
_UNITS = {"bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
# cudaMallocAsync prints its "no limit" sentinel (2**64 bytes) as 17179869184.00 GiB.
NO_LIMIT = 2**60
# What a CUDA context and library workspaces add to PyTorch's reserved memory in NVML's view of
# a process (a few hundred MiB; generous, so that the own-process guess errs towards "unknown").
CONTEXT_ALLOWANCE = 4 * 2**30


def to_bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit.lower()])


def _grab(found: dict[str, Any], key: str, pattern: str, message: str) -> None:
    if key in found:
        return
    match = re.search(pattern, message, re.IGNORECASE)
    if match:
        found[key] = to_bytes(match.group(1), match.group(2))


def parse_oom(message: str) -> dict[str, Any]:
    """The figures in an out-of-memory message, by ``FailureFacts`` field name.

    Keys (each only when the message has it): ``requested``, ``device_index``, ``total``,
    ``free``, ``process_in_use``, ``allocated``, ``reserved``, ``reserved_unallocated``,
    ``private_pools``, ``fraction_limit``, ``other_processes``, ``other_process_count``,
    ``allocator_backend``, and ``processes_listed`` (the message named processes, so a missing
    ``other_processes`` means "none", not "unknown").
    """
    found: dict[str, Any] = {}
    if re.search(r"would exceed allowed memory", message, re.IGNORECASE):
        _parse_async(found, message)
    else:
        _parse_native(found, message)
    _parse_processes(found, message)
    if "allocated" in found and "reserved_unallocated" in found and "reserved" not in found:
        found["reserved"] = found["allocated"] + found["reserved_unallocated"]
    if "reserved" in found and "allocated" in found and "reserved_unallocated" not in found:
        found["reserved_unallocated"] = max(0, found["reserved"] - found["allocated"])
    return found


def _parse_native(found: dict[str, Any], message: str) -> None:
    _grab(found, "requested", r"tried to allocate " + SIZE, message)
    # 2.1+: "GPU 0 has a total capacity of 79.15 GiB of which 9.44 MiB is free." (2.1: capacty)
    _grab(found, "total", r"total capaci?ty of " + SIZE, message)
    _grab(found, "free", r"of which " + SIZE + r" is free", message)
    _grab(found, "allocated", r"of the allocated memory " + SIZE + r" is allocated by pytorch",
          message)
    _grab(found, "private_pools", r"with " + SIZE + r" allocated in private pools", message)
    _grab(found, "reserved_unallocated", SIZE + r" is reserved by pytorch but unallocated",
          message)
    # 1.x-2.0: "(GPU 0; 15.78 GiB total capacity; 12.91 GiB already allocated; 1.05 GiB free;
    #          [4.77 GiB allowed; ]13.07 GiB reserved in total by PyTorch)"
    _grab(found, "total", SIZE + r" total capacity", message)
    _grab(found, "allocated", SIZE + r" already allocated", message)
    _grab(found, "free", r"; " + SIZE + r" free", message)
    _grab(found, "reserved", SIZE + r" reserved in total by pytorch", message)
    # torch <= 1.3: "...; 1.05 GiB free; 310.00 MiB cached)": cached = reserved, unallocated
    _grab(found, "reserved_unallocated", r"; " + SIZE + r" cached\)", message)
    _grab(found, "fraction_limit", SIZE + r" allowed;", message)
    device = re.search(r"\b(?:GPU|device) (\d+)\b", message)
    if device:
        found["device_index"] = int(device.group(1))


def _parse_async(found: dict[str, Any], message: str) -> None:
    found["allocator_backend"] = "cudaMallocAsync"
    _grab(found, "allocated", r"currently allocated\s*:\s*" + SIZE, message)
    _grab(found, "requested", r"requested\s*:\s*" + SIZE, message)
    _grab(found, "total", r"device limit\s*:\s*" + SIZE, message)
    _grab(found, "free", r"free \(according to cuda\)\s*:\s*" + SIZE, message)
    limit: dict[str, Any] = {}
    _grab(limit, "limit", r"memory fraction\)\s*:\s*" + SIZE, message)
    if "limit" in limit and limit["limit"] < NO_LIMIT:
        found["fraction_limit"] = limit["limit"]
    device = re.search(r"allocation on device (\d+)", message, re.IGNORECASE)
    if device:
        found["device_index"] = int(device.group(1))


def _parse_processes(found: dict[str, Any], message: str) -> None:
    """Every process's memory: "Process N has SIZE memory in use." for others, "this process
    has SIZE" for the failing one."""
    listed = [(int(pid), to_bytes(number, unit)) for pid, number, unit in
              re.findall(r"Process (\d+) has " + SIZE + r" memory in use", message)]
    own = re.search(r"this process has " + SIZE + r" memory in use", message, re.IGNORECASE)
    if own is not None:
        found["process_in_use"] = to_bytes(own.group(1), own.group(2))
        others = listed
    elif listed:
        # PyTorch did not find its own PID among NVML's: it is one of the "Process N" lines.
        mine = _own_entry(listed, found.get("reserved") or _reserved(found))
        if mine is None:
            found["processes_listed"] = True
            return
        found["process_in_use"] = mine[1]
        others = [entry for entry in listed if entry is not mine]
    else:
        return
    found["processes_listed"] = True
    found["other_process_count"] = len(others)
    found["other_processes"] = sum(size for _, size in others)


def _reserved(found: dict[str, Any]) -> int | None:
    if "allocated" in found and "reserved_unallocated" in found:
        return int(found["allocated"]) + int(found["reserved_unallocated"])
    return None


def _own_entry(listed: list[tuple[int, int]], reserved: int | None
               ) -> tuple[int, int] | None:
    """The listed process whose memory is PyTorch's reserved memory plus a CUDA context."""
    if reserved is None:
        return None
    fits = [entry for entry in listed if reserved <= entry[1] <= reserved + CONTEXT_ALLOWANCE]
    return fits[0] if len(fits) == 1 else None  # two candidates: no way to tell
