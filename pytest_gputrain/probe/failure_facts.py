"""Failure facts: a test that failed on a GPU error, the ``failure.*`` names (and a few
training failures whose cause the probe's records name, on any device: a batch-norm batch of
one sample, ``batch_norm_single``).

``FailureFacts`` holds the exception, classified (``failure_kinds.py``), and what the probe,
the message and NVML say of the moment it failed (``failures.py`` fills it). Its rule scope,
``failure``, is registered with the run's in ``facts.py``: a failure rule also sees ``run.*``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pytest_gputrain.facts import FactGroup, fact

FailureKind = Literal[
    "oom",
    "device_mismatch",
    "no_kernel_image",
    "driver_too_old",
    "illegal_memory_access",
    "device_side_assert",
    "launch_failure",
    "nccl",
    "graph_capture",
    "cuda_fork",
    "cuda_unavailable",
    "numpy_on_cuda",
    "dtype_mismatch",
    "nondeterministic_op",
    "loader_worker",
    "cudnn_no_algorithm",
    "library_init",
    "compile",
    "cudnn",
    "cublas",
    "cuda_other",
    "batch_norm_single",
    "not_gpu",
]


class FailureFacts(FactGroup):
    """A test that failed on a GPU error: the ``failure.*`` names."""

    nodeid: str = fact(doc="the test", default="")
    when: str = fact(doc="the phase that failed: setup, call or teardown", default="call")
    exc_type: str = fact(doc="exception class, e.g. torch.OutOfMemoryError", default="")
    message: str = fact(doc="exception message (first 2000 characters)", default="")
    kind: FailureKind = fact(doc="classified from the exception type and text", default="not_gpu")
    sticky: bool = fact(doc="the CUDA context is unusable after this error (no CUDA calls made)",
                        default=False)
    device_index: int | None = fact(doc="CUDA device named in the message")
    requested: int | None = fact("bytes", "the allocation that failed (OOM)")
    total: int | None = fact("bytes", "device memory")
    free: int | None = fact("bytes", "device memory free at the failure")
    process_in_use: int | None = fact("bytes", "memory this process had in use (incl. context)")
    allocated: int | None = fact("bytes", "allocated by PyTorch at the failure")
    reserved: int | None = fact("bytes", "reserved by PyTorch at the failure")
    reserved_unallocated: int | None = fact("bytes", "reserved but not allocated (cached, free)")
    reserved_unallocated_percent: float | None = fact("%", "reserved_unallocated / reserved")
    private_pools: int | None = fact(
        "bytes", "memory in private pools (CUDA graphs) at the failure, per the message")
    peak_allocated: int | None = fact("bytes", "peak allocated during the test")
    peak_reserved: int | None = fact(
        "bytes", "peak reserved while the test ran (includes a cache earlier tests left)")
    reserved_start: int | None = fact(
        "bytes", "reserved when the test started: the cache earlier tests left")
    reserved_grown: int | None = fact(
        "bytes", "how far the test grew the cache above what it found")
    peak_memory: int | None = fact(
        "bytes", "the test's own peak: max(peak_allocated, reserved_grown)")
    fraction: float | None = fact(doc="set_per_process_memory_fraction in force at the failure")
    fraction_limit: int | None = fact("bytes", "total x fraction: the allocator's limit")
    other_processes: int | None = fact(
        "bytes", "memory other processes held on the device at the failure")
    other_process_count: int | None = fact(doc="other processes on the device at the failure")
    oom_observed: bool | None = fact(
        doc="the allocator's out-of-memory observer recorded the failure's moment (limit, free "
            "memory and other processes read at the failure itself)")
    allocator_backend: str | None = fact(
        doc="the allocator named by the message (cudaMallocAsync), else unknown")
    budget: int | None = fact("bytes", "min(total x fraction, total - other processes)")
    num_alloc_retries: int | None = fact(doc="allocator retries before the failure")
    num_ooms: int | None = fact(doc="OOMs the allocator raised in this process")
    expandable_segments: bool | None = fact(doc="PYTORCH_CUDA_ALLOC_CONF has expandable_segments")
    batch_size: int | None = fact(doc="batch size seen by the probe before the failure")
    devices: list[str] = Field(default_factory=list, description="devices named in the message")
    module: str | None = fact(doc="innermost module in the traceback (or last top-level forward)")
    module_path: str | None = fact(doc="that module's class and the layer that failed")
    module_param_devices: list[str] = Field(default_factory=list,
                                            description="devices of that module's parameters")
    module_input_devices: list[str] = Field(default_factory=list,
                                            description="devices of that module's tensor inputs")
    compute_capability: str | None = fact(doc="compute capability of the device (from NVML)")
    arch_list: list[str] | None = fact(doc="torch.cuda.get_arch_list()")
    launch_blocking: bool | None = fact(doc="CUDA_LAUNCH_BLOCKING=1 was set")
    dsa_enabled: bool | None = fact(doc="TORCH_USE_CUDA_DSA was set")
    nccl_error: str | None = fact(doc="NCCL error class from the message (unhandled cuda error, "
                                      "system error, internal error, invalid usage, remote "
                                      "error, timeout, duplicate gpu)")
    # What the message names, per kind (failure_kinds.py)
    status: str | None = fact(doc="status a cuDNN / cuBLAS / CUDA error names, e.g. "
                                  "CUBLAS_STATUS_EXECUTION_FAILED")
    driver_problem: str | None = fact(doc="driver_too_old: too_old, ptx_newer_than_driver, "
                                          "driver_library_mismatch or compat_unsupported")
    operation: str | None = fact(doc="nondeterministic_op: the operation without a "
                                     "deterministic implementation")
    cublas_workspace_config: str | None = fact(doc="CUBLAS_WORKSPACE_CONFIG at the failure")
    in_loader_worker: bool | None = fact(doc="raised inside a DataLoader worker process")
    loader_cause: str | None = fact(doc="loader_worker: shared_memory, host_memory, open_files "
                                        "or crashed")
    signal: str | None = fact(doc="signal that killed a DataLoader worker ('Bus error', "
                                  "'Killed')")
    compile_stage: str | None = fact(doc="compile: the stage that failed (dynamo, aot, "
                                         "inductor, triton)")
    dtypes: list[str] = Field(default_factory=list, description="dtypes named in the message")
    input_shape: list[int] = Field(
        default_factory=list,
        description="batch_norm_single: the input size the message names ([1, 64])")
    cuda_involved: bool | None = fact(doc="the message names CUDA, or the failing module's "
                                          "parameters or inputs were on a CUDA device")
    cuda_unavailable_cause: str | None = fact(
        doc="cuda_unavailable: cpu_only_build, no_driver, gpus_hidden, busy, init_failed or "
            "no_gpu")
    world_size: int | None = fact(doc="WORLD_SIZE of the failing process")
    rank: int | None = fact(doc="RANK of the failing process")
    local_world_size: int | None = fact(doc="LOCAL_WORLD_SIZE of the failing process")
