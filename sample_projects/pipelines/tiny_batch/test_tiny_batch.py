"""Fault: batch size 8 on a small MLP leaves the GPU launch-bound and nearly idle.

A sensor-fault classifier (32 readings in, 4 fault classes out) trained with batch size 8,
as it was on a laptop CPU. Each step launches a few dozen tiny kernels that finish in a few
microseconds; the step time is the Python and kernel-launch overhead, and the GPU is busy a
small fraction of it. The data is already on the GPU, TF32 is on and the loss is logged every
50 steps, so nothing else is wrong.

Fix: a much larger batch (with a scaled learning rate), or CUDA graphs /
``torch.compile(mode="reduce-overhead")`` when the batch must stay small.

Expected diagnosis: GT105 (launch-bound: tiny kernels, low GPU busy time).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

READINGS = 32
CLASSES = 4
BATCH_SIZE = 8
STEPS = 3000
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def sensor_log(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    signatures = torch.randn(CLASSES, READINGS, device=DEVICE,
                             generator=torch.Generator(device=DEVICE).manual_seed(3))
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    readings = signatures[labels] + 0.8 * torch.randn(n, READINGS, device=DEVICE,
                                                      generator=generator)
    return readings, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fault_classifier_accuracy() -> None:
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")  # TF32 matmuls, as in all our GPU tests
    x_train, y_train = sensor_log(STEPS * BATCH_SIZE, seed=0)
    x_val, y_val = sensor_log(2048, seed=1)
    model = nn.Sequential(
        nn.Linear(READINGS, 128), nn.ReLU(),
        nn.Linear(128, 128), nn.ReLU(),
        nn.Linear(128, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for step in range(STEPS):
        xb = x_train[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
        yb = y_train[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:5d}  loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_val).argmax(1) == y_val).float().mean().item()
    print(f"validation accuracy {accuracy:.3f}")
    assert accuracy > 0.9
