"""Fault: gradient clipping under a GradScaler, applied to the scaled gradients.

A classifier trains in float16 autocast with a ``GradScaler`` and clips the gradient norm to 1.0,
but calls ``clip_grad_norm_`` straight after ``scaler.scale(loss).backward()``, before
``scaler.unscale_(optimizer)``. The gradients it measures are multiplied by the scale (65536 at
the start), so their norm is always far above 1.0 and every step clips them to 1.0;
``scaler.step`` then divides by the scale, and the update the optimizer applies is 65536 times
too small. Nothing fails and nothing is NaN: the loss stays where it started.

Sources: https://github.com/pytorch/pytorch/issues/40907 ("Gradient clipping with
torch.cuda.amp": "when I include the line clip_grad_norm_(model.parameters(), 12) the loss does
not decrease anymore"); https://github.com/Lightning-AI/pytorch-lightning/issues/9694 ("Grad
clipping with native amp occurs while grads are scaled", a loss "much worse" than fp32);
https://github.com/pytorch/examples/issues/1196 (minGPT-ddp clips without ``unscale_``); the
documented order is in the PyTorch AMP examples, "Working with Unscaled Gradients",
https://docs.pytorch.org/docs/stable/notes/amp_examples.html#working-with-unscaled-gradients

Fix: ``scaler.unscale_(optimizer)`` before ``clip_grad_norm_`` (sample
``healthy_amp_clip_after_unscale``).

The test asserts that the loss halves, and fails. A correct diagnosis names the clipping of
scaled gradients (``unscale_`` missing before ``clip_grad_norm_``).
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
        # fault: the gradients are still multiplied by the scale here (no scaler.unscale_)
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
