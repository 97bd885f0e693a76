"""Run facts: what the ``--gpu-diagnose`` run probe measured while one test trained.

``RunFacts`` describes how a test used the GPU (steps, DataLoader waits, devices, allocator,
host-device syncs, a short profiler window, the NVML timeline); ``FailureFacts``
(``failure_facts.py``) describes a test that failed on a GPU error (the exception, classified,
and the allocator at the failure). Both are recorded in the facts file (``--gpu-facts-out``) and
replay through the rules anywhere.

Rule names: a ``run`` rule sees the session names (``torch.*``, ``host.*``, ...) plus ``run.*``;
a ``failure`` rule also sees ``failure.*``. This module registers both scopes (the probe
declares it, see ``probe/plugin.py``). Percentages are 0-100 (unit ``%``), times seconds
(``s``) unless the unit says ``µs``, memory bytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pytest_gputrain import scopes
from pytest_gputrain.facts import (
    EnvironmentFacts,
    FactGroup,
    fact,
    group_namespace,
    session_namespace,
)
from pytest_gputrain.probe.attention_facts import AttentionFacts
from pytest_gputrain.probe.evaluation_facts import EvaluationFacts
from pytest_gputrain.probe.failure_facts import FailureFacts
from pytest_gputrain.probe.habit_facts import CompileFacts, DdpFacts, OptimizerFacts
from pytest_gputrain.probe.host_facts import HostFacts
from pytest_gputrain.probe.loop_facts import AmpFacts, CheckpointFacts, GradFacts, LossFacts
from pytest_gputrain.probe.recompute_facts import RecomputeFacts
from pytest_gputrain.probe.timeline_facts import TimelineFacts
from pytest_gputrain.probe.update_facts import UpdateFacts
from pytest_gputrain.probe.warning_facts import WarningFacts

Namespace = dict[str, tuple[Any, str | None, str | None]]


class ModuleRecord(BaseModel):
    """A top-level module the probe saw called (a module called outside any other's forward)."""

    model_config = ConfigDict(extra="forbid")

    name: str = fact(doc="class name of the module", default="")
    calls: int = fact(doc="forward calls", default=0)
    grad_calls: int = fact(doc="forward calls under grad mode", default=0)
    inference_calls: int = fact(doc="forward calls under inference_mode", default=0)
    autocast_calls: int = fact(doc="forward calls inside CUDA autocast", default=0)
    training_calls: int = fact(doc="forward calls with module.training True", default=0)
    param_devices: list[str] = Field(default_factory=list, description="devices of parameters")
    param_dtypes: list[str] = Field(default_factory=list, description="dtypes of parameters")
    input_devices: list[str] = Field(default_factory=list, description="devices of tensor inputs")
    input_shapes: list[list[int]] = Field(
        default_factory=list, description="distinct shapes of the first tensor input (at most 8)")
    parameters: int | None = fact(doc="number of parameter elements")
    conv_layers: int | None = fact(doc="Conv1d/2d/3d layers inside the module")


class LoaderRecord(BaseModel):
    """One DataLoader the test iterated, with its settings and measured waits."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = fact(doc="class name of the dataset", default="")
    num_workers: int | None = fact(doc="DataLoader num_workers")
    pin_memory: bool | None = fact(doc="DataLoader pin_memory")
    persistent_workers: bool | None = fact(doc="DataLoader persistent_workers")
    prefetch_factor: int | None = fact(doc="DataLoader prefetch_factor (workers only)")
    batch_size: int | None = fact(doc="DataLoader batch_size")
    drop_last: bool | None = fact(doc="DataLoader drop_last")
    samples: int | None = fact(doc="samples its sampler yields per epoch")
    iterators: int = fact(doc="iterators created (epochs)", default=0)
    batches: int = fact(doc="batches fetched", default=0)
    wait: float = fact("s", "time blocked in __next__", default=0.0)
    first_batch_wait: float = fact("s", "time blocked for the first batch of each iterator",
                                   default=0.0)
    batch_pinned: bool | None = fact(doc="first batch's tensors were in pinned memory")
    batch_device: str | None = fact(doc="device of the first batch's tensors")


class LoaderFacts(FactGroup):
    """The DataLoader that fed the most batches, and totals over all loaders."""

    count: int = fact(doc="DataLoaders iterated during the test", default=0)
    dataset: str | None = fact(doc="class name of the main loader's dataset")
    num_workers: int | None = fact(doc="num_workers of the main loader")
    pin_memory: bool | None = fact(doc="pin_memory of the main loader")
    persistent_workers: bool | None = fact(doc="persistent_workers of the main loader")
    prefetch_factor: int | None = fact(doc="prefetch_factor of the main loader (workers only)")
    batch_size: int | None = fact(doc="batch_size of the main loader")
    drop_last: bool | None = fact(doc="drop_last of the main loader")
    samples: int | None = fact(
        doc="samples the main loader's sampler yields per epoch (len of the sampler or dataset)")
    last_batch_size: int | None = fact(
        doc="samples in the main loader's last batch of an epoch (samples % batch_size; the "
            "full batch size when it divides evenly; None with drop_last)")
    batch_pinned: bool | None = fact(doc="the main loader's batches arrive in pinned memory")
    batch_small_tensors: int | None = fact(
        doc="host tensors under 64 KiB in one of the main loader's batches (labels, masks...)")
    pad_percent: float | None = fact(
        "%", "padding's share of the token positions of the main loader's first 8 batches "
             "(the zeros of their attention_mask; host batches only)")
    padded_length: int | None = fact(
        doc="sequence length of those batches (the longest, where they differ)")
    padded_lengths: int | None = fact(
        doc="distinct sequence lengths among those batches (1: padded to one fixed length)")
    padding_batches: int | None = fact(doc="batches whose attention_mask was read (up to 8)")
    epochs: int | None = fact(doc="passes over the main loader (epochs): its iterators, and each "
                              "reset of a persistent-workers iterator")
    batches: int = fact(doc="batches fetched from all loaders", default=0)
    wait_total: float = fact("s", "time blocked in DataLoader __next__, all loaders", default=0.0)
    wait_per_step: float | None = fact("s", "median time blocked in the loader per steady step")
    wait_max: float | None = fact("s", "longest wait for one batch")
    wait_percent: float | None = fact(
        "%", "time blocked in the loader / wall time, over the steady steps (0 with no loader)")
    epoch_start_wait: float | None = fact(
        "s", "time spent waiting for the first batch of epochs after the first (worker start-up)")
    epoch_start_percent: float | None = fact("%", "epoch_start_wait / the run's training time")
    cpus: int | None = fact("CPUs", "CPUs this process may run on")
    processes_per_host: int | None = fact(
        doc="training processes sharing the host: LOCAL_WORLD_SIZE x pytest-xdist workers")
    cpus_per_process: int | None = fact("CPUs", "cpus // processes_per_host")
    loaders: list[LoaderRecord] = Field(default_factory=list, description="every loader seen")


class MemoryFacts(FactGroup):
    """The caching allocator during the run (CUDA runs only)."""

    device: str | None = fact(doc="the CUDA device measured, e.g. cuda:0")
    total: int | None = fact("bytes", "device memory")
    fraction: float | None = fact(
        doc="set_per_process_memory_fraction in force while the test trained (1.0 = none; the "
            "smallest read at a step when the test changed it)")
    other_processes: int | None = fact(
        "bytes", "most memory other processes held on the device while the test ran")
    budget: int | None = fact(
        "bytes", "memory this process can get: min(total x fraction, total - other processes)")
    allocated_start: int | None = fact("bytes", "allocated when the test started")
    reserved_start: int | None = fact(
        "bytes", "reserved when the test started: the cache earlier tests left")
    reserved_grown: int | None = fact(
        "bytes", "how far the test grew the cache above what it found (peak_reserved - "
                 "reserved_start)")
    allocated_end: int | None = fact("bytes", "allocated after the last step")
    steady_allocated: int | None = fact(
        "bytes", "median allocated between steps (parameters, gradients, optimizer state)")
    peak_allocated: int | None = fact("bytes", "peak allocated during the test")
    peak_reserved: int | None = fact(
        "bytes", "peak reserved by the caching allocator while the test ran (includes a cache "
                 "earlier tests left: see reserved_start)")
    peak_memory: int | None = fact(
        "bytes", "the test's own peak: max(peak_allocated, reserved_grown); with an empty cache "
                 "at the start, the peak reserved")
    reserved_end: int | None = fact("bytes", "reserved after the last step")
    peak_reserved_percent: float | None = fact("%", "peak_memory / budget")
    num_alloc_retries: int | None = fact(doc="allocations retried after freeing cached blocks")
    num_ooms: int | None = fact(doc="out-of-memory errors the allocator raised")
    inactive_split: int | None = fact("bytes", "inactive, non-releasable split blocks (steady)")
    inactive_split_percent: float | None = fact("%", "inactive_split / reserved (steady)")
    expandable_segments: bool | None = fact(doc="PYTORCH_CUDA_ALLOC_CONF has expandable_segments")
    allocator_backend: str | None = fact(
        doc="torch.cuda.get_allocator_backend() at the first CUDA step: native or cudaMallocAsync")
    pinned_host: int | None = fact(
        "bytes", "most pinned host memory torch's host allocator held during the test")
    pinned_host_start: int | None = fact("bytes", "pinned host memory it held when the test began")
    allocated_per_step: list[int] = Field(
        default_factory=list, description="allocated after steps 1, 1 + s, 1 + 2s, ... with s "
        "= allocated_stride (every step in short runs; at most 64 readings, evenly spaced)")
    allocated_stride: int | None = fact(doc="steps between two allocated_per_step readings")
    growth_steps: int | None = fact(doc="steps past warm-up spanned by the growth fit")
    growth_per_step: float | None = fact("bytes", "least-squares slope of allocated per step",
                                         signed=True)
    growth_late_per_step: float | None = fact(
        "bytes", "least-squares slope over the second half of the fitted readings", signed=True)
    growth_total: int | None = fact("bytes", "allocated at the last reading - at the first fitted",
                                    signed=True)
    growth_rising_percent: float | None = fact(
        "%", "fitted readings where allocated rose since the reading before")
    steps_to_exhaust: float | None = fact(doc="steps until the budget is used up at this slope")
    batch_size: int | None = fact(doc="batch size of the run (loader or first input dimension)")
    per_sample: float | None = fact("bytes", "(peak reserved - steady allocated) / batch size")
    oom_batch_estimate: int | None = fact(
        doc="batch size at which peak reserved would exceed the budget (linear model)")
    device_allocs_steady: int | None = fact(
        doc="cudaMalloc calls by the caching allocator after warm-up (num_device_alloc)")
    device_frees_steady: int | None = fact(
        doc="cudaFree calls by the caching allocator after warm-up, not made by empty_cache()")
    device_allocs_per_step: float | None = fact(
        doc="device_allocs_steady per optimizer step after warm-up")
    allocator_calls_per_step: float | None = fact(
        doc="allocations and frees the caching allocator served per optimizer step after "
            "warm-up (memory_stats allocation.all.allocated + allocation.all.freed): each "
            "records a stack trace while its history is recorded")


class SyncFacts(FactGroup):
    """Host-device synchronisations the Python code asked for (item, cpu, tolist, ...,
    torch.cuda.synchronize), by kind and call site (``collect/sync_calls.py``)."""

    method: str = fact(doc="how syncs were counted", default="python-wrappers")
    total: int = fact(doc="syncing calls during the test: read-backs of CUDA tensors and "
                          "explicit waits (torch.cuda.synchronize, Stream/Event.synchronize)",
                      default=0)
    per_step: float | None = fact(doc="median syncing calls per steady step")
    max_per_step: int | None = fact(doc="most syncing calls in one step")
    by_call: list[str] = Field(
        default_factory=list, description="count per kind of call, most frequent first "
        "('Tensor.item: 200', 'torch.cuda.synchronize: 400')")
    kinds: list[str] = Field(
        default_factory=list, description="the kinds of syncing call seen, most frequent "
        "first ('Tensor.item', 'torch.cuda.synchronize', 'Event.synchronize', ...)")
    by_site: list[str] = Field(
        default_factory=list, description="count per call site (the first caller outside torch), "
        "most frequent first, at most 8 ('torch.cuda.synchronize at test_train.py:42 in "
        "train_step: 400')")
    profiled_per_step: float | None = fact(
        doc="stream/device/event synchronizations per step seen by the profiler window")
    profiled_readbacks_per_step: float | None = fact(
        doc="of those, the read-backs: a device-to-host copy then a synchronize, or "
            "torch.cuda.synchronize() (profile.readback_syncs_per_step)")
    wait_percent: float | None = fact(
        "%", "host time inside the syncing calls / the time of the steady steps")
    framework: str | None = fact(
        doc="the framework whose own code made most of the syncing calls (transformers, "
            "lightning, accelerate; the first caller outside torch); none: the test's code")
    framework_per_step: float | None = fact(
        doc="median syncing calls per steady step made by a framework's own code")
    framework_calls: list[str] = Field(
        default_factory=list, description="those calls by framework and method, most frequent "
                                          "first ('transformers: __bool__: 180')")


class ProfileFacts(FactGroup):
    """What the profiler saw over a short window of steps (CUDA activity only)."""

    enabled: bool = fact(doc="a profiler window was configured (gpu_profile_steps)",
                         default=False)
    captured: bool = fact(doc="the window ran and produced events", default=False)
    reason: str | None = fact(doc="why no window was captured")
    first_step: int | None = fact(doc="first profiled step")
    last_step: int | None = fact(doc="last profiled step")
    steps: int | None = fact(doc="steps profiled")
    wall: float | None = fact("s", "wall time of the profiled steps")
    step_time: float | None = fact("s", "wall time per profiled step")
    kernel_time: float | None = fact("s", "time with any kernel or copy running (union)")
    busy_percent: float | None = fact("%", "kernel_time / wall")
    kernel_time_per_step: float | None = fact("s", "kernel_time / steps profiled")
    busy_percent_unprofiled: float | None = fact(
        "%", "kernel_time_per_step / run.step_time: busy share of a step outside the window "
             "(the profiler slows launches, not kernels)")
    busy_percent_without_waits: float | None = fact(
        "%", "kernel_time_per_step / (run.step_time - loader wait - pageable copy time per "
             "step): how busy the GPU would be without the loader and pageable-copy waits")
    idle_without_waits_percent: float | None = fact(
        "%", "GPU idle time per step that neither the loader wait nor pageable copies explain, "
             "as a share of run.step_time")
    kernels: int | None = fact(doc="kernels launched in the window")
    kernels_per_step: float | None = fact(doc="kernels per profiled step")
    kernel_mean: float | None = fact("µs", "mean kernel duration")
    short_kernel_percent: float | None = fact("%", "kernels shorter than 50 µs")
    gemm_percent: float | None = fact("%", "matmul/convolution kernels' share of kernel time")
    tensor_core_percent: float | None = fact(
        "%", "tensor-core kernels' share of matmul/convolution kernel time")
    tensor_core_kernels: int | None = fact(doc="tensor-core kernels launched")
    h2d_pageable_copies: int | None = fact(doc="host-to-device copies from pageable memory")
    h2d_pageable_bytes_per_step: float | None = fact("bytes", "pageable H2D bytes per step")
    h2d_pageable_percent: float | None = fact("%", "pageable H2D copy time / wall")
    h2d_pinned_copies: int | None = fact(doc="host-to-device copies from pinned memory")
    syncs_per_step: float | None = fact(doc="cuda*Synchronize calls per step")
    readback_syncs_per_step: float | None = fact(
        doc="syncs per step that waited for a value from the GPU: a device-to-host copy then a "
            "synchronize, or torch.cuda.synchronize() (not libraries' event waits)")
    sync_wait_percent: float | None = fact(
        "%", "host time inside synchronize calls and device-to-host copies / wall")
    graph_launches_per_step: float | None = fact(doc="CUDA graph launches per step")
    host_wait_percent: float | None = fact(
        "%", "GPU idle time where the next kernel was launched only after the GPU went idle")
    h2d_small_copies_per_step: float | None = fact(
        doc="host-to-device copies under 64 KiB per step (tensors built on the host)")
    h2d_small_host_percent: float | None = fact(
        "%", "host time in the runtime calls of those copies and the syncs right after them "
             "/ wall")
    h2d_small_syncs_per_step: float | None = fact(
        doc="cuda*Synchronize calls per step made right after a small host-to-device copy")
    top_kernels: list[str] = Field(default_factory=list, description="longest kernels by time")
    # Host-side work in the loop (GT117), kernel families (GT128), communication (GT311),
    # blocking pinned copies (GT130).
    host_silent_percent: float | None = fact(
        "%", "GPU idle while no host thread made a CUDA call for >= 200 µs / wall")
    host_silent_per_step: float | None = fact("s", "that silent idle time per profiled step")
    loader_wait_percent: float | None = fact(
        "%", "time blocked in the DataLoader during the profiled steps / wall")
    host_work_percent: float | None = fact(
        "%", "host_silent_percent - loader_wait_percent: the GPU idle while the host did "
             "other work than CUDA calls and waiting for the loader")
    host_work_percent_steady: float | None = fact(
        "%", "that host work per profiled step, less the time the profiled steps took beyond "
             "a steady step (one-time work of early steps), / the steady step time")
    layout_transpose_percent: float | None = fact(
        "%", "cuDNN's NCHW<->NHWC conversion kernels' share of kernel time")
    elementwise_percent: float | None = fact(
        "%", "eager elementwise and reduction kernels' share of kernel time")
    triton_percent: float | None = fact("%", "Triton (torch.compile) kernels' share of kernel time")
    attention_percent: float | None = fact(
        "%", "fused attention kernels' (flash, memory-efficient, cuDNN) share of kernel time")
    comm_percent: float | None = fact("%", "NCCL kernel time (union) / wall")
    comm_exposed_percent: float | None = fact(
        "%", "NCCL kernel time with no other kernel running / wall")
    comm_overlap_percent: float | None = fact(
        "%", "NCCL kernel time overlapped by computation / NCCL kernel time")
    h2d_pinned_blocking_per_step: float | None = fact(
        doc="pinned host-to-device copies per step followed at once by a stream synchronize "
            "(made without non_blocking=True)")
    # What the window leaves behind.
    cupti_teardown: bool | None = fact(
        doc="kineto detached CUPTI when the window closed (TEARDOWN_CUPTI=1), so later steps "
            "run without its callbacks")
    cupti_teardown_reason: str | None = fact(doc="why CUPTI was or was not detached")


class LayerFacts(FactGroup):
    """The layers of the top-level modules, read once when each module is first called."""

    conv2d: int | None = fact(doc="Conv2d layers")
    conv_bias_before_bn: int | None = fact(
        doc="convolutions with a bias registered right before a batch norm of their channels")
    conv_bias_pairs: list[str] = Field(
        default_factory=list, description="those convolution/batch-norm pairs (at most 8)")
    channels_last_weights: bool | None = fact(
        doc="the Conv2d weights are channels_last (unknown when the layout is ambiguous)")
    channels_last_input: bool | None = fact(
        doc="the first 4-D input of the main conv model was channels_last (unknown: ambiguous)")
    linear_weights: int | None = fact(doc="weight elements of Linear and Embedding layers")
    misaligned: list[str] = Field(
        default_factory=list,
        description="Linear/Embedding layers with a dimension not divisible by 8 (at most 8)")
    misaligned_percent: float | None = fact(
        "%", "weight elements of those layers / all Linear and Embedding weight elements")


class StallFacts(FactGroup):
    """Steps far longer than the median step that nothing in the loop explains (GT118)."""

    threshold: float | None = fact("s", "a stall is a step longer than this: "
                                        "max(0.1 s, 5 x the median step)")
    steps: int | None = fact(doc="stall steps no epoch start, validation or torch.save explains")
    explained: int | None = fact(
        doc="long steps explained by an epoch start, extra forwards (validation), torch.save, or "
            "a new input shape under cuDNN autotuning or torch.compile, or a wait for queued work")
    time: float | None = fact("s", "time the unexplained stalls took beyond the median step")
    time_percent: float | None = fact("%", "that time / the training time of the judged steps")
    longest: float | None = fact("s", "the longest unexplained stall step")
    step_numbers: list[int] = Field(
        default_factory=list, description="1-based step numbers of the stalls (first 10)")
    every: int | None = fact(doc="median number of steps between two stalls")


class NvmlRunFacts(FactGroup):
    """The NVML timeline of the run's GPU (collect/sampler.py)."""

    index: int | None = fact(doc="NVML index of the sampled GPU")
    samples: int = fact(doc="samples taken", default=0)
    utilization_mean: float | None = fact("%", "mean GPU utilization")
    utilization_p50: float | None = fact("%", "median GPU utilization")
    memory_used_max: int | None = fact("bytes", "most device memory in use (all processes)")
    process_memory_max: int | None = fact("bytes", "most device memory this process held")
    temperature_max: float | None = fact("°C", "highest temperature")
    power_max: float | None = fact("W", "highest power draw")
    sm_clock_min: float | None = fact("MHz", "lowest SM clock")
    sm_clock_max: float | None = fact("MHz", "highest SM clock")
    other_process_memory_max: int | None = fact(
        "bytes", "most memory processes outside this test session held on the GPU in one "
                 "sample (pytest-xdist workers of the session excluded)")
    other_process_count_max: int | None = fact(
        doc="most processes outside this test session on the GPU in one sample")
    throttle_reasons: list[str] = Field(
        default_factory=list, description="clock event reasons seen in any sample")
    throttle_percent: float | None = fact(
        "%", "samples with a hardware slowdown, thermal slowdown or power brake")
    power_cap_percent: float | None = fact("%", "samples held by the software power cap")
    power_limit: float | None = fact("W", "enforced power limit when sampling started")
    power_limit_default: float | None = fact("W", "the board's default power limit")


class ForwardRecord(BaseModel):
    """The last top-level forward before a failure (or the end of the test)."""

    model_config = ConfigDict(extra="forbid")

    module: str = ""
    param_devices: list[str] = Field(default_factory=list)
    input_devices: list[str] = Field(default_factory=list)
    grad_enabled: bool | None = None


class RunFacts(FactGroup):
    """How one test trained: the ``run.*`` names."""

    nodeid: str = fact(doc="the test", default="")
    duration: float | None = fact("s", "wall time of the test call")
    cuda_available: bool | None = fact(doc="torch.cuda.is_available() during the test")
    framework: str | None = fact(
        doc="the framework that drives the training loop, from the call stack at the first "
            "optimizer step: transformers (Hugging Face Trainer), lightning, accelerate, or "
            "pytorch (the test's own loop)")
    cpu_parametrized: bool | None = fact(
        doc="the test is parametrized with a CPU device ('cpu' or torch.device('cpu'))")
    cuda_used: bool | None = fact(doc="the test allocated CUDA memory")
    device: str | None = fact(doc="device of the trained parameters (cuda:0, cpu)")
    device_name: str | None = fact(doc="name of that device")
    compute_capability: str | None = fact(doc="its compute capability, '9.0'")
    steps: int = fact(doc="optimizer steps of the main optimizer", default=0)
    optimizer_steps: int = fact(doc="optimizer steps of all optimizers", default=0)
    optimizers: list[str] = Field(default_factory=list, description="optimizer classes stepped")
    warmup_steps: int = fact(doc="steps left out of steady-state statistics", default=2)
    steady_steps: int | None = fact(doc="steps in the steady-state statistics")
    step_time: float | None = fact("s", "median wall time per steady step (host clock)")
    step_time_mean: float | None = fact("s", "mean wall time per steady step")
    step_times: list[float] = Field(default_factory=list, description="each step's wall time (s)")
    forwards: int = fact(doc="top-level forward calls", default=0)
    grad_forwards: int = fact(doc="top-level forwards under grad mode", default=0)
    no_grad_forwards: int = fact(doc="top-level forwards under no_grad/inference_mode", default=0)
    autocast_forwards: int = fact(doc="top-level forwards inside CUDA autocast", default=0)
    autocast_other_forwards: int = fact(
        doc="top-level forwards under autocast for another device only, CUDA's off "
            "(torch.autocast(\"cpu\", ...) around a CUDA model: it casts nothing on the GPU)",
        default=0)
    autocast_other_devices: list[str] = Field(
        default_factory=list, description="the devices whose autocast those forwards ran under "
                                          "(cpu, xpu, mps, ...)")
    backwards: int = fact(doc="torch.autograd.backward calls", default=0)
    forwards_without_backward: int | None = fact(
        doc="grad-mode forwards of top-level modules with parameters (models) whose autograd "
            "graph no backward went through")
    param_devices: list[str] = Field(default_factory=list,
                                     description="devices of the optimized parameters")
    param_dtypes: list[str] = Field(default_factory=list,
                                    description="dtypes of the optimized parameters")
    input_devices: list[str] = Field(default_factory=list,
                                     description="devices of top-level forward inputs")
    modules: list[ModuleRecord] = Field(default_factory=list, description="top-level modules")
    last_forward: ForwardRecord = Field(default_factory=ForwardRecord,
                                        description="the last top-level forward")
    conv_layers: int | None = fact(doc="convolution layers in the top-level modules")
    batch_tokens: int | None = fact(
        doc="tokens per batch when the model is fed token ids (a 2-D integer batch x sequence "
            "tensor, from the main loader's batches or the first input): the work of a "
            "language model's step grows with its tokens, not its batch size")
    input_shape_count: int | None = fact(
        doc="distinct input shapes of the most called top-level module (counted up to 8)")
    input_shape_count_all: int | None = fact(
        doc="distinct input shapes of the most called top-level module (counted up to 64)")
    new_shape_steps: int | None = fact(
        doc="steady steps in which that module first saw an input shape (after step 1)")
    new_shape_step_time: float | None = fact("s", "median wall time of those steps")
    seen_shape_step_time: float | None = fact(
        "s", "median wall time of the other steady steps (inputs of a shape seen before)")
    new_shape_time_percent: float | None = fact(
        "%", "share of the steady training time spent in those steps")
    cudnn_enabled: bool | None = fact(
        doc="torch.backends.cudnn.enabled in force while training (read at steps)")
    cudnn_benchmark: bool | None = fact(
        doc="torch.backends.cudnn.benchmark in force while training (read at steps)")
    cudnn_deterministic: bool | None = fact(
        doc="torch.backends.cudnn.deterministic in force while training")
    deterministic_algorithms: bool | None = fact(
        doc="torch.are_deterministic_algorithms_enabled() in force while training")
    tf32_matmul: bool | None = fact(
        doc="matmuls may use TF32 while training (allow_tf32 or precision != highest)")
    tf32_cudnn: bool | None = fact(doc="torch.backends.cudnn.allow_tf32 while training")
    float32_matmul_precision: str | None = fact(
        doc="torch.get_float32_matmul_precision() while training")
    anomaly_detection: bool | None = fact(
        doc="autograd anomaly detection in force while training (read at steps)")
    anomaly_backwards: int = fact(doc="backward passes run under anomaly detection", default=0)
    anomaly_slowdown: float | None = fact(
        doc="median steady step with a backward under anomaly detection / median steady step "
            "without (measured where the test has at least 3 of each)")
    settings_reads: int = fact(doc="times the settings were read at step boundaries", default=0)
    settings_changes: list[str] = Field(
        default_factory=list,
        description="settings the test changed while it trained, with the step that saw it")
    user_profiler_steps: int = fact(
        doc="steps run while a profiler of the test's own recorded (torch.profiler, "
            "emit_nvtx), outside the probe's window", default=0)
    user_profiler_percent: float | None = fact("%", "user_profiler_steps / steps")
    user_profiler_kinds: list[str] = Field(
        default_factory=list, description="the kinds of those profilers (torch.profiler, "
        "emit_nvtx, torch.autograd.profiler (legacy), emit_itt)")
    user_profiler_slowdown: float | None = fact(
        doc="median steady step while the test's profiler recorded / median steady step "
            "without it (measured where the test has at least 3 of each)")
    user_profiler_setup_time: float | None = fact(
        "s", "time inside the start(), stop() and step() of the test's torch.profiler.profile: "
             "setting up kineto and CUPTI, and processing every recorded event")
    user_profiler_setup_percent: float | None = fact(
        "%", "user_profiler_setup_time / the test's duration")
    memory_history: bool | None = fact(
        doc="the CUDA caching allocator recorded its history while training "
            "(torch.cuda.memory._record_memory_history: a stack trace at every allocation and "
            "free; read at steps)")
    sync_debug_mode: str | None = fact(
        doc="torch.cuda.set_sync_debug_mode in force while training: off, warn (a warning at "
            "every synchronising call) or error (read at steps)")
    compile_logs: str | None = fact(
        doc="verbose torch.compile logging in force while training: DEBUG levels of the "
            "compiler's loggers and artifacts that print graphs or code (torch._logging."
            "set_logs, TORCH_LOGS), e.g. 'dynamo=DEBUG, output_code'; '' for none")
    instrument_slowdown: float | None = fact(
        doc="median steady step with allocator history recording or the sync debug mode on / "
            "median steady step with both off (measured where the test turned one on or off "
            "while training, with at least 3 steps of each)")
    instruments: list[str] = Field(
        default_factory=list, description="the debugging instruments on while training, each "
        "with the call that turns it on (allocator history recording, the sync debug mode, "
        "verbose compile logging)")
    gradcheck_calls: int = fact(
        doc="torch.autograd.gradcheck/gradgradcheck calls after the first optimizer step",
        default=0)
    mode_layers: int | None = fact(
        doc="layers that behave differently in train and eval mode (dropout p > 0, batch "
            "norm with running statistics, RNN dropout) in the top-level modules")
    eval_forwards_in_train_mode: int | None = fact(
        doc="no_grad/inference_mode forwards of modules with such layers in training mode")
    trained_forwards_in_eval_mode: int | None = fact(
        doc="forwards in eval mode of modules with such layers that a backward went through")
    empty_cache_calls: int = fact(doc="torch.cuda.empty_cache() calls", default=0)
    empty_cache_steps_percent: float | None = fact(
        "%", "optimizer steps after warm-up in which empty_cache() was called")
    loader: LoaderFacts = Field(default_factory=LoaderFacts)
    memory: MemoryFacts = Field(default_factory=MemoryFacts)
    sync: SyncFacts = Field(default_factory=SyncFacts)
    profile: ProfileFacts = Field(default_factory=ProfileFacts)
    layers: LayerFacts = Field(default_factory=LayerFacts)
    stalls: StallFacts = Field(default_factory=StallFacts)
    nvml: NvmlRunFacts = Field(default_factory=NvmlRunFacts)
    timeline: TimelineFacts = Field(default_factory=TimelineFacts)
    compile: CompileFacts = Field(default_factory=CompileFacts)
    optimizer: OptimizerFacts = Field(default_factory=OptimizerFacts)
    ddp: DdpFacts = Field(default_factory=DdpFacts)
    checkpoint: CheckpointFacts = Field(default_factory=CheckpointFacts)
    loss: LossFacts = Field(default_factory=LossFacts)
    amp: AmpFacts = Field(default_factory=AmpFacts)
    grads: GradFacts = Field(default_factory=GradFacts)
    host: HostFacts = Field(default_factory=HostFacts)
    warnings: WarningFacts = Field(default_factory=WarningFacts)
    updates: UpdateFacts = Field(default_factory=UpdateFacts)
    attention: AttentionFacts = Field(default_factory=AttentionFacts)
    recompute: RecomputeFacts = Field(default_factory=RecomputeFacts)
    evaluation: EvaluationFacts = Field(default_factory=EvaluationFacts)
    probe_errors: list[str] = Field(default_factory=list,
                                    description="probe problems (the test was not affected)")


def run_namespace(env: EnvironmentFacts, run: RunFacts) -> Namespace:
    """The names a run rule can use: the session's plus ``run.*``."""
    names = session_namespace(env)
    names.update(group_namespace("run", run))
    return names


def failure_namespace(env: EnvironmentFacts, failure: FailureFacts,
                      run: RunFacts | None = None) -> Namespace:
    """The names a failure rule can use: the session's, ``run.*`` and ``failure.*``."""
    names = run_namespace(env, run or RunFacts(nodeid=failure.nodeid))
    names.update(group_namespace("failure", failure))
    return names


def _failure_namespace(env: EnvironmentFacts, failure: FailureFacts,
                       related: scopes.Related) -> Namespace:
    # The failed test's run, when the probe recorded one (the last, should a test run twice).
    runs = scopes.related_where(related, "run", "nodeid", failure.nodeid)
    return failure_namespace(env, failure, runs[-1] if runs else None)


scopes.register(scopes.Scope(
    name="run",
    model=RunFacts,
    namespace=lambda env, run, related: run_namespace(env, run),
    subject=lambda run: run.nodeid,
    records_key="runs",
))
scopes.register(scopes.Scope(
    name="failure",
    model=FailureFacts,
    namespace=_failure_namespace,
    subject=lambda failure: failure.nodeid,
    records_key="failures",
))
