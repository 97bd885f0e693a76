"""Fault: a regression loss whose target broadcasts against the model's output.

A tabular regressor (64 features, two hidden layers of 256, one output) trains at batch 4096
under bf16 autocast with ``AdamW(fused=True)``, data on the GPU. The model returns shape
(4096, 1) and the targets are (4096,): ``F.mse_loss(model(x), y)`` broadcasts them to a
4096 x 4096 matrix and averages the squared difference of every prediction with every target.
Its minimum is a constant prediction (the targets' mean), so the loss falls at first, the test's
"the loss went down" passes, and the model never learns the function. torch says so once, in
the warnings summary: "Using a target size (torch.Size([4096])) that is different to the input
size (torch.Size([4096, 1])). This will likely lead to incorrect results due to broadcasting."

Sources: https://github.com/pytorch/pytorch/issues/16045 (the shapes (n, 1) and (n,), which
made torch add the warning in https://github.com/pytorch/pytorch/pull/18349);
https://github.com/sunwuzhou03/reinforcement-learning-lab/issues/1 (a critic trained on the
broadcast loss).

Fix: the same shapes, ``F.mse_loss(model(x).squeeze(1), y)`` (sample
``healthy_mse_target_shaped``).

The broadcast loss also holds memory: it is a 0-d tensor whose storage is the whole 4096 x 4096
buffer, so keeping ``loss.detach()`` for the loss curve keeps 64 MiB a step.

Expected diagnosis: GT150, naming the warning and the line of the loss; GT108, the memory that
grows by 64 MiB a step.
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
        loss = F.mse_loss(prediction, y)  # fault: (4096, 1) against (4096,) broadcasts
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        predicted = model(val_rows).float().squeeze(1)
    r2 = 1.0 - float(((predicted - val_targets) ** 2).mean() / val_targets.var())
    return float(losses[0]), float(torch.stack(losses[-10:]).mean()), r2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_regressor_loss_goes_down() -> None:
    first, last, r2 = train()
    print(f"loss {first:.4f} -> {last:.4f}; validation R^2 {r2:.3f}")
    assert last < first  # passes: the broadcast loss falls to the targets' variance
