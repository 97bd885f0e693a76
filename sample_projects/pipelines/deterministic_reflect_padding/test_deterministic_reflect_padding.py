"""Failure on purpose: deterministic algorithms on, and convolutions with reflection padding.

A small foreground-segmentation network whose convolutions pad by reflecting the image
(``padding_mode="reflect"``, common in image-to-image models to avoid dark borders) is trained
with ``torch.use_deterministic_algorithms(True)`` so that two runs give identical masks. The
forward pass works; the first backward does not: the CUDA backward of reflection padding
accumulates with atomic adds and has no deterministic kernel, so PyTorch raises
``RuntimeError: reflection_pad2d_backward_cuda does not have a deterministic implementation``.
(Bilinear upsampling, the textbook case, no longer fails: since torch 2.2 ``F.interpolate``
falls back to a deterministic decomposition in this mode.)

Fix: ``torch.use_deterministic_algorithms(True, warn_only=True)``, or zero / replicate padding
(``padding_mode="zeros"`` or ``"replicate"``), which have deterministic backward kernels.

Expected diagnosis: GT211 (nondeterministic operation), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

BATCH_SIZE = 16
SIZE = 128
STEPS = 20
DEVICE = torch.device("cuda")


class TinySegmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1, padding_mode="reflect"),  # fault
            nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1, padding_mode="reflect"),
            nn.BatchNorm2d(64), nn.ReLU(),
        )
        self.head = nn.Conv2d(64, 1, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.encoder(images))
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_segmenter_is_reproducible_and_learns() -> None:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)  # fault: reflection padding has no such backward
    torch.backends.cudnn.benchmark = False
    generator = torch.Generator().manual_seed(0)
    model = TinySegmenter().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    for _ in range(STEPS):
        images, masks = shapes_batch(generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.binary_cross_entropy_with_logits(model(images).float(), masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.3
