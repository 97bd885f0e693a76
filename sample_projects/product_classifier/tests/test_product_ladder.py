"""The readiness ladder for this project, rung by rung (pytest-gputrain's docs/ladder.md).

Each rung reuses the training code itself (train.py), so a rung that passes says something
about the real run, not about a test double.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from product_classifier import train as training
from product_classifier.model import SetupError, make_model
from product_classifier.train import (
    TrainConfig,
    build_loaders,
    evaluate,
    resolve_device,
    train,
    train_step,
)

CHANCE = 1 / 5


@pytest.fixture(scope="module")
def loaders() -> training.Loaders:
    # Small images keep the CPU rungs fast; the GPU rungs use the real 64 px.
    return build_loaders(batch_size=16, image_size=32, num_workers=0, device="cpu")


@pytest.fixture(scope="module")
def fixed_batch(loaders: training.Loaders) -> tuple[torch.Tensor, torch.Tensor]:
    return next(iter(loaders.train))


# --- rung 2: the stack refuses what it cannot do, with a reason ------------------------------


def test_cuda_request_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SetupError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(SetupError, match="CUDA is not available"):
        train(TrainConfig(device="cuda", steps=1))
    assert resolve_device("cpu") == torch.device("cpu")


# --- rung 3a: one batch on the CPU ------------------------------------------------------------


def test_one_batch_forward_backward_on_cpu(
    fixed_batch: tuple[torch.Tensor, torch.Tensor],
) -> None:
    torch.manual_seed(0)
    model = make_model(width=16)
    head_before = model.head.weight.detach().clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = train_step(model, fixed_batch, optimizer, "cpu")
    assert loss.shape == () and not loss.requires_grad and loss.device.type == "cpu"
    assert math.isfinite(loss.item())
    assert abs(loss.item() - math.log(5)) < 1.0  # an untrained 5-way head starts near ln 5
    for name, param in model.named_parameters():
        # Some gradients are exactly zero on step one (zero-initialised residual BatchNorm),
        # but backward must reach every parameter and produce finite values.
        assert param.grad is not None and bool(torch.isfinite(param.grad).all()), name
    assert not torch.equal(head_before, model.head.weight)


def test_overfits_a_single_batch(fixed_batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    torch.manual_seed(0)
    model = make_model(width=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = [train_step(model, fixed_batch, optimizer, "cpu").item() for _ in range(20)]
    assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_step_on_cpu(
    precision: str, fixed_batch: tuple[torch.Tensor, torch.Tensor]
) -> None:
    torch.manual_seed(0)
    model = make_model(width=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    loss = train_step(model, fixed_batch, optimizer, "cpu", precision, scaler)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())


def test_evaluate_runs_without_autograd(loaders: training.Loaders) -> None:
    model = make_model(width=8)
    grad_modes: list[bool] = []

    def record(_module: nn.Module, _inputs: object) -> None:
        grad_modes.append(torch.is_grad_enabled())

    handle = model.register_forward_pre_hook(record)
    accuracy = evaluate(model, loaders.val, "cpu")
    handle.remove()
    assert 0.0 <= accuracy <= 1.0
    assert grad_modes and not any(grad_modes)
    assert model.training, "evaluate() must hand the model back in train mode"


# --- rung 4 on the CPU: a short run learns something ------------------------------------------


def test_short_cpu_run_beats_chance() -> None:
    result = train(
        TrainConfig(
            device="cpu",
            batch_size=16,
            steps=100,
            image_size=32,
            width=16,
            num_workers=0,
            log_every=0,
        )
    )
    assert result.steps == 100 and len(result.step_seconds) == 100
    assert result.seconds_per_step > 0
    assert result.peak_vram_bytes is None and result.device == "cpu"
    assert math.isfinite(result.final_loss) and result.final_loss < math.log(5)
    assert result.val_accuracy is not None and result.val_accuracy > CHANCE + 0.15


# The rungs that produce the ladder's table (CPU and GPU, with pytest-gputrain's markers) are in
# test_product_gpu_ladder.py.
