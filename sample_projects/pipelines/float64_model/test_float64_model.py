"""Fault: a model trained in float64 because its numpy features are float64.

A tabular regression (energy use from 256 sensor features) loads its features with numpy,
whose default dtype is float64; ``torch.from_numpy`` keeps it. The first version raised
"mat1 and mat2 must have the same dtype", and the fix that went in was ``model.double()``. The
whole network now trains in double precision on the GPU: float64 arithmetic at a fraction of
float32 speed, no tensor cores, twice the memory.

Fix: ``torch.from_numpy(features).float()`` and a float32 model (with autocast or TF32).

Expected diagnosis: GT122 (float64 training).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
HIDDEN = 2048
ROWS = 4096 * 8
BATCH_SIZE = 4096
STEPS = 80
LOG_EVERY = 20
DEVICE = torch.device("cuda")


def sensor_table(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, FEATURES))  # float64, numpy's default
    weights = np.random.default_rng(7).normal(size=FEATURES) / FEATURES**0.5
    target = np.tanh(features @ weights) + 0.1 * rng.normal(size=rows)
    return features, target[:, None]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_energy_regression_fits() -> None:
    torch.manual_seed(0)
    features, target = sensor_table(ROWS, seed=0)
    x_all = torch.from_numpy(features).to(DEVICE)  # stays float64
    y_all = torch.from_numpy(target).to(DEVICE)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    ).to(DEVICE).double()  # fault: made to match the float64 inputs
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    batches = ROWS // BATCH_SIZE
    for step in range(1, STEPS + 1):
        start = (step % batches) * BATCH_SIZE
        x, y = x_all[start:start + BATCH_SIZE], y_all[start:start + BATCH_SIZE]
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1:
            first_loss = loss.item()
        if step % LOG_EVERY == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")

    assert loss.item() < first_loss
