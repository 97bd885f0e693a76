"""Healthy: long bf16 matrix products that keep the GPU at its power limit.

No fault. A wide MLP (four 8192x8192 layers) trains on 16384 rows per step under bf16 autocast
with a fused AdamW; each step is tens of milliseconds of back-to-back tensor-core GEMMs, so the
GPU runs flat out and draws close to its default power limit. NVML then reports the software
power cap as the reason the clocks are not at their maximum: that is GPU Boost working at the
default limit, not throttling. Nothing here is for a reviewer to change.

Expected diagnosis: nothing at warning level in the run (no GT112). The device-scope GT008 reads
the GPU's state at the session, not this run, and fires only when the enforced power limit is
below the default or the slowdown is thermal or from the hardware.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

WIDTH = 8192
LAYERS = 4
BATCH_SIZE = 16384
STEPS = 60
LOG_EVERY = 20
DEVICE = torch.device("cuda")


class WideRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.out(x).squeeze(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_wide_regressor_fits_a_smooth_target() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(BATCH_SIZE, WIDTH, device=DEVICE, generator=generator)
    direction = torch.randn(WIDTH, device=DEVICE, generator=generator) / WIDTH**0.5
    y = torch.tanh(x @ direction)
    model = WideRegressor().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)

    losses = []
    for step in range(1, STEPS + 1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            prediction = model(x)
        loss = F.mse_loss(prediction.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            losses.append(loss.item())
            print(f"step {step:3d}  loss {losses[-1]:.4f}")

    assert losses[-1] < 0.5 * losses[0]
