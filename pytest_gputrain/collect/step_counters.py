"""Exact per-step counters of a training step, read in one untimed pass after it was timed.

``count_step`` runs the step a few more times, in three phases:

1. **plain** (``host_rounds`` steps, nothing instrumented): the host's CPU time and, where the
   kernel allows, its instructions per step, on the calling thread and torch's autograd
   threads (``host_counters``), and on CUDA the caching
   allocator's counters around each step (``torch.cuda.memory_stats``: allocations, and the
   segments it had to ``cudaMalloc``/``cudaFree``). On CUDA the GPU is synchronised before each
   step, so that the host never waits for room in the launch queue while it is being timed.
2. **Python** (``steps`` steps, ``bytecodes``): the bytecode instructions the step executed on
   its thread, by function: more Python per step, which no operator or kernel shows.
3. **operators** (``steps`` steps, ``op_counts``): ATen operators by name, and the call sites of
   copies and synchronisations.
4. **CUDA activity** (``steps`` steps, ``cuda_activity``, CUDA only): kernels and their names,
   copies (bytes, pageable or pinned), synchronisations by kind, GPU busy time.

Every step of phases 2 to 4 is counted on its own: a counter is exact when the steps agree,
and where they do not, ``varies`` holds its lowest and highest count (the value kept is the
median step's). What cannot be counted says why in ``unavailable``. The result is a plain,
JSON-ready dict (``COUNTERS_VERSION``); the regression gate stores and compares it.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pytest_gputrain.collect.host_counters import InstructionCounter, cpu_time_ns, step_threads

COUNTERS_VERSION = 1
COUNTED_STEPS = 3
# The exact counters, per step (the caching allocator's from the plain phase).
EXACT = ("kernels", "syncs", "h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes", "allocs",
         "cuda_mallocs", "ops", "bytecodes")
# What only torch's steps have (a step of plain Python still counts its bytecodes).
OF_TORCH = tuple(name for name in EXACT if name != "bytecodes")
CUDA_ONLY = ("kernels", "syncs", "h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes")
ALLOCATOR = ("allocs", "cuda_mallocs")
# memory_stats keys: allocation requests served, and segments the allocator cudaMalloc'ed.
ALLOCATOR_KEYS = {"allocs": "allocation.all.allocated", "frees": "allocation.all.freed",
                  "cuda_mallocs": "segment.all.allocated", "cuda_frees": "segment.all.freed"}


def _median(values: list[float]) -> float | int:
    middle = statistics.median_low(values) if values else 0
    return int(middle) if float(middle).is_integer() else float(middle)


def _per_step(values: list[float], name: str, kept: dict[str, Any],
              varies: dict[str, list[float]]) -> None:
    """Keep the median step's count, and the range where the steps disagreed."""
    kept[name] = _median(values)
    if values and min(values) != max(values):
        varies[name] = [min(values), max(values)]


def _histogram(steps: Iterable[Mapping[Any, int]]) -> dict[Any, float | int]:
    """Per key, the median step's count (a key a step lacks counts 0 there)."""
    steps = list(steps)
    keys = {key for step in steps for key in step}
    found = {key: _median([float(step.get(key, 0)) for step in steps]) for key in keys}
    return {key: value for key, value in found.items() if value}


def _memory_stats(torch: Any, index: int) -> dict[str, int]:
    stats = torch.cuda.memory_stats(index)
    return {name: int(stats.get(key, 0)) for name, key in ALLOCATOR_KEYS.items()}


def _plain(torch: Any | None, cuda_index: int | None, step: Callable[[], Any], rounds: int,
           out: dict[str, Any], varies: dict[str, list[float]]) -> None:
    threads = step_threads()  # after the warm-up: the autograd engine's threads exist
    opened = InstructionCounter.open(threads=threads)
    counter = opened if isinstance(opened, InstructionCounter) else None
    if isinstance(opened, str):
        out["unavailable"]["instructions"] = opened
    host: list[float] = []
    instructions: list[int] = []
    allocator: dict[str, list[float]] = {name: [] for name in ALLOCATOR_KEYS}
    multiplexed = False
    cuda = torch.cuda if torch is not None and cuda_index is not None else None
    try:
        for _ in range(rounds):
            if cuda is not None:
                cuda.synchronize()
                before_stats = _memory_stats(torch, cuda_index)  # type: ignore[arg-type]
            before = counter.read() if counter is not None else None
            started = cpu_time_ns(threads)
            step()
            spent = cpu_time_ns(threads) - started
            after = counter.read() if counter is not None else None
            host.append(spent / 1e9)
            if before is not None and after is not None:
                instructions.append(after.value - before.value)
                multiplexed = multiplexed or after.multiplexed
            if cuda is not None:
                cuda.synchronize()
                after_stats = _memory_stats(torch, cuda_index)  # type: ignore[arg-type]
                for name in ALLOCATOR_KEYS:
                    allocator[name].append(after_stats[name] - before_stats[name])
    finally:
        if counter is not None:
            out["instructions_threads"] = counter.threads
            counter.close()
    out["host_cpu"] = host
    out["host_threads"] = len(threads)
    if instructions:
        out["instructions"] = instructions
        out["instructions_multiplexed"] = multiplexed
    if cuda is not None:
        for name in ALLOCATOR:
            _per_step(allocator[name], name, out["per_step"], varies)
        out["allocator"] = {name: _median(values) for name, values in allocator.items()}


def _bytecodes(step: Callable[[], Any], steps: int, out: dict[str, Any],
               varies: dict[str, list[float]]) -> None:
    from pytest_gputrain.collect.bytecodes import count_bytecodes

    found = count_bytecodes(step, steps)
    if isinstance(found, str):
        out["unavailable"]["bytecodes"] = found
        return
    _per_step([float(s.total) for s in found], "bytecodes", out["per_step"], varies)
    out["bytecodes_by_function"] = _histogram(s.by_function for s in found)


def _operators(torch: Any, step: Callable[[], Any], steps: int, cuda: bool,
               out: dict[str, Any], varies: dict[str, list[float]]) -> None:
    from pytest_gputrain.collect.op_counts import count_ops

    found = count_ops(torch, step, steps, cuda)
    if isinstance(found, str):
        out["unavailable"]["ops"] = found
        return
    _per_step([float(sum(s.ops.values())) for s in found], "ops", out["per_step"], varies)
    out["ops_by_name"] = _histogram(s.ops for s in found)
    copies = _histogram(s.copies for s in found)
    out["copy_sites"] = [{"direction": direction, "memory": memory, "bytes": size, "op": op,
                          "site": site.where, "code": site.code, "count": count}
                         for (direction, memory, size, op, site), count in copies.items()]
    syncs = _histogram(s.syncs for s in found)
    out["sync_sites"] = [{"kind": kind, "op": what, "site": site.where, "code": site.code,
                          "count": count} for (kind, what, site), count in syncs.items()]


def _activity(torch: Any, step: Callable[[], Any], steps: int, out: dict[str, Any],
              varies: dict[str, list[float]]) -> None:
    from pytest_gputrain.collect.cuda_activity import record

    found = record(torch, step, steps)
    if isinstance(found, str):
        for name in CUDA_ONLY:
            out["unavailable"][name] = found
        return
    per_step = out["per_step"]
    _per_step([float(s.kernels) for s in found], "kernels", per_step, varies)
    _per_step([float(sum(s.syncs.values())) for s in found], "syncs", per_step, varies)
    for direction in ("h2d", "d2h"):
        _per_step([float(s.copies.get(direction, {}).get("count", 0)) for s in found],
                  f"{direction}_copies", per_step, varies)
        _per_step([float(s.copies.get(direction, {}).get("bytes", 0)) for s in found],
                  f"{direction}_bytes", per_step, varies)
    out["kernel_names"] = _histogram(s.kernel_names for s in found)
    out["syncs_by_kind"] = _histogram(s.syncs for s in found)
    out["copies"] = {direction: _histogram(s.copies.get(direction, {}) for s in found)
                     for direction in ("h2d", "d2h", "d2d")}
    out["memsets"] = _median([float(s.memsets) for s in found])
    out["graph_launches"] = _median([float(s.graph_launches) for s in found])
    out["cuda_malloc_calls"] = _median([float(s.cuda_mallocs) for s in found])
    out["cuda_free_calls"] = _median([float(s.cuda_frees) for s in found])
    out["gpu_busy"] = statistics.median(s.busy_ns for s in found) / 1e9


def count_step(step: Callable[[], Any], *, torch: Any | None, cuda_index: int | None,
               host_rounds: int, steps: int = COUNTED_STEPS) -> dict[str, Any]:
    """The counters of ``step`` (see the module docstring). ``torch`` None: a step of plain
    Python (no operators to count); ``cuda_index`` None: a CPU step. The step's own exceptions
    propagate; a counter that cannot be read says why in ``unavailable``."""
    out: dict[str, Any] = {"version": COUNTERS_VERSION, "steps": steps,
                           "host_rounds": host_rounds, "per_step": {}, "unavailable": {}}
    varies: dict[str, list[float]] = {}
    if torch is None:
        _plain(None, None, step, host_rounds, out, varies)
        _bytecodes(step, steps, out, varies)
        for name in OF_TORCH:
            out["unavailable"][name] = "torch is not in use in this benchmark"
        out["varies"] = varies
        return out
    cuda = cuda_index is not None
    with torch.cuda.device(cuda_index) if cuda else contextlib.nullcontext():
        _plain(torch, cuda_index, step, host_rounds, out, varies)
        _bytecodes(step, steps, out, varies)
        _operators(torch, step, steps, cuda, out, varies)
        if out["per_step"].get("ops") == 0 and "ops" not in varies:
            # torch is loaded, but this step is plain Python: there is nothing of torch's to
            # count, and counts of 0 would only be rows saying so
            for name in OF_TORCH:
                out["per_step"].pop(name, None)
                varies.pop(name, None)
                out["unavailable"][name] = ("the step dispatched no ATen operator: torch is "
                                            "not in use in it")
            out["varies"] = varies
            return out
        if cuda:
            _activity(torch, step, steps, out, varies)
    if not cuda:
        for name in (*CUDA_ONLY, *ALLOCATOR):
            out["unavailable"][name] = "a CPU step: no CUDA runtime to count"
    out["varies"] = varies
    return out
