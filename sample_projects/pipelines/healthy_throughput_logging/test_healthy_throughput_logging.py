"""Healthy: a GPU-bound bf16 loop that logs its loss and throughput every 20 steps.

No fault. A wide MLP (four 8192x8192 layers, 8192 rows per step) trains under bf16 autocast with
a fused AdamW: each step is ~20 ms of back-to-back tensor-core GEMMs against ~1-2 ms of Python
on the host, so the host runs ahead of the GPU. Every 20 steps the loop times itself the usual
way, ``torch.cuda.synchronize()`` and then ``loss.item()``: the synchronize waits for the ~20
steps of work queued since the last log, so that step takes a few hundred milliseconds while
the median step takes one or two. The GPU was busy all along; those steps are the host waiting
for queued work, not stalls (the probe times ``torch.cuda.synchronize()`` as it times
``loss.item()``, and the profiler window's GPU time per step accounts for waits in any other
call).

Expected diagnosis: nothing at warning level (no GT118).
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

WIDTH = 8192
LAYERS = 4
BATCH_SIZE = 8192
STEPS = 240
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
def test_wide_regressor_logs_throughput_every_20_steps() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(BATCH_SIZE, WIDTH, device=DEVICE, generator=generator)
    direction = torch.randn(WIDTH, device=DEVICE, generator=generator) / WIDTH**0.5
    y = torch.tanh(x @ direction)
    model = WideRegressor().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)

    losses = []
    started = time.perf_counter()
    for step in range(1, STEPS + 1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            prediction = model(x)
        loss = F.mse_loss(prediction.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            torch.cuda.synchronize()  # waits for the steps queued since the last log
            elapsed, started = time.perf_counter() - started, time.perf_counter()
            losses.append(loss.item())
            rows = BATCH_SIZE * (1 if step == 1 else LOG_EVERY)
            print(f"step {step:3d}  loss {losses[-1]:.4f}  {rows / elapsed:,.0f} rows/s")

    assert losses[-1] < 0.5 * losses[0]
