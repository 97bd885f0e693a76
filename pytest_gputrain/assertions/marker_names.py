"""The GPU markers' and fixtures' names and the markers' help lines: all that pytest needs of
them at start-up (registering the markers, finding the GPU tests). Parsing their arguments is
``markers.py``'s, loaded when a GPU test is found.
"""

from __future__ import annotations

REQUIRES_CUDA = "requires_cuda"
MAX_VRAM = "max_vram"
MIN_UTILIZATION = "min_utilization"
GPU = "gpu"
GPU_MARKERS = (REQUIRES_CUDA, MAX_VRAM, MIN_UTILIZATION, GPU)
GPU_FIXTURES = ("gpu", "gpu_monitor")

#: ``markers`` ini lines, registered by the plugin (shown by ``pytest --markers``).
MARKER_HELP: tuple[str, ...] = (
    "gpu: a GPU test (added to every test with a GPU marker or the gpu/gpu_monitor fixtures, so "
    "`-m gpu` / `-m 'not gpu'` select them); skipped when no CUDA GPU is usable, failed instead "
    "with --gpu-required.",
    "requires_cuda(min_devices=1, min_capability=None, min_total_vram=None, min_free_vram=None, "
    "bf16=False, min_torch=None, min_driver=None): skip unless a CUDA GPU meets every condition, "
    "with the unmet one as the reason. min_capability=(8, 0) or \"8.0\"; sizes such as \"24GiB\"; "
    "min_free_vram is free now, after other processes; min_torch=\"2.1\"; min_driver=\"535\". "
    "Adds the gpu marker.",
    "max_vram(limit, measure=\"allocated\"): fail the test when its peak GPU memory exceeds "
    "limit (\"6GiB\", \"6 GB\", 6e9). measure: allocated (torch.cuda.max_memory_allocated, "
    "default), reserved (caching allocator) or device (NVML: this process's memory, sampled). "
    "The failure shows the peak, the excess and the top allocations. Adds the gpu marker.",
    "min_utilization(percent, warmup=0, interval=0.05): fail the test when the mean GPU "
    "utilization (NVML, sampled every interval seconds over the call phase, after warmup "
    "seconds) is below percent (70 or \"70%\"). Adds the gpu marker.",
)
