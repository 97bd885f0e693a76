"""Fault: boolean-mask indexing in the loss synchronises the host with the GPU every step.

A multi-label tagger predicts 8 attributes per product; not every product has every attribute
labelled (missing labels are -1). The loss picks the labelled rows of each attribute with a
boolean mask, ``logits[known]`` and ``labels[known]``, and the per-attribute accuracy does the
same. A boolean mask's result has a data-dependent size, so PyTorch runs ``nonzero`` and copies
the count back to the host before it can allocate the result: each mask is a
device-to-host sync made inside C++, 16 per step here, with no ``.item()`` anywhere in the loop.
The GPU drains its queue at each one.

Fix: keep shapes static: ``F.cross_entropy(logits, labels.clamp_min(0), reduction="none")``
multiplied by ``known.float()`` and divided by ``known.sum()`` (or ``ignore_index=-1``), and the
accuracy as a masked sum.

Expected diagnosis: GT104 (syncs per step, counted by the profiler).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 512
ATTRIBUTES = 8
VALUES = 16
BATCH_SIZE = 512
STEPS = 200
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def product_table(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels (n, ATTRIBUTES) with about 30 % of the labels missing (-1)."""
    teacher = torch.Generator(device=DEVICE).manual_seed(5)
    projection = torch.randn(FEATURES, ATTRIBUTES * VALUES, device=DEVICE, generator=teacher)
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    features = torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    labels = (features @ projection).view(n, ATTRIBUTES, VALUES).argmax(2)
    missing = torch.rand(n, ATTRIBUTES, device=DEVICE, generator=generator) < 0.3
    return features, labels.masked_fill(missing, -1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_attribute_tagger_learns() -> None:
    torch.manual_seed(0)
    features, labels = product_table(STEPS * BATCH_SIZE, seed=0)
    model = nn.Sequential(nn.Linear(FEATURES, 1024), nn.GELU(),
                          nn.Linear(1024, ATTRIBUTES * VALUES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    history = []
    for step in range(STEPS):
        x = features[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
        y = labels[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x).view(-1, ATTRIBUTES, VALUES).float()
        losses, accuracies = [], []
        for attribute in range(ATTRIBUTES):
            known = y[:, attribute] >= 0
            picked = logits[known, attribute]  # fault: boolean mask -> nonzero -> sync
            target = y[known, attribute]  # fault: another one
            losses.append(F.cross_entropy(picked, target))
            accuracies.append((picked.argmax(1) == target).float().mean())
        loss = torch.stack(losses).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.append(torch.stack(accuracies).mean().detach())
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4f}  "
                  f"accuracy {history[-1].item():.3f}")

    assert history[-1].item() > history[0].item() + 0.2
