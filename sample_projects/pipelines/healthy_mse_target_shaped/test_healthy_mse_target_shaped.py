"""Healthy: the regression loss with the target in the output's shape.

No fault. The neighbour of ``mse_target_broadcast``: the same tabular regressor, data and
settings (batch 4096, bf16 autocast, ``AdamW(fused=True)``, data on the GPU), but the loss
compares each prediction with its own target, ``F.mse_loss(model(x).squeeze(1), y)``: torch
raises no warning and the model learns the function (validation R^2 above 0.8).

Expected diagnosis: nothing at warning level; GT137 (info, launch-bound at a large batch) may
appear.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 64
HIDDEN = 256
BATCH_SIZE = 4096
STEPS = 200
DEVICE = torch.device("cuda")


def regression_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and a smooth target of them (a fixed random two-layer function around 2), on the
    GPU."""
    weights = torch.Generator(device=DEVICE).manual_seed(7)
    first = torch.randn(FEATURES, 32, device=DEVICE, generator=weights) / FEATURES ** 0.5
    second = torch.randn(32, device=DEVICE, generator=weights) / 32 ** 0.5
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, 2.0 + torch.tanh(rows @ first) @ second


def train() -> tuple[float, float, float]:
    """Train; returns the first and last loss and the validation R^2."""
    torch.manual_seed(0)
    rows, targets = regression_data(16 * BATCH_SIZE, seed=0)
    val_rows, val_targets = regression_data(8192, seed=1)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.GELU(), nn.Linear(HIDDEN, 1)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, fused=True)
    batches = len(rows) // BATCH_SIZE
    losses = []
    for step in range(STEPS):
        start = (step % batches) * BATCH_SIZE
        x, y = rows[start:start + BATCH_SIZE], targets[start:start + BATCH_SIZE]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            prediction = model(x).float()
        loss = F.mse_loss(prediction.squeeze(1), y)  # one prediction against its own target
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        predicted = model(val_rows).float().squeeze(1)
    r2 = 1.0 - float(((predicted - val_targets) ** 2).mean() / val_targets.var())
    return float(losses[0]), float(torch.stack(losses[-10:]).mean()), r2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_regressor_learns_the_function() -> None:
    first, last, r2 = train()
    print(f"loss {first:.4f} -> {last:.4f}; validation R^2 {r2:.3f}")
    assert last < 0.5 * first and r2 > 0.8
