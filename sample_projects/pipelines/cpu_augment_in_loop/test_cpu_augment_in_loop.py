"""Fault: per-sample augmentation in NumPy inside the training loop; the GPU waits for it.

A texture classifier for 40x40 camera crops (4 stripe patterns). The whole uint8 dataset sits in
memory, and each step augments its 256 images one at a time in NumPy (random crop, flip, colour
and saturation jitter, blur, sensor noise) in the training process before copying the batch to
the GPU: a recipe ported from a CPU notebook. The network itself is sound: a strided CNN at
128x128 in fp32 with TF32 and cuDNN autotuning, batches of 768 KiB, no synchronisation per step
(the loss is read every 10 steps). Each step's GPU work takes a few milliseconds; the
augmentation takes several times longer, and no CUDA call happens while it runs.

Fix: move ``augment`` into ``Dataset.__getitem__`` and run it in DataLoader workers
(``num_workers=8``), or augment whole batches on the GPU.

Expected diagnosis: GT117 (host-bound step: the GPU idles while the host works outside CUDA).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

IMAGE = 40
CROP = 32
INPUT = 128  # the network's input size: crops are upsampled on the GPU
CLASSES = 4
SAMPLES = 2048
BATCH_SIZE = 256
STEPS = 30
LOG_EVERY = 10
DEVICE = torch.device("cuda")


def stripe_photos(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stripes, horizontal or vertical, coarse or fine (classes 0-3), with random phase and
    colour: uint8 NCHW photos and int64 labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=count)
    axis = np.arange(IMAGE, dtype=np.float32)
    photos = np.empty((count, 3, IMAGE, IMAGE), dtype=np.uint8)
    for i, label in enumerate(labels):
        period = 6.0 if label % 2 == 0 else 16.0
        wave = np.sin(2 * np.pi * axis / period + rng.uniform(0, 2 * np.pi))
        pattern = wave[:, None] if label < 2 else wave[None, :]
        pattern = np.broadcast_to(pattern, (IMAGE, IMAGE))
        colour = rng.uniform(60, 200, size=(3, 1, 1))
        photos[i] = np.clip(colour + 50 * pattern, 0, 255).astype(np.uint8)
    return photos, labels.astype(np.int64)


def augment(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random crop, horizontal flip, colour and saturation jitter, blur and sensor noise."""
    top, left = rng.integers(0, IMAGE - CROP + 1, size=2)
    crop = photo[:, top:top + CROP, left:left + CROP].astype(np.float32)
    if rng.random() < 0.5:
        crop = crop[:, :, ::-1]
    crop = crop * rng.uniform(0.7, 1.3, size=(3, 1, 1)).astype(np.float32) + rng.uniform(-20, 20)
    gray = crop.mean(axis=0, keepdims=True)
    crop = gray + rng.uniform(0.6, 1.4) * (crop - gray)
    padded = np.pad(crop, ((0, 0), (1, 1), (1, 1)), mode="edge")
    crop = sum(padded[:, dy:dy + CROP, dx:dx + CROP] for dy in range(3) for dx in range(3)) / 9
    crop += rng.normal(0.0, 6.0, size=crop.shape).astype(np.float32)
    return np.clip(crop, 0, 255).astype(np.uint8)


def texture_net() -> nn.Module:
    def conv(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride, 1), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *conv(3, 96, 2), *conv(96, 192, 2), *conv(192, 384, 2), *conv(384, 384, 1),
        *conv(384, 768, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(768, CLASSES),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_texture_classifier_learns_stripes() -> None:
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    photos, labels = stripe_photos(SAMPLES, seed=0)
    rng = np.random.default_rng(1)
    model = texture_net().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mean = torch.tensor([127.0, 127.0, 127.0], device=DEVICE).view(1, 3, 1, 1)

    logged: list[float] = []
    for step in range(1, STEPS + 1):
        rows = rng.choice(SAMPLES, size=BATCH_SIZE, replace=False)
        batch = np.stack([augment(photos[i], rng) for i in rows])  # fault: on the host, per sample
        images = torch.from_numpy(batch).to(DEVICE, non_blocking=True)
        targets = torch.from_numpy(labels[rows]).to(DEVICE, non_blocking=True)
        images = F.interpolate((images.float() - mean) / 64.0, size=INPUT, mode="bilinear",
                               align_corners=False)
        loss = F.cross_entropy(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.5 * logged[0]
