"""The probe's readings of training habits, on the CPU: train/eval mode, the optimizer's
implementation and zero_grad, empty_cache and allocator churn, torch.compile (dynamo's counters,
with the "eager" backend: no compiler needed), DistributedDataParallel (gloo, one process) and
small host-to-device copies in the profiler window (synthetic events).

CUDA-only parts (the empty_cache wrapper's allocator reads, the copies' real kernel names and
timings) are exercised by the GPU sample pipelines; their pure parts are tested here.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_gputrain.probe import (
    compile_readings,
    module_readings,
    optimizer_readings,
    run,
    torch_hooks,
)
from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.run_record import OptimizerReadings, StepFlag
from pytest_gputrain.probe.window_analysis import GpuEvent, RuntimeEvent, analyse, small_copies


def _probe_run(train: Callable[[], None], warmup: int = 2) -> RunFacts:
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False, warmup=warmup)
    probe.start()
    try:
        train()
    finally:
        probe.stop()
    counts = torch_hooks.global_hook_counts(torch)
    assert counts == {name: 0 for name in counts}, counts
    assert probe.record.errors == []
    return probe.facts()


class Net(torch.nn.Module):
    """Batch norm and dropout: two mode layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.2)
        self.fc2 = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.norm(self.fc1(x)).relu()))


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(4, 8)).square().mean().backward()
    optimizer.step()


# -- train / eval mode -----------------------------------------------------------------------


def test_mode_layers_are_counted() -> None:
    nn = torch.nn
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0), nn.Dropout(0.1), nn.BatchNorm2d(2),
                          nn.BatchNorm1d(2, track_running_stats=False), nn.InstanceNorm1d(2),
                          nn.LSTM(2, 2, num_layers=2, dropout=0.1), nn.LSTM(2, 2, dropout=0.0),
                          nn.MultiheadAttention(4, 2, dropout=0.1), nn.LayerNorm(2))
    count, norm = module_readings.mode_layers(torch, model)
    assert count == 4  # Dropout(0.1), BatchNorm2d, the 2-layer LSTM, the attention
    assert norm is model[3]
    assert module_readings.mode_layers(torch, nn.Linear(2, 2)) == (0, None)


def test_evaluation_in_training_mode_is_counted() -> None:
    def train() -> None:
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            _step(model, optimizer)
            with torch.no_grad():  # validation without model.eval()
                model(torch.randn(4, 8))
        model.eval()
        with torch.inference_mode():  # correct: eval mode
            model(torch.randn(4, 8))

    facts = _probe_run(train)
    assert facts.mode_layers == 2
    assert facts.eval_forwards_in_train_mode == 6
    assert facts.trained_forwards_in_eval_mode == 0


def test_training_in_eval_mode_is_counted_only_when_a_backward_uses_it() -> None:
    def train() -> None:
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        _step(model, optimizer)
        model.eval()
        for _ in range(5):
            _step(model, optimizer)  # model.train() forgotten
        model(torch.randn(4, 8))  # an eval forward under grad mode, never backpropagated

    facts = _probe_run(train)
    assert facts.trained_forwards_in_eval_mode == 5
    assert facts.eval_forwards_in_train_mode == 0
    assert facts.forwards_without_backward == 1  # GT109's business, not GT121's


def test_batch_norm_recalibration_is_not_evaluation() -> None:
    from torch.optim.swa_utils import update_bn

    def train() -> None:
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            _step(model, optimizer)
        update_bn([torch.randn(4, 8) for _ in range(5)], model)  # no_grad, train mode, on purpose

    facts = _probe_run(train)
    assert facts.mode_layers == 2 and facts.eval_forwards_in_train_mode == 0


def test_a_frozen_teacher_in_training_mode_is_not_evaluation() -> None:
    def train() -> None:
        student, teacher = Net(), Net()
        teacher.requires_grad_(False)  # an EMA / teacher copy, run in training mode on purpose
        optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
        for _ in range(4):
            x = torch.randn(4, 8)
            with torch.no_grad():
                target = teacher(x)
            optimizer.zero_grad()
            (student(x) - target).square().mean().backward()
            optimizer.step()

    facts = _probe_run(train)
    assert facts.mode_layers == 4 and facts.eval_forwards_in_train_mode == 0


def test_the_mode_of_a_compiled_model_is_the_wrapped_models() -> None:
    def train() -> None:
        model = Net()
        compiled = torch.compile(model, backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            _step(compiled, optimizer)
        model.eval()  # on the original module: the compiled wrapper's own flag stays True
        with torch.no_grad():
            compiled(torch.randn(4, 8))
            compiled(torch.randn(4, 8))

    facts = _probe_run(train)
    assert facts.mode_layers == 2 and facts.eval_forwards_in_train_mode == 0


# -- the optimizer -----------------------------------------------------------------------------


def test_zero_grad_wrapper_counts_set_to_none_false() -> None:
    readings = OptimizerReadings()
    seen: list[tuple[Any, ...]] = []

    def zero_grad(self: Any, set_to_none: bool = True) -> None:
        seen.append((self, set_to_none))

    wrapped = torch_hooks.wrap_zero_grad(zero_grad, readings)
    wrapped("opt")
    wrapped("opt", False)
    wrapped("opt", set_to_none=False)
    wrapped("opt", set_to_none=True)
    assert readings.zero_grad_calls == 4 and readings.zero_grad_to_zeros == 2
    assert seen == [("opt", True), ("opt", False), ("opt", False), ("opt", True)]
    assert wrapped.__wrapped__ is zero_grad  # type: ignore[attr-defined]


def test_optimizer_implementation_step_time_and_zero_grad() -> None:
    def train() -> None:
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        for _ in range(6):
            optimizer.zero_grad(set_to_none=False)
            model(torch.randn(4, 8)).square().mean().backward()
            optimizer.step()
        model.zero_grad()  # Module.zero_grad is seen too

    facts = _probe_run(train)
    optimizer = facts.optimizer
    assert optimizer.name == "AdamW" and optimizer.foreach is False and optimizer.fused is None
    assert optimizer.param_tensors == 6
    assert optimizer.zero_grad_calls == 7 and optimizer.zero_grad_to_zeros == 6
    assert optimizer.step_host_time is not None and optimizer.step_host_time > 0
    assert optimizer.step_host_percent is not None and 0 < optimizer.step_host_percent <= 100


def test_optimizer_defaults_read_as_configured() -> None:
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    assert optimizer_readings.optimizer_setup(torch.optim.SGD(params, lr=0.1)) == (None, None, 3)
    assert optimizer_readings.optimizer_setup(
        torch.optim.Adam(params, foreach=True)) == (True, None, 3)
    assert optimizer_readings.optimizer_setup(torch.optim.Adam(params, fused=False)) == (
        None, False, 3)


# -- empty_cache and the allocator's cudaMalloc/cudaFree calls ---------------------------------


def test_empty_cache_wrapper_reports_to_the_probe_even_when_the_call_fails() -> None:
    events: list[Any] = []

    class Probe:
        def on_empty_cache_start(self) -> dict[str, int]:
            events.append("start")
            return {"num_device_free": 3}

        def on_empty_cache_end(self, before: Any) -> None:
            events.append(before)

    def failing() -> None:
        raise RuntimeError("CUDA error")

    with pytest.raises(RuntimeError):
        torch_hooks.wrap_empty_cache(failing, Probe())()
    assert events == ["start", {"num_device_free": 3}]


def _cuda_record_probe(steps: int) -> run.RunProbe:
    probe = run.RunProbe(torch, "t::x", profile_steps=(3, 6), sampler=False)
    record = probe.record
    record.devices.cuda_index = 0
    record.steps.times = [0.01] * steps
    record.steps.waits = [0.0] * steps
    record.steps.syncs = [0] * steps
    record.steps.flags = [StepFlag.STEADY] * steps
    record.duration = 0.01 * steps
    return probe


def test_churn_counts_the_allocators_own_frees_after_the_mark() -> None:
    probe = _cuda_record_probe(107)  # the mark is after step 7: 100 steps after it
    cache = probe.record.cache
    assert cache.mark_step == 7
    cache.mark = {"num_device_alloc": 50, "num_device_free": 0}
    cache.end = {"num_device_alloc": 250, "num_device_free": 190}
    cache.frees_by_empty_cache = 40
    memory = probe.facts().memory
    assert memory.device_allocs_steady == 200 and memory.device_allocs_per_step == 2.0
    assert memory.device_frees_steady == 150


def test_churn_unknown_without_the_allocator_counters() -> None:
    probe = _cuda_record_probe(50)
    memory = probe.facts().memory
    assert memory.device_allocs_per_step is None
    assert "num_device_alloc" in memory.unknown["device_allocs_per_step"]
    short = _cuda_record_probe(5).facts().memory
    assert "too few" in short.unknown["device_allocs_per_step"]


def test_empty_cache_steps_percent_counts_steps_after_warm_up() -> None:
    probe = _cuda_record_probe(12)
    cache = probe.record.cache
    # before training (0), warm-up step 1, steps 2..11 twice each at 2, 4, ... and after (12)
    cache.empty_cache_steps = [0, 1, 2, 2, 4, 6, 8, 10, 12]
    cache.empty_cache_calls = len(cache.empty_cache_steps)
    facts = probe.facts()
    assert facts.empty_cache_calls == 9
    assert facts.empty_cache_steps_percent == 50.0  # 5 of the 10 steps after warm-up


def test_the_milestones_read_once_each() -> None:
    probe = run.RunProbe(torch, "t::x", profile_steps=(3, 6), sampler=False)
    assert probe._milestones == [2, 7]
    assert run.RunProbe(torch, "t::x", profile_steps=None, warmup=0)._milestones == [1]


# -- torch.compile -------------------------------------------------------------------------------


def test_recompiles_and_the_recompile_limit() -> None:
    def train() -> None:
        model = torch.compile(torch.nn.Linear(4, 2), backend="eager", dynamic=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for size in range(1, 21):  # a new batch size every step: a new graph every step
            model(torch.randn(size, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    facts = _probe_run(train).compile
    assert facts.used is True and facts.compiled_calls == 20
    assert facts.recompile_limit_hits == 1  # 8 graphs, then eager
    assert facts.unique_graphs == 8 and facts.compiles == 8
    assert facts.frames_failed is not None and facts.frames_failed >= 1
    assert facts.steps_with_compile == 6  # steps 3-8 of the 18 after warm-up
    assert facts.recompile_steps_percent == pytest.approx(100 * 6 / 18, abs=0.01)
    assert facts.recompile_reasons and "size mismatch" in facts.recompile_reasons[0]
    assert len(facts.recompile_reasons) == 1  # one kind of reason, many sizes
    assert facts.compile_time is not None and facts.compile_time > 0
    assert facts.wrapped_modules == ["Linear"] and facts.wraps_ddp is False


def test_compiles_after_a_dynamo_reset_inside_the_test_are_still_seen() -> None:
    """torch._dynamo.reset() clears dynamo's compile-start callbacks and its compile-time
    metrics: the probe registers again and counts the time from zero."""
    def train() -> None:
        first = torch.compile(torch.nn.Linear(4, 2), backend="eager")
        optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
        for _ in range(4):  # steps 1-4: one compile, at step 0
            first(torch.randn(3, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        torch._dynamo.reset()
        second = torch.compile(torch.nn.Linear(4, 2), backend="eager")
        optimizer = torch.optim.SGD(second.parameters(), lr=0.1)
        for _ in range(4):  # steps 5-8: a compile at step 4, after the reset
            second(torch.randn(3, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False, warmup=2)
    probe.start()
    try:
        train()
    finally:
        probe.stop()
    assert probe.record.errors == []
    assert not getattr(torch._dynamo.reset, "_gputrain_probe", False)  # put back at stop
    assert 4 in probe.record.compile.compile_steps, probe.record.compile.compile_steps
    facts = probe.facts().compile
    assert facts.compile_time is not None and facts.compile_time > 0


def test_compile_time_counts_from_zero_after_a_reset() -> None:
    from pytest_gputrain.probe.compile_readings import DynamoCounters

    frames: dict[str, int] = {}
    start = DynamoCounters(compile_time=11.1, frames_counter=frames)
    after_reset = DynamoCounters(compile_time=1.3, frames_counter=frames)
    assert after_reset.since(start).compile_time == 0.0
    grown = DynamoCounters(compile_time=12.0, frames_counter=frames)
    assert grown.since(start) is start


# The probe's sync-counting wrapper of Tensor.item is a Python function that dynamo inlines and
# then warns about (it calls the C method); reported to the maintainers of torch_hooks.py.
@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace the builtin")
def test_graph_breaks_are_listed_by_reason() -> None:
    class Logging(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            print("activation mean", h.detach().mean().item())
            return h.relu().sum()

    def train() -> None:
        model = torch.compile(Logging(), backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            model(torch.randn(2, 4)).backward()
            optimizer.step()
            optimizer.zero_grad()

    facts = _probe_run(train).compile
    assert facts.graph_breaks is not None and facts.graph_breaks >= 1
    assert any("item()" in reason for reason in facts.graph_break_reasons)
    assert facts.recompile_limit_hits == 0 and facts.suppress_errors is False


@torch.library.custom_op("gputrain_habits::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A custom op without a fake kernel: dynamo cannot trace it."""
    return torch.tanh(x) * scale


def test_suppressed_compile_errors_are_counted() -> None:
    # With suppress_errors the frame that calls scaled_tanh runs eagerly and the test passes.
    def train() -> None:
        config = torch._dynamo.config
        config.suppress_errors = True
        try:
            model = torch.nn.Linear(4, 4)
            compiled = torch.compile(lambda x: scaled_tanh(model(x), 2.0).sum(), backend="eager")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                with torch.no_grad():
                    compiled(torch.randn(2, 4))
                model(torch.randn(2, 4)).sum().backward()
                optimizer.step()
        finally:
            config.suppress_errors = False

    facts = _probe_run(train).compile
    assert facts.suppress_errors is True  # read while training, restored by the test after
    assert facts.frames_failed is not None and facts.frames_failed >= 1
    assert facts.recompile_limit_hits == 0


def test_compile_facts_from_counter_readings() -> None:
    probe = _cuda_record_probe(20)
    readings = probe.record.compile
    start = compile_readings.DynamoCounters(
        frames_total=4, frames_ok=4, unique_graphs=2, graph_breaks={"old break": 3},
        unimplemented={}, compile_time=10.0, suppress_errors=False)
    readings.start = start
    readings.warm = compile_readings.DynamoCounters(frames_total=5, frames_ok=5)
    readings.end = compile_readings.DynamoCounters(
        frames_total=15, frames_ok=13, unique_graphs=10,
        graph_breaks={"old break": 3, "Failed to trace builtin operator\n  more": 2},
        unimplemented={"Dynamo recompile limit exceeded\n  Explanation: ...": 1},
        compile_time=12.5, suppress_errors=True)
    readings.callback = True
    readings.compile_steps = [0, 0, 1, 3, 3, 5, 20]
    facts = probe.facts().compile
    assert (facts.frames_compiled, facts.frames_after_warmup, facts.frames_failed) == (11, 10, 2)
    assert facts.unique_graphs == 8 and facts.graph_breaks == 2
    assert facts.graph_break_reasons == ["Failed to trace builtin operator"]
    assert facts.recompile_limit_hits == 1 and facts.compile_time == 2.5
    assert facts.suppress_errors is True and facts.used is True
    assert facts.compiles == 7 and facts.steps_with_compile == 2  # steps 3 and 5
    assert facts.recompile_steps_percent == pytest.approx(100 * 2 / 18, abs=0.01)


def test_a_reset_of_dynamos_counters_during_the_test_counts_from_zero() -> None:
    def train() -> None:
        torch._dynamo.reset()  # what compile test suites do first
        model = torch.compile(torch.nn.Linear(4, 2), backend="eager", dynamic=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for size in range(1, 13):
            model(torch.randn(size, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    warm_up = torch.compile(torch.nn.Linear(3, 3), backend="eager", dynamic=False)
    for size in range(1, 10):  # earlier compiles in the process, limit hit included
        warm_up(torch.randn(size, 3))
    facts = _probe_run(train).compile
    assert facts.unique_graphs == 8 and facts.recompile_limit_hits == 1
    assert facts.frames_compiled is not None and facts.frames_compiled >= 9
    assert facts.recompile_reasons and "size mismatch" in facts.recompile_reasons[0]


def test_no_dynamo_means_no_compile() -> None:
    probe = _cuda_record_probe(20)
    facts = probe.facts().compile
    assert facts.used is False and facts.frames_compiled is None
    assert "not imported" in facts.unknown["frames_compiled"]


def test_recompile_limit_entries_of_several_torch_versions() -> None:
    assert compile_readings.is_recompile_limit("Dynamo recompile limit exceeded\n  Explanation")
    assert compile_readings.is_recompile_limit("cache_size_limit reached")
    assert not compile_readings.is_recompile_limit("Failed to trace builtin operator")


# -- DistributedDataParallel (gloo, one process) ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def gloo_group() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _ddp(find_unused: bool = False) -> Any:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return torch.nn.parallel.DistributedDataParallel(net, find_unused_parameters=find_unused)


@pytest.mark.usefixtures("gloo_group")
@pytest.mark.parametrize(("no_sync", "synced"), [(False, 4.0), (True, 1.0)])
def test_ddp_micro_batches_and_their_gradient_syncs(no_sync: bool, synced: float) -> None:
    def train() -> None:
        model = _ddp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(8):
            for micro in range(4):
                skip = no_sync and micro < 3
                with model.no_sync() if skip else contextlib.nullcontext():
                    model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    facts = _probe_run(train).ddp
    assert facts.used is True and facts.world_size == 1
    assert facts.forwards_per_step == 4.0 and facts.synced_forwards_per_step == synced
    assert facts.find_unused_parameters is False


@pytest.mark.usefixtures("gloo_group")
def test_ddp_find_unused_parameters_and_what_it_found() -> None:
    def train() -> None:
        model = _ddp(find_unused=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    facts = _probe_run(train).ddp
    assert facts.find_unused_parameters is True and facts.unused_parameter_size == 0
    assert facts.logged_iteration is not None and facts.logged_iteration >= 1
    assert facts.forwards_per_step == 1.0


@pytest.mark.usefixtures("gloo_group")
def test_compiled_ddp_is_seen_through_the_compile_wrapper() -> None:
    def train() -> None:
        model = torch.compile(_ddp(), backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    facts = _probe_run(train)
    assert facts.compile.wraps_ddp is True
    assert facts.compile.wrapped_modules == ["DistributedDataParallel"]
    assert facts.ddp.used is True and facts.ddp.synced_forwards_per_step == 1.0


def test_no_ddp() -> None:
    facts = _probe_run(lambda: _step(Net(), torch.optim.SGD(Net().parameters(), lr=0.1)))
    assert facts.ddp.used is False and facts.ddp.forwards_per_step is None


# -- small host-to-device copies in the profiler window ---------------------------------------


def _copy(start_us: float, nbytes: int, corr: int, pinned: bool = False) -> GpuEvent:
    kind = "Pinned" if pinned else "Pageable"
    return GpuEvent(f"Memcpy HtoD ({kind} -> Device)", int(start_us * 1000),
                    int((start_us + 2) * 1000), corr, nbytes)


def _call(name: str, start_us: float, end_us: float, corr: int = 0,
          thread: int = 0) -> RuntimeEvent:
    return RuntimeEvent(name, int(start_us * 1000), int(end_us * 1000), corr, thread)


def test_small_copies_and_the_syncs_right_after_them() -> None:
    copies = [_copy(100, 4, 1), _copy(300, 4096, 2), _copy(500, 32 * 2**20, 3),
              _copy(700, 8, 4, pinned=True)]
    runtime = [
        # CUPTI's versioned name for the sync: still the copy's own
        _call("cudaMemcpyAsync", 90, 100, 1), _call("cudaStreamSynchronize_v3020", 101, 151),
        # a launch in between: the later sync waits for that kernel, not for the copy
        _call("cudaMemcpyAsync", 290, 300, 2), _call("cudaLaunchKernel", 302, 306, 9),
        _call("cudaStreamSynchronize", 307, 357),
        _call("cudaMemcpyAsync", 490, 900, 3), _call("cudaStreamSynchronize", 901, 951),
        _call("cudaMemcpyAsync", 690, 695, 4),  # non_blocking pinned: no sync after
        _call("cudaStreamSynchronize", 696, 740, thread=2),  # another thread's sync
        _call("cudaStreamSynchronize", 2000, 2100),  # far away: not the copy's own
    ]
    facts = small_copies(copies, runtime, wall_ns=2_000_000, steps=2)
    assert facts["h2d_small_copies_per_step"] == 1.5  # 4 B, 4 KiB and the pinned 8 B
    assert facts["h2d_small_syncs_per_step"] == 0.5
    host_us = 10 + 50 + 10 + 5
    assert facts["h2d_small_host_percent"] == pytest.approx(100 * host_us / 2000, abs=0.01)


def test_small_copies_unknown_without_sizes_and_zero_without_copies() -> None:
    assert small_copies([_copy(100, 0, 1)], [], wall_ns=1_000_000, steps=1) == {}
    assert small_copies([], [], wall_ns=1_000_000, steps=1) == {
        "h2d_small_copies_per_step": 0.0, "h2d_small_host_percent": 0.0,
        "h2d_small_syncs_per_step": 0.0}
    kernel = GpuEvent("void gemm_kernel", 0, 1000, 7)
    facts = analyse([kernel, _copy(10, 4, 1)],
                    [_call("cudaMemcpyAsync", 5, 9, 1), _call("cudaStreamSynchronize", 9, 20)],
                    wall=0.001, steps=1)
    assert facts["h2d_small_copies_per_step"] == 1.0
    assert facts["h2d_small_syncs_per_step"] == 1.0


# -- through the plugin: the findings on a test's report -------------------------------------


def _codes(pytester: pytest.Pytester) -> dict[str, set[str]]:
    import json

    report = json.loads((pytester.path / "report.json").read_text())
    codes: dict[str, set[str]] = {}
    for finding in report["findings"]:
        if finding["scope"] == "run":
            codes.setdefault(finding["subject"].split("::")[1], set()).add(finding["code"])
    return codes


def test_eval_mode_and_zero_grad_findings(pytester: pytest.Pytester,
                                          use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_habits="""
        import torch

        def model_and_optimizer():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                        torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                        torch.nn.Linear(16, 2))
            return model, torch.optim.SGD(model.parameters(), lr=0.1)

        def test_validation_in_training_mode():
            model, optimizer = model_and_optimizer()
            for _ in range(10):
                optimizer.zero_grad(set_to_none=False)
                model(torch.randn(8, 8)).square().mean().backward()
                optimizer.step()
                with torch.no_grad():
                    model(torch.randn(8, 8))

        def test_healthy():
            model, optimizer = model_and_optimizer()
            for _ in range(10):
                model.train()
                optimizer.zero_grad()
                model(torch.randn(8, 8)).square().mean().backward()
                optimizer.step()
                model.eval()
                with torch.inference_mode():
                    model(torch.randn(8, 8))
        """)
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                                "no:cacheprovider", "--gpu-report=report.json")
    result.assert_outcomes(passed=2)
    codes = _codes(pytester)
    assert {"GT121", "GT124"} <= codes["test_validation_in_training_mode"]
    assert not {"GT121", "GT124"} & codes.get("test_healthy", set())
    result.stdout.fnmatch_lines(["WARNING GT121 train-eval-mode-mismatch: *"])


COMPILE_TESTS = """
import contextlib, os, socket
import torch
import torch.distributed as dist

def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

def train(model, optimizer, batches, micro=1, no_sync=False):
    for x in batches:
        for i in range(micro):
            skip = no_sync and i < micro - 1
            with model.no_sync() if skip else contextlib.nullcontext():
                model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

def test_recompiles():
    model = torch.nn.Linear(4, 2)
    compiled = torch.compile(model, backend="eager", dynamic=False)
    train(compiled, torch.optim.SGD(model.parameters(), lr=0.1),
          [torch.randn(n, 4) for n in range(1, 21)])

def test_compiled_once():
    model = torch.nn.Linear(4, 2)
    compiled = torch.compile(model, backend="eager")
    train(compiled, torch.optim.SGD(model.parameters(), lr=0.1),
          [torch.randn(8, 4) for _ in range(20)])

@contextlib.contextmanager
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()

def net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

def test_ddp_accumulation_without_no_sync():
    with group():
        model = torch.nn.parallel.DistributedDataParallel(net())
        train(model, torch.optim.SGD(model.parameters(), lr=0.1),
              [torch.randn(4, 4) for _ in range(8)], micro=4)

def test_ddp_accumulation_with_no_sync_and_unused_search():
    with group():
        model = torch.nn.parallel.DistributedDataParallel(net(), find_unused_parameters=True)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1),
              [torch.randn(4, 4) for _ in range(8)], micro=4, no_sync=True)
"""


def test_compile_and_ddp_findings(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_compile_ddp=COMPILE_TESTS)
    result = pytester.runpytest_subprocess("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                                           "no:cacheprovider", "--gpu-report=report.json")
    result.assert_outcomes(passed=4)
    codes = _codes(pytester)
    assert "GT131" in codes["test_recompiles"]
    assert "GT131" not in codes.get("test_compiled_once", set())
    assert "GT309" in codes["test_ddp_accumulation_without_no_sync"]
    unused = codes["test_ddp_accumulation_with_no_sync_and_unused_search"]
    assert "GT310" in unused and "GT309" not in unused


def test_small_host_tensors_of_a_loader_batch_are_counted() -> None:
    from pytest_gputrain.probe.loader import small_host_tensors

    batch = {"input_ids": torch.zeros(32, 128, dtype=torch.long),  # 32 KiB
             "mask": torch.ones(32, 128, dtype=torch.bool), "labels": torch.zeros(32),
             "images": torch.zeros(32, 3, 64, 64), "meta": ["a", "b"]}
    assert small_host_tensors(batch) == 3
    assert small_host_tensors((torch.zeros(8), [torch.zeros(2), torch.zeros(20000)])) == 2
    assert small_host_tensors("text") == 0


COMPILED_ITEM = r'''
import sys, warnings, torch
from pytest_gputrain.probe.run import RunProbe

class Logging(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        h = self.fc(x)
        self.last = h.detach().mean().item()   # a logging sync inside the compiled forward
        return h.relu().sum()

def breaks(probe):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = torch.compile(Logging(), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = RunProbe(torch, "t::x", profile_steps=None, sampler=False) if probe else None
    if p: p.start()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(2, 4)).backward()
                opt.step()
    finally:
        if p: p.stop()
    texts = [str(w.message) for w in seen if "TensorBase" in str(w.message)]
    return sum(counters["graph_break"].values()), texts, p

plain, plain_texts, _ = breaks(False)
probed, probed_texts, probe = breaks(True)
print("PLAIN", plain, plain_texts)
print("PROBED", probed, probed_texts, probe.record.syncs.stopped_at, probe.facts().sync.method)
assert probed == plain and not probed_texts, (plain, probed, probed_texts)
assert torch.Tensor.item is torch._C.TensorBase.item  # nothing left patched
print("OK")
'''


def run_script(script: Path, text: str) -> str:
    """Run ``text`` as a script in a fresh interpreter (torch.compile and its dynamo state stay
    out of this process); it must exit 0 and print OK. Returns its output."""
    script.write_text(text)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    return done.stdout


def test_compiled_code_never_sees_the_sync_wrappers(tmp_path: Path) -> None:
    # Dynamo would trace into the probe's Python wrapper of Tensor.item and meet the C method it
    # wraps ("does not know how to trace the builtin TensorBase.item"): an extra graph break and
    # a warning that -W error turns into a failure. The probe takes its wrappers out when
    # torch.compile starts; compiled code then sees torch's own methods.
    out = run_script(tmp_path / "compiled_item.py", COMPILED_ITEM)
    assert "torch.compile began in step 1" in out


COMPILED_BACKWARDS = r'''
import torch
from pytest_gputrain.probe.run import RunProbe

torch._dynamo.reset()
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                          torch.nn.Linear(8, 1)), backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
probe = RunProbe(torch, "t::x", profile_steps=None, sampler=False)
probe.start()
try:
    for _ in range(6):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
finally:
    probe.stop()
facts = probe.facts()
print("BACKWARDS", probe.record.forwards.backwards, "ANOMALY", facts.anomaly_backwards)
assert probe.record.forwards.backwards == 6, probe.record.forwards.backwards
assert not facts.anomaly_backwards, facts.anomaly_backwards
print("OK")
'''


def test_compiles_traced_backward_is_not_a_backward_of_the_code(tmp_path: Path) -> None:
    # AOTAutograd traces the backward (autograd.grad on fake tensors) under
    # detect_anomaly(check_nan=False), to keep the forward's stack traces: counted as the
    # code's backward passes, a compiled model looked as if it trained with anomaly detection
    # on (GT115) and had more backward passes than steps.
    run_script(tmp_path / "compiled_backwards.py", COMPILED_BACKWARDS)


def test_the_tracing_check_holds_where_is_compiling_says_no() -> None:
    # Not every torch release answers torch.compiler.is_compiling() True during the
    # AOTAutograd joint trace; dynamo's TracingContext is open around it.
    from types import SimpleNamespace

    from pytest_gputrain.probe.torch_hooks import is_tracing

    context: list[object] = []
    fake = SimpleNamespace(
        compiler=SimpleNamespace(is_compiling=lambda: False),
        _guards=SimpleNamespace(TracingContext=SimpleNamespace(
            try_get=lambda: context[-1] if context else None)))
    tracing = is_tracing(fake)
    assert tracing() is False
    context.append(object())
    assert tracing() is True
    assert is_tracing(SimpleNamespace())() is False  # no torch.compile at all
