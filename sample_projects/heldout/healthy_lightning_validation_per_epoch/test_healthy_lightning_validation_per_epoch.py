"""Healthy: PyTorch Lightning validates once per epoch.

No fault. The neighbour of ``lightning_validation_every_batch``: the same Lightning image
classifier (VGG-style convnet at batch 256, ``precision="bf16-mixed"``, train and validation
loaders with 4 pinned persistent workers each), with the ``Trainer``'s default validation
schedule: once per epoch (``val_check_interval=1.0``, ``check_val_every_n_epoch=1``), 5
validations of 4 batches in 40 training steps. Lightning's documentation of
``val_check_interval``: https://lightning.ai/docs/pytorch/stable/common/trainer.html#val-check-interval

Expected diagnosis: nothing at warning level. Skipped without PyTorch Lightning
(``pip install pytest-gputrain[frameworks]``).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip(
    "pytorch_lightning", minversion="2.0",
    reason="needs PyTorch Lightning 2.x: pip install 'pytest-gputrain[frameworks]'")

nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

NUM_CLASSES = 4
IMAGE_SIZE = 64
BATCH_SIZE = 256
TRAIN_IMAGES = 2048
VAL_IMAGES = 1024
STEPS = 40


def stripe_images(n: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (n, 3, size, size) of stripes oriented by label (0, 45, 90, 135 degrees)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(NUM_CLASSES, (n,), generator=generator)
    coords = torch.linspace(-1.0, 1.0, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    angle = labels.float() * math.pi / NUM_CLASSES
    period = 4.0 + 4.0 * torch.rand(n, generator=generator)
    phase = 2 * math.pi * torch.rand(n, generator=generator)
    proj = xx * torch.cos(angle)[:, None, None] + yy * torch.sin(angle)[:, None, None]
    wave = torch.sin(math.pi * period[:, None, None] * proj + phase[:, None, None])
    image = 0.5 + 0.3 * wave[:, None] + 0.15 * torch.randn(n, 3, size, size, generator=generator)
    return (image.clamp(0.0, 1.0) * 255).to(torch.uint8), labels


class StripeImages(torch.utils.data.Dataset):
    def __init__(self, n: int, size: int, seed: int) -> None:
        self.images, self.labels = stripe_images(n, size, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]


def conv_net() -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for width in (64, 128, 256):
        layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                   nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, NUM_CLASSES))


class StripeClassifier(pl.LightningModule):
    def __init__(self, image_size: int = IMAGE_SIZE, workers: int = 4) -> None:
        super().__init__()
        self.net = conv_net()
        self.image_size = image_size
        self.workers = workers
        self.losses: list[torch.Tensor] = []  # detached, read once after training

    def _loader(self, n: int, seed: int, shuffle: bool) -> DataLoader:
        return DataLoader(StripeImages(n, self.image_size, seed), batch_size=BATCH_SIZE,
                          shuffle=shuffle, drop_last=shuffle, num_workers=self.workers,
                          pin_memory=True, persistent_workers=self.workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(TRAIN_IMAGES, 0, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(VAL_IMAGES, 1, shuffle=False)

    def on_after_batch_transfer(self, batch: tuple[torch.Tensor, torch.Tensor],
                                dataloader_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        return (images.float() / 255.0 - 0.5) / 0.25, labels

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                      batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss)
        self.losses.append(loss.detach())
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        self.log("val_loss", F.cross_entropy(self.net(images), labels))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.01)


def train(accelerator: str, steps: int = STEPS, image_size: int = IMAGE_SIZE,
          workers: int = 4) -> tuple[list[float], float]:
    """Train through a Lightning Trainer; returns the training losses and the last val loss."""
    pl.seed_everything(0, verbose=False)
    model = StripeClassifier(image_size, workers)
    trainer = pl.Trainer(
        accelerator=accelerator, devices=1, precision="bf16-mixed",
        benchmark=accelerator == "gpu", max_steps=steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False)
    trainer.fit(model)
    losses = torch.stack(model.losses).float().tolist()
    return losses, float(trainer.callback_metrics["val_loss"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lightning_classifier_learns_and_validates() -> None:
    losses, val_loss = train("gpu")
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}; validation loss {val_loss:.3f}")
    assert last < 0.5 * first
    assert val_loss < first
