"""The caching allocator's history around one run, for its replay (allocator_model.py).

    with AllocatorHistory(torch, device, limit, budget) as history:
        ...  # the run
    history.room  # the least limit its allocations need, fragmentation included (or None)
    history.why_not  # why there is no replay ("" when there is one)

``torch.cuda.memory._record_memory_history`` keeps every allocation and free, without stack
traces (a couple of microseconds each). The replay is trusted only where it agrees with the
allocator: replayed under the limit the run had, it must make the segments the allocator made,
of the same sizes, at the same places, in the same order.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from pytest_gputrain.ladder.allocator_model import (
    Recording,
    agrees,
    least_room,
    recording_from_snapshots,
    segment_size,
)

MAX_EVENTS = 4_000_000  # a run with more is not replayed (its start would be overwritten)
# Allocator settings that change where blocks go, as PYTORCH_ALLOC_CONF (and the older
# PYTORCH_CUDA_ALLOC_CONF) writes them, with the value that does (None: any value): the replay
# models the defaults only.
PLACEMENT = {"expandable_segments": "true", "max_split_size_mb": None,
             "roundup_power2_divisions": None, "garbage_collection_threshold": None}
CONFIG_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
SIZE_TEXT = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def placement_settings(snapshot: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """The allocator settings in force that the replay does not model: as the allocator reports
    them in a snapshot (``allocator_settings``, set by the environment or at run time), else as
    the environment writes them."""
    running = snapshot.get("allocator_settings")
    if isinstance(running, Mapping):
        found = []
        if running.get("expandable_segments"):
            found.append("expandable_segments")
        split = running.get("max_split_size")
        if isinstance(split, int) and 0 < split < 2**62:  # the default is SIZE_MAX (or -1)
            found.append(f"max_split_size {split:,} bytes")
        if float(running.get("garbage_collection_threshold") or 0) > 0:
            found.append(f"garbage_collection_threshold {running['garbage_collection_threshold']}")
        divisions = running.get("roundup_power2_divisions") or {}
        if any(int(value) > 1 for value in divisions.values()):
            found.append("roundup_power2_divisions")
        return [f"the allocator runs with {setting}" for setting in found]
    found = []
    for variable in CONFIG_VARIABLES:
        for item in environ.get(variable, "").split(","):
            key, _, value = (part.strip() for part in item.partition(":"))
            if key in PLACEMENT and PLACEMENT[key] in (None, value.lower()):
                found.append(f"{variable} sets {key}:{value}")
    return found


def why_not_recorded(torch: Any) -> str:
    """Why the allocator's history cannot be recorded here ("" when it can)."""
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    if not callable(getattr(memory, "_record_memory_history", None)) or not callable(
            getattr(memory, "_snapshot", None)):
        return "this torch cannot record the allocator's history"
    backend = getattr(torch.cuda, "get_allocator_backend", None)
    if callable(backend) and backend() != "native":
        return f"the allocator is {backend()}, not the caching allocator the replay models"
    enabled = getattr(getattr(torch, "_C", None), "_cuda_isHistoryEnabled", None)
    if callable(enabled) and enabled():
        return "the project records the allocator's history itself: left as it is"
    return ""


def requested_bytes(error: BaseException) -> int | None:
    """The segment an out-of-memory error says the allocator asked for ("Tried to allocate
    118.00 MiB": the request rounded up to its segment, to the message's two decimals)."""
    match = SIZE_TEXT.search(str(error))
    return int(float(match.group(1)) * UNITS[match.group(2)]) if match else None


class AllocatorHistory:
    """Records the allocator's history of ``device`` around a ``with`` block. ``limit``: what
    the allocator itself lets the process hold (its per-process fraction; None: no fraction,
    the GPU's memory); ``budget``: what the run was meant to fit, for how short it fell."""

    def __init__(self, torch: Any, device: Any, limit: int | None, budget: int,
                 environ: Mapping[str, str] | None = None) -> None:
        self._torch, self._limit, self._budget = torch, limit, budget
        self._index = (device.index if device.index is not None
                       else int(getattr(torch.cuda, "current_device", lambda: 0)()))
        self._environ = os.environ if environ is None else environ
        self.why_not = why_not_recorded(torch)
        self.recording: Recording | None = None
        self.room: int | None = None
        self.short_by: int | None = None  # where the run ran out of memory: bytes it lacked
        self._before: Mapping[str, Any] = {}
        self._recording = False

    def __enter__(self) -> AllocatorHistory:
        if self.why_not:
            return self
        memory = self._torch.cuda.memory
        self._before = memory._snapshot()
        unmodelled = placement_settings(self._before, self._environ)
        if unmodelled:
            self.why_not = f"{'; '.join(unmodelled)}, which the replay does not model"
            return self
        memory._record_memory_history(enabled="all", context=None, stacks="python",
                                      max_entries=MAX_EVENTS)
        self._recording = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        out_of_memory = error is not None and isinstance(error, self._torch.OutOfMemoryError)
        if self._recording:
            self._read_history()
        if out_of_memory:
            assert error is not None
            self.short_by = self._short_by(error)
        if self.why_not or self.recording is None:
            return
        if self.recording.out_of_memory is not None:
            self.why_not = "the run ran out of memory"
            return
        alike, made, replayed = agrees(self.recording, self._limit)
        if not alike == made == replayed:
            self.why_not = (f"the replay differed from the allocator at segment {alike + 1} (the "
                            f"allocator made {made}, the replay {replayed}): not trusted")
            return
        self.room = least_room(self.recording)

    def _read_history(self) -> None:
        memory = self._torch.cuda.memory
        try:
            after = memory._snapshot()
        finally:
            memory._record_memory_history(enabled=None)
        traces = after.get("device_traces") or []
        if self._index < len(traces) and len(traces[self._index]) >= MAX_EVENTS:
            self.why_not = f"the run made more than {MAX_EVENTS:,} allocator events"
            return
        self.recording = recording_from_snapshots(self._before, after, self._index)

    def _short_by(self, error: BaseException) -> int | None:
        """Bytes the allocator lacked when it ran out of memory: what it still held (having
        given back its free segments) and the segment it asked for, over the limit. The
        segment is the recorded request's, else the one the error names."""
        stats = getattr(self._torch.cuda, "memory_stats", None)
        if self.recording is not None and self.recording.out_of_memory is not None:
            asked: int | None = segment_size(self.recording.out_of_memory)
        else:
            asked = requested_bytes(error)
        if not callable(stats) or asked is None:
            return None
        held = stats(self._index).get("reserved_bytes.all.current")
        if held is None:
            return None
        return max(0, int(held) + asked - self._budget)
