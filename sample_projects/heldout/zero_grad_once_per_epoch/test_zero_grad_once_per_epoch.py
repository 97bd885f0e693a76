"""Fault: ``optimizer.zero_grad()`` once per epoch, so gradients pile up across steps.

A small convolutional classifier (bf16 autocast, images made on the GPU) clears the gradients
at the start of each epoch instead of before each step. From the second step of an epoch on,
``loss.backward()`` adds the new gradient to all the earlier ones of the epoch, and
``optimizer.step()`` follows their running sum: a direction that is mostly stale, with a norm
that grows step after step. No error, no NaN; training is just wrong.

Sources: https://github.com/pytorch/pytorch/issues/47175 ("It is easy to introduce an extremely
nasty bug in your code by forgetting to call zero_grad() or calling it at the beginning of each
epoch instead of the beginning of each iteration", a request for a warning);
https://github.com/tenstorrent/tt-blacksmith/pull/711 (a LoRA trainer that "forgot to do
zero_grad on optimizer after each optimizer step"); https://github.com/IDEA-Research/DN-DETR/issues/19
("It looks like you forgot optimizer.zero_grad() ... at each step you accumulate all gradients
which were previously calculated").

Fix: ``optimizer.zero_grad(set_to_none=True)`` before every backward (or, for deliberate
accumulation, after each ``optimizer.step()``).

A correct diagnosis names the missing per-step ``zero_grad`` (gradients summed across optimizer
steps).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

CLASSES = 4
IMAGE_SIZE = 32
BATCH_SIZE = 512
STEPS_PER_EPOCH = 16
EPOCHS = 4
DEVICE = torch.device("cuda")


def stripe_images(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 3, 32, 32) of noisy stripes whose orientation (0/45/90/135 degrees) is the
    class, made on the device."""
    generator = torch.Generator(device=device).manual_seed(0)
    labels = torch.randint(CLASSES, (n,), device=device, generator=generator)
    coords = torch.linspace(-1.0, 1.0, IMAGE_SIZE, device=device)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    angle = labels.float() * math.pi / CLASSES
    period = 3.0 + 3.0 * torch.rand(n, device=device, generator=generator)
    phase = 2 * math.pi * torch.rand(n, device=device, generator=generator)
    proj = xx * torch.cos(angle)[:, None, None] + yy * torch.sin(angle)[:, None, None]
    wave = torch.sin(math.pi * period[:, None, None] * proj + phase[:, None, None])
    noise = torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, device=device, generator=generator)
    return wave[:, None] + 0.5 * noise, labels


def conv_net(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1, bias=False), nn.BatchNorm2d(4 * width),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, CLASSES))


def train(device: torch.device, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE,
          width: int = 64) -> list[float]:
    """Train for a few epochs; returns the loss of every step (read once, at the end)."""
    torch.manual_seed(0)
    images, labels = stripe_images(STEPS_PER_EPOCH * batch_size, device)
    model = conv_net(width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, fused=device.type == "cuda")
    losses = []
    for _ in range(epochs):
        optimizer.zero_grad()  # fault: once per epoch, not before each step
        order = torch.randperm(len(images), device=device)
        for step in range(STEPS_PER_EPOCH):
            rows = order[step * batch_size:(step + 1) * batch_size]
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images[rows]).float(), labels[rows])
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    return torch.stack(losses).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_stripe_classifier_learns() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < 0.5 * first
