"""Fault: the last batch of an epoch holds one sample, and a BatchNorm layer refuses it.

A tabular classifier with ``BatchNorm1d`` after its hidden layers trains on 641 labelled rows in
batches of 128 (two loader workers, pinned memory) with the DataLoader's default
``drop_last=False``: five full batches and a sixth of one sample. In training mode batch norm
needs more than one value per channel, so the step on that batch fails with "ValueError:
Expected more than 1 value per channel when training" at the end of the first epoch. A dataset
of 640 or 642 rows would have passed.

Fix: ``DataLoader(..., drop_last=True)`` for training, or a batch size that leaves more than one
sample over.

Expected diagnosis: the test fails; GT220 (batch-norm batch of one) names the layer and the
loader's last partial batch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
data = torch.utils.data

ROWS = 641
FEATURES = 64
HIDDEN = 1024
CLASSES = 4
BATCH_SIZE = 128
EPOCHS = 3
DEVICE = torch.device("cuda")


def tagger() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tagger_trains_on_the_labelled_rows() -> None:
    torch.manual_seed(0)
    features = torch.randn(ROWS, FEATURES)
    labels = (features[:, :2] > 0).long() @ torch.tensor([1, 2])
    loader = data.DataLoader(data.TensorDataset(features, labels), batch_size=BATCH_SIZE,
                             shuffle=True, num_workers=2, pin_memory=True)
    # the fault: drop_last=False (the default) with 641 % 128 == 1
    model = tagger().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for _ in range(EPOCHS):
        for x, y in loader:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    model.eval()
    with torch.no_grad():
        accuracy = (model(features.to(DEVICE)).argmax(1).cpu() == labels).float().mean().item()
    assert accuracy > 0.9
