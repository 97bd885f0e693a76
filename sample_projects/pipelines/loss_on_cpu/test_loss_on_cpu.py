"""Fault: the model trains on the GPU, but its outputs are copied to the host every step and the
loss is computed there.

A 100-class MLP classifier: the inputs live on the GPU, the labels stay on the CPU, and the
training step does ``logits = model(x).cpu()`` before ``F.cross_entropy(logits, labels)``. The
loss, and the start of its backward, run on the CPU; autograd copies the gradient back to the
GPU, so the model still learns and nothing fails. Each step waits for the forward to finish
before the copy, and the GPU waits for the CPU's loss before it can start the backward.
Everything else is healthy: a large batch, the loss read back every 50 steps, evaluation under
``torch.no_grad()``.

Fix: move the labels to the GPU once and compute the loss on the outputs where they are.

Expected diagnosis: GT143 (loss on the CPU) at warning level; not GT117 (the host work is the
loss).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 1024
HIDDEN = 4096
CLASSES = 100
BATCH_SIZE = 512
STEPS = 300
LOG_EVERY = 50
DEVICE = torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_learns_with_the_loss_on_the_host() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    centres = torch.randn(CLASSES, FEATURES, device=DEVICE, generator=generator)
    labels = torch.randint(CLASSES, (16 * BATCH_SIZE,), generator=torch.Generator().manual_seed(0))
    inputs = centres[labels.to(DEVICE)] + 2.0 * torch.randn(
        len(labels), FEATURES, device=DEVICE, generator=generator)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Linear(HIDDEN, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for step in range(STEPS):
        rows = slice((step % 16) * BATCH_SIZE, (step % 16 + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs[rows])
        loss = F.cross_entropy(logits.float().cpu(), labels[rows])  # the fault: on the CPU
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        predicted = model(inputs[:4096]).argmax(1).cpu()
    accuracy = (predicted == labels[:4096]).float().mean().item()
    print(f"training accuracy {accuracy:.3f}")
    assert accuracy > 0.5
