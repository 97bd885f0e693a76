"""What a CUDA step asks of the GPU, counted exactly: kernels, copies, synchronisations and
allocations, step by step, from torch's profiler (kineto over CUPTI).

``record`` runs a few steps under ``torch.profiler`` (CPU and CUDA activity), each step inside a
``record_function`` mark, with a synchronisation and a short pause before and after it, so that
every CUDA runtime call of a step (on any thread: the autograd engine launches a CUDA
backward's kernels from a thread of its own) lies inside its mark, and the marker's own
synchronisations lie outside every mark. ``per_step`` then reads, per step:

- **kernels** launched (a kernel belongs to the step whose mark holds the runtime call that
  launched it, matched by CUPTI's correlation id), with a histogram of their names
  (``kernel_label``: the kernel without its parameters, and the functor that names the
  operation: ``vectorized_elementwise_kernel<MulFunctor>``), memsets apart;
- **copies**, host-to-device and device-to-host: count and bytes, and whether the host side was
  pageable or pinned memory (CUPTI's memcpy kinds, as Nsight Systems' pageable-memcpy rule
  reads them);
- **synchronisations** by kind: ``cuda(Stream|Device|Event)Synchronize`` (and the driver's
  ``cu*`` forms) and blocking ``cudaMemcpy`` calls;
- **cudaMalloc / cudaFree** calls (torch's caching allocator's, and any other library's);
- **GPU busy time**: the union of the step's kernels, copies and memsets on the GPU's timeline.

Nothing here runs unless ``record`` is called; the profiler is asked to detach CUPTI when it
stops (``collect.cupti``), and where that is unsafe nothing is recorded, since CUPTI left
attached would slow every later launch of the process. ``per_step`` is a pure function over
plain event records, so it is tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gputrain.collect.cuda_events import (
    GpuEvent,
    RuntimeEvent,
    api_name,
    event_bytes,
    with_trace_bytes,
)

STEP_MARK = "gputrain::counted_step"
GAP_S = 0.002  # the pause either side of a step: no runtime call of a step falls outside it
SYNC_KINDS = {"cudaStreamSynchronize": "stream", "cuStreamSynchronize": "stream",
              "cudaDeviceSynchronize": "device", "cuCtxSynchronize": "device",
              "cudaEventSynchronize": "event", "cuEventSynchronize": "event"}
MALLOC_CALLS = ("cudaMalloc", "cuMemAlloc", "cudaMallocAsync", "cuMemAllocAsync",
                "cudaMallocHost", "cudaHostAlloc", "cuMemHostAlloc", "cudaMallocManaged")
FREE_CALLS = ("cudaFree", "cuMemFree", "cudaFreeAsync", "cuMemFreeAsync", "cudaFreeHost",
              "cuMemFreeHost")
_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
_FUNCTOR = re.compile(r"\b(\w*Functor\w*|\w*Op(?:erator)?\b|\w+_functor\w*)")
LABEL_LENGTH = 120


@dataclass
class StepActivity:
    """What one step asked of the GPU (see the module docstring)."""

    kernels: int = 0
    kernel_names: Counter[str] = field(default_factory=Counter)
    memsets: int = 0
    copies: dict[str, dict[str, int]] = field(default_factory=dict)  # h2d/d2h/d2d -> figures
    syncs: Counter[str] = field(default_factory=Counter)  # kind -> calls
    cuda_mallocs: int = 0
    cuda_frees: int = 0
    graph_launches: int = 0
    busy_ns: int = 0


def kernel_label(name: str) -> str:
    """A kernel's name, short enough to read and still telling kernels apart: no ``void``, no
    parameter list, no namespaces, the innermost functor of its template arguments kept
    (``vectorized_elementwise_kernel<MulFunctor>``); cuDNN's and cuBLAS's kernels, which carry
    no templates, as they are (cut at ``LABEL_LENGTH``)."""
    text = name.strip()
    text = text.removeprefix("void ").replace("(anonymous namespace)::", "").strip()
    depth, cut = 0, len(text)
    for index, char in enumerate(text):
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        elif char == "(" and depth == 0:
            cut = index
            break
    text = text[:cut].strip()
    base, bracket, arguments = text.partition("<")
    base = base.rsplit("::", 1)[-1] or base
    label = base
    if bracket:
        functors = [f for f in _FUNCTOR.findall(arguments) if f]
        if functors:
            label = f"{base}<{functors[-1].rsplit('::', 1)[-1]}>"
    return label[:LABEL_LENGTH]


def _copy_kind(name: str) -> tuple[str, str] | None:
    """("h2d" | "d2h" | "d2d" | "h2h", "pageable" | "pinned" | "device") of a memcpy event."""
    match = _MEMCPY.match(name)
    if match is None:
        return None
    direction, source, target = match.groups()
    direction = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "HtoH": "h2h",
                 "PtoP": "d2d"}.get(direction, direction.lower())
    host = source if direction == "h2d" else target if direction == "d2h" else "Device"
    return direction, host.lower()


def _busy_ns(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of ``intervals`` (kernels on several streams may overlap)."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def per_step(gpu: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent],
             ranges: Sequence[tuple[int, int]]) -> list[StepActivity]:
    """Each step's activity; ``ranges`` are the steps' marks (start, end) on the host's clock,
    in order. Runtime calls outside every mark (the marker's own synchronisations) count for
    no step."""
    steps = [StepActivity() for _ in ranges]
    starts = [start for start, _ in ranges]

    def step_of(moment: int) -> int | None:
        for index, (start, end) in enumerate(ranges):
            if start <= moment <= end:
                return index
        return None

    launched: dict[int, int] = {}
    for call in runtime:
        index = step_of(call.start_ns)
        if index is None:
            continue
        name = api_name(call.name)
        if call.correlation:
            launched[call.correlation] = index
        step = steps[index]
        if name in SYNC_KINDS:
            step.syncs[SYNC_KINDS[name]] += 1
        elif name.startswith(("cudaMemcpy", "cuMemcpy")) and "Async" not in name:
            step.syncs["memcpy"] += 1  # returns once the copy is done: a wait in itself
        elif name.startswith(MALLOC_CALLS):
            step.cuda_mallocs += 1
        elif name.startswith(FREE_CALLS):
            step.cuda_frees += 1
        elif name in ("cudaGraphLaunch", "cuGraphLaunch"):
            step.graph_launches += 1
    intervals: list[list[tuple[int, int]]] = [[] for _ in ranges]
    for event in gpu:
        index = launched.get(event.correlation) if event.correlation else None
        if index is None:  # no launch seen: the step that began last before it ran
            earlier = [i for i, start in enumerate(starts) if start <= event.start_ns]
            if not earlier or event.correlation:
                continue
            index = earlier[-1]
        step = steps[index]
        intervals[index].append((event.start_ns, max(event.end_ns, event.start_ns)))
        if event.kind == "kernel":
            step.kernels += 1
            step.kernel_names[kernel_label(event.name)] += 1
        elif event.kind == "memset":
            step.memsets += 1
        else:
            kind = _copy_kind(event.name)
            if kind is None:
                continue
            direction, memory = kind
            figures = step.copies.setdefault(direction, {"count": 0, "bytes": 0})
            figures["count"] += 1
            figures["bytes"] += event.nbytes
            figures[memory] = figures.get(memory, 0) + 1
    for step, spans in zip(steps, intervals, strict=True):
        step.busy_ns = _busy_ns(spans)
    return steps


GPU_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_ACTIVITIES = ("cuda_runtime", "cuda_driver")


def _activity(event: Any) -> str | None:
    """Kineto's activity type (``kernel``, ``gpu_memcpy``, ``cuda_runtime``,
    ``user_annotation``, ``gpu_user_annotation``...), or None where this torch has none."""
    try:
        return str(event.activity_type())
    except Exception:
        return None


def convert(events: Iterable[Any]) -> tuple[list[GpuEvent], list[RuntimeEvent],
                                             list[tuple[int, int]]]:
    """Kineto events (``prof.profiler.kineto_results.events()``) as plain records, and the
    steps' marks (the host's: a ``record_function`` range is drawn on the GPU's timeline too,
    as a ``gpu_user_annotation``, which is no step and no kernel)."""
    gpu: list[GpuEvent] = []
    runtime: list[RuntimeEvent] = []
    ranges: list[tuple[int, int]] = []
    for event in events:
        name = str(event.name())
        start = int(event.start_ns())
        end = start + int(event.duration_ns())
        correlation = int(event.correlation_id() or 0)
        activity = _activity(event)
        on_gpu = str(event.device_type()).endswith("CUDA")
        if activity is not None and "annotation" in activity:
            if name == STEP_MARK and activity == "user_annotation":
                ranges.append((start, end))
            continue
        if name == STEP_MARK:
            if not on_gpu:
                ranges.append((start, end))
        elif activity in GPU_ACTIVITIES or (activity is None and on_gpu):
            nbytes = event_bytes(event) if name.startswith("Memcpy") else 0
            gpu.append(GpuEvent(name, start, end, correlation, nbytes))
        elif activity in RUNTIME_ACTIVITIES or (activity is None and not on_gpu
                                                 and re.match(r"cu[A-Z]|cuda[A-Z]", name)):
            runtime.append(RuntimeEvent(name, start, end, correlation))
    return gpu, runtime, sorted(ranges)


def profiler_busy(torch: Any) -> str | None:
    """Why no profiler can start now (another torch profiler is running), else None."""
    with contextlib.suppress(Exception):
        if torch.autograd.profiler._is_profiler_enabled:
            return "another torch profiler is running"
    with contextlib.suppress(Exception):
        if torch._C._autograd._profiler_enabled():
            return "another torch profiler is running"
    return None


def record(torch: Any, step: Callable[[], Any], steps: int) -> list[StepActivity] | str:
    """Run ``step`` ``steps`` times under the profiler on the current CUDA device; each step's
    activity, or why none was recorded. Never raises for the profiler's sake (the step's own
    exceptions propagate)."""
    from pytest_gputrain.collect.cupti import ask_for_teardown

    busy = profiler_busy(torch)
    if busy is not None:
        return busy
    teardown = ask_for_teardown(torch)
    if not teardown.on:
        return (f"not counted: CUPTI would stay attached after the profiler ({teardown.reason}) "
                "and slow every later kernel launch of this process")
    try:
        from torch.profiler import ProfilerActivity, record_function
        from torch.profiler import profile as _profile
    except Exception as exc:
        return f"torch.profiler cannot be used: {exc}"
    profile: Any = _profile
    cuda = torch.cuda
    cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events..." is not the user's
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.start()
    try:
        for _ in range(steps):
            time.sleep(GAP_S)
            with record_function(STEP_MARK):
                step()
            cuda.synchronize()
            time.sleep(GAP_S)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profiler.stop()
    results = getattr(profiler.profiler, "kineto_results", None)
    if results is None:
        return "the profiler returned no events"
    gpu, runtime, ranges = convert(results.events())
    if len(ranges) != steps:
        return f"the profiler kept {len(ranges)} of the {steps} step marks"
    if not gpu and not runtime:
        return ("the profiler saw no CUDA activity in the steps (CUPTI not working here, or "
                "the step runs nothing on the GPU)")
    if any(e.kind == "memcpy" and not e.nbytes for e in gpu):
        gpu = with_trace_bytes(profiler, gpu)
    return per_step(gpu, runtime, ranges)
