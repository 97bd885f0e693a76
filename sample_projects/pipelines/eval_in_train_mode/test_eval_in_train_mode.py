"""Fault: validation under ``torch.no_grad()`` without ``model.eval()``.

A small convolutional classifier with batch norm and dropout learns synthetic 64x64 "texture"
images (bf16 autocast, channels_last, cudnn.benchmark, data on the GPU). Validation runs every
40 steps under ``torch.no_grad()``, so no graph is built, but the model stays in training mode:
dropout keeps dropping activations, batch norm normalises each validation batch by its own
statistics and updates its running estimates with validation data. The metric is noisy and the
model drifts towards the validation set.

Fix: ``model.eval()`` before validating, ``model.train()`` after.

Expected diagnosis: GT121 (no-grad forwards of a model in training mode). GT109 stays quiet:
the validation does use ``no_grad``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

CLASSES = 8
SIZE = 64
BATCH_SIZE = 256
STEPS = 120
VALIDATE_EVERY = 40
VALIDATION_BATCHES = 8
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
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(256, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).mean((2, 3))
        return self.head(self.dropout(x))


def validate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    correct = 0
    with torch.no_grad():  # fault: no model.eval(), so dropout and batch norm train
        for x, y in zip(images.split(BATCH_SIZE), labels.split(BATCH_SIZE), strict=True):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                correct += int((model(x).argmax(1) == y).sum())
    return correct / len(labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_texture_classifier_validation() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    images, labels = textures(STEPS * BATCH_SIZE // 4, seed=0)
    val_images, val_labels = textures(VALIDATION_BATCHES * BATCH_SIZE, seed=1)
    model = TextureNet().to(DEVICE, memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)

    accuracies = []
    batches = len(labels) // BATCH_SIZE
    for step in range(1, STEPS + 1):
        rows = slice((step % batches) * BATCH_SIZE, (step % batches + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images[rows]), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % VALIDATE_EVERY == 0:
            accuracies.append(validate(model, val_images, val_labels))
            print(f"step {step:4d}  loss {loss.item():.4f}  val accuracy {accuracies[-1]:.3f}")

    assert accuracies[-1] > 2 / CLASSES
