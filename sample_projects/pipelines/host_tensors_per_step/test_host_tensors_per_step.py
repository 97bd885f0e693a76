"""Fault: small tensors built on the CPU and moved with ``.cuda()`` inside every forward.

A wide residual MLP regressor (8 blocks of width 4096, batch 2048, bf16 autocast, data on the
GPU) builds two small tensors in each block's forward on the host: the block's residual scale,
``torch.tensor(self.scale).cuda()``, and training noise, ``torch.randn(width).cuda()``. Each
``.cuda()`` of a host tensor is a pageable copy that waits for all GPU work queued before it
(``cudaMemcpyAsync`` then ``cudaStreamSynchronize``), so 16 times per step the host stops until
the GPU has caught up, and the GPU then idles while the host launches the next kernels.

Fix: keep Python scalars as scalars (``h * self.scale``), make tensors on the GPU
(``torch.randn(width, device=x.device)``), keep constants as buffers (``register_buffer``).

Expected diagnosis: GT129 (small host-to-device copies every step, costing host time).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
WIDTH = 4096
BLOCKS = 8
BATCH_SIZE = 2048
STEPS = 80
LOG_EVERY = 20
DEVICE = torch.device("cuda")


class GatedBlock(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.scale = 1.0 / (index + 1) ** 0.5
        self.noise = 0.01

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(self.scale).cuda()  # fault: a host tensor and a copy per call
        jitter = torch.randn(WIDTH).cuda() * self.noise  # fault: the same for the noise
        return x + F.gelu(self.fc(self.norm(x))) * scale + jitter


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.Sequential(*(GatedBlock(i) for i in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x))).squeeze(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_regressor_fits_a_smooth_target() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    features = torch.randn(8 * BATCH_SIZE, FEATURES, device=DEVICE, generator=generator)
    weights = torch.randn(FEATURES, device=DEVICE, generator=generator) / FEATURES ** 0.5
    target = torch.sin(features @ weights)
    model = Regressor().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    losses = []
    for step in range(STEPS):
        rows = slice((step % 8) * BATCH_SIZE, (step % 8 + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            prediction = model(features[rows])
        loss = F.mse_loss(prediction.float(), target[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            losses.append(loss.item())
            print(f"step {step + 1:4d}  loss {losses[-1]:.4f}")

    assert losses[-1] < losses[0]
