"""Fault: an epoch-based learning-rate schedule stepped after every batch.

A tabular classifier (an MLP, bf16 autocast, data on the GPU) means to halve its learning rate
every two epochs: ``StepLR(optimizer, step_size=2, gamma=0.5)``. But ``scheduler.step()`` sits in
the batch loop, next to ``optimizer.step()``, so the rate halves every two *batches*: after 20
steps it is a thousandth of its start, after 40 a millionth, and the rest of the run changes
nothing. No error and no warning: the loss simply stops moving.

Sources: https://github.com/pytorch/pytorch/issues/3814 ("Scheduler should step after the end of
each epoch, not after every iteration"); https://github.com/pytorch/vision/issues/1261
("Scheduler called at each step, instead of epoch"); https://github.com/pytorch/tutorials/pull/640
("scheduler.step() per epoch not per batch" in the transfer-learning tutorial);
https://github.com/aimagelab/meshed-memory-transformer/issues/71 ("Call scheduler.step() per
epoch AND per batch?").

Fix: call ``scheduler.step()`` once per epoch (or give an iteration-based schedule its length
in steps).

The test asserts that the loss falls by a tenth, and fails: it falls by under 1 %, where the
schedule stepped per epoch makes it fall by a quarter (a smaller copy of the run, on a CPU). A
correct diagnosis names the scheduler (the learning rate that ``StepLR`` decayed to almost
nothing within the run).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
HIDDEN = 2048
CLASSES = 20
BATCH_SIZE = 1024
STEPS_PER_EPOCH = 10
EPOCHS = 6
DEVICE = torch.device("cuda")


def make_dataset(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels from a fixed random two-layer teacher network over Gaussian features."""
    generator = torch.Generator(device=device).manual_seed(0)
    features = torch.randn(n, FEATURES, device=device, generator=generator)
    w1 = torch.randn(FEATURES, 64, device=device, generator=generator) / FEATURES ** 0.5
    w2 = torch.randn(64, CLASSES, device=device, generator=generator)
    labels = (torch.tanh(features @ w1) @ w2).argmax(1)
    return features, labels


def train(device: torch.device, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE,
          hidden: int = HIDDEN) -> list[float]:
    """Train with the schedule; returns the loss of every step (read once, at the end)."""
    torch.manual_seed(0)
    features, labels = make_dataset(STEPS_PER_EPOCH * batch_size, device)
    model = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, CLASSES)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)  # per epoch
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(features), device=device)
        for step in range(STEPS_PER_EPOCH):
            rows = order[step * batch_size:(step + 1) * batch_size]
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(features[rows]).float(), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()  # fault: inside the batch loop
            losses.append(loss.detach())
    return torch.stack(losses).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tabular_classifier_learns_the_teacher() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < 0.9 * first
