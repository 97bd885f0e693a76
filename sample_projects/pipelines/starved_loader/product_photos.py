"""Product photos decoded and augmented on the fly, one sample at a time, on the CPU.

Stands in for a folder of JPEGs read through PIL and a torchvision-style augmentation chain:
``__getitem__`` "decodes" a 3x256x256 photo (drawn from the sample's index, so the data is
deterministic), then applies a random resized crop, a colour jitter and a Gaussian blur, and
returns a normalised 3x128x128 float tensor. That costs a few milliseconds of CPU per sample.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

RAW_SIZE = 256
OUT_SIZE = 128
NUM_CLASSES = 10


def _gaussian_kernel(sigma: float, radius: int) -> torch.Tensor:
    xs = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-(xs**2) / (2 * sigma**2))
    return kernel / kernel.sum()


class ProductPhotos(Dataset):
    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.seed = seed

    def __len__(self) -> int:
        return self.n

    def decode(self, index: int, generator: torch.Generator) -> tuple[torch.Tensor, int]:
        """The 'JPEG decode': a textured background with the product (a class-placed patch)."""
        label = index % NUM_CLASSES
        background = torch.rand(3, RAW_SIZE // 8, RAW_SIZE // 8, generator=generator)
        photo = F.interpolate(background[None], size=(RAW_SIZE, RAW_SIZE), mode="bicubic",
                              align_corners=False)[0]
        photo += 0.1 * torch.randn(3, RAW_SIZE, RAW_SIZE, generator=generator)
        row, col = divmod(label, 5)
        top, left = 40 + 100 * row, 20 + 44 * col
        colour = 0.6 + 0.4 * torch.rand(3, 1, 1, generator=generator)
        photo[:, top:top + 72, left:left + 40] = colour
        return photo.clamp_(0, 1), label

    def augment(self, photo: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # random resized crop (scale 0.8-1.0)
        scale = 0.8 + 0.2 * torch.rand((), generator=generator).item()
        side = int(RAW_SIZE * math.sqrt(scale))
        top = int(torch.randint(RAW_SIZE - side + 1, (), generator=generator))
        left = int(torch.randint(RAW_SIZE - side + 1, (), generator=generator))
        crop = photo[:, top:top + side, left:left + side]
        image = F.interpolate(crop[None], size=(OUT_SIZE, OUT_SIZE), mode="bilinear",
                              antialias=True, align_corners=False)[0]
        # colour jitter: brightness, contrast, saturation
        factors = 0.8 + 0.4 * torch.rand(3, generator=generator)
        image = image * factors[0]
        mean = image.mean()
        image = (image - mean) * factors[1] + mean
        grey = image.mean(0, keepdim=True)
        image = (image - grey) * factors[2] + grey
        # Gaussian blur, separable 9-tap
        kernel = _gaussian_kernel(0.5 + torch.rand((), generator=generator).item(), 4)
        image = F.conv2d(F.pad(image[:, None], (4, 4, 0, 0), mode="reflect"),
                         kernel.view(1, 1, 1, 9))
        image = F.conv2d(F.pad(image, (0, 0, 4, 4), mode="reflect"), kernel.view(1, 1, 9, 1))
        return ((image[:, 0].clamp(0, 1) - 0.5) / 0.25).contiguous()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        photo, label = self.decode(index, generator)
        return self.augment(photo, generator), label
