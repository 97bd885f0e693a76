"""Healthy: per-sample decoding in DataLoader workers that keep ahead of the GPU.

No fault. ``EncodedTiles.__getitem__`` decompresses, crops and flips each tile on the CPU; the
DataLoader runs it in four worker processes with ``pin_memory=True``,
``persistent_workers=True`` and ``prefetch_factor=4``, so batches are ready (and pinned) before
the training step asks for them. Batches go to the GPU with ``non_blocking=True`` as uint8 and
are normalised there; a ResNet-style network trains under bf16 autocast with
``cudnn.benchmark`` on; the loss is read back every 25 steps.

Expected diagnosis: nothing at warning level (no loader wait: no GT102 or GT113; pinned
copies: no GT103).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from encoded_tiles import NUM_CLASSES, EncodedTiles  # noqa: E402

nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

BATCH_SIZE = 256
EPOCHS = 3
LOG_EVERY = 25
DEVICE = torch.device("cuda")


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(channels, channels), conv_bn(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def tile_classifier() -> nn.Module:
    return nn.Sequential(
        conv_bn(3, 64), conv_bn(64, 192, 2), Residual(192),
        conv_bn(192, 384, 2), Residual(384), conv_bn(384, 768, 2), Residual(768),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(768, NUM_CLASSES),
    )


def normalize(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255 - 0.5) / 0.25


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tile_classifier_with_loader_workers() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    loader = DataLoader(EncodedTiles(8192, seed=0), batch_size=BATCH_SIZE, shuffle=True,
                        drop_last=True, num_workers=4, pin_memory=True,
                        persistent_workers=True, prefetch_factor=4)
    model = tile_classifier().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

    logged: list[float] = []
    step = 0
    for _epoch in range(EPOCHS):
        for images, labels in loader:
            images = normalize(images.to(DEVICE, non_blocking=True))
            labels = labels.to(DEVICE, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step == 1 or step % LOG_EVERY == 0:
                logged.append(loss.item())
                print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.5 * logged[0]
