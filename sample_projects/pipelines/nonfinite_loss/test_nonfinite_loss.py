"""Fault: the loss diverges to Inf and then NaN, and the test does not notice.

A linear-regression smoke test: features with a large scale on the GPU, plain SGD with a
learning rate far too high for them. Within a few dozen steps the weights overflow, the loss
becomes Inf and then NaN, and every later step writes NaN into the weights. The test only checks
that training ran and that the model still maps a batch to the right shape, so it passes.

Fix: a learning rate that fits the features (or normalised features, gradient clipping), and a
test that asserts the loss is finite (``assert torch.isfinite(loss)``).

Expected diagnosis: GT142 (non-finite loss) at warning level, with the step it appeared at.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
BATCH_SIZE = 2048
STEPS = 120
LOG_EVERY = 40
DEVICE = torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_linear_regression_smoke() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    x = 30.0 * torch.randn(8 * BATCH_SIZE, FEATURES, device=DEVICE, generator=generator)
    true_weight = torch.randn(FEATURES, device=DEVICE, generator=generator)
    y = x @ true_weight
    model = nn.Linear(FEATURES, 1).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # the fault: far too high here

    for step in range(STEPS):
        rows = slice((step % 8) * BATCH_SIZE, (step % 8 + 1) * BATCH_SIZE)
        loss = F.mse_loss(model(x[rows]).squeeze(1), y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4g}")

    assert model(x[:4]).shape == (4, 1)  # passes whatever the weights hold
