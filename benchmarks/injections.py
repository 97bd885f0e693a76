"""Regressions injected into a training step, each of the kind a launch-bound step pays for
per step, for ``regression_power.py --injections``: does the gate catch them, and name them?

- ``kernel``: one extra small elementwise kernel per block (a multiply by 1.0 of each ResNet
  block's output, or of the conv net's last convolution: its forward and its backward);
- ``sync``: one extra synchronisation per step (``loss.item()`` after the step);
- ``copy``: one extra pageable host-to-device copy per step (a tensor in ordinary host memory
  copied with ``.to(device)``, which also waits for the copy);
- ``python``: extra Python work per step (a loop of integer arithmetic);
- ``alloc``: one extra allocation per step that the caching allocator cannot serve from its
  cache (a buffer in a memory pool of its own, ``torch.cuda.MemPool``, dropped after the
  step, so the next step's comes from ``cudaMalloc`` again).

Each is sized to about ``--size`` (2 %) of the step where a size can be chosen: the Python
work and the copy's bytes are calibrated in a first session from the step's median, the
loop's speed and the pageable copy's bandwidth; one kernel per block, one sync and one
allocation are what they are, and the run reports what each cost (the measured change in
step time). On the CPU, only ``kernel`` and ``python`` apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

VARIANTS = ("unchanged", "kernel", "sync", "copy", "python", "alloc")
CPU_VARIANTS = ("unchanged", "kernel", "python")
# What the verdict must name for each injection: a regression row of one of these metrics.
EXPECTED: dict[str, tuple[str, ...]] = {
    "kernel": ("kernels", "ops"), "sync": ("syncs",), "copy": ("h2d_copies", "h2d_bytes"),
    "python": ("bytecodes", "host_cpu", "instructions"), "alloc": ("allocs", "cuda_mallocs"),
}
# ...or a regression whose reason names the injected call itself (a GPU-bound step's copy is
# gated through the sync it makes: "+1 sync per step (Tensor.to() at injections.py:96 ...)").
CALLS: dict[str, tuple[str, ...]] = {
    "copy": ("Tensor.to()",), "sync": ("Tensor.item()",), "python": ("python_work (",),
}
WHAT = {
    "unchanged": "the step as it is",
    "kernel": "one extra small elementwise kernel per block",
    "sync": "one extra sync per step (loss.item())",
    "copy": "one extra pageable host-to-device copy per step",
    "python": "extra Python work per step",
    "alloc": "one extra allocation per step that the cache cannot serve (cudaMalloc)",
}
ALLOC_BYTES = 64 << 20


def python_work(iterations: int) -> int:
    """Pure Python arithmetic: what a few more lines of bookkeeping per step cost."""
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def seconds_per_iteration(trials: int = 7, iterations: int = 20_000) -> float:
    """The fastest of a few timings of ``python_work``, per iteration."""
    best = float("inf")
    for _ in range(trials):
        started = time.perf_counter()
        python_work(iterations)
        best = min(best, time.perf_counter() - started)
    return best / iterations


def pageable_seconds_per_byte(torch: Any, device: str, size: int = 4 << 20) -> float:
    """The fastest of a few pageable host-to-device copies of ``size`` bytes, per byte."""
    host = torch.empty(size, dtype=torch.uint8)
    best = float("inf")
    for _ in range(7):
        torch.cuda.synchronize()
        started = time.perf_counter()
        host.to(device)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best / size


def sizes(torch: Any, device: str, medians: dict[str, float], share: float) -> dict[str, Any]:
    """Per step, the Python iterations and the copy's bytes that cost ``share`` of its
    median."""
    per_iteration = seconds_per_iteration()
    per_byte = pageable_seconds_per_byte(torch, device) if device != "cpu" else None
    return {step: {"python_iterations": max(1, int(share * median / per_iteration)),
                   "copy_bytes": (max(4096, int(share * median / per_byte))
                                  if per_byte else 0)}
            for step, median in medians.items()}


def inject(torch: Any, step: Callable[[], Any], variant: str, device: str,
           size: dict[str, Any]) -> Callable[[], Any]:
    """``step`` with one injection (``kernel`` is built into the model instead: ``build``)."""
    if variant in ("unchanged", "kernel"):
        return step
    if variant == "sync":
        def synced() -> Any:
            loss = step()
            loss.item()
            return loss
        return synced
    if variant == "copy":
        host = torch.empty(int(size["copy_bytes"]), dtype=torch.uint8)  # pageable

        def copied() -> Any:
            host.to(device)
            return step()
        return copied
    if variant == "python":
        iterations = int(size["python_iterations"])

        def worked() -> Any:
            python_work(iterations)
            return step()
        return worked
    if variant == "alloc":
        pool_type = getattr(torch.cuda, "MemPool", None)
        use_pool = getattr(torch.cuda, "use_mem_pool", None)

        def allocated() -> Any:
            if pool_type is None or use_pool is None:  # torch < 2.5: a cached allocation
                torch.empty(ALLOC_BYTES, dtype=torch.uint8, device=device)
                return step()
            pool = pool_type()
            with use_pool(pool):
                buffer = torch.empty(ALLOC_BYTES, dtype=torch.uint8, device=device)
            del buffer, pool
            return step()
        return allocated
    raise ValueError(f"unknown injection {variant!r}; one of {', '.join(VARIANTS)}")


def build(torch: Any, step: str, device: str, variant: str, gpu_batch: int) -> Any:
    """The step to time, with the ``kernel`` injection built into its model."""
    import training_step

    extra = variant == "kernel"
    if step == "launch":
        if device == "cpu":
            return training_step.build_resnet18_step(torch, device, batch=2, size=32, width=8,
                                                     extra_kernel=extra)
        return training_step.build_resnet18_step(torch, device, batch=32, size=224,
                                                 extra_kernel=extra)
    return training_step.build_step(torch, device, 64 if device == "cpu" else gpu_batch,
                                    extra_kernel=extra)
