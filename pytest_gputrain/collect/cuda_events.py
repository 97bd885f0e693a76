"""The torch profiler's CUDA events as plain values, for every reader of a profile in this
package: the benchmark's counting pass (``collect/cuda_activity.py``) and the probe's window
over a few steps of a diagnosed test (``probe/window_analysis.py``).

``GpuEvent``: a kernel, copy or memset as the GPU ran it; ``RuntimeEvent``: a CUDA runtime or
driver call as the host made it. ``event_bytes`` and ``thread_of`` read what kineto's Python
events may or may not carry; ``with_trace_bytes`` takes the copies' sizes from the Chrome trace
where they carry none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

_VERSION_SUFFIX = re.compile(r"_v\d+$")  # CUPTI's versioned names: cudaLaunchKernel_v7000
_BYTES = re.compile(r'"bytes"\s*:\s*(\d+)')


@dataclass(frozen=True)
class GpuEvent:
    name: str
    start_ns: int
    end_ns: int
    correlation: int = 0
    nbytes: int = 0

    @property
    def kind(self) -> str:
        if self.name.startswith("Memcpy"):
            return "memcpy"
        if self.name.startswith("Memset"):
            return "memset"
        return "kernel"

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True)
class RuntimeEvent:
    name: str
    start_ns: int
    end_ns: int
    correlation: int = 0
    thread: int = 0  # host thread id; 0 when the profiler did not say


def api_name(name: str) -> str:
    """A runtime call's name without CUPTI's version suffix."""
    return _VERSION_SUFFIX.sub("", name)


def event_bytes(event: Any) -> int:
    """A kineto event's byte count (a copy's size), 0 where it carries none."""
    try:
        value = int(event.nbytes())
        if value > 0:
            return value
    except Exception:
        pass
    try:
        match = _BYTES.search(event.metadata_json() or "")
        return int(match.group(1)) if match else 0
    except Exception:
        return 0


def thread_of(event: Any) -> int:
    try:
        return int(event.start_thread_id())
    except Exception:  # older kineto bindings: one thread as far as the analysis knows
        return 0


def with_trace_bytes(profiler: Any, gpu: list[GpuEvent]) -> list[GpuEvent]:
    """Copy sizes from the Chrome trace, where kineto's Python events carry none."""
    handle, path = tempfile.mkstemp(prefix="gputrain-trace-", suffix=".json")
    os.close(handle)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profiler.export_chrome_trace(path)
        with open(path, encoding="utf-8") as stream:
            trace = json.load(stream)
    except Exception:
        return gpu
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    sizes: dict[tuple[str, int], int] = {}
    for event in trace.get("traceEvents", []):
        if not isinstance(event, dict) or not str(event.get("name", "")).startswith("Memcpy"):
            continue
        args = event.get("args") or {}
        correlation, size = args.get("correlation"), args.get("bytes")
        if isinstance(correlation, int) and isinstance(size, int):
            sizes[(str(event["name"]), correlation)] = size
    if not sizes:
        return gpu
    return [GpuEvent(e.name, e.start_ns, e.end_ns, e.correlation,
                     sizes.get((e.name, e.correlation), e.nbytes)) if e.kind == "memcpy" else e
            for e in gpu]
