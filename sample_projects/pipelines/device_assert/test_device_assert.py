"""Failure on purpose: a class label out of range triggers a CUDA device-side assert.

The labels come from a CSV export that numbers the ten product categories 1..10; the model has
ten outputs (0..9). On the CPU ``F.cross_entropy`` would raise a readable ``IndexError``; on the
GPU the range check is an assertion inside the loss kernel, so the run dies with
``CUDA error: device-side assert triggered``, reported asynchronously at a later call, and the
CUDA context of the process is unusable afterwards: every later CUDA call fails too.

Run this sample in its own process (``isolated = true`` in EXPECTED.toml).

Fix: map the labels to 0..9 (``labels - 1``); re-run with ``CUDA_LAUNCH_BLOCKING=1`` (or on the
CPU) to see the failing call and a readable message.

Expected diagnosis: GT205 (device-side assert), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
CLASSES = 10
BATCH_SIZE = 512
STEPS = 100
DEVICE = torch.device("cuda")


def product_table(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and the category column as exported: categories numbered 1..10."""
    generator = torch.Generator().manual_seed(seed)
    category = torch.randint(1, CLASSES + 1, (n,), generator=generator)  # 1-based
    centroids = torch.randn(CLASSES + 1, FEATURES, generator=torch.Generator().manual_seed(8))
    features = centroids[category] + torch.randn(n, FEATURES, generator=generator)
    return features, category


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_category_classifier_trains() -> None:
    torch.manual_seed(0)
    features, category = product_table(BATCH_SIZE * STEPS, seed=0)
    features, category = features.to(DEVICE), category.to(DEVICE)  # fault: labels not remapped
    model = nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, CLASSES)).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for step in range(STEPS):
        rows = slice(step * BATCH_SIZE, (step + 1) * BATCH_SIZE)
        loss = F.cross_entropy(model(features[rows]), category[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1
