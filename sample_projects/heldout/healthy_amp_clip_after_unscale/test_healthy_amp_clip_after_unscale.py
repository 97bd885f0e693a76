"""Healthy: gradient clipping under a GradScaler, on unscaled gradients.

No fault. The neighbour of ``amp_clip_before_unscale``: the same float16-autocast classifier
(MLP 1024-2048-2048-100 at batch 1024, data on the GPU, SGD with momentum), which calls
``scaler.unscale_(optimizer)`` before ``clip_grad_norm_(model.parameters(), 1.0)`` as the
PyTorch AMP examples show ("Working with Unscaled Gradients",
https://docs.pytorch.org/docs/stable/notes/amp_examples.html#working-with-unscaled-gradients).

Expected diagnosis: nothing at warning level.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 1024
HIDDEN = 2048
CLASSES = 100
BATCH_SIZE = 1024
STEPS = 80
MAX_NORM = 1.0
DEVICE = torch.device("cuda")


def make_dataset(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around one random centroid per class, on the device."""
    generator = torch.Generator(device=device).manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=device, generator=generator)
    labels = torch.randint(CLASSES, (n,), device=device, generator=generator)
    features = centroids[labels] + torch.randn(n, FEATURES, device=device, generator=generator)
    return features, labels


def train(device: torch.device, steps: int = STEPS, batch_size: int = BATCH_SIZE,
          hidden: int = HIDDEN) -> list[float]:
    """Train the classifier; returns the loss of every step (read once, at the end)."""
    torch.manual_seed(0)
    features, labels = make_dataset(8 * batch_size, device)
    model = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, CLASSES)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type)
    losses = []
    for step in range(steps):
        rows = slice((step % 8) * batch_size, (step % 8 + 1) * batch_size)
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(features[rows]), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clip the gradients the optimizer will apply
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.detach())
    return torch.stack(losses).float().tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mixed_precision_classifier_with_clipping_learns() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < 0.5 * first
