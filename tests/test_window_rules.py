"""The facts behind GT117, GT118, GT125-GT128, GT130, GT138 and GT311, on the CPU.

The profiler window's analysis is a pure function over event records, so the GPU's behaviour is
written here as synthetic kernels, copies and runtime calls (times in µs); the layer scan reads
real modules; the stall and pinned-memory facts build from hand-made records.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from pytest_gputrain.probe import loader, run, torch_hooks, window_analysis
from pytest_gputrain.probe.cuda_readings import pinned_host_stats
from pytest_gputrain.probe.layer_scan import channels_last, scan_layers
from pytest_gputrain.probe.run_facts_builder import ProcessReadings, build_run_facts
from pytest_gputrain.probe.run_record import (
    LoaderWaits,
    ModuleState,
    RunRecord,
    StepFlag,
    StepSeries,
)
from pytest_gputrain.probe.window_analysis import GpuEvent, RuntimeEvent, analyse

GiB = 2**30
STEADY, IN_WINDOW, EPOCH = StepFlag.STEADY, StepFlag.IN_WINDOW, StepFlag.EPOCH_START


def _k(name: str, start_us: float, end_us: float, corr: int = 0) -> GpuEvent:
    return GpuEvent(name, int(start_us * 1000), int(end_us * 1000), corr)


def _r(name: str, start_us: float, end_us: float, corr: int = 0, thread: int = 1
       ) -> RuntimeEvent:
    return RuntimeEvent(name, int(start_us * 1000), int(end_us * 1000), corr, thread)


def _launches(starts: list[float], first_corr: int = 1) -> list[RuntimeEvent]:
    return [_r("cudaLaunchKernel", t, t + 3, first_corr + i) for i, t in enumerate(starts)]


# -- GT117: host-side work that leaves the GPU idle ---------------------------------------------


def test_host_silence_counts_idle_gpu_time_inside_long_host_gaps() -> None:
    # Step 1: kernels 0-1000 µs, launched back to back; then 3000 µs of host work (no CUDA call),
    # then step 2's kernels 4000-5000 µs.
    gpu = [_k("conv_fprop", 0, 1000, 1), _k("conv_fprop", 4000, 5000, 2)]
    runtime = [_r("cudaLaunchKernel", -10, -5, 1), _r("cudaLaunchKernel", 3990, 3995, 2)]
    facts = analyse(gpu, runtime, wall=5010e-6, steps=2)
    # Silent from -5 to 3990 µs; the GPU was idle 1000-4000 of it.
    assert facts["host_silent_percent"] == pytest.approx(100 * 3000 / 5010, abs=0.01)
    assert facts["host_silent_per_step"] == pytest.approx(1500e-6)


def test_launching_small_kernels_is_not_silence() -> None:
    # A launch-bound loop: 5 µs kernels, a launch every 20 µs; the GPU idles 75 % of the time.
    starts = [20.0 * i for i in range(200)]
    gpu = [_k("elementwise_kernel", t + 10, t + 15, i + 1) for i, t in enumerate(starts)]
    facts = analyse(gpu, _launches(starts), wall=4000e-6, steps=4)
    assert facts["busy_percent"] == 25.0
    assert facts["host_silent_percent"] == 0.0


def test_a_silence_while_queued_kernels_run_costs_nothing() -> None:
    # The host queues 2 ms of work, then computes on the CPU for 1.5 ms: the GPU never waits.
    gpu = [_k("gemm", 5, 2005, 1)]
    runtime = [_r("cudaLaunchKernel", 0, 5, 1), _r("cudaLaunchKernel", 1505, 1510)]
    facts = analyse(gpu, runtime, wall=2005e-6, steps=1)
    assert facts["host_silent_percent"] == 0.0


def test_a_synchronize_is_a_runtime_call_not_a_silence() -> None:
    # .item(): the host waits in cudaStreamSynchronize while the kernel runs, then launches.
    gpu = [_k("gemm", 0, 1000, 1), _k("gemm", 1100, 2100, 2)]
    runtime = [_r("cudaLaunchKernel", -5, 0, 1), _r("cudaStreamSynchronize", 1, 1001),
               _r("cudaLaunchKernel", 1095, 1100, 2)]
    facts = analyse(gpu, runtime, wall=2105e-6, steps=2)
    assert facts["host_silent_percent"] == 0.0  # the 94 µs gap is below 200 µs


def test_host_silence_unknown_without_runtime_events() -> None:
    facts = analyse([_k("gemm", 0, 10)], [], wall=1e-4, steps=1)
    assert facts["host_silent_percent"] is None


def _window_record(waits: list[float], flags: list[StepFlag], silent: float) -> RunRecord:
    record = RunRecord(
        nodeid="t::x", warmup=2, profile_steps=(3, 6),
        steps=StepSeries(last_t=0.0, times=[0.01] * len(flags), waits=waits,
                         syncs=[0] * len(flags), flags=flags),
        loader=LoaderWaits(loader.LoaderTracker()))
    record.devices.cuda_index = 0
    record.window_facts = {"captured": True, "wall": 0.04, "steps": 4,
                           "host_silent_percent": silent}
    return record


def test_host_work_is_the_silence_the_loader_does_not_explain() -> None:
    flags = [STEADY] * 2 + [IN_WINDOW] * 4 + [STEADY] * 4
    waits = [0.0] * 2 + [0.004] * 4 + [0.0] * 4  # 16 ms of 40 ms in the window
    facts = build_run_facts(_window_record(waits, flags, silent=70.0), ProcessReadings())
    assert facts.profile.loader_wait_percent == 40.0
    assert facts.profile.host_work_percent == 30.0
    starving = [0.0] * 2 + [0.008] * 4 + [0.0] * 4  # 32 of 40 ms: the loader explains it all
    facts = build_run_facts(_window_record(starving, flags, silent=70.0), ProcessReadings())
    assert facts.profile.host_work_percent == 0.0


# -- GT128: kernel families -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "family"), [
    # ATen's eager kernels (torch 2.x names, as CUPTI reports them)
    ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
     "float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, "
     "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<"
     "float> >, std::array<char*, 3ul>)", "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
     "TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#10}::operator()() const"
     "::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, "
     "unsigned int>>", "elementwise"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native"
     "::erf_kernel_cuda(at::TensorIteratorBase&)::{lambda()#1}>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<"
     "float, float, float, float>, unsigned int, float, 4, 4> >", "elementwise"),
    ("triton_poi_fused_add_erf_mul_0", "triton"),
    ("triton_red_fused_native_layer_norm_1", "triton"),
    ("triton_per_fused__softmax_2", "triton"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", None),
    ("void at::native::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMeta"
     "Data<float, 4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>", None),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", None),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None),
])
def test_kernel_families(name: str, family: str | None) -> None:
    assert bool(window_analysis.ELEMENTWISE_PATTERN.search(name)) is (family == "elementwise")
    assert bool(window_analysis.TRITON_PATTERN.search(name)) is (family == "triton")


def test_elementwise_and_triton_shares_of_kernel_time() -> None:
    gpu = [_k("nvjet_sm90_tst_128x256", 0, 400),
           _k("void at::native::vectorized_elementwise_kernel<4, GeluFunctor>", 400, 700),
           _k("void at::native::reduce_kernel<512, 1, MeanOps>", 700, 800),
           _k("triton_poi_fused_mul_0", 800, 1000)]
    facts = analyse(gpu, [], wall=1000e-6, steps=1)
    assert facts["elementwise_percent"] == 40.0
    assert facts["triton_percent"] == 20.0
    assert analyse([], [], wall=1e-3, steps=1)["elementwise_percent"] is None


# -- GT311: exposed communication --------------------------------------------------------------


def test_communication_exposed_and_overlapped() -> None:
    gpu = [
        _k("sm90_xmma_gemm_bf16bf16", 0, 400),                        # backward compute
        _k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 700),      # 100 µs overlapped
        _k("ncclKernel_AllReduce_RING_LL_Sum_float", 700, 900),       # old NCCL name, exposed
        _k("void at::native::multi_tensor_apply_kernel<Adam>", 900, 1000),
    ]
    facts = analyse(gpu, [], wall=1000e-6, steps=1)
    assert facts["comm_percent"] == 60.0
    assert facts["comm_exposed_percent"] == 50.0
    assert facts["comm_overlap_percent"] == pytest.approx(100 * 100 / 600, abs=0.01)


def test_no_nccl_kernels_no_communication() -> None:
    facts = analyse([_k("gemm", 0, 100)], [], wall=1e-4, steps=1)
    assert facts["comm_percent"] == 0.0 and facts["comm_exposed_percent"] == 0.0
    assert facts["comm_overlap_percent"] is None


# -- GT130: pinned copies the host waited for -------------------------------------------------

PINNED = "Memcpy HtoD (Pinned -> Device)"


def test_pinned_copy_followed_by_a_stream_synchronize_blocks() -> None:
    gpu = [_k(PINNED, 10, 40, 1), _k(PINNED, 60, 70, 2), _k("conv", 70, 500, 3),
           _k(PINNED, 1000, 1030, 4), _k(PINNED, 1040, 1050, 5)]
    runtime = [
        # step 1: x.to("cuda"), y.to("cuda") without non_blocking (same thread)
        _r("cudaMemcpyAsync", 0, 8, 1), _r("cudaStreamSynchronize", 9, 41),
        _r("cudaMemcpyAsync", 50, 55, 2), _r("cudaStreamSynchronize_v3020", 56, 71),
        _r("cudaLaunchKernel", 72, 75, 3),
        # step 2: non_blocking=True: the host goes on launching
        _r("cudaMemcpyAsync", 990, 995, 4), _r("cudaMemcpyAsync", 996, 999, 5),
        _r("cudaLaunchKernel", 1000, 1003),
        # another thread synchronizing right after is not this copy's wait
        _r("cudaStreamSynchronize", 997, 1100, thread=2),
    ]
    assert analyse(gpu, runtime, wall=2e-3, steps=2)["h2d_pinned_blocking_per_step"] == 1.0


TO_HOST = "Memcpy DtoH (Device -> Pinned)"


def test_read_backs_are_copies_to_the_host_that_the_host_waited_for() -> None:
    gpu = [_k("gemm", 0, 300, 1), _k(TO_HOST, 300, 301, 2), _k(TO_HOST, 400, 401, 4),
           _k(TO_HOST, 600, 601, 6), _k("Memcpy DtoH (Device -> Pageable)", 700, 701, 7)]
    runtime = [
        _r("cudaLaunchKernel", 0, 3, 1),
        # loss.item(): the copy, then torch's stream synchronize at once
        _r("cudaMemcpyAsync_v3020", 10, 12, 2), _r("cudaStreamSynchronize", 13, 301),
        # a boolean mask's nonzero: the same pattern, made inside C++
        _r("cudaMemcpyAsync", 390, 392, 4), _r("cudaStreamSynchronize", 393, 402),
        # cuDNN benchmark mode timing algorithms: event waits with no copy before them
        _r("cudaEventSynchronize", 450, 470), _r("cudaEventSynchronize", 480, 490),
        # DDP's bookkeeping: a stream sync after a launch, no copy
        _r("cudaLaunchKernel", 500, 503, 5), _r("cudaStreamSynchronize", 504, 520),
        # a non_blocking copy to pinned memory: the host launches on, no wait
        _r("cudaMemcpyAsync", 590, 592, 6), _r("cudaLaunchKernel", 593, 596),
        _r("cudaStreamSynchronize", 597, 620),
        # a synchronous cudaMemcpy to pageable memory, and torch.cuda.synchronize()
        _r("cudaMemcpy", 690, 702, 7), _r("cudaDeviceSynchronize", 800, 810),
        # the window's own closing synchronize
        _r("cudaDeviceSynchronize", 900, 910),
    ]
    facts = analyse(gpu, runtime, wall=1e-3, steps=2, own_syncs=1)
    assert facts["readback_syncs_per_step"] == 2.0  # item, mask, cudaMemcpy, synchronize
    assert facts["syncs_per_step"] == 3.5  # every synchronize but the window's own


def test_blocking_copies_unknown_without_matching_runtime_calls() -> None:
    gpu = [_k(PINNED, 10, 40, 1)]
    assert analyse(gpu, [], wall=1e-4, steps=1)["h2d_pinned_blocking_per_step"] is None
    assert analyse([_k("gemm", 0, 9)], [], wall=1e-4, steps=1)[
        "h2d_pinned_blocking_per_step"] == 0.0


def test_convert_keeps_the_runtime_calls_thread() -> None:
    def event(name: str, device: str, thread: int, corr: int) -> Any:
        return SimpleNamespace(
            name=lambda: name, start_ns=lambda: 1000, duration_ns=lambda: 500,
            correlation_id=lambda: corr, device_type=lambda: f"DeviceType.{device}",
            start_thread_id=lambda: thread, nbytes=lambda: 0, metadata_json=lambda: "")

    gpu, runtime = window_analysis.convert([event("cudaMemcpyAsync", "CPU", 77, 5),
                                            event(PINNED, "CUDA", 0, 5)])
    assert runtime == [RuntimeEvent("cudaMemcpyAsync", 1000, 1500, 5, 77)]
    assert gpu[0].kind == "memcpy" and gpu[0].correlation == 5


# -- GT125-GT127: the layer scan ----------------------------------------------------------------


class Block(nn.Module):
    """A hand-written block: conv1 registered right before bn1, as by convention."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 32, 3, padding=1, bias=bias)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.bn2 = nn.BatchNorm2d(32)  # not adjacent to conv2: not counted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.pool(self.conv2(self.bn1(self.conv1(x)))))


def test_conv_bias_before_batch_norm_in_sequential_and_blocks() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        Block(bias=True), Block(bias=False),
        nn.Conv1d(32, 8, 1), nn.BatchNorm1d(16),  # channels differ: not a pair
    )
    scan = scan_layers(torch, model, ())
    assert scan.conv_bias_pairs == 2
    assert scan.conv_bias_names == ["0 Conv2d -> 1 BatchNorm2d",
                                    "3.conv1 Conv2d -> 3.bn1 BatchNorm2d"]
    assert scan.conv2d == 5


def test_conv_weight_and_input_layouts() -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.Conv2d(16, 16, 1), nn.Conv2d(16, 8, 3))
    scan = scan_layers(torch, model, (torch.zeros(2, 3, 8, 8),))
    assert scan.channels_last_weights is False and scan.channels_last_input is False
    model = model.to(memory_format=torch.channels_last)
    image = torch.zeros(2, 3, 8, 8).to(memory_format=torch.channels_last)
    scan = scan_layers(torch, model, (image,))
    assert scan.channels_last_weights is True and scan.channels_last_input is True
    # One input channel, or a 1x1 kernel on a 1x1 map: both layouts are the same memory.
    assert channels_last(torch, torch.zeros(2, 1, 8, 8)) is None
    assert channels_last(torch, nn.Conv2d(16, 16, 1).weight) is None
    assert channels_last(torch, torch.zeros(8)) is None
    only_pointwise = scan_layers(torch, nn.Sequential(nn.Conv2d(16, 16, 1)), ())
    assert only_pointwise.conv2d == 1 and only_pointwise.channels_last_weights is None


class TinyLM(nn.Module):
    def __init__(self, vocab: int, tied: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        self.head = nn.Linear(64, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(tokens)))  # type: ignore[no-any-return]


def test_misaligned_vocabulary_through_a_tied_head() -> None:
    scan = scan_layers(torch, TinyLM(50257, tied=True), ())
    assert scan.misaligned == [("head Linear(64->50257)", 64 * 50257)]
    assert scan.linear_weights == 64 * 50257 + 2 * 64 * 256  # the tied weight once
    assert scan_layers(torch, TinyLM(50304, tied=True), ()).misaligned == []


def test_a_lookup_only_vocabulary_is_not_a_matmul() -> None:
    table = nn.Sequential(nn.Embedding(100_003, 64), nn.Linear(64, 8))
    scan = scan_layers(torch, table, ())
    assert scan.misaligned == [] and scan.linear_weights == 100_003 * 64 + 64 * 8
    odd = scan_layers(torch, nn.Sequential(nn.Embedding(1000, 100), nn.Linear(100, 8)), ())
    assert [label for label, _ in odd.misaligned] == ["0 Embedding(1000, 100)",
                                                      "1 Linear(100->8)"]


def _layer_record(*modules: nn.Module) -> RunRecord:
    record = RunRecord(nodeid="t::x", warmup=2, profile_steps=None,
                       steps=StepSeries(last_t=0.0), loader=LoaderWaits(loader.LoaderTracker()))
    for module in modules:
        state = ModuleState(module)
        state.layers = scan_layers(torch, module, ())
        record.forwards.modules[id(module)] = state
    return record


def test_layer_facts_sum_the_top_level_modules() -> None:
    lm = TinyLM(50257, tied=True)
    convnet = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.Conv2d(16, 16, 3))
    facts = build_run_facts(_layer_record(lm, convnet, nn.CrossEntropyLoss()),
                            ProcessReadings()).layers
    assert facts.conv2d == 2 and facts.conv_bias_before_bn == 1
    assert facts.channels_last_weights is False
    assert facts.misaligned == ["head Linear(64->50257)"]
    assert facts.misaligned_percent == pytest.approx(
        100 * 64 * 50257 / (64 * 50257 + 2 * 64 * 256), abs=0.01)
    empty = build_run_facts(_layer_record(), ProcessReadings()).layers
    assert empty.conv2d is None and "conv2d" in empty.unknown


def test_the_probe_scans_each_top_level_module_once() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for _ in range(3):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)),
                                        torch.zeros(4, dtype=torch.long)).backward()
            optimizer.step()
    finally:
        probe.stop()
    facts = probe.facts()
    assert facts.layers.conv_bias_before_bn == 1 and facts.layers.conv2d == 1
    assert facts.layers.channels_last_input is False
    assert facts.layers.misaligned == ["4 Linear(288->10)"]


# -- GT118: stalls ------------------------------------------------------------------------------


def _stall_record(times: list[float], forwards: list[int] | None = None,
                  flags: list[StepFlag] | None = None, saves: list[int] | None = None
                  ) -> RunRecord:
    n = len(times)
    per_step = forwards or [2] * n
    cumulative = [sum(per_step[:i + 1]) for i in range(n)]
    return RunRecord(
        nodeid="t::x", warmup=2, profile_steps=None,
        steps=StepSeries(last_t=0.0, times=times, waits=[0.0] * n, syncs=[0] * n,
                         flags=flags or [STEADY] * n, forwards=cumulative,
                         saves=saves or []),
        loader=LoaderWaits(loader.LoaderTracker()))


def test_periodic_unexplained_stalls() -> None:
    times = [0.5, 0.3] + [0.02] * 100
    for i in (26, 51, 76, 101):
        times[i] = 1.02
    stalls = build_run_facts(_stall_record(times), ProcessReadings()).stalls
    assert stalls.threshold == 0.1  # max(0.1 s, 5 x 20 ms)
    assert stalls.steps == 4 and stalls.explained == 0
    assert stalls.step_numbers == [27, 52, 77, 102] and stalls.every == 25
    assert stalls.time == pytest.approx(4.0) and stalls.longest == pytest.approx(1.02)
    assert stalls.time_percent == pytest.approx(100 * 4.0 / (96 * 0.02 + 4 * 1.02), abs=0.01)


def test_validation_epoch_starts_and_checkpoints_explain_long_steps() -> None:
    times = [0.5, 0.3] + [0.02] * 100
    forwards = [2] * 102
    flags = [STEADY] * 102
    for i in (26, 51, 76, 101):
        times[i] = 1.02
    forwards[26] = 34  # a validation pass ran 32 more forwards
    flags[51] = EPOCH  # workers started for a new epoch
    stalls = build_run_facts(_stall_record(times, forwards, flags, saves=[76, 101]),
                             ProcessReadings()).stalls
    assert stalls.steps == 0 and stalls.explained == 4 and stalls.time_percent == 0.0
    assert stalls.longest is None


def test_a_new_input_shape_explains_a_long_step_in_eager_mode_too() -> None:
    # Each new shape costs one-time work (kernel choice, cuDNN graphs, autotuning under
    # cudnn.benchmark): a Trainer padded per batch ran 174 ms steps at each new length.
    times = [0.5, 0.3] + [0.02] * 60
    times[20] = times[40] = times[50] = 0.9
    record = _stall_record(times)
    state = ModuleState(nn.Linear(3, 1))
    state.new_shape_steps = [20, 40]  # steps in which the model met a new input shape
    record.forwards.modules[id(state)] = state
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 1 and stalls.explained == 2 and stalls.step_numbers == [51]
    record.devices.backend_flags = {"cudnn_benchmark": True}
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 1 and stalls.explained == 2


def test_the_probe_notes_the_step_of_each_new_input_shape() -> None:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for rows in (4, 4, 8, 4, 8, 2):
            optimizer.zero_grad()
            model(torch.ones(rows, 3)).sum().backward()
            optimizer.step()
    finally:
        probe.stop()
    # The first shape (step 0) is no news; rows=8 arrived in step 2, rows=2 in step 5.
    (state,) = probe.record.forwards.modules.values()
    assert state.new_shape_steps == [2, 5]


def test_long_steps_are_judged_against_the_median_step() -> None:
    slow = [0.5, 0.3] + [0.2] * 40
    slow[20] = 0.9  # 4.5 x the median: not a stall
    assert build_run_facts(_stall_record(slow), ProcessReadings()).stalls.steps == 0
    assert "steps" in build_run_facts(_stall_record([0.1] * 4), ProcessReadings()).stalls.unknown


def test_the_probe_records_forwards_and_torch_save_per_step(tmp_path: Any) -> None:
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        assert getattr(torch.save, "_gputrain_probe", False)
        for step in range(4):
            optimizer.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            if step == 1:
                with torch.no_grad():
                    model(torch.ones(2, 3))
                    model(torch.ones(2, 3))
                torch.save(model.state_dict(), tmp_path / "checkpoint.pt")
    finally:
        probe.stop()
    assert not getattr(torch.save, "_gputrain_probe", False)
    counts = torch_hooks.global_hook_counts(torch)
    assert counts == {name: 0 for name in counts}
    steps = probe.record.steps
    assert steps.forwards == [1, 2, 5, 6]
    assert steps.saves == [2]  # saved after step 2's optimizer step: falls in step 3
    assert (tmp_path / "checkpoint.pt").is_file()


# -- GT138: pinned host memory ------------------------------------------------------------------


def _pinned_record(start: dict[str, int], window: dict[str, int], end: dict[str, int]
                   ) -> RunRecord:
    record = _stall_record([0.01] * 10)
    record.devices.cuda_index = 0
    record.allocator.start = {0: start}
    record.allocator.window = window
    record.allocator.end = {"total": 100 * GiB, **end}
    return record


def test_pinned_host_memory_of_the_test() -> None:
    def pinned(start: dict[str, int], window: dict[str, int], end: dict[str, int]
               ) -> tuple[int | None, int | None]:
        memory = build_run_facts(_pinned_record(start, window, end), ProcessReadings()).memory
        return memory.pinned_host, memory.pinned_host_start

    held = {"pinned_host.current": 64 * GiB, "pinned_host.peak": 64 * GiB}
    assert pinned({}, held, held) == (64 * GiB, 0)
    # Pinned and released (host cache emptied) before the end: the peak set during the test.
    assert pinned({}, {}, {"pinned_host.current": 0, "pinned_host.peak": 32 * GiB}) == (
        32 * GiB, 0)
    # An earlier test's peak is not this test's.
    earlier = {"pinned_host.current": GiB, "pinned_host.peak": 64 * GiB}
    assert pinned(earlier, {}, {"pinned_host.current": GiB, "pinned_host.peak": 64 * GiB}) == (
        GiB, GiB)
    memory = build_run_facts(_pinned_record({}, {}, {}), ProcessReadings()).memory
    assert memory.pinned_host is None and "pinned_host" in memory.unknown


def test_pinned_host_stats_read_and_unreadable() -> None:
    def fake(stats: Any) -> Any:
        def read() -> Any:
            if isinstance(stats, Exception):
                raise stats
            return stats
        return SimpleNamespace(cuda=SimpleNamespace(memory=SimpleNamespace(
            host_memory_stats=read)))

    stats = {"allocated_bytes.current": 3 * GiB, "allocated_bytes.peak": 4 * GiB}
    assert pinned_host_stats(fake(stats)) == {"pinned_host.current": 3 * GiB,
                                              "pinned_host.peak": 4 * GiB}
    older = {"allocated_bytes.current": GiB, "allocated_bytes.peak": GiB,  # torch 2.7-2.9
             "reserved_bytes.current": 3 * GiB, "reserved_bytes.peak": 4 * GiB}
    assert pinned_host_stats(fake(older)) == {"pinned_host.current": 3 * GiB,
                                              "pinned_host.peak": 4 * GiB}
    assert pinned_host_stats(fake({})) == {}  # CUDA not initialised: torch answers {}
    assert pinned_host_stats(fake(RuntimeError("no CUDA"))) == {}
    assert pinned_host_stats(SimpleNamespace(cuda=SimpleNamespace())) == {}


def test_a_read_back_that_waited_for_queued_gpu_work_is_not_a_stall() -> None:
    # A loop without a sync per step logs loss.item() every 20 steps: the host runs ahead of
    # the GPU, and each read-back waits for the ~0.5 s of work queued since the last one.
    times = [0.5, 0.3] + [0.003] * 60
    record = _stall_record(times)
    record.steps.sync_waits = [0.0] * len(times)
    for i in (21, 41, 61):
        record.steps.syncs[i] = 1
        record.steps.sync_waits[i] = 0.495
        times[i] = 0.498
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 0 and stalls.explained == 3
    # A read-back that returned at once, then CPU work (metrics over accumulated predictions):
    # still a stall.
    for i in (21, 41, 61):
        record.steps.sync_waits[i] = 0.002
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 3 and stalls.explained == 0


def test_the_sync_wrapper_times_the_calls_it_counts() -> None:
    import time

    from pytest_gputrain.collect.sync_calls import wrap_tensor_method, wrap_wait
    from pytest_gputrain.probe.run_record import SyncCounts

    class FakeCudaTensor:
        is_cuda = True

    def slow_item(self: object) -> float:
        time.sleep(0.02)
        return 1.0

    counts = SyncCounts()
    item = wrap_tensor_method("item", slow_item, counts)
    assert item(FakeCudaTensor()) == 1.0
    assert counts.pending == 1 and counts.pending_wait >= 0.015
    FakeCudaTensor.is_cuda = False
    item(FakeCudaTensor())
    assert counts.pending == 1 and counts.pending_wait < 0.1
    # an explicit wait (torch.cuda.synchronize) is timed too, once it returned
    synchronize = wrap_wait("torch.cuda.synchronize", lambda: time.sleep(0.02), counts)
    synchronize()
    assert counts.pending == 2 and counts.pending_wait >= 0.03
    assert counts.by_kind == {"Tensor.item": 1, "torch.cuda.synchronize": 1}


def test_cudnn_autotuning_in_the_window_leaves_the_read_backs_unknown() -> None:
    # cuDNN benchmark mode times its algorithms for each new shape and reads the timings back:
    # dozens of read-backs per step that the code did not make (GT120 reports the cost).
    times = [0.5, 0.3] + [0.02] * 20
    record = _stall_record(times)
    for i in range(3, 7):
        record.steps.flags[i] = IN_WINDOW
    record.window_facts = {"syncs_per_step": 174.0, "readback_syncs_per_step": 91.0}
    state = ModuleState(nn.Conv1d(1, 4, 3))
    state.conv_layers = 1
    state.new_shape_steps = [4, 12]
    record.forwards.modules[id(state)] = state
    assert build_run_facts(record, ProcessReadings()).sync.profiled_readbacks_per_step == 91.0
    record.devices.backend_flags = {"cudnn_benchmark": True}
    sync = build_run_facts(record, ProcessReadings()).sync
    assert sync.profiled_readbacks_per_step is None
    assert "cuDNN" in sync.unknown["profiled_readbacks_per_step"]
    state.new_shape_steps = [12]  # the new shape came after the window
    assert build_run_facts(record, ProcessReadings()).sync.profiled_readbacks_per_step == 91.0


def test_host_work_is_judged_against_a_steady_step() -> None:
    # A batch-8 MLP on the H200: 1.2 ms steady steps, but steps 3-6 (the window) still took
    # 4.1 ms with 2.2 ms of host silence each: one-time work of early steps, not work that
    # every step does.
    flags = [STEADY] * 2 + [IN_WINDOW] * 4 + [STEADY] * 20
    record = _window_record([0.0] * len(flags), flags, silent=52.74)
    record.steps.times = [0.5, 0.0035] + [0.0041] * 4 + [0.0012] * 20
    record.window_facts.update(wall=0.0164, step_time=0.0041, kernel_time_per_step=0.00007)
    profile = build_run_facts(record, ProcessReadings()).profile
    assert profile.host_work_percent == 52.74 and profile.host_work_percent_steady == 0.0
    # Host work that every step does keeps its share: window steps as long as steady ones.
    record.steps.times = [0.5, 0.0035] + [0.0041] * 24
    profile = build_run_facts(record, ProcessReadings()).profile
    assert profile.host_work_percent_steady == pytest.approx(52.74, abs=0.01)


def test_cudnn_layout_conversions_are_their_own_family() -> None:
    kernels = [
        _k("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw", 0, 40),
        _k("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false>",
           40, 55),
        _k("void cudnn::ops::nhwcToNchwKernel<__nv_bfloat16, __nv_bfloat16, float, true>",
           55, 60),
        _k("void at::native::vectorized_elementwise_kernel<4, BatchNormOp>", 60, 100),
    ]
    facts = window_analysis.kernel_families(kernels)
    assert facts["layout_transpose_percent"] == 20.0
    assert window_analysis.kernel_families([])["layout_transpose_percent"] is None


def test_long_steps_the_gpus_lag_accounts_for_are_not_stalls() -> None:
    # A compiled GPU-bound loop that logs every 20 steps (the sync wrappers are out once
    # torch.compile starts, so nothing is timed): 2.8 ms host steps, 38 ms of kernels a step.
    # The host runs ahead and waits at each read-back for the work queued since.
    times = [0.5, 0.3] + [0.0028] * 60
    for i in (21, 41, 61):
        times[i] = 0.5
    record = _stall_record(times)
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 3  # without the window's kernel time: stalls
    record.window_facts = {"kernel_time_per_step": 0.038}
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 0 and stalls.explained == 3
    # A GPU faster than the host has no queue to drain: a CPU report every 20 steps stalls.
    record.window_facts = {"kernel_time_per_step": 0.002}
    assert build_run_facts(record, ProcessReadings()).stalls.steps == 3
    # Extra time far beyond the lag: more than queued work.
    for i in (21, 41, 61):
        record.steps.times[i] = 5.0
    record.window_facts = {"kernel_time_per_step": 0.038}
    assert build_run_facts(record, ProcessReadings()).stalls.steps == 3
    # The wrappers timed no wait in those steps (the host waited in a call they do not wrap,
    # torch.cuda.synchronize() say): the lag accounts for them all the same.
    for i in (21, 41, 61):
        record.steps.times[i] = 0.5
    record.steps.sync_waits = [0.0] * len(record.steps.times)
    assert build_run_facts(record, ProcessReadings()).stalls.steps == 0
    # Lag the timed read-backs already waited out is not there to explain more long steps.
    record.steps.times[11] = 1.2
    record.steps.sync_waits[11] = 1.19
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 3 and stalls.explained == 1


def test_a_host_that_waits_for_queued_work_in_any_call_is_not_stalled() -> None:
    # A healthy GPU-bound bf16 loop (10 ms of kernels a step, 1.6 ms host steps) reads the loss
    # every 20 steps through a call the wrappers do not time: each read waits for ~20 steps of
    # queued GPU work, 111 steps of 170 ms in 2,220. The GPU was busy all along.
    times = [0.5, 0.3] + [0.0016] * 2220
    for i in range(21, len(times), 20):
        times[i] = 0.0016 + 20 * (0.010 - 0.0016)
    record = _stall_record(times)
    record.steps.sync_waits = [0.0] * len(times)
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 111 and stalls.time_percent is not None and stalls.time_percent > 80
    record.window_facts = {"kernel_time_per_step": 0.010}
    stalls = build_run_facts(record, ProcessReadings()).stalls
    assert stalls.steps == 0 and stalls.explained == 111 and stalls.time_percent == 0.0
    # A host that stops longer than the queue lasts (CPU work beyond the GPU's lag) stalls.
    for i in range(21, len(times), 20):
        times[i] = 0.6
    assert build_run_facts(record, ProcessReadings()).stalls.steps == 111
