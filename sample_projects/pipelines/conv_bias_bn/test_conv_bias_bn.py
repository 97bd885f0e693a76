"""Info: a VGG-style network from an old recipe: biased convolutions before batch norms, NCHW.

Every block is ``nn.Conv2d(cin, cout, 3, padding=1)`` (the default ``bias=True``) followed by
``nn.BatchNorm2d(cout)``: the batch norm subtracts each channel's mean, so the bias is trained
for nothing. The network trains under bf16 autocast in the default NCHW layout, so cuDNN's
tensor-core convolutions transpose around every layer instead of running channels_last. The rest
is done right (cuDNN autotuning, data on the GPU, no synchronisation per step), so nothing here
warrants a warning; the two findings are information.

Expected diagnosis: nothing at warning level; info GT125 (conv bias before batch norm) and GT126
(channels_last missing).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

SIZE = 64
CLASSES = 8
BATCH_SIZE = 128
STEPS = 40
LOG_EVERY = 10
DEVICE = torch.device("cuda")


def vgg_block(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def vgg() -> nn.Module:
    return nn.Sequential(
        *vgg_block(3, 64), *vgg_block(64, 64), nn.MaxPool2d(2),
        *vgg_block(64, 128), *vgg_block(128, 128), nn.MaxPool2d(2),
        *vgg_block(128, 256), *vgg_block(256, 256), nn.MaxPool2d(2),
        *vgg_block(256, 512), *vgg_block(512, 512), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(512, CLASSES),
    )


def blobs(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class is the position of a bright blob in a 4x2 grid, plus noise."""
    labels = torch.randint(0, CLASSES, (count,), device=DEVICE, generator=generator)
    ys = torch.arange(SIZE, device=DEVICE).view(1, SIZE, 1).float()
    xs = torch.arange(SIZE, device=DEVICE).view(1, 1, SIZE).float()
    cy = (labels // 2).float().view(-1, 1, 1) * SIZE / 4 + SIZE / 8
    cx = (labels % 2).float().view(-1, 1, 1) * SIZE / 2 + SIZE / 4
    blob = torch.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / 50.0)
    noise = torch.randn(count, 3, SIZE, SIZE, device=DEVICE, generator=generator)
    return blob.unsqueeze(1) * 2.0 + 0.5 * noise, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vgg_finds_the_blob() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    images, labels = blobs(BATCH_SIZE * STEPS, generator)
    model = vgg().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    logged: list[float] = []
    for step, (x, y) in enumerate(zip(images.split(BATCH_SIZE), labels.split(BATCH_SIZE),
                                      strict=True), start=1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.5 * logged[0]
