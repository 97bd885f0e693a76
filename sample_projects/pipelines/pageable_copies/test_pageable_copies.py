"""Fault: every batch is copied to the GPU from pageable (not pinned) host memory.

A linear-probe style classifier trains on embeddings that a frozen backbone produced earlier and
that are cached in host RAM as one big float32 tensor. Each step slices a 16 MiB batch out of it
and sends it with ``.to("cuda", non_blocking=True)``. The tensor is not pinned, so the copy
goes through a staging buffer and blocks the host (``non_blocking`` does nothing for pageable
memory), and the GPU waits for each copy instead of overlapping it with compute. The model side
is fine: bf16 autocast, batch 1024, no DataLoader waits (the data is already in memory).

Fix: ``embeddings = embeddings.pin_memory()`` once (or ``DataLoader(pin_memory=True)``).

Expected diagnosis: GT103 (host-to-device copies from pageable memory every step).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 4096
HIDDEN = 8192
CLASSES = 1000
BATCH_SIZE = 1024
SAMPLES = 16384
STEPS = 300
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def cached_embeddings(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Backbone features as they come back from disk: class centroid + noise, float32, CPU."""
    centroids = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(99))
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), generator=generator)
    features = centroids[labels]
    features += 1.5 * torch.randn(n, FEATURES, generator=generator)
    return features, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_probe_head_fits_cached_embeddings() -> None:
    torch.manual_seed(0)
    features, labels = cached_embeddings(SAMPLES, seed=0)  # fault: never .pin_memory()
    val_features, val_labels = cached_embeddings(2048, seed=1)

    head = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-4)

    for step in range(1, STEPS + 1):
        start = ((step - 1) * BATCH_SIZE) % SAMPLES
        x = features[start:start + BATCH_SIZE].to(DEVICE, non_blocking=True)
        y = labels[start:start + BATCH_SIZE].to(DEVICE, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(head(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % LOG_EVERY == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")

    head.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for start in range(0, len(val_features), BATCH_SIZE):
            x = val_features[start:start + BATCH_SIZE].to(DEVICE, non_blocking=True)
            y = val_labels[start:start + BATCH_SIZE].to(DEVICE, non_blocking=True)
            correct += (head(x).argmax(1) == y).sum().item()
    accuracy = correct / len(val_features)
    print(f"validation accuracy {accuracy:.3f}")
    assert accuracy > 0.9
