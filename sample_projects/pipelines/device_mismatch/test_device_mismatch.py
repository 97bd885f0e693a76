"""Failure on purpose: the model is on the GPU, the labels are still on the CPU.

The training loop moves the images to the GPU but forgets the labels, a one-word slip when the
batch is unpacked. The forward pass works; the loss does not: ``F.cross_entropy`` gets CUDA
logits and a CPU target and raises ``RuntimeError: Expected all tensors to be on the same
device ...``.

Fix: ``labels = labels.to(device, non_blocking=True)`` next to the images (with
``pin_memory=True`` in the DataLoader).

Expected diagnosis: GT202 (tensors on different devices), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader
TensorDataset = torch.utils.data.TensorDataset

CLASSES = 10
BATCH_SIZE = 128
DEVICE = torch.device("cuda")


def digits_like(n: int, seed: int) -> TensorDataset:
    """28x28 greyscale 'digits': a class-specific stroke pattern plus noise."""
    generator = torch.Generator().manual_seed(seed)
    templates = torch.rand(CLASSES, 1, 28, 28, generator=torch.Generator().manual_seed(4)) > 0.7
    labels = torch.randint(CLASSES, (n,), generator=generator)
    images = templates[labels].float() + 0.3 * torch.randn(n, 1, 28, 28, generator=generator)
    return TensorDataset(images, labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_digit_classifier_first_epoch() -> None:
    torch.manual_seed(0)
    loader = DataLoader(digits_like(8192, seed=0), batch_size=BATCH_SIZE, shuffle=True,
                        pin_memory=True)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for images, labels in loader:
        images = images.to(DEVICE, non_blocking=True)  # fault: labels never moved
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5
