"""The probe's readings that name the exact cause, on the CPU under a real probe:

- every sync by kind and call site, explicit waits (``torch.cuda.synchronize``) included, the
  plugin's own left out (GT104);
- an autocast context opened for another device than CUDA (GT106);
- debugging instruments left on: verbose compile logging, a profiler of the test's own (its
  kind, its steps against the others, the time its own calls took), and the switches only a
  CUDA build answers (allocator history recording, the sync debug mode), read from a stand-in
  (GT116, GT144);
- gradients nobody uses: parameters with a gradient that no optimizer holds (GT145), and the
  legitimate cases that must stay quiet (frozen, a second optimizer, accumulation, a teacher);
- the loss's values at the finiteness checks, the learning rate and the clipping in force
  (GT146).

Their GPU behaviour is shown by the sample pipelines recorded on a GPU
(sample_projects/pipelines/, tests/gpu/test_sample_pipelines_gpu.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from probed_run import probed
from torch import nn

from pytest_gputrain.probe import instrument_readings, run
from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.habit_facts_builder import instrument_facts

F = nn.functional


def _probed(train: Callable[[], Any], profile_steps: tuple[int, int] | None = None
            ) -> RunFacts:
    facts: RunFacts = probed(train, profile_steps)[1]
    return facts


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int,
           body: Callable[[int], None] | None = None) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        if body is not None:
            body(step)


# -- syncs by kind and call site ----------------------------------------------------------------


@pytest.fixture
def fake_synchronize(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """``torch.cuda.synchronize`` as a CUDA build's would return (this torch has no CUDA)."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(1))
    yield calls


def test_explicit_synchronize_calls_are_counted_by_kind_and_line(
        fake_synchronize: list[int]) -> None:
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def phases(step: int) -> None:  # times each phase the way a hand-written benchmark does
        torch.cuda.synchronize()
        torch.cuda.synchronize()

    facts = _probed(lambda: _steps(model, optimizer, 12, phases))
    assert len(fake_synchronize) == 24
    sync = facts.sync
    assert sync.per_step == 2.0 and sync.total == 24
    assert sync.by_call == ["torch.cuda.synchronize: 24"]
    assert sync.kinds == ["torch.cuda.synchronize"]
    assert len(sync.by_site) == 2
    assert all(site.startswith("torch.cuda.synchronize at test_probe_causes.py:")
               and site.endswith(" in phases: 12") for site in sync.by_site)


def test_the_plugins_own_waits_are_not_the_tests(fake_synchronize: list[int]) -> None:
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    own: dict[str, Any] = {"__name__": "pytest_gputrain.regression.benchmark", "torch": torch}
    exec("def wait():\n    torch.cuda.synchronize()\n", own)
    facts = _probed(lambda: _steps(model, optimizer, 6, lambda step: own["wait"]()))
    assert len(fake_synchronize) == 6 and facts.sync.total == 0


# -- autocast for the wrong device --------------------------------------------------------------


def test_forwards_under_another_devices_autocast_are_counted() -> None:
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def under_cpu_autocast() -> None:
        for _ in range(6):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(8, 16)).float().sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    facts = _probed(under_cpu_autocast)
    assert facts.autocast_other_forwards == 6 and facts.autocast_other_devices == ["cpu"]
    assert facts.autocast_forwards == 0  # CUDA's autocast was off
    plain = _probed(lambda: _steps(model, optimizer, 6))
    assert plain.autocast_other_forwards == 0 and plain.autocast_other_devices == []


# -- debugging instruments ----------------------------------------------------------------------


def test_verbose_compile_logging_turned_on_inside_the_test_is_read() -> None:
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def logged() -> None:
        torch._logging.set_logs(dynamo=logging.DEBUG, output_code=True, graph_breaks=True)
        try:
            _steps(model, optimizer, 40)
        finally:
            torch._logging.set_logs()

    facts = _probed(logged)
    assert facts.compile_logs == "dynamo=DEBUG, output_code"  # graph_breaks is cheap
    assert facts.instruments == []  # nothing compiled: the logging cost nothing
    facts.compile.used, facts.compile.compiles = True, 2
    record = SimpleNamespace(settings=SimpleNamespace(
        user_profiler_kinds=[], user_profiled=[], anomaly_steps=[], snapshots=[],
        user_profiler_setup_time=0.0, user_profiler_steps=0), steps=SimpleNamespace(times=[]),
        duration=1.0)
    facts.instruments = []
    instrument_facts(facts, record, [])  # type: ignore[arg-type]
    assert facts.instruments == [
        "verbose torch.compile logging (dynamo=DEBUG, output_code): whole graphs and generated "
        "code printed at each compilation, 2 compilation(s) in the test"]
    assert _probed(lambda: _steps(model, optimizer, 4)).compile_logs == ""


def test_a_profiler_of_the_tests_own_is_measured() -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def partly_profiled() -> None:
        with profile(activities=[ProfilerActivity.CPU],
                     schedule=schedule(wait=8, warmup=1, active=8, repeat=1)) as prof:
            _steps(model, optimizer, 30, lambda step: prof.step())

    facts = _probed(partly_profiled)
    assert facts.user_profiler_kinds == ["torch.profiler"]
    assert 8 <= facts.user_profiler_steps <= 10
    # both kinds of step measured: the slowdown is a measurement, not a guess
    assert facts.user_profiler_slowdown is not None and facts.user_profiler_slowdown > 0
    assert facts.user_profiler_setup_time and facts.user_profiler_setup_time > 0
    assert facts.user_profiler_setup_percent is not None


def test_the_probes_own_window_is_not_the_tests_profiler() -> None:
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    times = instrument_readings.ProfilerTimes(probe.record.settings)
    ours = SimpleNamespace(_gputrain_window=True)
    theirs = SimpleNamespace()
    called: list[Any] = []
    original = torch.profiler.profile.start
    try:
        torch.profiler.profile.start = lambda self: called.append(self)  # type: ignore[method-assign]
        (_, _, start), *_ = times.wrappers(torch)
        start(ours)
        assert probe.record.settings.user_profiler_setup_time == 0.0
        start(theirs)
        assert called == [ours, theirs] and probe.record.settings.user_profiler_setup_time > 0
    finally:
        torch.profiler.profile.start = original  # type: ignore[method-assign]


def test_the_switches_only_a_cuda_build_answers_are_read_when_cuda_is_initialised() -> None:
    state = {"history": True, "mode": 1}
    fake = SimpleNamespace(
        cuda=SimpleNamespace(is_initialized=lambda: True),
        _C=SimpleNamespace(_cuda_isHistoryEnabled=lambda: state["history"],
                           _cuda_get_sync_debug_mode=lambda: state["mode"]))
    assert instrument_readings.read_instruments(fake) == {
        "memory_history": True, "sync_debug_mode": "warn", "compile_logs": ""}
    state.update(history=False, mode=0)
    assert instrument_readings.read_instruments(fake)["sync_debug_mode"] == "off"
    fake.cuda.is_initialized = lambda: False  # no CUDA call on a device the test left alone
    assert instrument_readings.read_instruments(fake) == {"compile_logs": ""}
    assert instrument_readings.read_instruments(torch) == {"compile_logs": ""}  # CPU build


# -- gradients nobody uses ----------------------------------------------------------------------


class FineTune(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128),
                                      nn.ReLU())
        self.head = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


BACKBONE = 16 * 128 + 128 + 128 * 128 + 128  # 18,688 parameters
HEAD = 128 * 4 + 4


def test_a_backbone_left_trainable_beside_a_head_only_optimizer_is_found() -> None:
    model = FineTune()
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.01)
    grads = _probed(lambda: _steps(model, optimizer, 10)).grads
    assert grads.read_at_step == 2
    assert grads.unused_params == BACKBONE and grads.unused_tensors == 4
    assert grads.unused_bytes == 4 * BACKBONE  # float32 gradients: exact
    assert grads.unused_modules == ["backbone: 18,688 parameters, 73.0 KiB of gradients"]
    assert grads.trained_params == HEAD and grads.model_params == BACKBONE + HEAD
    assert grads.unused_ahead is True
    assert grads.unused_percent == pytest.approx(100.0 * BACKBONE / (BACKBONE + HEAD), abs=0.01)
    # no profiler window: the time is not estimated, and says why
    assert grads.backward_time_estimate is None and "profiler window" in grads.unknown[
        "backward_time_estimate"]


def _quiet(grads: Any) -> None:
    assert grads.unused_params == 0 and grads.unused_bytes == 0, grads


def test_a_frozen_backbone_is_quiet() -> None:
    model = FineTune()
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.01)
    _quiet(_probed(lambda: _steps(model, optimizer, 10)).grads)


def test_parameters_of_a_second_optimizer_stepping_every_few_steps_are_quiet() -> None:
    model = FineTune()
    head = torch.optim.SGD(model.head.parameters(), lr=0.01)
    backbone = torch.optim.SGD(model.backbone.parameters(), lr=0.001)

    def slow_backbone(step: int) -> None:
        if step % 4 == 3:  # the second optimizer's first step comes after the reading
            backbone.step()

    _quiet(_probed(lambda: _steps(model, head, 12, slow_backbone)).grads)


def test_gradient_accumulation_and_a_progressive_unfreeze_are_quiet() -> None:
    model = FineTune()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def accumulate() -> None:
        for _step in range(8):
            for _ in range(4):  # .grad holds the sum of 4 backwards before each step
                model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    _quiet(_probed(accumulate).grads)

    model = FineTune()
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.01)

    def unfreeze(step: int) -> None:
        if step == 5:  # the backbone joins the optimizer: from then on its gradients train it
            optimizer.add_param_group({"params": model.backbone.parameters(), "lr": 0.001})

    _quiet(_probed(lambda: _steps(model, optimizer, 10, unfreeze)).grads)


def test_a_teacher_under_no_grad_is_quiet_and_one_under_grad_mode_is_found() -> None:
    student, teacher = nn.Linear(16, 4), nn.Linear(16, 4)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)

    def distill(teacher_grad: bool) -> None:
        for _ in range(6):
            x = torch.randn(8, 16)
            with torch.set_grad_enabled(teacher_grad):
                target = teacher(x)
            loss = F.mse_loss(student(x), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    _quiet(_probed(lambda: distill(False)).grads)
    grads = _probed(lambda: distill(True)).grads  # the teacher's gradients, for nothing
    assert grads.unused_params == 16 * 4 + 4
    assert grads.unused_modules == ["Linear: 68 parameters, 272 B of gradients"]


def test_a_backbone_and_a_head_called_one_after_the_other() -> None:
    backbone = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128))
    head = nn.Linear(128, 4)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.01)

    def train() -> None:
        for _ in range(6):
            loss = head(backbone(torch.randn(8, 16))).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    grads = _probed(train).grads
    assert grads.unused_params == 16 * 128 + 128 + 128 * 128 + 128 and grads.unused_ahead
    assert grads.unused_modules == ["Sequential.2: 16,512 parameters, 64.5 KiB of gradients",
                                    "Sequential.0: 2,176 parameters, 8.5 KiB of gradients"]


def test_an_optimizer_holding_none_of_the_modules_parameters_is_left_alone() -> None:
    model = nn.Linear(16, 4)
    masters = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    optimizer = torch.optim.SGD(masters, lr=0.01)  # fp32 master copies, as apex O2 keeps

    def train() -> None:
        for _ in range(6):
            optimizer.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            for master, param in zip(masters, model.parameters(), strict=True):
                master.grad = param.grad
            optimizer.step()

    grads = _probed(train).grads
    assert grads.unused_params is None and "no called module" in grads.unknown["unused_params"]


# -- the loss's values, the learning rate and the clipping ---------------------------------------


def _classifier(lr: float, clip: float | None = None, steps: int = 60) -> RunFacts:
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    centroids = torch.randn(10, 64)
    labels = torch.randint(10, (steps * 256,))
    features = centroids[labels] + 3 * torch.randn(steps * 256, 64)

    def train() -> None:
        for step in range(steps):
            rows = slice(step * 256, (step + 1) * 256)
            loss = F.cross_entropy(model(features[rows]), labels[rows])
            optimizer.zero_grad()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
            optimizer.step()

    return _probed(train)


def test_a_loss_that_diverges_but_stays_finite_is_measured() -> None:
    facts = _classifier(lr=1e4)
    loss = facts.loss
    assert loss.nonfinite_checks == 0 and loss.checks == 9  # every 8th backward and the last
    assert loss.first_value_step == 1 and loss.last_value_step == 60
    assert loss.growth_orders is not None and loss.growth_orders >= 2.0
    assert loss.max_value is not None and loss.max_value >= loss.last_value  # type: ignore[operator]
    assert loss.values[0].startswith("1: ") and loss.values[-1].startswith("60: ")
    assert facts.optimizer.lr == 1e4 and facts.optimizer.lr_last == 1e4
    assert facts.optimizer.clip_calls == 0


def test_a_loss_that_falls_and_the_clipping_in_force() -> None:
    facts = _classifier(lr=0.1, clip=1.0)
    assert facts.loss.growth_orders is not None and facts.loss.growth_orders < 0
    assert facts.optimizer.clip_calls == 60 and facts.optimizer.clip_kinds == ["norm"]
    assert facts.optimizer.clip_limit == 1.0 and facts.optimizer.lr == 0.1


def test_an_objective_driven_below_zero_is_no_loss_that_explodes() -> None:
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = _probed(lambda: _steps(model, optimizer, 30)).loss  # minimises model(x).sum()
    assert loss.first_value is not None and loss.growth_orders is None
    assert "not positive" in loss.unknown.get("growth", "") or loss.unknown.get("growth_orders")


def test_anomaly_detection_for_part_of_the_test_is_measured() -> None:
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def half(step: int) -> None:
        torch.autograd.set_detect_anomaly(step >= 9)  # on for the second half

    try:
        facts = _probed(lambda: _steps(model, optimizer, 20, half))
    finally:
        torch.autograd.set_detect_anomaly(False)
    assert facts.anomaly_backwards == 10
    assert facts.anomaly_slowdown is not None and facts.anomaly_slowdown > 0


def test_steps_under_a_per_step_instrument_are_dated_from_the_settings_read() -> None:
    from pytest_gputrain.probe.habit_facts_builder import _instrumented_steps

    # read after steps 1, 2 (history on), the window's 3-6 (off), 32 (sync debug 'warn')
    snapshots = [(1, {"memory_history": True}), (3, {"memory_history": False}),
                 (32, {"memory_history": False, "sync_debug_mode": "warn"})]
    assert _instrumented_steps(snapshots, 40) == {0, 1, *range(31, 40)}
    assert _instrumented_steps([(1, {"memory_history": False})], 40) == set()
