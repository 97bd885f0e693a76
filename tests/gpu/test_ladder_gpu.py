"""The ladder's headroom rung on a real CUDA GPU (written for the lent H200): with AdamW and
with SGD with momentum, the prediction is verified at the first try in a fresh model and
optimizer, each probe's peak is split at the optimizer's step, each probe's allocations are
replayed in agreement with the allocator's own decisions, and nothing the rung made is left in
the allocator."""

from __future__ import annotations

from typing import Any

import pytest
from cuda_usable import SKIP_WITHOUT_CUDA

pytestmark = [SKIP_WITHOUT_CUDA, pytest.mark.gpu, pytest.mark.requires_cuda]

GiB = 2**30


def _spec(optimizer: str) -> Any:
    import itertools

    import torch
    from torch import nn

    from pytest_gputrain.ladder import LadderSpec

    def make_model() -> nn.Module:  # a small convolutional classifier: activations dominate
        return nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))

    def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
        if optimizer == "adamw":
            return torch.optim.AdamW(model.parameters(), lr=1e-3)
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def batches(size: int) -> Any:
        images = torch.randn(size, 3, 64, 64).pin_memory()
        labels = torch.randint(10, (size,)).pin_memory()
        return itertools.repeat((images, labels))

    def step(model: nn.Module, batch: Any, optim: Any, device: Any, precision: str) -> Any:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        return loss

    return LadderSpec(name=f"conv-{optimizer}", make_model=make_model,
                      make_optimizer=make_optimizer, batches=batches, step=step)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_prediction_is_verified_in_a_fresh_allocator(optimizer: str) -> None:
    import gc

    import torch

    from pytest_gputrain.ladder import Ladder
    from pytest_gputrain.ladder.headroom import MARGIN

    spec = _spec(optimizer)
    gc.collect()
    torch.cuda.empty_cache()
    allocated_before = torch.cuda.memory_allocated()
    budget = 3 * GiB
    result = Ladder(spec).largest_batch("bf16", start_batch=32, budget=budget)
    assert result.verified and result.note == "", result
    assert result.verified_peak is not None and result.verified_peak <= budget
    assert len(result.probes) == 3 and result.predicted > max(b for b, _ in result.probes)
    # The optimizer's step hooks fired at every probe.
    assert len(result.optimizer_peaks) == 3 and None not in result.optimizer_peaks
    # Every probe was replayed, and each replay made the segments the allocator made.
    assert result.replay_note == "", result.replay_note
    for room, (_, outside), inside in zip(result.probe_rooms, result.probes,
                                          result.optimizer_peaks, strict=True):
        assert room is not None and room >= max(outside, inside or 0)
    assert result.verified_room is not None and result.verified_room <= budget
    assert result.left_by_probes is not None and result.left_by_probes <= budget * MARGIN
    # Nothing the rung made stays allocated (its cache is emptied, cuBLAS's workspaces too).
    assert torch.cuda.memory_allocated() <= allocated_before
