"""Satellite tiles stored compressed, decoded and augmented in the DataLoader's workers.

Stands in for a folder of PNG tiles: at construction each 3x72x72 uint8 tile (a field pattern
whose stripe direction is the class, plus sensor noise) is drawn once and zlib-compressed, the
way it would sit on disk. ``__getitem__`` decompresses one tile, takes a random 64x64 crop and a
random flip, and returns a uint8 tensor: real per-sample CPU work, cheap enough that four
workers keep ahead of the GPU.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch
from torch.utils.data import Dataset

RAW = 72
CROP = 64
NUM_CLASSES = 8


def draw_tiles(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8 tiles (N, 3, RAW, RAW): stripes at the class's angle, random phase and tint."""
    coords = np.linspace(-1.0, 1.0, RAW, dtype=np.float32)
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    angle = labels.astype(np.float32) * math.pi / NUM_CLASSES
    phase = rng.uniform(0, 2 * math.pi, len(labels)).astype(np.float32)
    proj = xx * np.cos(angle)[:, None, None] + yy * np.sin(angle)[:, None, None]
    wave = np.sin(5 * math.pi * proj + phase[:, None, None])
    tint = rng.uniform(0.4, 1.0, (len(labels), 3)).astype(np.float32)
    image = 0.5 + 0.35 * wave[:, None] * tint[:, :, None, None]
    image += rng.normal(0, 0.1, image.shape).astype(np.float32)
    return (np.clip(image, 0, 1) * 255).astype(np.uint8)


class EncodedTiles(Dataset):
    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(NUM_CLASSES, size=n)
        self.blobs: list[bytes] = []
        for start in range(0, n, 512):
            tiles = draw_tiles(self.labels[start:start + 512], rng)
            self.blobs.extend(zlib.compress(tile.tobytes(), 1) for tile in tiles)

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        raw = np.frombuffer(zlib.decompress(self.blobs[index]), dtype=np.uint8)
        top, left = np.random.randint(0, RAW - CROP + 1, size=2)
        tile = raw.reshape(3, RAW, RAW)[:, top:top + CROP, left:left + CROP]
        if np.random.rand() < 0.5:
            tile = tile[:, ::-1, ::-1]  # a half turn keeps the stripes' direction
        return torch.from_numpy(np.ascontiguousarray(tile)), int(self.labels[index])
