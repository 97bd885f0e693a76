"""Texture photos decoded into RAM once; ``__getitem__`` crops and flips (cheap, in workers).

Each 3x144x144 uint8 image is a blend of two oriented textures whose pair of orientations is the
class (12 classes), with random frequency, phase and tint and sensor noise, drawn in chunks at
construction as a team would cache a small dataset. A random 128x128 crop and a random half turn
are the augmentations.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

RAW = 144
CROP = 128
NUM_CLASSES = 12
_ANGLES = [(a, b) for a in range(4) for b in range(4) if a < b] * 2  # 12 ordered pairs


def draw_textures(labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    n = len(labels)
    coords = torch.linspace(-1.0, 1.0, RAW)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    pairs = torch.tensor([_ANGLES[int(label)] for label in labels], dtype=torch.float32)
    scale = torch.where(labels >= 6, 9.0, 5.0)  # coarse or fine texture halves the classes
    image = torch.zeros(n, 3, RAW, RAW)
    for which in range(2):
        angle = pairs[:, which] * math.pi / 4
        phase = 2 * math.pi * torch.rand(n, generator=generator)
        proj = xx * torch.cos(angle)[:, None, None] + yy * torch.sin(angle)[:, None, None]
        wave = torch.sin(math.pi * scale[:, None, None] * proj + phase[:, None, None])
        tint = 0.4 + 0.6 * torch.rand(n, 3, generator=generator)
        image += 0.2 * wave[:, None] * tint[:, :, None, None]
    image += 0.5 + 0.08 * torch.randn(n, 3, RAW, RAW, generator=generator)
    return (image.clamp(0, 1) * 255).to(torch.uint8)


class TexturePhotos(Dataset):
    def __init__(self, n: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(NUM_CLASSES, (n,), generator=generator)
        self.images = torch.empty(n, 3, RAW, RAW, dtype=torch.uint8)
        for start in range(0, n, 256):
            chunk = self.labels[start:start + 256]
            self.images[start:start + len(chunk)] = draw_textures(chunk, generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        top, left = torch.randint(0, RAW - CROP + 1, (2,)).tolist()
        image = self.images[index, :, top:top + CROP, left:left + CROP]
        if torch.rand(()) < 0.5:
            image = image.flip(1, 2)  # a half turn keeps every texture's orientation
        return image.contiguous(), self.labels[index]
