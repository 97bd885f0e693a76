"""Failure on purpose: the Dataset builds CUDA tensors, and the DataLoader forks workers.

A sensor-window classifier whose ``Dataset.__getitem__`` already moves each sample to the GPU
("saves a copy later"). With ``num_workers=0`` that works; with two workers it does not:
the model is on the GPU, so this process has started CUDA, and the workers are forked from it.
The first CUDA call in a worker raises ``RuntimeError: Cannot re-initialize CUDA in forked
subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method``, which the
DataLoader re-raises as "Caught RuntimeError in DataLoader worker process 0".

Fix: return CPU tensors from ``__getitem__`` and move each batch in the loop
(``x.to(device, non_blocking=True)`` with ``pin_memory=True``).

Expected diagnosis: GT212 (CUDA in a forked process), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
Dataset = torch.utils.data.Dataset
DataLoader = torch.utils.data.DataLoader

CHANNELS = 6
WINDOW = 128
CLASSES = 5
DEVICE = torch.device("cuda")


class SensorWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Accelerometer/gyroscope windows with an activity label."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(CLASSES, (n,), generator=generator)
        self.signals = torch.randn(n, CHANNELS, WINDOW, generator=generator)
        self.signals += self.labels.view(-1, 1, 1).float()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # fault: CUDA tensors made in the (forked) worker process
        return self.signals[index].to(DEVICE), self.labels[index].to(DEVICE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_activity_classifier_first_epoch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(CHANNELS, 64, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        nn.Flatten(), nn.Linear(64, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(SensorWindows(8192, seed=0), batch_size=128, shuffle=True, num_workers=2)

    for windows, labels in loader:
        loss = F.cross_entropy(model(windows), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 1.2
