"""Fault: a PyTorch Lightning run whose GPU waits for the DataLoader.

``train_dataloader()`` returns ``DataLoader(dataset, batch_size=64, shuffle=True)``: no worker
processes (``num_workers`` defaults to 0) and no pinned memory. Every sample is "decoded" on
the CPU in ``__getitem__`` (stripes drawn, blurred, cropped: a few ms each), in the training
process, between steps; the small convnet needs a couple of milliseconds of GPU time for a
batch. Lightning itself trains as its docs advise (``precision="bf16-mixed"``).

Expected diagnosis: GT102, whose fix names Lightning's place for the loader's arguments (the
DataLoader that ``train_dataloader()`` or the DataModule returns). Skipped without PyTorch
Lightning (``pip install pytest-gputrain[frameworks]``).
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
IMAGE_SIZE = 96
BATCH_SIZE = 64
STEPS = 40


class DecodedStripes(torch.utils.data.Dataset):
    """Stripes oriented by the label, drawn per sample at 1.5x size, blurred and cropped: the
    per-sample CPU work of decoding and augmenting a photo."""

    def __init__(self, n: int, size: int = IMAGE_SIZE, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(NUM_CLASSES, (n,), generator=generator)
        self.size = size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = self.labels[index]
        big = self.size * 3 // 2
        coords = torch.linspace(-1.0, 1.0, big)
        yy, xx = torch.meshgrid(coords, coords, indexing="ij")
        angle = float(label) * math.pi / NUM_CLASSES
        wave = torch.sin(math.pi * 6.0 * (xx * math.cos(angle) + yy * math.sin(angle))
                         + 2 * math.pi * float(torch.rand(())))
        image = 0.5 + 0.3 * wave.expand(3, big, big) + 0.15 * torch.randn(3, big, big)
        image = F.avg_pool2d(image[None], 5, stride=1, padding=2)[0]  # the "decode" blur
        top, left = torch.randint(big - self.size + 1, (2,)).tolist()
        crop = image[:, top:top + self.size, left:left + self.size]
        return (crop.clamp(0.0, 1.0) * 255).to(torch.uint8), label


def conv_net() -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for width in (32, 64, 128):
        layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                   nn.ReLU(inplace=True), nn.MaxPool2d(2)]
        channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, NUM_CLASSES))


class StripeClassifier(pl.LightningModule):
    def __init__(self, images: int, size: int, batch_size: int) -> None:
        super().__init__()
        self.net = conv_net()
        self.images, self.size, self.batch_size = images, size, batch_size
        self.losses: list[torch.Tensor] = []

    def train_dataloader(self) -> DataLoader:
        # fault: num_workers defaults to 0 (every sample decoded here), pin_memory to False
        return DataLoader(DecodedStripes(self.images, self.size), batch_size=self.batch_size,
                          shuffle=True)

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
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def train(accelerator: str, steps: int, images: int = BATCH_SIZE * STEPS,
          size: int = IMAGE_SIZE, batch_size: int = BATCH_SIZE,
          precision: str = "bf16-mixed") -> list[float]:
    """Train through a Lightning Trainer; returns the losses read every 10 batches."""
    pl.seed_everything(0, verbose=False)
    model = StripeClassifier(images, size, batch_size)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, precision=precision,
                         max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    return [loss.item() for loss in model.losses]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.filterwarnings("ignore:The 'train_dataloader' does not have many workers")
def test_lightning_classifier_loss_goes_down() -> None:
    losses = train("gpu", STEPS)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < losses[0]
