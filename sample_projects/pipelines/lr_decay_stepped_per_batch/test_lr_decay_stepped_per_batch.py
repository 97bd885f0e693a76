"""Fault: an epoch learning-rate schedule stepped after every batch.

A tabular classifier (64 features, two hidden layers of 512, 10 classes) trains at batch 2048
under bf16 autocast with ``AdamW(fused=True)``, data on the GPU. Its recipe decays the learning
rate by 10 % an epoch, ``ExponentialLR(optimizer, gamma=0.9)``, but the loop calls
``scheduler.step()`` after every batch: by the 44th batch the rate is under 1 % of its start,
and the last two thirds of the 150 steps train at a rate that moves the weights by almost
nothing. The loss falls in the first steps, so the test's "the loss went down" passes.

Sources: https://github.com/pytorch/pytorch/issues/3814 (a scheduler stepped in the wrong
loop); https://docs.pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate ("learning
rate scheduling should be applied after optimizer's update", once per epoch in its examples).

Fix: ``scheduler.step()`` once per epoch, or a per-step schedule sized to the run
(``OneCycleLR(total_steps=...)``, sample ``healthy_one_cycle_per_batch``).

Expected diagnosis: GT151, naming ExponentialLR and its step() calls per optimizer step.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 64
HIDDEN = 512
CLASSES = 10
BATCH_SIZE = 2048
STEPS = 150
DEVICE = torch.device("cuda")


def tabular_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows around one centroid per class, generated on the GPU."""
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + 3.0 * torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, labels


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN),
                         nn.GELU(), nn.Linear(HIDDEN, CLASSES)).to(DEVICE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_loss_goes_down() -> None:
    torch.manual_seed(0)
    rows, labels = tabular_data(16 * BATCH_SIZE, seed=0)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=2e-3, fused=True)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)  # per epoch
    batches = len(rows) // BATCH_SIZE
    losses = []
    for step in range(STEPS):
        start = (step % batches) * BATCH_SIZE
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(rows[start:start + BATCH_SIZE]),
                                   labels[start:start + BATCH_SIZE])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()  # fault: after every batch, for a schedule that counts epochs
        losses.append(loss.detach())
    first, last = float(losses[0]), float(torch.stack(losses[-10:]).mean())
    print(f"loss {first:.3f} -> {last:.3f}; learning rate now {scheduler.get_last_lr()[0]:.2e}")
    assert last < first
