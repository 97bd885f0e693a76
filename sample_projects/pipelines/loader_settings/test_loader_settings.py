"""Fault: DataLoader workers oversubscribe the CPUs and are restarted every (short) epoch.

A tabular model fine-tunes for 15 short epochs (16 steps each) with
``num_workers=os.cpu_count() * 2`` ("more workers = faster") and ``persistent_workers=False``
(the default). Each epoch forks twice as many worker processes as there are CPUs, most of which
never get a batch (16 batches for 2 x CPUs workers), and tears them all down again at the end
of the epoch. The samples are cheap (an index into an in-memory tensor), so the GPU is not
starved by the data itself; the cost is the process churn at every epoch boundary and the
CPU oversubscription.

Fix: ``num_workers`` at most the CPUs available to this process (minus one for the main
process), ``persistent_workers=True``.

Expected diagnosis: GT113 (DataLoader settings: more workers than CPUs, workers not persistent
over many short epochs).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

FEATURES = 1024
HIDDEN = 8192
CLASSES = 10
BATCH_SIZE = 1024
STEPS_PER_EPOCH = 16
EPOCHS = 15
DEVICE = torch.device("cuda")


class CustomerTable(torch.utils.data.Dataset):
    """Rows already decoded into memory; ``__getitem__`` only indexes."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        centroids = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(2))
        self.labels = torch.randint(CLASSES, (n,), generator=generator)
        self.rows = centroids[self.labels] + 3.0 * torch.randn(n, FEATURES, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rows[index], self.labels[index]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_finetune_for_many_short_epochs() -> None:
    torch.manual_seed(0)
    loader = DataLoader(
        CustomerTable(STEPS_PER_EPOCH * BATCH_SIZE, seed=0), batch_size=BATCH_SIZE,
        shuffle=True, pin_memory=True,
        num_workers=(os.cpu_count() or 1) * 2,  # fault: twice the CPUs
        persistent_workers=False,  # fault: workers re-forked every epoch
    )
    layers: list[nn.Module] = [nn.Linear(FEATURES, HIDDEN), nn.GELU()]
    for _ in range(4):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(HIDDEN, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    epoch_losses = []
    for epoch in range(EPOCHS):
        total = torch.zeros((), device=DEVICE)
        for rows, labels in loader:
            rows = rows.to(DEVICE, non_blocking=True)
            labels = labels.to(DEVICE, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(rows), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        epoch_losses.append(total.item() / len(loader))
        print(f"epoch {epoch:2d}  loss {epoch_losses[-1]:.4f}")

    assert epoch_losses[-1] < 0.5 * epoch_losses[0]
