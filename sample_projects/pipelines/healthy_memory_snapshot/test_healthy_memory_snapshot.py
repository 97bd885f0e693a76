"""Healthy: a memory snapshot of the first steps, taken the documented way, then training on.

The neighbour of ``memory_history_left_on``: the same classifier at the same batch, and the test
keeps a memory snapshot of its first two steps for later inspection, as PyTorch's "Understanding
CUDA Memory Usage" page shows: ``_record_memory_history``, two steps, ``_dump_snapshot``, then
``_record_memory_history(enabled=None)``. The rest of the training runs without the recorder.

Expected diagnosis: nothing at warning level; GT144 stays quiet (the recorder was off for most
of the steps; the change is listed in run.settings_changes). The step is launch-bound at a
large batch: GT137 (info) may appear.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 64
HIDDEN = 512
LAYERS = 6
CLASSES = 16
BATCH_SIZE = 512
STEPS = 400
LOG_EVERY = 100
SNAPSHOT_STEPS = 2
DEVICE = torch.device("cuda")


def tabular_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, labels


def mlp() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(FEATURES, HIDDEN), nn.GELU()]
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(HIDDEN, CLASSES))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tabular_classifier_trains(tmp_path: Path) -> None:
    torch.manual_seed(0)
    rows, labels = tabular_data(16 * BATCH_SIZE, seed=0)
    model = mlp().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.cuda.memory._record_memory_history(max_entries=100_000)

    first = None
    for step in range(STEPS):
        start = (step % 16) * BATCH_SIZE
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(rows[start:start + BATCH_SIZE]),
                                   labels[start:start + BATCH_SIZE])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == SNAPSHOT_STEPS - 1:  # the snapshot covers the first steps only
            torch.cuda.memory._dump_snapshot(str(tmp_path / "first_steps.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        if step % LOG_EVERY == 0:
            value = loss.item()
            first = value if first is None else first

    assert (tmp_path / "first_steps.pickle").stat().st_size > 0
    assert loss.item() < first
