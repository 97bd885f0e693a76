"""Fault: the loss diverges by orders of magnitude and never becomes NaN, and the test passes.

A linear probe (a 128-class classifier on 256-dimensional embeddings, computed on the GPU)
trained with plain SGD at a learning rate of 1e4: a typo for 1e-4. The embeddings are noisy, so
no linear classifier separates them, and each step's huge update overshoots: the cross-entropy
climbs from about 10 to some 15,000 within a few steps and stays there (run on a CPU with the
CPU's random numbers, this code's loss was 9.7 at the first step and 14,781 at the 60th). A
cross-entropy grows only linearly with the logits, so the loss stays finite for the whole run:
nothing is NaN, GT142 (non-finite loss) has nothing to say, and the test, which only checks that
the loss is finite, passes.

Fix: a learning rate that fits (0.1 here, see ``healthy_loss_falls``), gradient clipping, and a
test that asserts the loss fell.

Expected diagnosis: GT146 (loss diverged) at warning level, with the loss at the checked steps,
the learning rate (1e4), the clipping (none) and the precision (float32) in force.
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
LEARNING_RATE = 1e4  # the fault: meant 1e-4
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

    for step in range(STEPS):
        start = (step % 8) * BATCH_SIZE
        loss = F.cross_entropy(probe(rows[start:start + BATCH_SIZE]),
                               labels[start:start + BATCH_SIZE])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:3d}  loss {loss.item():.4g}")

    assert torch.isfinite(loss)  # passes: the loss is in the thousands, but finite
