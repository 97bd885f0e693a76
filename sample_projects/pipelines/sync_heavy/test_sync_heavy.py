"""Fault: per-sample bookkeeping forces thousands of host-device synchronisations per step.

After each optimiser step the loop records, one sample at a time, the per-sample loss for hard-
example mining and the per-class accuracy: ``idx[i].item()``, ``per_sample[i].item()``,
``labels[i].item()`` and ``preds[i].item()`` inside a Python loop over the batch, then prints the
loss tensor. Every ``.item()`` copies a scalar to the host and waits for the GPU, so the GPU
runs one short burst per step and then idles while Python crawls through the batch.

Fix: keep the bookkeeping on the GPU (``sample_loss[idx] = per_sample.detach()``,
``torch.bincount``) and read it back once per epoch; log every N steps.

Expected diagnosis: GT104 (many host-device syncs per step).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 1024
HIDDEN = 4096
CLASSES = 100
SAMPLES = 65536
BATCH_SIZE = 512
STEPS = 120
DEVICE = torch.device("cuda")


def make_dataset(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    features = centroids[labels] + 1.0 * torch.randn(n, FEATURES, device=DEVICE,
                                                     generator=generator)
    return features, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_with_hard_example_tracking() -> None:
    torch.manual_seed(0)
    features, labels = make_dataset(SAMPLES, seed=0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    sample_loss = [0.0] * SAMPLES
    step_losses: list[float] = []
    class_seen = [0] * CLASSES
    class_correct = [0] * CLASSES
    order = torch.randperm(SAMPLES, device=DEVICE)
    for step in range(STEPS):
        idx = order[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
        x, y = features[idx], labels[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        per_sample = F.cross_entropy(logits.float(), y, reduction="none")
        loss = per_sample.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        preds = logits.argmax(1)
        for i in range(len(idx)):  # fault: a device->host sync per .item()
            sample_loss[idx[i].item()] = per_sample[i].item()
            label = y[i].item()
            class_seen[label] += 1
            class_correct[label] += int(preds[i].item() == label)
        step_losses.append(loss.item())
        print(f"step {step}: loss={loss}")  # fault: printing a CUDA tensor syncs too

    hardest = sorted(range(SAMPLES), key=sample_loss.__getitem__, reverse=True)[:100]
    recent_accuracy = sum(class_correct) / sum(class_seen)
    print(f"running accuracy {recent_accuracy:.3f}; hardest sample ids {hardest[:10]}")
    assert all(seen > 0 for seen in class_seen)
    assert sum(step_losses[-10:]) / 10 < 0.5 * math.log(CLASSES)  # far better than chance
