"""Fault: float16 autocast without a GradScaler.

A classifier MLP trains on synthetic data on the GPU under ``torch.autocast("cuda",
dtype=torch.float16)``, with ``loss.backward()`` and ``optimizer.step()`` as in fp32 code: no
``torch.amp.GradScaler``. The backward of every float16 operation makes float16 gradients, and
those under 2^-24 flush to zero; the run still trains (a loose accuracy check passes), but small
gradients are lost without a word. Everything else is healthy: data on the GPU, a large batch,
the loss read back every 50 steps, evaluation under ``torch.no_grad()``.

Fix: ``scaler = torch.amp.GradScaler("cuda")``; ``scaler.scale(loss).backward()``,
``scaler.step(optimizer)``, ``scaler.update()``; or bfloat16 autocast, which needs no scaler.

Expected diagnosis: GT141 (fp16 without a GradScaler) at warning level.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 512
HIDDEN = 2048
CLASSES = 16
BATCH_SIZE = 1024
STEPS = 200
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def clusters(n: int, seed: int, centres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    points = centres[labels] + torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return points, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mlp_separates_clusters_in_fp16() -> None:
    torch.manual_seed(0)
    centres = 0.3 * torch.randn(CLASSES, FEATURES, device=DEVICE,
                                generator=torch.Generator(device=DEVICE).manual_seed(7))
    train_x, train_y = clusters(16 * BATCH_SIZE, 0, centres)
    val_x, val_y = clusters(4096, 1, centres)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.GELU(), nn.Linear(HIDDEN, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for step in range(STEPS):
        rows = slice((step % 16) * BATCH_SIZE, (step % 16 + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.float16):  # the fault: no GradScaler below
            loss = F.cross_entropy(model(train_x[rows]), train_y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        accuracy = (model(val_x).argmax(1) == val_y).float().mean().item()
    print(f"validation accuracy {accuracy:.3f}")
    assert accuracy > 0.5
