"""Fault: cuDNN turned off inside the test (and restored in ``finally:``) while a conv net trains.

Everything else is healthy: data on the GPU, bf16 autocast, ``cudnn.benchmark`` on for the fixed
input shape, batch 256 of 96x96 images, loss read back every 50 steps, evaluation under
``torch.no_grad()``. ``torch.backends.cudnn.enabled = False`` (copied from an old answer "for
determinism") sends every convolution to PyTorch's fallback kernels; the test puts the flag
back in ``finally:``, so a reading at teardown would see the default.

Expected diagnosis: GT139 (cuDNN disabled) at warning level.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

IMAGE_SIZE = 96
CLASSES = 10
BATCH_SIZE = 256
STEPS = 200
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def gratings(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of sinusoidal gratings; the orientation (10 angles) is the class."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    coords = torch.linspace(-1, 1, IMAGE_SIZE, device=DEVICE)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    angle = labels * math.pi / CLASSES + 0.08 * torch.randn(n, device=DEVICE,
                                                             generator=generator)
    freq = 3 + 3 * torch.rand(n, device=DEVICE, generator=generator)
    phase = 2 * math.pi * torch.rand(n, device=DEVICE, generator=generator)
    proj = xx * angle.cos()[:, None, None] + yy * angle.sin()[:, None, None]
    wave = torch.sin(math.pi * freq[:, None, None] * proj + phase[:, None, None])
    tint = 0.4 + 0.6 * torch.rand(n, 3, device=DEVICE, generator=generator)
    images = wave[:, None] * tint[:, :, None, None]
    images += 0.3 * torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, device=DEVICE,
                                generator=generator)
    return images, labels


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(channels, channels), conv_bn(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def resnet9() -> nn.Module:
    """The ResNet-9 layout from the fast CIFAR training recipes, with a stride-2 stem."""
    return nn.Sequential(
        conv_bn(3, 64, stride=2), conv_bn(64, 128), nn.MaxPool2d(2), Residual(128),
        conv_bn(128, 256), nn.MaxPool2d(2), conv_bn(256, 512), nn.MaxPool2d(2), Residual(512),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resnet9_learns_orientation_without_cudnn() -> None:
    torch.manual_seed(0)
    train_images, train_labels = gratings(8192, seed=0)
    val_images, val_labels = gratings(1024, seed=1)
    model = resnet9().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=STEPS)

    saved = torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark
    torch.backends.cudnn.enabled = False  # the fault: "for determinism"
    torch.backends.cudnn.benchmark = True
    try:
        order = torch.randperm(len(train_images), device=DEVICE)
        for step in range(STEPS):
            start = (step * BATCH_SIZE) % len(train_images)
            rows = order[start:start + BATCH_SIZE]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(train_images[rows]), train_labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            if (step + 1) % LOG_EVERY == 0:
                print(f"step {step + 1:4d}  loss {loss.item():.4f}")

        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            predictions = torch.cat([model(chunk).argmax(1) for chunk in val_images.split(256)])
    finally:
        torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark = saved
    accuracy = (predictions == val_labels).float().mean().item()
    print(f"validation accuracy {accuracy:.3f}")
    assert accuracy > 0.5
