"""Healthy: a per-step learning-rate schedule sized to the run, stepped after every batch.

No fault. The neighbour of ``lr_decay_stepped_per_batch``: the same classifier, data and
settings (batch 2048, bf16 autocast, ``AdamW(fused=True)``, data on the GPU), with
``OneCycleLR(optimizer, max_lr=2e-3, total_steps=150)`` stepped after every batch, as its
``total_steps`` counts: a warm-up from 1/25 of the peak, then a cosine decay that reaches 1 % of
the peak only in the last few steps (a warm-up and a decay over the whole run, not a collapse).

Expected diagnosis: nothing at warning level; GT137 (info, launch-bound at a large batch) may
appear.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 64
HIDDEN = 512
CLASSES = 10
BATCH_SIZE = 2048
STEPS = 150
DEVICE = torch.device("cuda")


def tabular_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows around one centroid per class, generated on the GPU."""
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + 3.0 * torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, labels


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN),
                         nn.GELU(), nn.Linear(HIDDEN, CLASSES)).to(DEVICE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_learns() -> None:
    torch.manual_seed(0)
    rows, labels = tabular_data(16 * BATCH_SIZE, seed=0)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=STEPS)
    batches = len(rows) // BATCH_SIZE
    losses = []
    for step in range(STEPS):
        start = (step % batches) * BATCH_SIZE
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(rows[start:start + BATCH_SIZE]),
                                   labels[start:start + BATCH_SIZE])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()  # per batch, as total_steps counts
        losses.append(loss.detach())
    first, last = float(losses[0]), float(torch.stack(losses[-10:]).mean())
    print(f"loss {first:.3f} -> {last:.3f}; learning rate now {scheduler.get_last_lr()[0]:.2e}")
    assert last < 0.5 * first
