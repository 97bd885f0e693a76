"""Fault: ``AdamW(..., foreach=False)`` over a model with hundreds of parameter tensors.

An MLP-Mixer for 8x8-patch images (16 mixer blocks of 12 parameter tensors each, 198 tensors
in all) trains with bf16 autocast on data already on the GPU. The optimizer line was copied
from a CPU recipe with ``foreach=False``: AdamW then loops over the tensors in Python and
launches about seven small kernels per tensor and step, 1,300+ launches that keep the host busy
for milliseconds while the GPU waits for them. On CUDA torch's default (foreach) or
``fused=True`` does the same update in a handful of launches.

Fix: drop ``foreach=False`` (or pass ``fused=True``).

Expected diagnosis: GT123 (for-loop optimizer taking a large share of the step). GT105 stands
down: the idle GPU is explained by the optimizer's host time.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

CLASSES = 10
PATCH = 8
IMAGE = 64
TOKENS = (IMAGE // PATCH) ** 2  # 64 patches
CHANNELS = 512
BLOCKS = 16
BATCH_SIZE = 256
STEPS = 60
LOG_EVERY = 20
DEVICE = torch.device("cuda")


class MixerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(CHANNELS)
        self.token_mix = nn.Sequential(nn.Linear(TOKENS, 4 * TOKENS), nn.GELU(),
                                       nn.Linear(4 * TOKENS, TOKENS))
        self.norm2 = nn.LayerNorm(CHANNELS)
        self.channel_mix = nn.Sequential(nn.Linear(CHANNELS, 4 * CHANNELS), nn.GELU(),
                                         nn.Linear(4 * CHANNELS, CHANNELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mix(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mix(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, CHANNELS, PATCH, stride=PATCH)
        self.blocks = nn.Sequential(*(MixerBlock() for _ in range(BLOCKS)))
        self.norm = nn.LayerNorm(CHANNELS)
        self.head = nn.Linear(CHANNELS, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patches(images).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images with a bright blob whose position is the class."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    images = 0.5 * torch.randn(n, 3, IMAGE, IMAGE, device=DEVICE, generator=generator)
    row = (labels // 5) * 32 + 8
    column = (labels % 5) * 12 + 2
    for i in range(16):
        images[torch.arange(n, device=DEVICE), :, row + i // 4, column + i % 4] += 2.0
    return images, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mixer_learns_blob_positions() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    images, labels = blobs(STEPS * BATCH_SIZE // 4, seed=0)
    model = Mixer().to(DEVICE)
    # fault: foreach=False, copied from a CPU recipe
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, foreach=False)

    losses = []
    batches = len(labels) // BATCH_SIZE
    for step in range(STEPS):
        rows = slice((step % batches) * BATCH_SIZE, (step % batches + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images[rows]), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % LOG_EVERY == 0:
            losses.append(loss.item())
            print(f"step {step + 1:4d}  loss {losses[-1]:.4f}")

    assert losses[-1] < losses[0]
