"""The readiness ladder with pytest-gputrain (its docs/ladder.md): prove the driver, prove CUDA,
prove one batch, then scale. The session ends with the ladder's table; on a machine without a
GPU the GPU rungs skip with the reason and `--gpu-diagnose` explains why there is no GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from product_classifier.ladder import ladder_spec

CHANCE = 1 / 5


@pytest.fixture(scope="module")
def ladder(gpu_ladder: Any) -> Any:
    return gpu_ladder(ladder_spec())


# --- rungs 1 and 2: driver visible, stack aligned ------------------------------------------


@pytest.mark.requires_cuda
def test_driver_and_stack_have_no_errors() -> None:
    from pytest_gputrain.collect import collect_environment
    from pytest_gputrain.engine.evaluate import RuleEngine

    findings = RuleEngine.load().evaluate_environment(collect_environment())
    errors = [f"{f.code}: {f.message}" for f in findings if f.severity == "error"]
    assert not errors


# --- rung 3: one batch on the CPU, then the same batch on CUDA -------------------------------


def test_one_batch_on_cpu(ladder: Any) -> None:
    record = ladder.one_batch("cpu", batch_size=32)
    assert record.loss_last < record.loss_first * 1.5  # finite and not diverging


@pytest.mark.requires_cuda
def test_same_batch_on_cuda_uses_gpu_memory(ladder: Any) -> None:
    record = ladder.one_batch("cuda", batch_size=32)
    assert record.memory_after > record.memory_before, "GPU memory must visibly rise"


# --- rung 4: a short run (CPU for comparison, then 200 steps at batch 32 on the GPU) ------------


@pytest.mark.slow  # about 80 s of CPU training: the table's CPU row, the GPU rows' baseline
def test_short_run_on_cpu(ladder: Any) -> None:
    # Only the step time matters here (the CPU row of the table); 15 steps teach nothing.
    record = ladder.short_run("cpu", batch_size=32, steps=15, warmup=3, evaluate=False)
    assert record.seconds_per_step > 0


@pytest.mark.requires_cuda
@pytest.mark.max_vram("6 GiB")
def test_200_steps_fp32_on_gpu(ladder: Any) -> None:
    record = ladder.short_run("cuda", precision="fp32", batch_size=32, steps=200)
    assert record.val_accuracy > CHANCE + 0.3


# --- rung 5: mixed precision, and a larger batch while headroom stays -------------------------


@pytest.mark.requires_cuda(bf16=True)
def test_200_steps_bf16_on_gpu(ladder: Any) -> None:
    record = ladder.short_run("cuda", precision="bf16", batch_size=32, steps=200)
    assert record.val_accuracy > CHANCE + 0.3


@pytest.mark.requires_cuda(bf16=True, min_free_vram="4 GiB")
def test_batch_64_when_headroom_allows(ladder: Any) -> None:
    record = ladder.short_run("cuda", precision="bf16", batch_size=64, steps=100)
    assert record.val_accuracy > CHANCE + 0.3


@pytest.mark.requires_cuda(bf16=True)
def test_largest_batch_that_fits(ladder: Any) -> None:
    # Predict under a small budget so the probes stay quick on a large GPU.
    budget = min(4 * 2**30, int(torch.cuda.mem_get_info()[0] * 0.5))
    result = ladder.largest_batch(precision="bf16", start_batch=32, budget=budget)
    assert result.predicted and result.predicted > 64
    assert result.verified, result.note
    assert len(result.probes) <= 3
