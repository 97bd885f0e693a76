"""Failure on purpose: float64 features from NumPy fed to a float32 model on the GPU.

A tabular regressor reads its features the way most tabular pipelines do: a NumPy array (here
generated, as ``np.loadtxt`` or ``df.to_numpy()`` would return it), standardised in NumPy, then
``torch.from_numpy(...).to(device)``. NumPy's default dtype is float64, ``from_numpy`` keeps it,
and the model's ``nn.Linear`` layers are float32, so the first forward raises ``RuntimeError:
mat1 and mat2 must have the same dtype, but got Double and Float``.

Fix: ``torch.from_numpy(features).float()`` (or ``np.float32`` arrays) where the data enters.

Expected diagnosis: GT215 (dtype mismatch), the test fails.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

ROWS = 65536
FEATURES = 48
BATCH_SIZE = 1024
EPOCHS = 2
DEVICE = torch.device("cuda")


def housing_table(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrix and target column, float64 as NumPy (and pandas) produce them."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(ROWS, FEATURES))
    target = features @ rng.normal(size=FEATURES) + 0.1 * rng.normal(size=ROWS)
    features = (features - features.mean(0)) / features.std(0)
    return features, target


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_price_regressor_fits() -> None:
    torch.manual_seed(0)
    features, target = housing_table(seed=0)
    x_all = torch.from_numpy(features).to(DEVICE)  # fault: still float64
    y_all = torch.from_numpy(target).float().to(DEVICE)
    model = nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 1)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for _ in range(EPOCHS):
        for start in range(0, ROWS, BATCH_SIZE):
            x, y = x_all[start:start + BATCH_SIZE], y_all[start:start + BATCH_SIZE]
            loss = F.mse_loss(model(x).squeeze(-1), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    assert loss.item() < 1.0
