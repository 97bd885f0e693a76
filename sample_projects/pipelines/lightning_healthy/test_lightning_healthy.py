"""Healthy: an image classifier trained through PyTorch Lightning, set up as its docs advise.

No fault. ``Trainer(precision="bf16-mixed", benchmark=True)``; ``train_dataloader()`` returns a
DataLoader with 4 worker processes, pinned memory and persistent workers; uint8 batches are
normalised on the GPU in ``on_after_batch_transfer`` (after Lightning's copy); the loss is
logged with ``self.log`` (no per-step read-back: no progress bar, no logger in a test run).

The images are stripes whose orientation is the class (4 classes), with random period, phase
and noise, held in memory as uint8; ``__getitem__`` indexes and flips.

Expected diagnosis: nothing at warning level. Skipped without PyTorch Lightning
(``pip install pytest-gputrain[frameworks]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip(
    "pytorch_lightning", minversion="2.0",
    reason="needs PyTorch Lightning 2.x: pip install 'pytest-gputrain[frameworks]'")

nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

NUM_CLASSES = 4
IMAGE_SIZE = 128
BATCH_SIZE = 256
STEPS = 150


def stripe_images(n: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (n, 3, size, size) of stripes oriented by label (0, 45, 90, 135 degrees)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(NUM_CLASSES, (n,), generator=generator)
    coords = torch.linspace(-1.0, 1.0, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)
    for start in range(0, n, 256):  # in chunks, to bound the float temporaries
        chunk = labels[start:start + 256]
        angle = chunk.float() * math.pi / NUM_CLASSES
        period = 4.0 + 4.0 * torch.rand(len(chunk), generator=generator)
        phase = 2 * math.pi * torch.rand(len(chunk), generator=generator)
        proj = xx * torch.cos(angle)[:, None, None] + yy * torch.sin(angle)[:, None, None]
        wave = torch.sin(math.pi * period[:, None, None] * proj + phase[:, None, None])
        image = 0.5 + 0.3 * wave[:, None] + 0.15 * torch.randn(len(chunk), 3, size, size,
                                                                generator=generator)
        images[start:start + len(chunk)] = (image.clamp(0.0, 1.0) * 255).to(torch.uint8)
    return images, labels


@dataclass(frozen=True)
class Data:
    images: int = 2048
    size: int = IMAGE_SIZE
    batch_size: int = BATCH_SIZE
    workers: int = 4


class StripeImages(torch.utils.data.Dataset):
    def __init__(self, n: int, size: int = IMAGE_SIZE, seed: int = 0) -> None:
        self.images, self.labels = stripe_images(n, size, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if torch.rand(()) < 0.5:
            image = image.flip(1, 2)  # a half turn keeps the stripes' orientation
        return image, self.labels[index]


def conv_net() -> nn.Module:
    """A VGG-style stack: four stages of 3x3 convolutions with batch norm, then a linear head."""
    layers: list[nn.Module] = []
    channels = 3
    for width, convs in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for _ in range(convs):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            channels = width
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, NUM_CLASSES))


class StripeClassifier(pl.LightningModule):
    def __init__(self, data: Data) -> None:
        super().__init__()
        self.net = conv_net()
        self.data = data
        self.losses: list[torch.Tensor] = []  # detached, read once after training

    def train_dataloader(self) -> DataLoader:
        data = self.data
        return DataLoader(StripeImages(data.images, data.size), batch_size=data.batch_size,
                          shuffle=True, drop_last=True, num_workers=data.workers,
                          pin_memory=True, persistent_workers=data.workers > 0)

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, torch.Tensor],
                                dataloader_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        return (images.float() / 255.0 - 0.5) / 0.25, labels

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                      batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss)
        if batch_idx % 10 == 0:
            self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.01)


def train(accelerator: str, steps: int, data: Data | None = None,
          precision: str = "bf16-mixed") -> list[float]:
    """Train through a Lightning Trainer; returns the losses read every 10 batches."""
    pl.seed_everything(0, verbose=False)
    model = StripeClassifier(data or Data())
    trainer = pl.Trainer(accelerator=accelerator, devices=1, precision=precision,
                         benchmark=accelerator == "gpu", max_steps=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model)
    return [loss.item() for loss in model.losses]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lightning_classifier_learns_the_stripes() -> None:
    losses = train("gpu", STEPS)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.5 * losses[0]
