"""Fault: ``optimizer.zero_grad()`` called once, before the training loop.

A tabular classifier (64 features, two hidden layers of 512, 10 classes) trains at batch 2048
under bf16 autocast with ``AdamW(fused=True)``, data on the GPU. The loop was reorganised and
``optimizer.zero_grad()`` ended up above it: every ``loss.backward()`` adds its gradients to all
those before, so step 100's update follows the sum of 100 steps' gradients, each computed for
weights that have moved since. Adam normalises the growing size away, the loss still falls for a
while, and the test passes.

Sources: https://github.com/pytorch/pytorch/issues/47175 (gradients summed across steps);
https://docs.pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html ("it is beneficial
to zero out gradients when building a neural network ... torch.Tensor is accumulating the
gradient").

Fix: ``optimizer.zero_grad()`` inside the loop, once per optimizer step (gradient accumulation
done right clears once per optimizer step too: sample ``healthy_grad_accumulation``).

Expected diagnosis: GT153, naming the steps with no zero_grad since the step before.
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
STEPS = 100
DEVICE = torch.device("cuda")


def tabular_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows around one centroid per class, generated on the GPU."""
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + 3.0 * torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_loss_goes_down() -> None:
    torch.manual_seed(0)
    rows, labels = tabular_data(16 * BATCH_SIZE, seed=0)
    net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN),
                        nn.GELU(), nn.Linear(HIDDEN, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
    batches = len(rows) // BATCH_SIZE
    losses = []
    optimizer.zero_grad(set_to_none=True)  # fault: once, before the loop
    for step in range(STEPS):
        start = (step % batches) * BATCH_SIZE
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(rows[start:start + BATCH_SIZE]),
                                   labels[start:start + BATCH_SIZE])
        loss.backward()  # adds to the gradients of every step before
        optimizer.step()
        losses.append(loss.detach())
    first, last = float(losses[0]), float(torch.stack(losses[:20]).min())
    print(f"loss {first:.3f} -> lowest of the first 20 steps {last:.3f}; "
          f"last {float(losses[-1]):.3f}")
    assert last < first
