"""Failure on purpose: an accuracy metric that calls ``.numpy()`` on GPU predictions.

The evaluation helper was written when the model trained on the CPU: it takes the argmax of the
logits and compares it with the labels in NumPy. After the move to the GPU, the baseline
evaluation before fine-tuning fails with ``TypeError: can't convert cuda:0 device type tensor
to numpy. Use Tensor.cpu() to copy the tensor to host memory first.``

Fix: compute the metric on the GPU (``(logits.argmax(1) == labels).float().mean().item()``), or
copy once per evaluation with ``.cpu().numpy()``.

Expected diagnosis: GT218 (CUDA tensor to NumPy), the test fails.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 128
CLASSES = 10
BATCH_SIZE = 512
STEPS = 50
DEVICE = torch.device("cuda")


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        predictions = model(x).argmax(1)
    return float(np.mean(predictions.numpy() == y.numpy()))  # fault: CUDA tensors to NumPy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_finetuning_beats_the_baseline() -> None:
    torch.manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE)
    y_val = torch.randint(CLASSES, (4096,), device=DEVICE)
    x_val = centroids[y_val] + torch.randn(4096, FEATURES, device=DEVICE)
    model = nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, CLASSES))
    model = model.to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    baseline = accuracy(model, x_val, y_val)
    for _ in range(STEPS):
        y = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE)
        x = centroids[y] + torch.randn(BATCH_SIZE, FEATURES, device=DEVICE)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert accuracy(model, x_val, y_val) > baseline + 0.3
