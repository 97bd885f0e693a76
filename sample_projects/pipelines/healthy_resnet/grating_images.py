"""Oriented-grating photos: a learnable stand-in for a small image dataset decoded into RAM.

Each image is a sinusoidal grating whose orientation is the class (10 classes, 18 degrees apart),
with random frequency, phase, colour tint and sensor noise. The whole split is decoded once into
a uint8 tensor, as a team would cache a small dataset; ``__getitem__`` only indexes and augments.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def draw_gratings(labels: torch.Tensor, size: int, num_classes: int,
                  generator: torch.Generator) -> torch.Tensor:
    """uint8 images (N, 3, size, size) of gratings oriented by label."""
    device = labels.device
    n = len(labels)
    coords = torch.linspace(-1.0, 1.0, size, device=device)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    jitter = 0.08 * torch.randn(n, generator=generator, device=device)
    angle = labels.float() * math.pi / num_classes + jitter
    freq = 3.0 + 3.0 * torch.rand(n, generator=generator, device=device)
    phase = 2 * math.pi * torch.rand(n, generator=generator, device=device)
    proj = xx * torch.cos(angle)[:, None, None] + yy * torch.sin(angle)[:, None, None]
    wave = torch.sin(math.pi * freq[:, None, None] * proj + phase[:, None, None])
    tint = 0.4 + 0.6 * torch.rand(n, 3, generator=generator, device=device)
    image = 0.5 + 0.35 * wave[:, None] * tint[:, :, None, None]
    image += 0.15 * torch.randn(n, 3, size, size, generator=generator, device=device)
    return (image.clamp(0.0, 1.0) * 255).to(torch.uint8)


class GratingImages(Dataset):
    """A split of ``n`` images held in memory as uint8 (N, 3, size, size)."""

    def __init__(self, n: int, size: int = 128, num_classes: int = 10, seed: int = 0,
                 train: bool = True) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(num_classes, (n,), generator=generator)
        self.images = torch.empty(n, 3, size, size, dtype=torch.uint8)
        for start in range(0, n, 256):  # decode in chunks to bound the temporary floats
            chunk = self.labels[start:start + 256]
            self.images[start:start + len(chunk)] = draw_gratings(chunk, size, num_classes,
                                                                  generator)
        self.train = train

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.train and torch.rand(()) < 0.5:
            image = image.flip(1, 2)  # a 180-degree turn keeps the grating's orientation
        return image, self.labels[index]


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW on any device -> float, normalised (done on the GPU, after the copy)."""
    mean = images.new_tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = images.new_tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std
