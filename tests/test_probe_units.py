"""Units of the run probe: failure classification, OOM parsing, the profiler-window analysis,
exact patch restoring, sync counting, the growth fit and the settings parsers."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from pytest_gputrain.collect import sync_calls
from pytest_gputrain.probe import (
    failures,
    hooks,
    loader,
    probe_settings,
    run,
    torch_hooks,
    window_analysis,
)
from pytest_gputrain.probe.run_facts_builder import ProcessReadings, build_run_facts
from pytest_gputrain.probe.run_record import (
    LoaderWaits,
    RunRecord,
    StepFlag,
    StepSeries,
    SyncCounts,
)
from pytest_gputrain.probe.window_analysis import GpuEvent, RuntimeEvent, analyse

GiB = 2**30
MiB = 2**20


# -- classification ---------------------------------------------------------------------------


@pytest.mark.parametrize(("exc_type", "message", "kind"), [
    ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB.", "oom"),
    ("RuntimeError", "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
     "capacity; 12.91 GiB already allocated; 1.05 GiB free)", "oom"),
    ("RuntimeError", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     "oom"),
    ("RuntimeError", "Expected all tensors to be on the same device, but found at least two "
     "devices, cuda:0 and cpu!", "device_mismatch"),
    ("RuntimeError", "Expected all tensors to be on the same device, but got mat1 is on cpu, "
     "different from other tensors on cuda:0 (when checking argument in method "
     "wrapper_CUDA_addmm)", "device_mismatch"),
    ("RuntimeError", "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) "
     "should be the same or input should be a MKLDNN tensor and weight is a dense tensor",
     "device_mismatch"),
    ("torch.AcceleratorError", "CUDA error: no kernel image is available for execution on the "
     "device", "no_kernel_image"),
    ("RuntimeError", "The NVIDIA driver on your system is too old (found version 12040).",
     "driver_too_old"),
    ("RuntimeError", "CUDA error: CUDA driver version is insufficient for CUDA runtime version",
     "driver_too_old"),
    ("torch.AcceleratorError", "CUDA error: an illegal memory access was encountered",
     "illegal_memory_access"),
    ("RuntimeError", "CUDA error: device-side assert triggered\nCompile with "
     "`TORCH_USE_CUDA_DSA` to enable device-side assertions.", "device_side_assert"),
    ("RuntimeError", "CUDA error: unspecified launch failure", "launch_failure"),
    ("torch.distributed.DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
     "system error, NCCL version 2.27.3", "nccl"),
    ("RuntimeError", "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED", "cudnn"),
    ("RuntimeError", "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`",
     "cublas"),
    ("RuntimeError", "CUDA error: operation not permitted when stream is capturing",
     "graph_capture"),
    ("AssertionError", "assert 0.61 >= 0.8", "not_gpu"),
    ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied (4x3 and 4x2)", "not_gpu"),
    ("ValueError", "could not read /data/nccl_free_dataset.csv", "not_gpu"),
    # The launcher's failures carry "backend nccl" in their header; GT308 diagnoses them.
    ("pytest_gputrain.distributed.errors.RankFailure",
     "rank 1 failed (backend nccl): ValueError: bad batch", "not_gpu"),
    ("pytest_gputrain.distributed.errors.RankTimeout",
     "ranks [1] still running after 60 s (backend nccl)", "not_gpu"),
])
def test_classify(exc_type: str, message: str, kind: str) -> None:
    assert failures.classify(exc_type, message) == kind


def test_sticky_kinds_make_no_cuda_call() -> None:
    assert {"illegal_memory_access", "device_side_assert", "launch_failure"} <= failures.STICKY
    assert "oom" not in failures.STICKY and "device_mismatch" not in failures.STICKY

    class Exploding:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"CUDA was asked for {name} after a sticky error")

    facts = failures.build_failure("t::x", "call",
                                   RuntimeError("CUDA error: an illegal memory access was "
                                                "encountered"), None, None, Exploding())
    assert facts is not None and facts.sticky and facts.kind == "illegal_memory_access"
    assert failures.snapshot(Exploding(), "illegal_memory_access", 0) == {}


def test_parse_oom_message_of_torch_2() -> None:
    parsed = failures.parse_oom(
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB "
        "of which 9.44 MiB is free. Process 123456789 has 3.00 GiB memory in use. Including "
        "non-PyTorch memory, this process has 76.13 GiB memory in use. Of the allocated memory "
        "74.49 GiB is allocated by PyTorch, and 136.77 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert parsed["requested"] == 20 * MiB
    assert parsed["device_index"] == 0
    assert parsed["total"] == round(79.15 * GiB)
    assert parsed["free"] == round(9.44 * MiB)
    assert parsed["allocated"] == round(74.49 * GiB)
    assert parsed["reserved_unallocated"] == round(136.77 * MiB)
    assert parsed["reserved"] == parsed["allocated"] + parsed["reserved_unallocated"]
    assert parsed["other_processes"] == 3 * GiB


def test_parse_oom_message_of_torch_1() -> None:
    parsed = failures.parse_oom(
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 15.78 GiB total capacity; "
        "12.91 GiB already allocated; 1.05 GiB free; 13.07 GiB reserved in total by PyTorch)")
    assert parsed["requested"] == 2 * GiB and parsed["device_index"] == 1
    assert parsed["total"] == round(15.78 * GiB) and parsed["free"] == round(1.05 * GiB)
    assert parsed["reserved_unallocated"] == round(13.07 * GiB) - round(12.91 * GiB)


def test_oom_failure_facts_use_the_allocator_state_first() -> None:
    state = {"allocated": 10 * GiB, "reserved": 14 * GiB, "total": 100 * GiB,
             "free": 50 * GiB, "fraction": 0.2, "other_processes": 0, "num_alloc_retries": 3}
    facts = failures.build_failure(
        "t::oom", "call", RuntimeError("CUDA out of memory. Tried to allocate 6.00 GiB."), None,
        None, None, state)
    assert facts is not None and facts.kind == "oom" and not facts.sticky
    assert facts.reserved_unallocated == 4 * GiB and facts.reserved_unallocated_percent == 28.57
    assert facts.fraction_limit == 20 * GiB and facts.budget == 20 * GiB
    assert facts.requested == 6 * GiB and facts.num_alloc_retries == 3


def test_parse_devices_and_nccl_errors() -> None:
    assert failures.parse_devices("found at least two devices, cuda:0 and cpu!") == [
        "cuda:0", "cpu"]
    assert failures.parse_devices(
        "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor)") == [
        "cpu", "cuda"]
    assert failures.nccl_error("ncclUnhandledCudaError: Call to CUDA function failed.") == \
        "unhandled cuda error"
    assert failures.nccl_error("Watchdog caught collective operation timeout") == "timeout"


def test_traceback_names_the_innermost_module() -> None:
    class Head(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("Expected all tensors to be on the same device")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = Head(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x)  # type: ignore[no-any-return]

    try:
        Net()(torch.zeros(1, 3))
    except RuntimeError as exc:
        found = failures.traceback_module(exc.__traceback__, torch)
    assert found == {"module": "Head", "module_path": "Net.head (Head)",
                     "module_param_devices": ["cpu"], "module_input_devices": ["cpu"]}


def test_expandable_segments_detection() -> None:
    assert failures.expandable_segments("expandable_segments:True")
    assert failures.expandable_segments("max_split_size_mb:128,expandable_segments : true")
    assert not failures.expandable_segments("expandable_segments:False")
    assert not failures.expandable_segments("")


# -- the profiler window's analysis -----------------------------------------------------------


def _k(name: str, start_us: float, end_us: float, corr: int = 0, nbytes: int = 0) -> GpuEvent:
    return GpuEvent(name, int(start_us * 1000), int(end_us * 1000), corr, nbytes)


def _r(name: str, start_us: float, end_us: float, corr: int = 0) -> RuntimeEvent:
    return RuntimeEvent(name, int(start_us * 1000), int(end_us * 1000), corr)


def test_analyse_busy_time_kernel_sizes_and_host_wait() -> None:
    gpu = [
        _k("elementwise_kernel", 0, 10, 1),       # launched at -5: queued work
        _k("elementwise_kernel", 5, 20, 2),       # overlaps: the union counts it once
        _k("elementwise_kernel", 60, 70, 3),      # launched at 55, GPU idle since 20: host wait
        _k("sm90_xmma_gemm_f32f32_f32f32_f32_ffma", 70, 170, 4),
    ]
    runtime = [_r("cudaLaunchKernel", -5, -4, 1), _r("cudaLaunchKernel", -3, -2, 2),
               _r("cudaLaunchKernel", 55, 56, 3), _r("cudaLaunchKernel", 56, 57, 4),
               _r("cudaStreamSynchronize", 170, 171), _r("cudaDeviceSynchronize", 172, 180)]
    facts = analyse(gpu, runtime, wall=200e-6, steps=2, own_syncs=1)
    assert facts["kernel_time"] == pytest.approx(130e-6)
    assert facts["busy_percent"] == 65.0
    assert facts["kernels"] == 4 and facts["kernels_per_step"] == 2.0
    assert facts["kernel_mean"] == pytest.approx((10 + 15 + 10 + 100) / 4)
    assert facts["short_kernel_percent"] == 75.0
    assert facts["gemm_percent"] == pytest.approx(100 * 100 / 135, abs=0.01)
    assert facts["tensor_core_percent"] == 0.0  # ffma: plain FP32
    assert facts["host_wait_percent"] == 100.0
    assert facts["syncs_per_step"] == 0.5  # our own synchronize at the window end left out


def test_analyse_tensor_cores_and_copies() -> None:
    gpu = [
        _k("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 0, 100),
        _k("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_ffma", 100, 200),
        _k("Memcpy HtoD (Pageable -> Device)", 200, 300, nbytes=8 * MiB),
        _k("Memcpy HtoD (Pinned -> Device)", 300, 310, nbytes=8 * MiB),
        _k("Memcpy DtoH (Device -> Pinned)", 310, 311, nbytes=4),
    ]
    facts = analyse(gpu, [], wall=1000e-6, steps=2)
    assert facts["tensor_core_percent"] == 50.0 and facts["tensor_core_kernels"] == 1
    assert facts["h2d_pageable_copies"] == 1 and facts["h2d_pinned_copies"] == 1
    assert facts["h2d_pageable_bytes_per_step"] == 4 * MiB
    assert facts["h2d_pageable_percent"] == 10.0
    assert facts["host_wait_percent"] is None  # no launch records to tell


def test_analyse_kernel_time_per_step_graph_launches_and_sync_waits() -> None:
    gpu = [
        _k("void at::native::elementwise_kernel", 0, 20, 1),
        _k("Memcpy DtoH (Device -> Pageable)", 100, 102, 2),     # a .item()'s copy
        _k("void at::native::elementwise_kernel", 300, 340, 3),  # inside the graph
    ]
    runtime = [
        _r("cudaLaunchKernel", -5, -4, 1),
        _r("cudaMemcpyAsync", 90, 110, 2),           # waits for the GPU: 20 µs
        _r("cudaStreamSynchronize_v3020", 110, 150),  # versioned name, 40 µs
        _r("cudaGraphLaunch_v10000", 290, 295, 3),
        _r("cudaMemcpyAsync", 400, 405, 9),          # no DtoH copy of its own: not a wait
        _r("cudaDeviceSynchronize", 900, 1000),      # the window's own closing sync
    ]
    facts = analyse(gpu, runtime, wall=1000e-6, steps=2, own_syncs=1)
    assert facts["kernel_time_per_step"] == pytest.approx(30e-6)
    assert facts["graph_launches_per_step"] == 0.5
    assert facts["syncs_per_step"] == 0.5
    assert facts["sync_wait_percent"] == 6.0  # 20 + 40 µs of the 1000 µs window
    without_own = analyse(gpu, runtime, wall=1000e-6, steps=2, own_syncs=0)
    assert without_own["sync_wait_percent"] == 16.0


def test_pageable_bytes_unknown_when_the_profiler_gives_none() -> None:
    gpu = [_k("kernel", 0, 10), _k("Memcpy HtoD (Pageable -> Device)", 10, 20)]
    assert analyse(gpu, [], wall=1e-4, steps=1)["h2d_pageable_bytes_per_step"] is None
    assert analyse([_k("kernel", 0, 10)], [], 1e-4, 1)["h2d_pageable_bytes_per_step"] == 0.0


@pytest.mark.parametrize(("name", "gemm", "tensor_core"), [
    # kernel names read off an H200 with torch 2.11 / CUDA 13
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_"
     "alignc4_execute_kernel__5x_cublas", True, False),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>", True, False),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", True, True),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", True, True),
    ("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NTT", True, True),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32_stage5_"
     "warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn", True, True),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x32x8_stage3_"
     "warpsize2x2x1_g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn", True, False),
    ("void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>", True, False),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32", True,
     True),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", True, True),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>", False,
     False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
     False, False),
])
def test_kernel_name_classes(name: str, gemm: bool, tensor_core: bool) -> None:
    assert window_analysis.is_gemm(name) is gemm
    if gemm:
        assert window_analysis.is_tensor_core(name) is tensor_core


# -- hooks ------------------------------------------------------------------------------------


def test_patches_restore_exactly() -> None:
    class Base:
        def method(self) -> str:
            return "base"

    class Child(Base):
        def own(self) -> str:
            return "own"

    module = types.ModuleType("fake")
    module.function = len  # type: ignore[attr-defined]
    patches = torch_hooks.Patches()
    patches.set(Child, "method", lambda self: "patched")  # inherited: absent from Child
    patches.set(Child, "own", lambda self: "patched")
    patches.set(module, "function", min)
    assert Child().method() == "patched" and Child().own() == "patched"
    assert patches.restore() == []
    assert "method" not in vars(Child) and Child().method() == "base"
    assert Child().own() == "own" and module.function is len  # type: ignore[attr-defined]

    patches.set(module, "function", min)
    module.function = max  # type: ignore[attr-defined]  # someone replaced ours
    problems = patches.restore()
    assert problems and "replaced during the test" in problems[0]
    assert module.function is max  # type: ignore[attr-defined]


def test_sync_wrapper_counts_only_cuda_tensors() -> None:
    counts = SyncCounts()

    class FakeTensor:
        def __init__(self, cuda: bool) -> None:
            self.is_cuda = cuda

    def item(self: Any) -> float:
        return 1.5

    wrapped = sync_calls.wrap_tensor_method("item", item, counts)
    assert wrapped(FakeTensor(True)) == 1.5 and wrapped(FakeTensor(False)) == 1.5
    assert counts.pending == 1 and counts.by_kind == {"Tensor.item": 1}
    (site,) = counts.by_site
    assert site.kind == "Tensor.item" and site.file == "test_probe_units.py"
    assert site.function == "test_sync_wrapper_counts_only_cuda_tensors"

    class Weird:
        @property
        def is_cuda(self) -> bool:
            raise RuntimeError("no device")

    assert wrapped(Weird()) == 1.5  # the call still happens
    assert wrapped.__wrapped__ is item  # type: ignore[attr-defined]


def test_no_global_hooks_outside_a_probe() -> None:
    counts = torch_hooks.global_hook_counts(torch)
    assert counts == {name: 0 for name in counts}


def test_install_and_remove_restore_torch() -> None:
    before = {name: vars(torch.Tensor).get(name) for name in sync_calls.TENSOR_METHODS}
    backward = torch.autograd.backward
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    assert torch_hooks.global_hook_counts(torch)["patched_attributes"] >= 10
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
    probe.stop()
    assert {name: vars(torch.Tensor).get(name) for name in sync_calls.TENSOR_METHODS} == before
    assert torch.autograd.backward is backward
    counts = torch_hooks.global_hook_counts(torch)
    assert counts == {name: 0 for name in counts}
    facts = probe.facts()
    assert facts.steps == 5 and facts.backwards == 5 and facts.forwards == 5
    assert facts.modules[0].name == "Linear" and facts.modules[0].parameters == 4
    assert facts.modules[0].input_shapes == [[4, 3]]


def test_submodules_keep_the_fast_path() -> None:
    calls: list[str] = []

    class Leaf(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            from torch.nn.modules import module

            calls.append("hooked" if module._global_forward_pre_hooks else "fast")
            return super().forward(x)

    model = torch.nn.Sequential(Leaf(2, 2), Leaf(2, 2))
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        model(torch.ones(1, 2))
        model(torch.ones(1, 2))
    finally:
        probe.stop()
    assert calls == ["fast"] * 4
    assert probe.facts().forwards == 2


# -- the growth fit and the batch model -------------------------------------------------------


def _probe_with_steps(allocated: list[int], batch: int | None = None) -> run.RunProbe:
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    record = probe.record
    record.devices.cuda_index = 0
    record.steps.times = [0.01] * len(allocated)
    record.steps.waits = [0.0] * len(allocated)
    record.steps.syncs = [1] * len(allocated)
    record.steps.flags = [StepFlag.STEADY] * len(allocated)
    record.steps.allocated = list(allocated)
    record.allocator.end = {
        "total": 100 * GiB, "fraction": 0.5, "other_processes": 0,
        "allocated_bytes.all.peak": 30 * GiB, "reserved_bytes.all.peak": 40 * GiB,
        "reserved_bytes.all.current": 40 * GiB, "num_alloc_retries": 2}
    record.allocator.start = {0: {"reserved_bytes.all.current": 0, "num_alloc_retries": 1}}
    record.forwards.input_batch = batch
    record.duration = 1.0
    return probe


def test_growth_fit_on_a_leak() -> None:
    leak = [GiB + i * 8 * MiB for i in range(40)]
    memory = _probe_with_steps(leak).facts().memory
    assert memory.growth_steps == 37
    assert memory.growth_per_step == pytest.approx(8 * MiB)
    assert memory.growth_rising_percent == 100.0
    assert memory.growth_total == 36 * 8 * MiB
    assert memory.budget == 50 * GiB
    assert memory.steps_to_exhaust == pytest.approx((50 * GiB - 40 * GiB) / (8 * MiB), rel=1e-3)
    assert memory.num_alloc_retries == 1  # counted during the test only


def test_growth_that_stops_has_a_flat_second_half() -> None:
    filled = [GiB + min(i, 15) * 8 * MiB for i in range(40)]  # a cache that fills, then stays
    memory = _probe_with_steps(filled).facts().memory
    assert memory.growth_per_step is not None and memory.growth_per_step > 0
    assert memory.growth_late_per_step == 0.0
    leak = _probe_with_steps([GiB + i * 8 * MiB for i in range(40)]).facts().memory
    assert leak.growth_late_per_step == pytest.approx(8 * MiB)
    short = _probe_with_steps([GiB + i * MiB for i in range(6)]).facts().memory
    assert short.growth_late_per_step is None and "second half" in short.unknown[
        "growth_late_per_step"]


def test_busy_share_is_judged_against_the_step_outside_the_window() -> None:
    probe = _probe_with_steps([GiB] * 20)
    probe.record.profile_steps = (3, 6)
    # 10 ms steps outside the window; 2 ms of kernels per step; 4 ms waiting for the loader.
    probe.record.steps.waits = [0.004] * 20
    probe.record.window_facts = {"captured": True, "steps": 4, "step_time": 0.016,
                                 "kernel_time_per_step": 0.002, "busy_percent": 12.5,
                                 "h2d_pageable_percent": 12.5}  # 2 ms of the profiled step
    profile = probe.facts().profile
    assert profile.busy_percent_unprofiled == 20.0
    assert profile.busy_percent_without_waits == 50.0  # 2 ms of the 4 ms left
    assert profile.idle_without_waits_percent == 20.0  # 2 ms idle of the 10 ms step


def test_a_step_filled_by_waits_leaves_no_unexplained_idle_time() -> None:
    probe = _probe_with_steps([GiB] * 20)
    probe.record.profile_steps = (3, 6)
    probe.record.steps.waits = [0.0101] * 20
    probe.record.window_facts = {"captured": True, "steps": 4, "step_time": 0.01,
                                 "kernel_time_per_step": 0.0005, "h2d_pageable_percent": 0.0}
    profile = probe.facts().profile
    assert profile.busy_percent_unprofiled == 5.0
    assert profile.busy_percent_without_waits is None
    assert profile.idle_without_waits_percent == 0.0


def test_no_window_leaves_the_unprofiled_busy_share_unknown() -> None:
    probe = _probe_with_steps([GiB] * 20)
    profile = probe.facts().profile
    assert profile.busy_percent_unprofiled is None
    assert "profiler window is off" in profile.unknown["busy_percent_unprofiled"]


def test_flat_memory_and_the_batch_model() -> None:
    memory = _probe_with_steps([10 * GiB] * 40, batch=64).facts().memory
    assert memory.growth_per_step == 0.0 and memory.growth_rising_percent == 0.0
    assert memory.peak_reserved_percent == 80.0  # 40 GiB of a 50 GiB budget
    assert memory.per_sample == pytest.approx(30 * GiB / 64)
    assert memory.oom_batch_estimate == int(40 * GiB / (30 * GiB / 64))


def test_cached_memory_from_an_earlier_test_is_not_this_tests_peak() -> None:
    probe = _probe_with_steps([10 * GiB] * 10)
    probe.record.allocator.start = {0: {"reserved_bytes.all.current": 40 * GiB,
                                        "reserved_bytes.all.peak": 40 * GiB}}
    memory = probe.facts().memory
    assert memory.peak_reserved == 40 * GiB  # the allocator's figure, earlier cache included
    assert memory.reserved_start == 40 * GiB and memory.reserved_grown == 0
    assert memory.peak_memory == 30 * GiB  # peak allocated: the test's own
    assert memory.peak_reserved_percent == 60.0  # peak allocated 30 of 50 GiB


def test_epoch_starts_are_not_steady_loader_wait() -> None:
    probe = _probe_with_steps([GiB] * 10)
    steps = probe.record.steps
    steps.waits = [0.0] * 10
    steps.waits[5] = 0.5  # workers restarting for epoch 2
    steps.flags[5] = StepFlag.EPOCH_START
    steps.times[5] = 0.51
    facts = probe.facts()
    assert facts.steady_steps == 7 and facts.loader.wait_percent == 0.0


def test_steady_steps_leave_out_warm_up_and_the_window() -> None:
    probe = _probe_with_steps([GiB] * 10)
    steps = probe.record.steps
    steps.times = [1.0, 0.5] + [0.01] * 8
    steps.flags = [StepFlag.STEADY] * 3 + [StepFlag.IN_WINDOW] * 4 + [StepFlag.AFTER_WINDOW] \
        + [StepFlag.STEADY] * 2
    steps.times[3:7] = [0.2] * 4
    facts = probe.facts()
    assert facts.steady_steps == 3 and facts.step_time == pytest.approx(0.01)



def test_the_step_hook_flags_a_later_epochs_first_step() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(6, 3)),
                                       batch_size=2)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for _epoch in range(2):
            for (x,) in data:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
    finally:
        probe.stop()
    steps = probe.record.steps
    assert steps.flags == [StepFlag.STEADY] * 3 + [StepFlag.EPOCH_START] + [StepFlag.STEADY] * 2
    assert len(steps.times) == len(steps.waits) == len(steps.syncs) == 6
    assert steps.waits[3] > 0.0 and probe.record.loader.pending == 0.0


def test_facts_build_from_a_record_and_process_readings_alone() -> None:
    steady, after = StepFlag.STEADY, StepFlag.AFTER_WINDOW
    record = RunRecord(
        nodeid="t::x", warmup=1, profile_steps=None,
        steps=StepSeries(last_t=0.0, times=[0.5, 0.1, 0.1, 0.3], waits=[0.0] * 4,
                         syncs=[0, 2, 4, 0], flags=[steady, steady, steady, after]),
        loader=LoaderWaits(loader.LoaderTracker()))
    record.devices.backend_flags = {"cudnn_benchmark": True}
    process = ProcessReadings(cpus=16, processes_per_host=4,
                              backend_flags={"cudnn_benchmark": False})
    facts = build_run_facts(record, process)
    assert facts.steady_steps == 2 and facts.step_time == pytest.approx(0.1)
    assert facts.sync.per_step == 3.0 and facts.sync.max_per_step == 4
    assert facts.loader.cpus_per_process == 4
    assert facts.memory.unknown["budget"] == "the run did not train on CUDA"
    assert facts.cudnn_benchmark is True  # read at the first step
    record.devices.backend_flags = {}  # never stepped: the flags read at build time
    assert build_run_facts(record, process).cudnn_benchmark is False

# -- the DataLoader tracker -------------------------------------------------------------------


def test_loader_tracker_groups_iterators_into_epochs() -> None:
    class FakeIterator:
        def __init__(self, dataset: object) -> None:
            self._dataset = dataset
            self._num_workers = 2
            self._pin_memory = True
            self._persistent_workers = False
            self._prefetch_factor = 2
            self._index_sampler = types.SimpleNamespace(batch_size=4)

    dataset = object()
    tracker = loader.LoaderTracker()
    batch = (torch.zeros(4, 3), torch.zeros(4))
    starts = []
    for _epoch in range(3):
        iterator = FakeIterator(dataset)
        for index in range(5):
            starts.append(tracker.on_batch(iterator, batch, 0.1 if index == 0 else 0.01))
    assert [i for i, start in enumerate(starts) if start] == [5, 10]  # later epochs' first
    (state,) = tracker.loaders.values()
    assert state.iterators == 3 and state.batches == 15
    assert state.first_batch_wait == pytest.approx(0.3)
    assert state.later_first_batch_wait == pytest.approx(0.2)
    assert state.batch_size == 4 and state.num_workers == 2 and state.persistent_workers is False
    assert state.batch_device == "cpu" and state.batch_pinned is False


def test_first_tensor_finds_tensors_in_batches() -> None:
    tensor = torch.zeros(2)
    assert loader.first_tensor({"input_ids": tensor}) is tensor
    assert loader.first_tensor([("text", tensor)]) is tensor
    assert loader.first_tensor("text") is None


def test_processes_per_host() -> None:
    assert loader.processes_per_host({}) == 1
    assert loader.processes_per_host({"LOCAL_WORLD_SIZE": "4",
                                      "PYTEST_XDIST_WORKER_COUNT": "2"}) == 8
    assert loader.processes_per_host({"LOCAL_WORLD_SIZE": "x"}) == 1


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("3-6", (3, 6)), ("5", (5, 5)), (" 2-10 ", (2, 10)), ("off", None), ("0", None),
    (None, (3, 6)),
])
def test_parse_profile_steps(text: str | None, expected: tuple[int, int] | None) -> None:
    assert probe_settings.parse_profile_steps(text) == expected


@pytest.mark.parametrize("text", ["1-3", "6-3", "a-b", "3-"])
def test_parse_profile_steps_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        probe_settings.parse_profile_steps(text)


def test_nvml_timeline_facts() -> None:
    from pytest_gputrain.facts import DeviceSample

    probe = _probe_with_steps([GiB] * 10)
    probe.record.nvml.index = 3
    probe.record.nvml.samples = [
        DeviceSample(t=0.0, utilization_gpu=90.0, memory_used=10 * GiB, power_draw=600.0,
                     temperature=70.0, sm_clock=1980.0, clock_event_reasons=0x4,
                     process_memory=8 * GiB),
        DeviceSample(t=0.25, utilization_gpu=80.0, memory_used=12 * GiB, power_draw=650.0,
                     temperature=88.0, sm_clock=1400.0, clock_event_reasons=0x20 | 0x4),
        DeviceSample(t=0.5, utilization_gpu=None, clock_event_reasons=0x1),
    ]
    probe.record.nvml.power_limit, probe.record.nvml.power_limit_default = 400.0, 700.0
    probe.record.allocator.backend = "cudaMallocAsync"
    facts = probe.facts()
    nvml = facts.nvml
    assert (nvml.power_limit, nvml.power_limit_default) == (400.0, 700.0)
    assert facts.memory.allocator_backend == "cudaMallocAsync"
    assert nvml.index == 3 and nvml.samples == 3
    assert nvml.utilization_mean == 85.0 and nvml.memory_used_max == 12 * GiB
    assert nvml.process_memory_max == 8 * GiB and nvml.temperature_max == 88.0
    assert (nvml.sm_clock_min, nvml.sm_clock_max) == (1400.0, 1980.0)
    assert nvml.throttle_reasons == ["gpu_idle", "sw_power_cap", "sw_thermal_slowdown"]
    assert nvml.throttle_percent == pytest.approx(33.33)
    assert nvml.power_cap_percent == pytest.approx(66.67)


def test_allocator_backend_reads_torch_and_never_raises() -> None:
    from pytest_gputrain.probe.cuda_readings import allocator_backend

    def fake(answer: Any) -> Any:
        def get_allocator_backend() -> str:
            if isinstance(answer, Exception):
                raise answer
            return str(answer)
        return types.SimpleNamespace(cuda=types.SimpleNamespace(
            get_allocator_backend=get_allocator_backend))

    assert allocator_backend(fake("cudaMallocAsync")) == "cudaMallocAsync"
    assert allocator_backend(fake("native")) == "native"
    assert allocator_backend(fake(RuntimeError("no CUDA"))) is None


@pytest.mark.parametrize(("params", "expected"), [
    ({"device": "cpu"}, True),
    ({"device": "CPU:0", "batch": 8}, True),
    ({"device": torch.device("cpu")}, True),
    ({"device": "cuda"}, False),
    ({"device": torch.device("cuda", 0)}, False),
    ({"name": "cpu_heavy"}, False),  # a value that merely mentions the CPU
    ({}, False),
])
def test_cpu_parametrized_reads_the_tests_parameters(params: dict[str, Any],
                                                     expected: bool) -> None:
    item = types.SimpleNamespace(callspec=types.SimpleNamespace(params=params))
    assert hooks.cpu_parametrized(item) is expected  # type: ignore[arg-type]
    assert hooks.cpu_parametrized(types.SimpleNamespace()) is False  # type: ignore[arg-type]


def test_run_facts_are_json_round_trippable() -> None:
    facts = _probe_with_steps([GiB] * 12, batch=8).facts()
    from pytest_gputrain.probe.facts import RunFacts

    again = RunFacts.model_validate_json(facts.model_dump_json())
    assert again == facts
    assert "torch" in sys.modules


def test_a_persistent_workers_iterator_starts_an_epoch_at_each_reset() -> None:
    # persistent_workers=True: DataLoader.__iter__ returns the same iterator, reset, every
    # epoch. Its first batch waits for the workers like a new iterator's; counted as steady
    # loader wait, it made a healthy loader look starved (GT102).
    data = torch.utils.data.TensorDataset(torch.arange(12.0))
    dataloader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1,
                                             persistent_workers=True)
    tracker = loader.LoaderTracker()
    starts = []
    iterators = set()
    for _epoch in range(3):
        iterator = iter(dataloader)
        iterators.add(id(iterator))
        for batch in iterator:
            starts.append(tracker.on_batch(iterator, batch, 0.01))
    assert len(iterators) == 1  # the same iterator, three times
    assert [i for i, start in enumerate(starts) if start] == [3, 6]
    (state,) = tracker.loaders.values()
    assert state.epochs == 3 and state.iterators == 1
    assert state.later_first_batch_wait == pytest.approx(0.02)
