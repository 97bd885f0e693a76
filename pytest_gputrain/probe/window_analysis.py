"""What the profiler window's events say: what only a profiler sees.

The window (``profiler_window.py``) covers a few steps of each diagnosed test
(``gpu_profile_steps``, default 3-6). It records GPU activity (kernels, copies) and the CUDA
runtime calls that launched them; from those this module yields:

- kernel busy time / wall time of the profiled steps (the TensorBoard profiler plugin's "GPU
  utilization": < 50 % means the GPU mostly waits);
- kernel count and mean duration per step (HolisticTraceAnalysis: kernels < 50 µs mark a
  launch-bound run), and how much of the GPU's idle time was host wait (the next kernel was
  launched only after the GPU had gone idle);
- host-to-device copies from pageable vs pinned memory (Nsight Systems' pageable-memcpy rule);
- matmul/convolution kernels and whether they run on tensor cores (kernel names);
- ``cuda*Synchronize`` calls per step, and the host time spent waiting in them (plus
  device-to-host copies, which wait the same way);
- kernel time per step (so that busy time can be judged against the step time measured outside
  the window: the profiler's callbacks slow every launch) and CUDA graph launches per step.
- small host-to-device copies (tensors built on the host every step) and the host time of their
  runtime calls, with the synchronisation a blocking copy makes right after (``small_copies``).
- host-side work that starves the GPU: idle GPU time during which no thread made a CUDA call
  for a while (Python, CPU preprocessing, I/O in the loop);
- elementwise/reduction and Triton kernels' share of kernel time (eager pointwise ops that a
  compiler would fuse);
- NCCL kernels: communication time, and how much of it no computation overlapped;
- pinned host-to-device copies that the host waited for (``non_blocking=False``).

``analyse`` is a pure function over plain event records, so it is tested on CPU machines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_gputrain.collect.cuda_events import (
    GpuEvent,
    RuntimeEvent,
    api_name,
    event_bytes,
    thread_of,
)

SHORT_KERNEL_NS = 50_000  # HolisticTraceAnalysis: kernels under 50 µs are "short"

# Matmul and convolution kernels (cuBLAS, cuBLASLt/nvjet, cuDNN, CUTLASS, xmma, Triton mm).
GEMM_PATTERN = re.compile(
    r"gemm|conv|fprop|dgrad|wgrad|matmul|cutlass|xmma|gmma|nvjet|winograd|implicit_convolve"
    r"|cublas|\bmm_|_mm\b|triton_tem_fused_mm|bmm",
    re.IGNORECASE,
)
# Kernels that run on tensor cores: MMA instruction families and reduced-precision or TF32 data
# types in cuBLAS/cuBLASLt (nvjet)/cuDNN/CUTLASS kernel names. Plain FP32 kernels say sgemm, simt,
# ffma or f32f32_f32f32 (seen on an H200: sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...,
# cutlass_80_simt_sgemm_...; TF32: sm90_xmma_gemm_f32f32_tf32f32_...; bf16: nvjet_sm90_tst_...).
TENSOR_CORE_PATTERN = re.compile(
    r"hmma|wgmma|gmma|tensorop|[shi]16816|[shi]1688|[shi]884|imma|bf16|fp16|f16|half|tf32"
    r"|e4m3|e5m2|nvjet|tensor\d+x\d+x\d+",
    re.IGNORECASE,
)
NOT_TENSOR_CORE_PATTERN = re.compile(r"sgemm|simt|ffma|nvjet_sm\d+_sss", re.IGNORECASE)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")
GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch", "cuGraphLaunch")
LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cudaMemcpy", "cudaMemset",
                   "cuMemcpy", "cuMemset")
SMALL_COPY_BYTES = 64 * 1024  # Nsight Systems' boundary for small memory transfers
# torch's non_blocking=False copy is cudaMemcpyAsync followed at once, on the same thread, by a
# synchronize (at::cuda::memcpy_and_sync); a later sync is other work's.
SYNC_AFTER_COPY_NS = 100_000

# Eager elementwise and reduction kernels of ATen (at::native::vectorized_elementwise_kernel,
# unrolled_elementwise_kernel, elementwise_kernel, index_elementwise_kernel, reduce_kernel), as
# named since torch 1.x; fused library kernels (layer norm, softmax, foreach optimizer steps) are
# not matched: they are fused already.
ELEMENTWISE_PATTERN = re.compile(r"elementwise_kernel|reduce_kernel", re.IGNORECASE)
# TorchInductor's generated kernels: triton_poi_/triton_red_/triton_per_/triton_tem_fused_...
# (older releases: triton__0d1d2d...).
TRITON_PATTERN = re.compile(r"^(void )?triton_", re.IGNORECASE)
# cuDNN's layout conversions around tensor-core convolutions of NCHW tensors
# (cudnn::ops::nchwToNhwcKernel, nhwcToNchwKernel).
LAYOUT_TRANSPOSE_PATTERN = re.compile(r"nchwToNhwc|nhwcToNchw", re.IGNORECASE)
# Fused attention kernels: flash (flash_fwd_kernel, flash_bwd_..., pytorch_flash::),
# memory-efficient (fmha_cutlassF_/fmha_cutlassB_..., efficient_attention), cuDNN's
# (cudnn_generated_fort_native_sdpa_sm90_flash_fprop_...).
ATTENTION_PATTERN = re.compile(r"flash_|fmha|attention|_sdpa_", re.IGNORECASE)
# NCCL collectives: ncclKernel_AllReduce_RING_LL_Sum_float (NCCL < 2.19),
# ncclDevKernel_AllReduce_Sum_f32_RING_LL (2.19 and later).
COMM_PATTERN = re.compile(r"nccl", re.IGNORECASE)
STREAM_SYNC_CALLS = ("cudaStreamSynchronize", "cuStreamSynchronize")
MEMCPY_CALL_PREFIXES = ("cudaMemcpy", "cuMemcpy")
# A host-side gap shorter than this is the ordinary Python and dispatcher time between two
# launches (a few to a few tens of µs per op in eager mode); longer gaps are other work.
SILENT_GAP_NS = 200_000


def is_gemm(name: str) -> bool:
    return GEMM_PATTERN.search(name) is not None


def is_tensor_core(name: str) -> bool:
    return (TENSOR_CORE_PATTERN.search(name) is not None
            and NOT_TENSOR_CORE_PATTERN.search(name) is None)


def _merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping intervals covering the same time."""
    merged: list[tuple[int, int]] = []
    for begin, finish in sorted(intervals):
        if merged and begin <= merged[-1][1]:
            if finish > merged[-1][1]:
                merged[-1] = (merged[-1][0], finish)
        else:
            merged.append((begin, finish))
    return merged


def _union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    return sum(finish - begin for begin, finish in _merged(intervals))


def _calls_by_thread(runtime: Sequence[RuntimeEvent]) -> dict[int, list[RuntimeEvent]]:
    """Each host thread's runtime calls in time order."""
    by_thread: dict[int, list[RuntimeEvent]] = {}
    for event in sorted(runtime, key=lambda e: e.start_ns):
        by_thread.setdefault(event.thread, []).append(event)
    return by_thread


def _copy_calls(by_thread: dict[int, list[RuntimeEvent]]) -> dict[int, tuple[int, int]]:
    """Copy calls by correlation id: (thread, index in that thread's calls)."""
    return {event.correlation: (thread, index)
            for thread, events in by_thread.items() for index, event in enumerate(events)
            if event.correlation and event.name.startswith(MEMCPY_CALL_PREFIXES)}


def _sync_after(events: Sequence[RuntimeEvent], index: int,
                syncs: tuple[str, ...]) -> RuntimeEvent | None:
    """The synchronize call (one of ``syncs``) that follows ``events[index]`` on its thread
    within SYNC_AFTER_COPY_NS and before any launch: the copy made the host wait."""
    call = events[index]
    for following in events[index + 1:]:
        if following.start_ns - call.end_ns > SYNC_AFTER_COPY_NS:
            return None
        if api_name(following.name) in syncs:
            return following
        if following.name.startswith(LAUNCH_PREFIXES):
            return None  # the host went on to other work: the copy did not block it
    return None


def _gaps(merged: Sequence[tuple[int, int]], start: int, end: int,
          min_ns: int = 0) -> list[tuple[int, int]]:
    """The parts of [start, end] that ``merged`` does not cover, at least ``min_ns`` long."""
    gaps: list[tuple[int, int]] = []
    cursor = start
    for begin, finish in merged:
        if begin > cursor and begin - cursor >= min_ns:
            gaps.append((cursor, min(begin, end)))
        cursor = max(cursor, finish)
        if cursor >= end:
            break
    if end > cursor and end - cursor >= min_ns:
        gaps.append((cursor, end))
    return gaps


def _overlap_ns(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """Time covered by both of two merged interval lists."""
    total = i = j = 0
    while i < len(a) and j < len(b):
        low = max(a[i][0], b[j][0])
        high = min(a[i][1], b[j][1])
        if high > low:
            total += high - low
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _host_wait_ns(kernels: Sequence[GpuEvent], launches: dict[int, RuntimeEvent]
                  ) -> tuple[int, int] | None:
    """(idle ns between GPU activities, of which the host had not launched the next one yet)."""
    if len(kernels) < 2 or not launches:
        return None
    ordered = sorted(kernels, key=lambda e: e.start_ns)
    busy_until = ordered[0].end_ns
    idle = host = 0
    matched = 0
    for event in ordered[1:]:
        gap = event.start_ns - busy_until
        if gap > 0:
            idle += gap
            launch = launches.get(event.correlation)
            if launch is not None:
                matched += 1
                # Launched after the GPU went idle: the GPU waited for the host.
                if launch.start_ns >= busy_until:
                    host += gap
                elif launch.end_ns > busy_until:
                    host += min(gap, launch.end_ns - busy_until)
        busy_until = max(busy_until, event.end_ns)
    if matched == 0:
        return None
    return idle, host


def _sync_wait_ns(gpu: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent], own_syncs: int
                  ) -> int:
    """Host time inside synchronize calls and device-to-host copy calls (they return only when
    the GPU has caught up). The window's own closing ``cudaDeviceSynchronize`` is left out."""
    to_host = {e.correlation for e in gpu
               if e.kind == "memcpy" and "DtoH" in e.name and e.correlation}
    waits = [e for e in runtime if api_name(e.name) in SYNC_CALLS]
    if own_syncs and waits:
        device_syncs = [e for e in waits if api_name(e.name) == "cudaDeviceSynchronize"]
        if device_syncs:
            waits.remove(max(device_syncs, key=lambda e: e.start_ns))
    copies = [e for e in runtime if e.correlation in to_host
              and e.name.startswith(MEMCPY_CALL_PREFIXES)]
    return _union_ns((e.start_ns, e.end_ns) for e in [*waits, *copies])


def analyse(gpu: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent], wall: float, steps: int,
            own_syncs: int = 0) -> dict[str, Any]:
    """ProfileFacts fields from a window's events (``wall`` seconds, ``steps`` steps)."""
    steps = max(1, steps)
    kernels = [e for e in gpu if e.kind == "kernel"]
    copies = [e for e in gpu if e.kind == "memcpy"]
    kernel_ns = _union_ns((e.start_ns, e.end_ns) for e in kernels)
    wall_ns = max(1, int(wall * 1e9))
    durations = [e.duration_ns for e in kernels]
    gemm = [e for e in kernels if is_gemm(e.name)]
    gemm_ns = sum(e.duration_ns for e in gemm)
    tc = [e for e in gemm if is_tensor_core(e.name)]
    tc_ns = sum(e.duration_ns for e in tc)
    all_kernel_ns = sum(durations)
    pageable = [e for e in copies if "HtoD" in e.name and "Pageable" in e.name]
    pinned = [e for e in copies if "HtoD" in e.name and "Pinned" in e.name]
    syncs = sum(1 for e in runtime if api_name(e.name) in SYNC_CALLS)
    syncs = max(0, syncs - own_syncs)
    graph_launches = sum(1 for e in runtime if api_name(e.name) in GRAPH_LAUNCH_CALLS)
    launches = {e.correlation: e for e in runtime
                if e.correlation and e.name.startswith(LAUNCH_PREFIXES)}
    waits = _host_wait_ns(kernels, launches)
    by_name: dict[str, int] = {}
    for event in kernels:
        by_name[event.name] = by_name.get(event.name, 0) + event.duration_ns
    top = sorted(by_name.items(), key=lambda item: -item[1])[:5]
    facts: dict[str, Any] = {
        "wall": wall,
        "step_time": wall / steps,
        "kernel_time": kernel_ns / 1e9,
        "kernel_time_per_step": kernel_ns / 1e9 / steps,
        "busy_percent": round(min(100.0, 100.0 * kernel_ns / wall_ns), 2),
        "kernels": len(kernels),
        "kernels_per_step": round(len(kernels) / steps, 2),
        "kernel_mean": round(all_kernel_ns / len(kernels) / 1000, 3) if kernels else None,
        "short_kernel_percent": round(
            100.0 * sum(1 for d in durations if d < SHORT_KERNEL_NS) / len(kernels), 2)
        if kernels else None,
        "gemm_percent": round(100.0 * gemm_ns / all_kernel_ns, 2) if all_kernel_ns else None,
        "tensor_core_percent": round(100.0 * tc_ns / gemm_ns, 2) if gemm_ns else None,
        "tensor_core_kernels": len(tc),
        "h2d_pageable_copies": len(pageable),
        "h2d_pageable_bytes_per_step": (sum(e.nbytes for e in pageable) / steps
                                        if any(e.nbytes for e in pageable) else
                                        0.0 if not pageable else None),
        "h2d_pageable_percent": round(
            100.0 * sum(e.duration_ns for e in pageable) / wall_ns, 2),
        "h2d_pinned_copies": len(pinned),
        "syncs_per_step": round(syncs / steps, 2),
        "sync_wait_percent": round(
            min(100.0, 100.0 * _sync_wait_ns(gpu, runtime, own_syncs) / wall_ns), 2),
        "graph_launches_per_step": round(graph_launches / steps, 2),
        "host_wait_percent": round(100.0 * waits[1] / waits[0], 2) if waits and waits[0] else None,
        "top_kernels": [f"{name[:120]} ({ns / 1e6:.2f} ms)" for name, ns in top],
    }
    facts.update(small_copies(copies, runtime, wall_ns, steps))
    facts.update(kernel_families(kernels))
    facts.update(communication(kernels, wall_ns))
    facts.update(host_silence(gpu, runtime, wall_ns, steps))
    facts.update(blocking_pinned_copies(copies, runtime, steps))
    facts.update(read_backs(copies, runtime, steps, own_syncs))
    return facts


def small_copies(copies: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent], wall_ns: int,
                 steps: int) -> dict[str, Any]:
    """Host-to-device copies under 64 KiB: how many per step, and the host time of the runtime
    calls that made them plus the stream synchronisation each blocking copy makes right after
    (``Tensor.cuda()`` / ``.to("cuda")`` of a host tensor: ``cudaMemcpyAsync`` then
    ``cudaStreamSynchronize``). Empty (facts unknown) when no copy carries its size."""
    h2d = [e for e in copies if "HtoD" in e.name]
    if h2d and not any(e.nbytes for e in h2d):
        return {}
    small = [e for e in h2d if 0 < e.nbytes < SMALL_COPY_BYTES]
    by_thread = _calls_by_thread(runtime)
    calls = _copy_calls(by_thread)
    host_ns = syncs = 0
    for copy in small:
        found = calls.get(copy.correlation)
        if found is None:
            continue
        events = by_thread[found[0]]
        call = events[found[1]]
        host_ns += call.end_ns - call.start_ns
        sync = _sync_after(events, found[1], SYNC_CALLS)
        if sync is not None:
            host_ns += sync.end_ns - sync.start_ns
            syncs += 1
    return {
        "h2d_small_copies_per_step": round(len(small) / steps, 2),
        "h2d_small_host_percent": round(100.0 * host_ns / wall_ns, 2),
        "h2d_small_syncs_per_step": round(syncs / steps, 2),
    }


def kernel_families(kernels: Sequence[GpuEvent]) -> dict[str, Any]:
    """Eager elementwise/reduction kernels' and Triton kernels' shares of kernel time (GT128),
    cuDNN's NCHW<->NHWC conversions (GT126: the cost channels_last removes), and the fused
    attention kernels (flash, memory-efficient, cuDNN's: what a causal mask given as a tensor
    costs, GT155)."""
    total = sum(e.duration_ns for e in kernels)
    if not total:
        return {"elementwise_percent": None, "triton_percent": None,
                "layout_transpose_percent": None, "attention_percent": None}
    elementwise = sum(e.duration_ns for e in kernels if ELEMENTWISE_PATTERN.search(e.name))
    triton = sum(e.duration_ns for e in kernels if TRITON_PATTERN.search(e.name))
    transposes = sum(e.duration_ns for e in kernels if LAYOUT_TRANSPOSE_PATTERN.search(e.name))
    attention = sum(e.duration_ns for e in kernels if ATTENTION_PATTERN.search(e.name))
    return {"attention_percent": round(100.0 * attention / total, 2),
            "elementwise_percent": round(100.0 * elementwise / total, 2),
            "triton_percent": round(100.0 * triton / total, 2),
            "layout_transpose_percent": round(100.0 * transposes / total, 2)}


def communication(kernels: Sequence[GpuEvent], wall_ns: int) -> dict[str, Any]:
    """NCCL kernel time, and how much of it no other kernel overlapped (GT311).

    HolisticTraceAnalysis's communication/computation overlap: computation while communicating
    / communication time. Exposed communication is NCCL time with no computation at the same
    moment: the step waits for it."""
    comm = _merged((e.start_ns, e.end_ns) for e in kernels if COMM_PATTERN.search(e.name))
    if not comm:
        return {"comm_percent": 0.0, "comm_exposed_percent": 0.0,
                "comm_overlap_percent": None}
    compute = _merged((e.start_ns, e.end_ns) for e in kernels
                      if not COMM_PATTERN.search(e.name))
    comm_ns = sum(finish - begin for begin, finish in comm)
    overlap = _overlap_ns(comm, compute)
    return {"comm_percent": round(min(100.0, 100.0 * comm_ns / wall_ns), 2),
            "comm_exposed_percent": round(min(100.0, 100.0 * (comm_ns - overlap) / wall_ns), 2),
            "comm_overlap_percent": round(100.0 * overlap / comm_ns, 2) if comm_ns else None}


def host_silence(gpu: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent], wall_ns: int,
                 steps: int) -> dict[str, Any]:
    """GPU idle time during which no host thread made a CUDA runtime call for at least
    SILENT_GAP_NS (GT117).

    While the host launches kernels, copies or waits in a synchronize, it is in a runtime call
    at least every few tens of µs; a longer silence is work outside CUDA (Python loops, CPU
    preprocessing, metrics, I/O, waiting for the DataLoader). Only the part that leaves the
    GPU without work counts: a silence while queued kernels run costs nothing."""
    if not runtime or not gpu:
        return {"host_silent_percent": None, "host_silent_per_step": None}
    start = min(min(e.start_ns for e in gpu), min(e.start_ns for e in runtime))
    end = max(max(e.end_ns for e in gpu), max(e.end_ns for e in runtime))
    busy = _merged((e.start_ns, e.end_ns) for e in gpu)
    idle = _gaps(busy, start, end)
    host = _merged((e.start_ns, e.end_ns) for e in runtime)
    silent = _gaps(host, start, end, SILENT_GAP_NS)
    starved_ns = _overlap_ns(idle, silent)
    return {"host_silent_percent": round(min(100.0, 100.0 * starved_ns / wall_ns), 2),
            "host_silent_per_step": round(starved_ns / 1e9 / steps, 6)}


def blocking_pinned_copies(copies: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent],
                           steps: int) -> dict[str, Any]:
    """Pinned host-to-device copies the host waited for (GT130): the copy's runtime call is
    followed on the same thread by a stream synchronize within SYNC_AFTER_COPY_NS, which is
    what ``tensor.to("cuda")`` without ``non_blocking=True`` does."""
    pinned = [e for e in copies if "HtoD" in e.name and "Pinned" in e.name and e.correlation]
    if not pinned or not runtime:
        return {"h2d_pinned_blocking_per_step": None if pinned else 0.0}
    by_thread = _calls_by_thread(runtime)
    calls = _copy_calls(by_thread)
    blocking = matched = 0
    for copy in pinned:
        found = calls.get(copy.correlation)
        if found is None:
            continue
        matched += 1
        if _sync_after(by_thread[found[0]], found[1], STREAM_SYNC_CALLS) is not None:
            blocking += 1
    if not matched:
        return {"h2d_pinned_blocking_per_step": None}
    return {"h2d_pinned_blocking_per_step": round(blocking / steps, 2)}


DEVICE_SYNC_CALLS = ("cudaDeviceSynchronize", "cuCtxSynchronize")


def read_backs(copies: Sequence[GpuEvent], runtime: Sequence[RuntimeEvent], steps: int,
               own_syncs: int = 0) -> dict[str, Any]:
    """Syncs in which the host waited for a value from the GPU (GT104), per step: a
    device-to-host copy whose runtime call is followed on the same thread by a synchronize
    before any other launch (``.item()``, ``.cpu()``, ``print(t)``, ``nonzero`` and boolean
    masks: torch's memcpy-and-sync), a synchronous ``cudaMemcpy`` to the host, and explicit
    device synchronizations (``torch.cuda.synchronize()``). Event waits and stream syncs with no
    copy before them are libraries' own (cuDNN benchmark mode timing its algorithms, DDP's and
    NCCL's bookkeeping): not the code's, and nothing its author could remove."""
    ordered = sorted(runtime, key=lambda e: e.start_ns)
    device_syncs = max(0, sum(1 for e in ordered if api_name(e.name) in DEVICE_SYNC_CALLS)
                       - own_syncs)
    to_host = {e.correlation for e in copies if "DtoH" in e.name and e.correlation}
    by_thread = _calls_by_thread(ordered)
    copied = 0
    for thread, index in _copy_calls(by_thread).values():
        call = by_thread[thread][index]
        if call.correlation not in to_host:
            continue
        if not api_name(call.name).endswith("Async"):
            copied += 1  # cudaMemcpy returns once the copy is done: a wait in itself
        elif _sync_after(by_thread[thread], index, SYNC_CALLS) is not None:
            copied += 1
    return {"readback_syncs_per_step": round((copied + device_syncs) / max(1, steps), 2)}


def convert(events: Iterable[Any]) -> tuple[list[GpuEvent], list[RuntimeEvent]]:
    """Kineto events (``prof.profiler.kineto_results.events()``) as plain records."""
    gpu: list[GpuEvent] = []
    runtime: list[RuntimeEvent] = []
    for event in events:
        name = str(event.name())
        start = int(event.start_ns())
        end = start + int(event.duration_ns())
        correlation = int(event.correlation_id() or 0)
        if str(event.device_type()).endswith("CUDA"):
            nbytes = event_bytes(event) if name.startswith("Memcpy") else 0
            gpu.append(GpuEvent(name, start, end, correlation, nbytes))
        elif name.startswith(("cuda", "cu")):
            runtime.append(RuntimeEvent(name, start, end, correlation, thread_of(event)))
    return gpu, runtime
