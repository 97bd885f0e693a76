"""Healthy: a small MLP trained at a large batch, bf16, with a fused optimizer.

No fault. A tabular classifier (64 features, two hidden layers of 256, 10 classes) trains at
batch 4096 under bf16 autocast with ``AdamW(fused=True)``; the data sits on the GPU and the loss
is read back every 100 steps. On a large GPU the model is simply small: each step's few dozen
kernels finish in microseconds and the GPU is mostly idle while Python launches them. That is
not something to fix with the batch (it already is large); only CUDA graphs
(``torch.compile(mode="reduce-overhead")``) or a bigger model would use the GPU more.

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
CLASSES = 10
BATCH_SIZE = 4096
STEPS = 300
LOG_EVERY = 100
DEVICE = torch.device("cuda")


def tabular_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows around one centroid per class, generated on the GPU."""
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + 2.0 * torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tabular_classifier_at_a_large_batch() -> None:
    torch.manual_seed(0)
    rows, labels = tabular_data(16 * BATCH_SIZE, seed=0)
    val_rows, val_labels = tabular_data(8192, seed=1)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)

    batches = len(rows) // BATCH_SIZE
    first = None
    for step in range(STEPS):
        start = (step % batches) * BATCH_SIZE
        x, y = rows[start:start + BATCH_SIZE], labels[start:start + BATCH_SIZE]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 0:
            first = loss.item()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        accuracy = (model(val_rows).argmax(1) == val_labels).float().mean().item()
    print(f"validation accuracy {accuracy:.3f}")
    assert first is not None and loss.item() < 0.5 * first
    assert accuracy > 0.9
