"""Failure on purpose: deterministic algorithms on, and a segmentation head with pyramid pooling.

A small foreground-segmentation network with a PSPNet-style pyramid pooling head (the features
average-pooled to 2x2, 3x3 and 6x6 grids with ``nn.AdaptiveAvgPool2d``, upsampled and
concatenated) and a class-balanced loss (pixel class frequencies counted with ``torch.histc``)
is trained with ``torch.use_deterministic_algorithms(True)`` so that two runs give identical
masks. Both are in PyTorch's list of operations with no deterministic CUDA implementation: the
histogram accumulates with atomic adds (``_histc_cuda``), and so does the backward of adaptive
average pooling to a grid larger than 1x1 (``adaptive_avg_pool2d_backward_cuda``), so PyTorch
raises ``RuntimeError: ... does not have a deterministic implementation, but you set
'torch.use_deterministic_algorithms(True)'``. (Bilinear upsampling and reflection padding, the
textbook cases, no longer fail: recent torch releases fall back to deterministic decompositions
for them in this mode.)

Fix: ``torch.use_deterministic_algorithms(True, warn_only=True)`` to keep the deterministic
kernels where they exist; count classes with ``torch.bincount`` (deterministic without weights);
pool the pyramid with fixed-size ``F.avg_pool2d`` where the input size allows it.

Expected diagnosis: GT211 (nondeterministic operation), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

BATCH_SIZE = 16
SIZE = 96
STEPS = 20
BINS = (2, 3, 6)
DEVICE = torch.device("cuda")


class PyramidSegmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        )
        self.pools = nn.ModuleList(nn.AdaptiveAvgPool2d(bins) for bins in BINS)  # fault
        self.head = nn.Conv2d(64 * (1 + len(BINS)), 1, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.encoder(images)
        size = features.shape[-2:]
        pyramid = [features] + [F.interpolate(pool(features), size=size, mode="nearest")
                                for pool in self.pools]
        logits = self.head(torch.cat(pyramid, dim=1))
        return F.interpolate(logits, size=images.shape[-2:], mode="nearest")


def shapes_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy images with one bright rectangle each, and its mask, made on the GPU."""
    masks = torch.zeros(BATCH_SIZE, 1, SIZE, SIZE, device=DEVICE)
    for index in range(BATCH_SIZE):
        top, left = torch.randint(0, SIZE // 2, (2,), generator=generator).tolist()
        masks[index, :, top:top + SIZE // 3, left:left + SIZE // 3] = 1.0
    images = masks.expand(-1, 3, -1, -1) + 0.3 * torch.randn(
        BATCH_SIZE, 3, SIZE, SIZE, device=DEVICE)
    return images, masks


def balanced_loss(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with each class weighted by its inverse pixel frequency."""
    counts = torch.histc(masks, bins=2, min=0.0, max=1.0)  # fault: atomic adds on the GPU
    weights = counts.sum() / (2 * counts.clamp_min(1.0))
    pixel_weights = torch.where(masks > 0.5, weights[1], weights[0])
    return F.binary_cross_entropy_with_logits(logits, masks, weight=pixel_weights)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_segmenter_is_reproducible_and_learns() -> None:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)  # fault: histc and the pooling backward have none
    torch.backends.cudnn.benchmark = False
    generator = torch.Generator().manual_seed(0)
    model = PyramidSegmenter().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    for _ in range(STEPS):
        images, masks = shapes_batch(generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images).float()
        loss = balanced_loss(logits, masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5
