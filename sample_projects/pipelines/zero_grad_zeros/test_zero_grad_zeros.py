"""Info: ``optimizer.zero_grad(set_to_none=False)`` from an old recipe.

A convolutional texture classifier (batch norm, bf16 autocast, channels_last, cudnn.benchmark,
data on the GPU, validation in eval mode under ``inference_mode``) is healthy except for one
line: gradients are zeroed with ``set_to_none=False``, the default before torch 2.0. Every step
then launches a memset per gradient, and the backward accumulates into the zeroed tensors
instead of writing new ones. A modest cost, so information rather than a warning.

Fix: ``optimizer.zero_grad()`` (``set_to_none=True`` has been the default since torch 2.0).

Expected diagnosis: nothing at warning level; GT124 as information.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

CLASSES = 8
SIZE = 64
BATCH_SIZE = 256
STEPS = 100
LOG_EVERY = 25
DEVICE = torch.device("cuda")


def textures(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class sets the frequency and orientation of a noisy stripe pattern."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    angle = labels.float() * (torch.pi / CLASSES)
    frequency = 0.2 + 0.05 * (labels % 4).float()
    axis = torch.linspace(-SIZE / 2, SIZE / 2, SIZE, device=DEVICE)
    yy, xx = torch.meshgrid(axis, axis, indexing="ij")
    along = xx * angle.cos()[:, None, None] + yy * angle.sin()[:, None, None]
    stripes = torch.sin(frequency[:, None, None] * along)
    noise = torch.randn(n, 3, SIZE, SIZE, device=DEVICE, generator=generator)
    images = stripes[:, None] + 0.8 * noise
    return images.contiguous(memory_format=torch.channels_last), labels


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.MaxPool2d(2))


class TextureNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(block(3, 64), block(64, 128), block(128, 256))
        self.head = nn.Linear(256, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


@torch.inference_mode()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    correct = 0
    for x, y in zip(images.split(BATCH_SIZE), labels.split(BATCH_SIZE), strict=True):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            correct += int((model(x).argmax(1) == y).sum())
    model.train()
    return correct / len(labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_texture_classifier_trains() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    images, labels = textures(STEPS * BATCH_SIZE // 4, seed=0)
    val_images, val_labels = textures(4 * BATCH_SIZE, seed=1)
    model = TextureNet().to(DEVICE, memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)

    batches = len(labels) // BATCH_SIZE
    for step in range(STEPS):
        rows = slice((step % batches) * BATCH_SIZE, (step % batches + 1) * BATCH_SIZE)
        optimizer.zero_grad(set_to_none=False)  # the torch 1.x default, kept from an old recipe
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images[rows]), labels[rows])
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4f}")

    assert accuracy(model, val_images, val_labels) > 2 / CLASSES
