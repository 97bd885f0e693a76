"""What the probe reads of the training loop itself (issue 23's missed faults): the checkpoints it
writes with ``torch.save`` (GT140), the loss each backward starts from (its device, GT143, and
whether it stayed finite, GT142, checked without a sync per step), fp16 autocast and a
GradScaler's loss scaling (GT141), and the DataLoader's last batch (GT220). CPU torch runs every
loop here; the GPU samples are in ``sample_projects/pipelines`` (``EXPECTED.toml``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from pytest_gputrain.probe import failure_kinds, loss_readings, run, torch_hooks
from pytest_gputrain.probe.cuda_readings import autocast_dtype
from pytest_gputrain.probe.loader import LoaderTracker
from pytest_gputrain.probe.run_facts_builder import ProcessReadings, build_run_facts
from pytest_gputrain.probe.run_record import LoaderWaits, RunRecord, StepFlag, StepSeries


def _probe() -> run.RunProbe:
    return run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)


def _train(steps: int, loss_of: Callable[[torch.Tensor, int], torch.Tensor],
           after_step: Callable[[nn.Module, int], None] | None = None) -> run.RunProbe:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        for step in range(steps):
            optimizer.zero_grad()
            loss_of(model(torch.ones(4, 3)), step).backward()
            optimizer.step()
            if after_step is not None:
                after_step(model, step)
    finally:
        probe.stop()
    assert torch_hooks.global_hook_counts(torch) == dict.fromkeys(
        torch_hooks.global_hook_counts(torch), 0)
    return probe


# -- the loss: finite, checked without a sync per step -----------------------------------------


def test_a_loss_that_turns_nan_is_found_at_the_first_check_after_it() -> None:
    probe = _train(40, lambda out, step: out.sum() * (float("nan") if step >= 20 else 1.0))
    loss = probe.facts().loss
    # Backwards 1, 9, 17, 25, 33 are checked (every 8th), and the last one at the end.
    assert loss.checks == 6 and loss.nonfinite_checks == 3
    assert loss.first_nonfinite_step == 25 and loss.last_finite is False
    assert loss.backwards == 40 and loss.cpu_backwards == 40 and loss.cpu_percent == 100.0


def test_a_finite_run_reads_its_checks_once_at_the_end() -> None:
    readings: list[Any] = []
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = _probe()
    probe.start()
    try:
        for _ in range(20):
            optimizer.zero_grad()
            model(torch.ones(4, 3)).sum().backward()
            optimizer.step()
        # While the test trains the checks are slots of one tensor, never read back.
        readings = list(probe.record.loss.checked_steps)
        assert probe.record.loss.finite == []
        slots = probe.record.loss.slots
        assert isinstance(slots, torch.Tensor)
        assert slots.shape == (2, loss_readings.MAX_CHECKS)
    finally:
        probe.stop()
    assert readings == [0, 8, 16]
    assert probe.record.loss.checked_steps == [] and probe.record.loss.slots is None
    assert probe.record.loss.last is None
    loss = probe.facts().loss
    assert loss.checks == 4 and loss.nonfinite_checks == 0 and loss.last_finite is True
    assert loss.first_nonfinite_step is None


def _backward(probe: run.RunProbe, tensors: Any) -> None:
    """What the backward wrapper does: the module watch counts it, then the loss is read."""
    probe.record.forwards.backwards += 1
    probe.loss.on_loss(tensors)


def test_the_checks_stay_evenly_spaced_as_the_stride_doubles() -> None:
    probe = _probe()
    watch = probe.loss
    loss = torch.ones(())
    for _ in range(8 * loss_readings.MAX_CHECKS * 2):
        _backward(probe, loss)
        probe.record.steps.times.append(0.01)  # one backward per step
    steps = probe.record.loss.checked_steps
    assert len(steps) < loss_readings.MAX_CHECKS
    assert probe.record.loss.check_every == 32
    assert steps == list(range(0, 32 * len(steps), 32))  # evenly spaced, every 32nd backward
    assert probe.record.loss.backwards == 8 * loss_readings.MAX_CHECKS * 2
    # A NaN loss in a kept slot is still found after the compactions.
    _backward(probe, torch.tensor(float("nan")))
    watch.read_end(cuda_ok=True)
    assert probe.record.loss.finite[-1] == (1024, False) and all(
        finite for _, finite in probe.record.loss.finite[:-1])


def test_a_vector_loss_and_a_list_of_losses_are_checked_whole() -> None:
    probe = _probe()
    _backward(probe, [torch.tensor([1.0, float("inf")]), torch.ones(())])
    probe.loss.read_end(cuda_ok=True)
    assert probe.record.loss.finite == [(0, False)]
    _backward(probe, "not a tensor")  # what a user passes is none of the probe's business
    assert probe.record.loss.backwards == 1 and not probe.disabled
    probe.loss.on_loss(torch.ones(()))  # a backward the module watch did not count (traced)
    assert probe.record.loss.backwards == 1


def test_checks_on_a_dead_cuda_context_are_not_read() -> None:
    probe = _probe()
    probe.record.loss.slots = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    probe.record.loss.checked_steps = [0]
    probe.loss.read_end(cuda_ok=False)
    assert probe.record.loss.finite == []
    assert probe.record.loss.unread == "the CUDA context was unusable when the test ended"
    probe.record.loss.backwards = 3
    assert "CUDA context" in build_run_facts(probe.record, ProcessReadings()).loss.unknown["checks"]


def test_grad_is_not_a_loss() -> None:
    model = nn.Linear(3, 1)
    probe = _probe()
    probe.start()
    try:
        torch.autograd.grad(model(torch.ones(2, 3)).sum(), list(model.parameters()))
    finally:
        probe.stop()
    assert probe.record.forwards.backwards == 1 and probe.record.loss.backwards == 0
    assert "checks" in probe.facts().loss.unknown


# -- torch.save per step -----------------------------------------------------------------------


def test_each_torch_save_is_timed_and_dated(tmp_path: Path) -> None:
    def save(model: nn.Module, step: int) -> None:
        torch.save(model.state_dict(), tmp_path / "last.pt")

    probe = _train(12, lambda out, _: out.sum(), save)
    steps = probe.record.steps
    assert steps.saves == list(range(1, 13))  # after step n's optimizer step: in step n + 1
    assert len(steps.save_times) == 12 and all(t > 0 for t in steps.save_times)
    checkpoint = probe.facts().checkpoint
    assert checkpoint.saves == 12 and checkpoint.save_steps == 10  # steps 3-12 after warm-up
    assert checkpoint.steps_percent == 100.0
    assert checkpoint.time_per_save is not None and checkpoint.time_per_save > 0
    assert checkpoint.time_percent is not None and 0 < checkpoint.time_percent <= 100


def _record(times: list[float], saves: list[int], save_times: list[float]) -> RunRecord:
    n = len(times)
    return RunRecord(
        nodeid="t::x", warmup=2, profile_steps=None,
        steps=StepSeries(last_t=0.0, times=times, waits=[0.0] * n, syncs=[0] * n,
                         sync_waits=[0.0] * n, flags=[StepFlag.STEADY] * n,
                         forwards=list(range(1, n + 1)), saves=saves, save_times=save_times),
        loader=LoaderWaits(LoaderTracker()))


def test_the_share_of_the_steps_inside_torch_save() -> None:
    times = [0.5, 0.3] + [0.2] * 10
    checkpoint = build_run_facts(_record(times, list(range(12)), [0.15] * 12),
                                 ProcessReadings()).checkpoint
    assert checkpoint.save_steps == 10 and checkpoint.steps_percent == 100.0
    assert checkpoint.time_percent == 75.0 and checkpoint.time_per_save == 0.15
    # A final checkpoint after the last step, and none during training: no share.
    checkpoint = build_run_facts(_record(times, [12], [3.0]), ProcessReadings()).checkpoint
    assert checkpoint.saves == 1 and checkpoint.save_steps == 0
    assert checkpoint.steps_percent == 0.0 and checkpoint.time_percent == 0.0
    # Saves recorded before they were timed: dated, not weighed.
    checkpoint = build_run_facts(_record(times, [4, 8], []), ProcessReadings()).checkpoint
    assert checkpoint.save_steps == 2 and "time_percent" in checkpoint.unknown


def test_a_save_in_the_profiled_steps_leaves_the_read_backs_unknown() -> None:
    record = _record([0.5, 0.3] + [0.2] * 10, [4], [0.1])
    for i in range(3, 7):
        record.steps.flags[i] = StepFlag.IN_WINDOW
    record.window_facts = {"syncs_per_step": 481.0, "readback_syncs_per_step": 480.0}
    sync = build_run_facts(record, ProcessReadings()).sync
    assert sync.profiled_readbacks_per_step is None
    assert "torch.save" in sync.unknown["profiled_readbacks_per_step"]
    record.steps.saves = [9]  # after the window: the window's read-backs are the code's
    assert build_run_facts(record, ProcessReadings()).sync.profiled_readbacks_per_step == 480.0


# -- mixed precision ---------------------------------------------------------------------------


def test_grad_scaler_scale_is_counted_when_the_scaler_is_on() -> None:
    scalers = [torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu", enabled=False)]

    def scaled(out: torch.Tensor, step: int) -> torch.Tensor:
        return scalers[step % 2].scale(out.sum())

    probe = _train(10, scaled)
    amp = probe.facts().amp
    assert amp.scaler_scales == 5 and amp.fp16_forwards == 0 and amp.fp16_percent == 0.0


def _scaled_loop(steps: int, unscale_first: bool) -> run.RunProbe:
    """float16 autocast with a GradScaler and clip_grad_norm_, on the CPU: the gradients
    clipped before or after scaler.unscale_."""
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    probe = _probe()
    probe.start()
    try:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(torch.randn(16, 8)).float().pow(2).mean()
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            if unscale_first:
                scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(optimizer)  # unscales here when the loop did not
            scaler.update()
    finally:
        probe.stop()
    assert torch_hooks.global_hook_counts(torch) == dict.fromkeys(
        torch_hooks.global_hook_counts(torch), 0)
    return probe


def test_clipping_before_unscale_is_counted_with_the_limit_the_gradients_got() -> None:
    amp = _scaled_loop(6, unscale_first=False).facts().amp
    assert amp.scaler_scales == 6 and amp.clip_scaled == 6 and amp.clip_scaled_percent == 100.0
    assert amp.init_scale == 1024.0 and amp.clip_effective_limit == 0.5 / 1024


def test_clipping_after_unscale_is_not_counted() -> None:
    facts = _scaled_loop(6, unscale_first=True).facts()
    assert facts.optimizer.clip_calls == 6 and facts.amp.scaler_scales == 6
    assert facts.amp.clip_scaled == 0 and facts.amp.clip_scaled_percent == 0.0
    assert facts.amp.clip_effective_limit is None


def test_fp16_forwards_make_the_amp_share() -> None:
    record = _record([0.01] * 10, [], [])
    record.forwards.grad = 20
    record.forwards.autocast_fp16 = 15
    amp = build_run_facts(record, ProcessReadings()).amp
    assert amp.fp16_forwards == 15 and amp.fp16_percent == 75.0 and amp.scaler_scales == 0


def test_the_autocast_dtype_is_read_for_cuda() -> None:
    calls: list[tuple[Any, ...]] = []
    recent = SimpleNamespace(get_autocast_dtype=lambda *a: calls.append(a) or "float16")
    assert autocast_dtype(recent)() == "float16" and calls == [("cuda",)]
    older = SimpleNamespace(get_autocast_gpu_dtype=lambda: "bfloat16")
    assert autocast_dtype(older)() == "bfloat16"
    assert autocast_dtype(SimpleNamespace())() is None


# -- the DataLoader's last batch ---------------------------------------------------------------


@pytest.mark.parametrize(("rows", "drop_last", "last"), [(641, False, 1), (640, False, 128),
                                                         (641, True, None)])
def test_the_last_batch_of_the_main_loader(rows: int, drop_last: bool, last: int | None) -> None:
    dataset = torch.utils.data.TensorDataset(torch.zeros(rows, 2))
    loader = torch.utils.data.DataLoader(dataset, batch_size=128, drop_last=drop_last)
    probe = _probe()
    probe.start()
    try:
        for _ in loader:
            pass
    finally:
        probe.stop()
    facts = probe.facts().loader
    assert facts.samples == rows and facts.drop_last is drop_last
    assert facts.last_batch_size == last
    assert facts.loaders[0].samples == rows


def test_a_batch_norm_batch_of_one_is_classified_with_its_input_size() -> None:
    message = ("Expected more than 1 value per channel when training, got input size "
               "torch.Size([1, 128])")
    assert failure_kinds.classify("ValueError", message) == "batch_norm_single"
    assert failure_kinds.parse_input_size(message) == [1, 128]
    assert failure_kinds.parse_input_size("no size here") == []
    assert failure_kinds.classify(
        "ValueError", "Expected input batch_size (32) to match target batch_size (16).") \
        == "not_gpu"


# -- through the plugin: the findings on a test's report ---------------------------------------


LOOP_TESTS = """
import torch
import torch.nn.functional as F

def test_last_batch_of_one():
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(641, 8), torch.randint(2, (641,)))
    loader = torch.utils.data.DataLoader(data, batch_size=128, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

def test_diverges():
    torch.manual_seed(0)
    x = 30.0 * torch.randn(64, 16)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(40):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()

def test_checkpoint_every_step(tmp_path):
    model = torch.nn.Linear(16, 1)
    model.register_buffer("table", torch.zeros(4_000_000))  # 16 MB in every checkpoint
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(20):
        optimizer.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        optimizer.step()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   tmp_path / "last.pt")

def test_healthy():
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(40):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
"""


def test_the_loop_faults_are_named_on_the_tests_that_have_them(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makepyfile(test_loop=LOOP_TESTS)
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                                "no:cacheprovider", "--gpu-report=report.json")
    result.assert_outcomes(passed=3, failed=1)
    report = json.loads((pytester.path / "report.json").read_text())
    codes: dict[str, set[str]] = {}
    messages: dict[str, str] = {}
    for finding in report["findings"]:
        if finding["scope"] in ("run", "failure"):
            test = finding["subject"].split("::")[1]
            codes.setdefault(test, set()).add(finding["code"])
            messages[finding["code"]] = finding["message"]
    assert "GT220" in codes["test_last_batch_of_one"]
    assert "Sequential.1 (BatchNorm1d)" in messages["GT220"]
    assert "641 samples per epoch in batches of 128 samples" in messages["GT220"]
    assert "GT142" in codes["test_diverges"]
    assert "GT140" in codes["test_checkpoint_every_step"]
    assert not {"GT140", "GT142", "GT220"} & codes.get("test_healthy", set())


# -- padding in token batches ----------------------------------------------------------------


def _padded_loader_run(lengths: list[int], pad_to: int | None) -> run.RunProbe:
    """Token batches with an attention_mask: padded to `pad_to`, or to each batch's longest."""
    def collate(rows: list[int]) -> dict[str, torch.Tensor]:
        width = pad_to or max(rows)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for row, length in enumerate(rows):
            mask[row, :length] = 1
        return {"input_ids": mask * 7, "attention_mask": mask}

    loader = torch.utils.data.DataLoader(lengths, batch_size=4, collate_fn=collate)
    model = nn.Embedding(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = _probe()
    probe.start()
    try:
        for batch in loader:
            optimizer.zero_grad()
            model(batch["input_ids"]).sum().backward()
            optimizer.step()
    finally:
        probe.stop()
    return probe


def test_the_padding_share_of_token_batches_padded_to_a_fixed_length() -> None:
    loader = _padded_loader_run([40, 50, 30, 40] * 4, pad_to=512).facts().loader
    assert loader.pad_percent == round(100 * (1 - 160 / 2048), 2)
    assert loader.padded_length == 512 and loader.padded_lengths == 1
    assert loader.padding_batches == 4


def test_batches_padded_to_their_longest_have_little_padding() -> None:
    loader = _padded_loader_run([40, 50, 30, 40, 45, 44, 40, 41], pad_to=None).facts().loader
    assert loader.pad_percent == round(100 * (1 - (160 + 170) / (200 + 180)), 2)
    assert loader.padded_length == 50 and loader.padded_lengths == 2
    assert loader.padding_batches == 2
