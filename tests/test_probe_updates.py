"""Optimizer steps that change nothing (``probe/update_readings.py``, ``run.updates.*``,
GT151-GT153): the learning rate at each scheduler step, zero_grad's cadence, and the weights a
step left unchanged, counted on the device at a few steps. CPU torch runs every loop here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pytest_gputrain.probe import run
from pytest_gputrain.probe.run_record import SchedulerStep
from pytest_gputrain.probe.torch_hooks import global_hook_counts
from pytest_gputrain.probe.update_facts import UpdateFacts
from pytest_gputrain.probe.update_facts_builder import learning_rates


def _train(dtype: torch.dtype = torch.float32, lr: float = 1e-3, steps: int = 40,
           scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
           clear_every: int = 1, micro_batches: int = 1) -> tuple[UpdateFacts, list[str]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 4)).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = scheduler(optimizer) if scheduler is not None else None
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for step in range(steps):
            if step % clear_every == 0:
                optimizer.zero_grad()
            for _ in range(micro_batches):
                model(torch.randn(32, 64, dtype=dtype)).float().square().mean().backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
    finally:
        probe.stop()
    return probe.facts().updates, probe.errors


def test_bf16_weights_at_a_fine_tuning_rate_keep_most_of_their_values() -> None:
    updates, errors = _train(torch.bfloat16, lr=2e-5)
    assert errors == []
    assert updates.checks == 4 and updates.skipped_checks == 0  # steps 5, 9, 17, 33
    assert updates.unchanged_percent is not None and updates.unchanged_percent > 50
    assert updates.check_dtype == "bfloat16" and updates.check_lr == 2e-5
    assert updates.checked[0].startswith("step 5: ")


def test_float32_weights_at_the_same_rate_all_move() -> None:
    updates, _ = _train(torch.float32, lr=2e-5)
    assert updates.checks == 4  # a few elements whose gradient is tiny keep their value
    assert updates.unchanged_percent is not None and updates.unchanged_percent < 1
    assert updates.check_dtype == "float32"


def test_an_epoch_schedule_stepped_per_batch_collapses_the_learning_rate() -> None:
    updates, _ = _train(scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 2, gamma=0.5))
    assert updates.scheduler == "StepLR" and updates.scheduler_steps == 40
    assert updates.scheduler_steps_per_step == 1.0
    assert updates.lr_peak == 1e-3 and updates.lr_end is not None and updates.lr_end < 1e-9
    # 0.5 ** 7 < 1 %: from the 15th step on (the rate halves every second step)
    assert updates.lr_low_from_step == 15 and updates.lr_low_percent == 65.0


def test_a_decay_over_the_whole_run_and_a_warm_up_are_not_a_collapse() -> None:
    def warm_then_cosine(optimizer: torch.optim.Optimizer) -> Any:
        lr_scheduler = torch.optim.lr_scheduler
        return lr_scheduler.SequentialLR(optimizer, [
            lr_scheduler.LinearLR(optimizer, start_factor=1e-3, total_iters=8),
            lr_scheduler.CosineAnnealingLR(optimizer, T_max=32)], milestones=[8])

    updates, errors = _train(scheduler=warm_then_cosine)
    assert errors == []
    assert updates.lr_start == 1e-6 and updates.lr_peak is not None
    assert updates.lr_low_percent is not None and updates.lr_low_percent <= 5.0


def test_zero_grad_once_every_ten_steps_leaves_nine_in_ten_uncleared() -> None:
    updates, _ = _train(clear_every=10)
    assert updates.steps_without_zero_grad == 36  # steps 2-10, 12-20, ... of 40
    assert updates.steps_without_zero_grad_percent == 92.31
    assert updates.steps_per_zero_grad == 10.0


def test_gradient_accumulation_clears_once_per_optimizer_step() -> None:
    updates, _ = _train(micro_batches=4, steps=12)
    assert updates.steps_without_zero_grad == 0 and updates.steps_per_zero_grad == 1.0


def test_the_schedule_from_the_scheduler_steps() -> None:
    events = [SchedulerStep("StepLR", 1, 0, 0.1),  # the scheduler's own first step, at setup
              SchedulerStep("StepLR", 1, 2, 0.05), SchedulerStep("StepLR", 1, 4, 0.025)]
    assert learning_rates(events, 0.1, 6) == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025]
    assert learning_rates(events, None, 6) is None  # a tensor learning rate: not read
    assert learning_rates([SchedulerStep("X", 1, 3, None)], 0.1, 6) is None


def test_the_probe_puts_the_schedulers_back() -> None:
    scheduler_step = vars(torch.optim.lr_scheduler.LRScheduler)["step"]
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    assert vars(torch.optim.lr_scheduler.LRScheduler)["step"] is not scheduler_step
    probe.stop()
    assert vars(torch.optim.lr_scheduler.LRScheduler)["step"] is scheduler_step
    assert global_hook_counts(torch)["patched_attributes"] == 0
