"""The GPU assertions' options (each with an ini twin): the table pytest shows, and nothing that
checks a value (``assertion_settings.py`` does, where one is set)."""

from __future__ import annotations

from pytest_gputrain.options import Option

DEFAULT_HISTORY = 20000  # allocation-history entries recorded for a max_vram failure

OPTIONS: tuple[Option, ...] = (
    Option("--gpu-required", "gpu_required",
           "a GPU test that would be skipped (no usable GPU, unmet requires_cuda) is an error "
           "at its setup instead (a failure where it skips inside its body): for GPU CI "
           "runners that must not pass vacuously", kind="bool", default=False),
    Option("--gpu-max-vram", "gpu_max_vram",
           "peak-VRAM limit for every GPU test without its own max_vram marker: SIZE or "
           "SIZE:MEASURE, e.g. 20GiB or 20GiB:reserved", metavar="SIZE"),
    Option("--gpu-vram-history", "gpu_vram_history",
           "allocator events to record (Python stacks) in tests with a max_vram marker, to show "
           "the top allocations when one fails; 0 turns recording off (default "
           f"{DEFAULT_HISTORY})", kind="int", default=DEFAULT_HISTORY, metavar="ENTRIES"),
    Option("--gpu-per-worker", "gpu_per_worker",
           "pytest-xdist: give each worker N GPUs through CUDA_VISIBLE_DEVICES, taken from the "
           "caller's CUDA_VISIBLE_DEVICES when set; more workers than GPUs is an error without "
           "--gpu-share", kind="int", metavar="N"),
    Option("--gpu-share", "gpu_share",
           "pytest-xdist with --gpu-per-worker: let workers share GPUs round-robin when there "
           "are more workers than GPUs", kind="bool", default=False),
)
