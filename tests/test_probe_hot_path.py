"""What the run probe does per step and per forward, and what it moved off that path.

The allocator's counters are read at evenly spaced steps (the stride doubling as the series
fills); a model's forwards have their autograd graph watched only where one can go without a
backward; leaf modules without parameters get no hooks of their own; NVML is sampled on a
thread; and the profiler window asks kineto to detach CUPTI after it (``TEARDOWN_CUPTI``) where
that is safe. CPU torch runs every loop here.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
import weakref
from typing import Any

import pytest
import torch

from pytest_gputrain.collect import cupti
from pytest_gputrain.facts import DeviceSample
from pytest_gputrain.probe import module_readings, nvml_timeline, run
from pytest_gputrain.probe.loader import LoaderTracker
from pytest_gputrain.probe.run_facts_builder import ProcessReadings, build_run_facts
from pytest_gputrain.probe.run_record import (
    ALLOCATED_CAPACITY,
    LoaderWaits,
    RunRecord,
    StepFlag,
    StepSeries,
    WatchMode,
)

GiB = 2**30
MiB = 2**20


def _probe() -> run.RunProbe:
    return run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int,
           forwards_per_step: int = 1) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum(model(torch.ones(4, 3)).sum() for _ in range(forwards_per_step))
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        optimizer.step()


# -- the allocator's counters at evenly spaced steps -------------------------------------------


def test_allocator_readings_stay_evenly_spaced_as_the_stride_doubles() -> None:
    steps = StepSeries(last_t=0.0)
    for index in range(200):
        if steps.allocated_due(index):
            steps.add_allocated(index)  # the reading is its own step index
    assert steps.allocated_stride == 4
    assert steps.allocated == list(range(0, 200, 4))
    assert ALLOCATED_CAPACITY // 2 <= len(steps.allocated) < ALLOCATED_CAPACITY


def test_a_long_run_reads_the_allocator_a_few_dozen_times_per_doubling() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    steps = probe.record.steps
    reads: list[int] = []

    def read_memory() -> tuple[int, int]:  # stands in for the allocator: the step number
        reads.append(len(steps.times))
        return len(steps.times), 2 * len(steps.times)

    probe.start()
    probe._read_memory = read_memory
    try:
        _train(model, optimizer, 1000)
    finally:
        probe.stop()
    # 64 reads fill the series (steps 1-64), then 32 per doubling of the stride (2, 4, 8)
    # up to step 512, then every 16th step: 31 more up to step 993.
    assert len(reads) == 64 + 32 * 3 + 31 and steps.allocated_stride == 16
    assert steps.allocated == [1 + 16 * i for i in range(63)]
    assert steps.reserved == [2 * value for value in steps.allocated]


def _record(allocated: list[int], stride: int, warmup: int = 2) -> RunRecord:
    count = (len(allocated) - 1) * stride + 1
    record = RunRecord(nodeid="t::x", warmup=warmup, profile_steps=None,
                       steps=StepSeries(last_t=0.0, times=[0.01] * count, waits=[0.0] * count,
                                        syncs=[0] * count, flags=[StepFlag.STEADY] * count,
                                        allocated=allocated, allocated_stride=stride),
                       loader=LoaderWaits(LoaderTracker()))
    record.devices.cuda_index = 0
    record.allocator.end = {"total": 100 * GiB, "fraction": 1.0, "other_processes": 0,
                            "allocated_bytes.all.peak": 30 * GiB,
                            "reserved_bytes.all.peak": 40 * GiB,
                            "reserved_bytes.all.current": 40 * GiB}
    record.allocator.start = {0: {"reserved_bytes.all.current": 0}}
    return record


def test_the_growth_fit_is_per_step_whatever_the_stride() -> None:
    stride = 4
    leak = [GiB + i * stride * 8 * MiB for i in range(40)]  # 8 MiB per step, read every 4th
    memory = build_run_facts(_record(leak, stride), ProcessReadings()).memory
    assert memory.allocated_stride == 4 and memory.allocated_per_step == leak
    assert memory.growth_per_step == pytest.approx(8 * MiB)
    # Past the 2 warm-up steps: readings 1..39, taken at (0-based) steps 4..156.
    assert memory.growth_steps == 38 * 4 + 1
    assert memory.growth_total == 38 * stride * 8 * MiB
    assert memory.growth_rising_percent == 100.0
    assert memory.allocated_end == leak[-1]
    flat = build_run_facts(_record([5 * GiB] * 40, stride), ProcessReadings()).memory
    assert flat.growth_per_step == 0.0 and flat.steady_allocated == 5 * GiB


# -- forwards without a backward ---------------------------------------------------------------


def _count_watches(probe: run.RunProbe) -> list[int]:
    watched: list[int] = []
    original = probe.modules._watch

    def counting(nodes: list[Any]) -> list[bool] | None:
        watched.append(len(nodes))
        return original(nodes)

    probe.modules._watch = counting  # type: ignore[method-assign]
    return watched


def test_plain_training_is_watched_only_for_the_first_forwards() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    watched = _count_watches(probe)
    probe.start()
    try:
        _train(model, optimizer, 50)
    finally:
        probe.stop()
    assert len(watched) == module_readings.WATCH_FIRST
    state = next(iter(probe.record.forwards.modules.values()))
    assert state.watch_mode is WatchMode.STREAKS and state.held is None
    facts = probe.facts()
    assert facts.forwards_without_backward == 0 and facts.grad_forwards == 50


def test_every_evaluation_forward_without_no_grad_is_counted() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = torch.ones(40, 3).split(4)  # no DataLoader: nothing between the forwards
    probe = _probe()
    probe.start()
    try:
        for _epoch in range(3):
            _train(model, optimizer, 20)
            for batch in batches:  # validation, autograd left on
                model(batch).argmax(1)
    finally:
        probe.stop()
    facts = probe.facts()
    assert facts.forwards_without_backward == 30
    assert facts.grad_forwards == 90 and facts.backwards == 60


def test_forwards_that_share_a_backward_are_trained_on() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        _train(model, optimizer, 30, forwards_per_step=2)  # a siamese step
    finally:
        probe.stop()
    facts = probe.facts()
    assert facts.grad_forwards == 60 and facts.forwards_without_backward == 0


def test_a_model_no_backward_goes_through_is_watched_at_every_forward() -> None:
    student = torch.nn.Linear(3, 1)
    teacher = torch.nn.Linear(3, 1)  # run under grad mode, its output detached
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        for _ in range(30):
            x = torch.ones(4, 3)
            target = teacher(x).detach()
            optimizer.zero_grad()
            ((student(x) - target) ** 2).mean().backward()
            optimizer.step()
    finally:
        probe.stop()
    modes = {id(m): s.watch_mode for m in (student, teacher)
             for s in probe.record.forwards.modules.values() if s.ref() is m}
    assert modes == {id(student): WatchMode.STREAKS, id(teacher): WatchMode.EVERY}
    assert probe.facts().forwards_without_backward == 30


def test_a_last_forward_with_no_backward_before_the_end_counts() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        _train(model, optimizer, 20)
        prediction = model(torch.ones(1, 3))  # held: no backward comes before the end
    finally:
        probe.stop()
    assert probe.facts().forwards_without_backward == 1
    assert all(state.held is None for state in probe.record.forwards.modules.values())
    assert not probe.modules.pending
    del prediction


def test_a_loader_batch_settles_the_held_forward() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(12, 3)),
                                         batch_size=4)
    probe = _probe()
    watched = _count_watches(probe)
    probe.start()
    try:
        _train(model, optimizer, 10)
        first = len(watched)
        for (batch,) in loader:
            model(batch).argmax(1)
    finally:
        probe.stop()
    assert len(watched) - first == 3  # each evaluation forward, the first at the next batch
    assert probe.facts().forwards_without_backward == 3


# -- hooks: only on modules that need them ----------------------------------------------------


def test_a_leaf_without_parameters_gets_no_hooks_and_is_still_counted() -> None:
    model = torch.nn.Linear(3, 2)
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        for _ in range(5):
            optimizer.zero_grad()
            loss = loss_fn(model(torch.ones(4, 3)), torch.zeros(4, dtype=torch.long))
            assert not loss_fn._forward_hooks and len(model._forward_hooks) == 1
            loss.backward()
            optimizer.step()
    finally:
        probe.stop()
    facts = probe.facts()
    assert facts.forwards == 10 and facts.grad_forwards == 10
    names = {record.name: record.calls for record in facts.modules}
    assert names == {"Linear": 5, "CrossEntropyLoss": 5}
    assert not model._forward_hooks


def test_inputs_given_as_keyword_arguments_are_seen() -> None:
    class Keyworded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 1)

        def forward(self, *, features: torch.Tensor) -> torch.Tensor:
            return self.linear(features)

    model = Keyworded()
    probe = _probe()
    probe.start()
    try:
        model(features=torch.ones(2, 3))
    finally:
        probe.stop()
    facts = probe.facts()
    assert facts.input_devices == ["cpu"]
    assert facts.last_forward is not None and facts.last_forward.input_devices == ["cpu"]


# -- NVML on a thread ---------------------------------------------------------------------------


def test_nvml_is_sampled_on_a_thread_and_the_thread_ends_with_the_test(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gputrain.collect import nvml

    readers: list[str] = []
    pid_reads: list[int] = []

    def read_sample(index: int, nvml: Any = None, pids: Any = None,
                    session_pids: Any = None) -> DeviceSample:
        readers.append(threading.current_thread().name)
        assert pids == [os.getpid()] and session_pids == {os.getpid()}
        return DeviceSample(utilization_gpu=50.0, process_memory=GiB,
                            other_process_memory=2 * GiB, other_process_count=1)

    def session_process_ids() -> set[int]:
        pid_reads.append(1)
        return {os.getpid()}

    unknown = types.SimpleNamespace(ok=False, value=None)
    monkeypatch.setattr(nvml, "shared", lambda: types.SimpleNamespace(available=True))
    monkeypatch.setattr(nvml, "index_for_cuda_device", lambda index: 0)
    monkeypatch.setattr(nvml, "read_power_limits", lambda index: (unknown, unknown))
    monkeypatch.setattr(nvml, "session_process_ids", session_process_ids)
    monkeypatch.setattr(nvml, "read_sample", read_sample)
    monkeypatch.setattr(nvml_timeline, "PIDS_REFRESH", 0.0)  # re-read while other processes show up
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=True)
    probe.nvml.start(0)
    time.sleep(3 * nvml_timeline.NVML_INTERVAL)
    probe.nvml.stop()
    timeline = probe.record.nvml
    assert probe.errors == [] and timeline.index == 0
    assert len(timeline.samples) >= 3 and timeline.before_stop == len(timeline.samples) - 1
    assert readers[0].startswith("gputrain-nvml-sampler")  # not the training thread
    assert len(pid_reads) >= 2  # at the start, and again once other processes were seen
    assert not any(t.name.startswith("gputrain-nvml-sampler") for t in threading.enumerate())
    assert probe.facts().nvml.utilization_mean == 50.0


# -- CUPTI after the profiler window ------------------------------------------------------------


def _torch_with_cuda(version: str | None) -> Any:
    return types.SimpleNamespace(version=types.SimpleNamespace(cuda=version))


def test_the_window_asks_kineto_to_detach_cupti() -> None:
    environ: dict[str, str] = {}
    teardown = cupti.ask_for_teardown(_torch_with_cuda("12.8"), environ)
    assert teardown.on and environ == {"TEARDOWN_CUPTI": "1"}


@pytest.mark.parametrize(("environ", "version", "reason"), [
    ({"TEARDOWN_CUPTI": "0"}, "12.8", "TEARDOWN_CUPTI=0 was set before"),
    ({"DISABLE_CUPTI_LAZY_REINIT": "1"}, "12.8", "DISABLE_CUPTI_LAZY_REINIT is set"),
    ({}, "12.4", "CUDA 12.4 < 12.6"),
    ({}, "11.8", "CUDA 11.8 < 12.6"),
    ({}, None, "no CUDA version"),
])
def test_cupti_is_left_attached_where_a_teardown_is_not_safe(
        environ: dict[str, str], version: str | None, reason: str) -> None:
    before = dict(environ)
    teardown = cupti.ask_for_teardown(_torch_with_cuda(version), environ)
    assert not teardown.on and reason in teardown.reason
    assert environ == before  # a value someone set is never overridden


def test_a_users_teardown_setting_is_kept_and_reported() -> None:
    environ = {"TEARDOWN_CUPTI": "1"}
    teardown = cupti.ask_for_teardown(_torch_with_cuda("12.8"), environ)
    assert teardown.on and "was set before" in teardown.reason
    assert environ == {"TEARDOWN_CUPTI": "1"}


def test_cuda_graphs_in_use_keep_cupti_attached(monkeypatch: pytest.MonkeyPatch) -> None:
    config = types.SimpleNamespace(triton=types.SimpleNamespace(cudagraphs=True))
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    environ: dict[str, str] = {}
    teardown = cupti.ask_for_teardown(_torch_with_cuda("12.8"), environ)
    assert not teardown.on and "CUDA graphs" in teardown.reason and environ == {}


def test_the_teardown_is_recorded_in_the_profile_facts() -> None:
    record = _record([GiB] * 10, 1)
    record.profile_steps = (3, 6)
    record.window_facts = {"captured": True, "cupti_teardown": True,
                           "cupti_teardown_reason": "TEARDOWN_CUPTI=1, set by the probe"}
    profile = build_run_facts(record, ProcessReadings()).profile
    assert profile.cupti_teardown is True and "set by the probe" in (
        profile.cupti_teardown_reason or "")


def test_a_held_graph_is_let_go_before_the_next_forward_runs() -> None:
    class Remembering(torch.nn.Module):
        """Keeps weak references to the activations its graph saves."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))
            self.saved: list[weakref.ref[torch.Tensor]] = []
            self.alive_at_start: list[int] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.alive_at_start.append(sum(ref() is not None for ref in self.saved))
            hidden = x * 2
            self.saved.append(weakref.ref(hidden))
            return (hidden * self.weight).sum(1)  # saves hidden for the weight's gradient

    model = Remembering()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        _train(model, optimizer, 12)
        for batch in torch.ones(20, 3).split(4):
            model(batch).argmax()  # the graph is dropped at once, as without the probe
    finally:
        probe.stop()
    assert model.alive_at_start[-5:] == [0] * 5
    assert probe.facts().forwards_without_backward == 5


def test_sync_wrappers_keep_every_signature_and_count_no_cpu_call() -> None:
    tensor = torch.tensor([1.5, 2.5])
    probe = _probe()
    probe.start()
    try:
        assert torch.Tensor.item.__name__ == "item"  # type: ignore[attr-defined]
        assert tensor[0].item() == 1.5 and float(tensor[1]) == 2.5 and int(tensor[1]) == 2
        assert bool(tensor[0]) and tensor.tolist() == [1.5, 2.5]
        assert tensor.cpu(memory_format=torch.preserve_format) is tensor
        with pytest.raises(TypeError):
            tensor.item(0)  # type: ignore[call-arg]
    finally:
        probe.stop()
    assert probe.record.syncs.pending == 0 and probe.record.syncs.by_kind == {}
