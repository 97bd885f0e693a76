"""Fault: a convolutional network trained with its weights in bfloat16 and SGD.

A small image classifier (three conv blocks with batch norm, batch 256, data on the GPU) is cast
whole to bfloat16 (``model.to(torch.bfloat16)``, "pure bf16" to halve memory) and trained with
``SGD(lr=1e-3, momentum=0.9)``. bfloat16 keeps 8 significant bits: next to a convolution weight
of 0.05 the nearest other value is 2.4e-4 away, next to a batch-norm weight of 1.0 it is 0.0078
away, and most SGD updates (the learning rate times a gradient of 1e-3 or so, times ten with the
momentum) are smaller than half of that: they round back to the weight they started from. A
batch-32 copy on a CPU left 68 % of the weight elements with a gradient unchanged at the steps
checked (28 % at lr=0.01, where the updates are ten times larger). The batch-norm weights stay
at exactly 1.0; the loss creeps down on the weights that can move, and the test's "the loss
went down" passes.

Sources: https://github.com/vllm-project/speculators/pull/765 (normalisation weights left at
1.0 by bf16 updates); https://github.com/pytorch/ao/pull/1124 ("if weight update is smaller than
1e-3 of the weight magnitude, there will be no change to the weight"). The held-out sample
``bf16_weights_updates_rounded_away`` is the AdamW fine-tune of the same fault.

Fix: float32 weights with ``torch.autocast("cuda", dtype=torch.bfloat16)`` for the forward
(sample ``healthy_small_model_large_batch`` trains that way), or float32 master weights.

Expected diagnosis: GT152, naming the bfloat16 weights whose updates round away.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

CLASSES = 8
SIZE = 32
BATCH_SIZE = 256
STEPS = 60
DEVICE = torch.device("cuda")


def textures(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class sets the orientation of a noisy stripe pattern, on the GPU."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    angle = labels.float() * (torch.pi / CLASSES)
    axis = torch.linspace(-SIZE / 2, SIZE / 2, SIZE, device=DEVICE)
    yy, xx = torch.meshgrid(axis, axis, indexing="ij")
    along = xx * angle.cos()[:, None, None] + yy * angle.sin()[:, None, None]
    images = torch.sin(0.5 * along)[:, None] + 0.5 * torch.randn(
        n, 3, SIZE, SIZE, device=DEVICE, generator=generator)
    return images, labels


def conv_net() -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for width in (32, 64, 128):
        layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                   nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, CLASSES))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pure_bf16_classifier_loss_goes_down() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    images, labels = textures(8 * BATCH_SIZE, seed=0)
    model = conv_net().to(DEVICE).to(torch.bfloat16)  # fault: the weights themselves bf16
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    losses = []
    for step in range(STEPS):
        rows = slice((step % 8) * BATCH_SIZE, (step % 8 + 1) * BATCH_SIZE)
        loss = F.cross_entropy(model(images[rows].to(torch.bfloat16)).float(), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    first, last = float(torch.stack(losses[:5]).mean()), float(torch.stack(losses[-5:]).mean())
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < first
