"""Healthy: a linear probe trained at a learning rate that fits; the loss falls.

The neighbour of ``loss_diverges_finite``: the same 128-class classifier on the same noisy
256-dimensional embeddings, with plain SGD at a learning rate of 0.1. The cross-entropy falls
from about 10 (to about 2 within the 60 steps, run on a CPU with the CPU's random numbers) and
the test asserts it did.

Expected diagnosis: nothing at warning level; GT146 (loss diverged) must stay quiet. The step is
small for the GPU at a large batch: GT137 (info) may appear.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
CLASSES = 128
BATCH_SIZE = 4096
STEPS = 60
LOG_EVERY = 20
LEARNING_RATE = 0.1
DEVICE = torch.device("cuda")


def embeddings(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy embeddings around one centroid per class: no linear classifier separates them."""
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + 6.0 * torch.randn(n, FEATURES, device=DEVICE,
                                                 generator=generator)
    return rows, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_linear_probe_trains() -> None:
    torch.manual_seed(0)
    rows, labels = embeddings(8 * BATCH_SIZE, seed=0)
    probe = nn.Linear(FEATURES, CLASSES).to(DEVICE)
    optimizer = torch.optim.SGD(probe.parameters(), lr=LEARNING_RATE)

    first = None
    for step in range(STEPS):
        start = (step % 8) * BATCH_SIZE
        loss = F.cross_entropy(probe(rows[start:start + BATCH_SIZE]),
                               labels[start:start + BATCH_SIZE])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 0:
            first = loss.item()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:3d}  loss {loss.item():.4g}")

    assert loss.item() < first  # the loss fell
