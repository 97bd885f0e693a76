"""Activation checkpointing as the probe sees it (``probe/recompute_readings.py``,
``run.recompute.*``, GT158), on the CPU with torch's real ``torch.utils.checkpoint``: the
segments and their recomputations counted on both paths (``use_reentrant`` True and False,
``checkpoint_sequential``), the line and the framework's setting that turned it on, the
recomputations timed at a few steady steps; and the facts built from a hand-made record with
what only CUDA gives (the GPU's time between events, the allocated bytes around each
recomputation). The CUDA readings themselves are checked on a GPU in
tests/gpu/test_probe_recompute_gpu.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from probed_run import probed
from sample_modules import load_sample
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.recompute_facts import recompute_facts
from pytest_gputrain.probe.recompute_record import RecomputeReadings
from pytest_gputrain.probe.run_record import StepFlag, StepSeries

HELDOUT = Path(__file__).resolve().parents[1] / "sample_projects" / "heldout"
WIDTH, BLOCKS, STEPS = 32, 4, 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x))


def _probed(train: Callable[[], Any]) -> RunFacts:
    facts: RunFacts = probed(train)[1]
    return facts


def _loop(forward: Callable[[list[Block], torch.Tensor], torch.Tensor],
          steps: int = STEPS) -> Callable[[], None]:
    torch.manual_seed(0)
    blocks = [Block() for _ in range(BLOCKS)]
    head = torch.nn.Linear(WIDTH, 1)
    parameters = [p for block in blocks for p in block.parameters()] + list(head.parameters())
    optimizer = torch.optim.SGD(parameters, lr=0.01)

    def train() -> None:
        for _ in range(steps):
            loss = head(forward(blocks, torch.randn(16, WIDTH))).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    return train


def _every_block(blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x


def test_checkpointed_blocks_are_counted_named_and_timed() -> None:
    facts = _probed(_loop(_every_block)).recompute
    assert facts.calls == facts.recomputes == BLOCKS * STEPS and facts.reentrant_calls == 0
    assert facts.recomputes_per_step == BLOCKS
    assert facts.segments == ["Block"]
    line = _every_block.__code__.co_firstlineno + 2  # the checkpoint call's
    assert facts.site == ("`x = checkpoint(block, x, use_reentrant=False)` at "
                          f"test_probe_recompute.py:{line}")
    assert facts.setting is None  # the test's own call: the site names it
    # the steps after the warm-up (2 steps), four of them, by the host clock on the CPU
    assert facts.timed_steps == 4 and facts.clock == "host clock"
    assert facts.time_per_step is not None and facts.time_per_step > 0
    assert facts.step_percent is not None and 0 < facts.step_percent < 100
    # the allocator's counters are CUDA's: no activation estimate, and GT158 has nothing to judge
    assert facts.activation_bytes is None and "CUDA" in facts.unknown["activation_bytes"]
    assert facts.peak_without is None


def test_a_reentrant_checkpoint_counts_its_forward_once() -> None:
    def reentrant(blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        x = blocks[0](x)  # the first block's output requires grad: the rest can recompute
        for block in blocks[1:]:
            x = checkpoint(block, x, use_reentrant=True)
        return x

    run_facts = _probed(_loop(reentrant))
    facts = run_facts.recompute
    assert facts.calls == facts.reentrant_calls == facts.recomputes == (BLOCKS - 1) * STEPS
    assert facts.recomputes_per_step == BLOCKS - 1 and facts.timed_steps == 4
    # each segment's backward is started inside the step's: neither a backward nor a loss
    assert run_facts.backwards == run_facts.loss.backwards == STEPS
    assert run_facts.loss.first_value is not None and run_facts.loss.first_value > 0


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
def test_a_reentrant_checkpoint_after_frozen_layers_recomputes_nothing() -> None:
    """use_reentrant=True whose input needs no gradient: no graph, no backward through it (the
    held-out checkpoint_reentrant_frozen_stem; GT150 names that warning)."""
    def frozen_stem(blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        return checkpoint(blocks[0], x, use_reentrant=True) + blocks[1](x)

    facts = _probed(_loop(frozen_stem)).recompute
    assert facts.calls == facts.reentrant_calls == STEPS and facts.recomputes == 0
    assert facts.recomputes_per_step is None and facts.timed_steps == 0


def test_checkpoint_sequential_is_seen_through_checkpoint() -> None:
    def sequential(blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        return checkpoint_sequential(torch.nn.Sequential(*blocks), 2, x, use_reentrant=False)

    facts = _probed(_loop(sequential)).recompute
    # two segments: the last one runs without checkpointing
    assert facts.calls == facts.recomputes == STEPS and facts.recomputes_per_step == 1
    assert facts.segments == ["checkpoint_sequential segment"]
    assert facts.site is not None and "checkpoint_sequential(" in facts.site


def test_evaluation_under_no_grad_recomputes_nothing() -> None:
    train = _loop(_every_block, steps=4)

    def train_then_evaluate() -> None:
        train()
        blocks = [Block() for _ in range(BLOCKS)]
        with torch.no_grad():
            for _ in range(3):
                _every_block(blocks, torch.randn(16, WIDTH))

    facts = _probed(train_then_evaluate).recompute
    assert facts.calls == BLOCKS * (4 + 3) and facts.recomputes == BLOCKS * 4


def test_a_graph_kept_past_the_test_recomputes_untouched() -> None:
    """A backward run after the probe stopped goes straight to the checkpointed function."""
    block = Block()
    x = torch.randn(4, WIDTH, requires_grad=True)
    kept: list[torch.Tensor] = []
    facts = _probed(lambda: kept.append(checkpoint(block, x, use_reentrant=False).sum()))
    assert facts.recompute.calls == 1 and facts.recompute.recomputes == 0
    kept[0].backward()
    assert x.grad is not None and block.linear.weight.grad is not None


# -- the frameworks' settings ---------------------------------------------------------------

def _ignore_framework_warnings(test: Callable[..., Any]) -> Callable[..., Any]:
    for category in ("UserWarning", "DeprecationWarning", "FutureWarning"):
        test = pytest.mark.filterwarnings(f"ignore::{category}")(test)
    return test


def _heldout(name: str) -> Any:
    import importlib.util

    path = next((HELDOUT / name).glob("test_*.py"))
    spec = importlib.util.spec_from_file_location(f"gputrain_heldout_{name}", path)
    assert spec is not None and spec.loader is not None
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    return sample


@_ignore_framework_warnings
@pytest.mark.parametrize("name", ["hf_trainer_gradient_checkpointing_unneeded",
                                  "healthy_checkpointing_memory_capped"])
def test_the_trainers_gradient_checkpointing_is_named(name: str, tmp_path: Path) -> None:
    """The held-out sample's own Trainer and its pipeline neighbour's, small:
    TrainingArguments(gradient_checkpointing=True) reaches GPT-2's layers through
    transformers' own bound checkpoint."""
    pytest.importorskip("transformers", reason="pip install 'pytest-gputrain[frameworks]'")
    pytest.importorskip("accelerate", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = _heldout(name) if name.startswith("hf_") else load_sample(name)
    facts = _probed(lambda: sample.train(str(tmp_path), 8, cpu=True, layers=2, width=32,
                                         length=16, batch_size=4, workers=0))
    recompute = facts.recompute
    assert facts.framework == "transformers" and facts.steps == 8
    assert recompute.setting is not None
    assert recompute.setting.startswith("TrainingArguments(gradient_checkpointing=True)")
    assert recompute.segments == ["GPT2Block"]
    assert recompute.calls == recompute.recomputes == 2 * 8 and recompute.recomputes_per_step == 2
    assert recompute.site is not None and "modeling_layers.py" in recompute.site
    assert recompute.timed_steps == 4 and recompute.step_percent is not None


@_ignore_framework_warnings
def test_a_model_that_enabled_it_itself_is_named() -> None:
    """model.gradient_checkpointing_enable() and a loop of the test's own: the model is named."""
    transformers = pytest.importorskip("transformers",
                                       reason="pip install 'pytest-gputrain[frameworks]'")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                     n_head=2, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train() -> None:
        for _ in range(4):
            ids = torch.randint(64, (2, 16))
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    recompute = _probed(train).recompute
    assert recompute.setting is not None
    assert recompute.setting.startswith("GPT2LMHeadModel.gradient_checkpointing_enable()")
    assert recompute.recomputes == 2 * 4


@_ignore_framework_warnings
def test_the_healthy_trainer_sample_checkpoints_nothing(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'pytest-gputrain[frameworks]'")
    pytest.importorskip("accelerate", reason="pip install 'pytest-gputrain[frameworks]'")
    sample = load_sample("hf_trainer_healthy")
    facts = _probed(lambda: sample.train(str(tmp_path), 4, cpu=True, layers=1, width=32,
                                         length=16, batch_size=4, vocab=128, workers=0))
    assert facts.recompute.calls == facts.recompute.recomputes == 0


# -- the facts from a record: what CUDA gives --------------------------------------------------

def _steps(times: list[float], flags: list[StepFlag] | None = None) -> StepSeries:
    steps = StepSeries(last_t=0.0)
    steps.times = list(times)
    steps.flags = flags or [StepFlag.STEADY] * len(times)
    return steps


def test_cuda_readings_give_the_cost_and_the_peak_without_checkpointing() -> None:
    GiB = 2**30
    readings = RecomputeReadings(
        calls=120, recomputes=120, segments=["GPT2Block"], clock="CUDA events",
        timed_steps=[3, 4, 5, 6], seconds={3: 0.02, 4: 0.022, 5: 0.018, 6: 0.02},
        # two micro-batches in step 4: one backward's activations are the largest, not the sum
        activations={(3, 4): 6 * GiB, (4, 5): 3 * GiB, (4, 6): 3 * GiB, (5, 7): 6 * GiB,
                     (6, 8): 6 * GiB})
    facts = recompute_facts(readings, _steps([0.1] * 10), peak=3 * GiB, budget=140 * GiB)
    assert facts.recomputes_per_step == 12.0 and facts.timed_steps == 4
    assert facts.time_per_step == 0.02 and facts.step_percent == 20.0
    assert facts.activation_bytes == 6 * GiB
    assert facts.peak_without == 9 * GiB and facts.peak_without_percent == round(900 / 140, 2)


def test_a_host_running_ahead_of_the_gpu_is_measured_by_the_steps_own_events() -> None:
    # A GPU-bound loop without a sync: the host's steps take 13 ms while each step queues
    # 140 ms of GPU work, 38 ms of it recomputation (the 8 x 4096 MLP on the H200).
    readings = RecomputeReadings(
        calls=28, recomputes=28, clock="CUDA events", timed_steps=[8, 9, 10, 11],
        seconds={8: 0.038, 9: 0.038, 10: 0.038, 11: 0.038},
        step_seconds={8: 0.14, 9: 0.14, 10: 0.141, 11: 0.139})
    facts = recompute_facts(readings, _steps([0.013] * 24), peak=100, budget=1000)
    assert facts.step_time == 0.14 and facts.step_percent == round(100 * 0.038 / 0.14, 2)
    host = recompute_facts(dataclasses.replace(readings, step_seconds={}),
                           _steps([0.013] * 24), peak=100, budget=1000)
    assert host.step_time == 0.013 and host.step_percent == 100.0  # what the host's clock says


def test_a_step_timed_in_part_or_not_steady_is_left_out() -> None:
    readings = RecomputeReadings(
        calls=40, recomputes=40, clock="CUDA events", timed_steps=[2, 3, 4, 5], cut=5,
        seconds={2: 0.05, 3: 0.01, 4: 0.01, 5: 0.001}, activations={(2, 3): 9, (3, 4): 4,
                                                                   (4, 5): 4, (5, 6): 1})
    flags = [StepFlag.STEADY] * 10
    flags[2] = StepFlag.EPOCH_START  # the loader's workers started: its time is not the step's
    facts = recompute_facts(readings, _steps([0.1] * 10, flags), peak=100, budget=1000)
    assert facts.timed_steps == 2 and facts.time_per_step == 0.01 and facts.step_percent == 10.0
    assert facts.activation_bytes == 4 and facts.peak_without == 104


def test_unread_timings_and_untimed_runs_are_unknown_with_the_reason() -> None:
    unread = RecomputeReadings(calls=8, recomputes=8, clock="CUDA events", timed_steps=[2],
                               unread="the CUDA context was unusable when the test ended")
    facts = recompute_facts(unread, _steps([0.1] * 4), peak=100, budget=1000)
    assert facts.step_percent is None and facts.peak_without_percent is None
    assert facts.unknown["activation_bytes"] == "the CUDA context was unusable when the test ended"
    short = recompute_facts(RecomputeReadings(calls=2, recomputes=2), _steps([0.1, 0.1]),
                            peak=100, budget=1000)
    assert short.recomputes_per_step == 1.0 and short.time_per_step is None
    assert "warm-up" in short.unknown["time_per_step"]
    none = recompute_facts(RecomputeReadings(), _steps([0.1] * 4), peak=100, budget=1000)
    assert none.recomputes == 0 and none.unknown == {}


class _FakeEvent:
    """A CUDA event as the watch uses it: recorded on a stream; its time is set by the test."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.at: float | None = None

    def record(self, stream: object = None) -> None:
        self.at = _FakeEvent.clock

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1000.0

    clock = 0.0


def test_the_timed_steps_boundaries_are_paired_and_the_events_stop_after_the_last() -> None:
    """An event at each step boundary from the first recomputation on: a timed step gets the
    boundary before it and the one after it; once the four timed steps have ended, no more."""
    from types import SimpleNamespace

    from pytest_gputrain.probe.recompute_readings import MAX_TIMED_STEPS, RecomputeWatch

    cuda = SimpleNamespace(Event=_FakeEvent, current_stream=lambda device=None: None,
                           is_current_stream_capturing=lambda: False)
    fake_torch = SimpleNamespace(cuda=cuda)
    readings = RecomputeReadings(timed_steps=[3, 4, 6, 7])
    probe = SimpleNamespace(record=SimpleNamespace(recompute=readings), disabled=False,
                            fail=lambda where, exc: pytest.fail(f"{where}: {exc}"))
    watch = RecomputeWatch(fake_torch, probe)
    watch.step_clock, watch._device = True, "cuda:0"
    recomputed = [(step, _FakeEvent(), _FakeEvent()) for step in readings.timed_steps]
    for _, start, end in recomputed:  # 20 ms of each step recomputed
        start.at, end.at = 0.0, 0.02
    watch._events = recomputed
    recorded = 0
    for count in range(1, 20):  # the boundary after step count - 1, 0.1 s a step
        _FakeEvent.clock = 0.1 * count
        if watch.step_clock:
            watch.at_boundary(count)
            recorded += 1
    assert len(readings.timed_steps) == MAX_TIMED_STEPS and recorded == 8  # up to step 7's end
    watch.stop(cuda_ok=True)
    assert readings.unread is None
    assert readings.step_seconds == pytest.approx({3: 0.1, 4: 0.1, 6: 0.1, 7: 0.1})
