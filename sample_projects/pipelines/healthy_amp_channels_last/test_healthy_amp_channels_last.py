"""Healthy: a ResNet-50 trained with AMP (fp16 + GradScaler) in channels_last memory format.

No fault; the setup the performance guides recommend for convolutional networks: fp16 autocast
with a ``GradScaler`` (scale, step, update), model and inputs in ``channels_last``,
``cudnn.benchmark`` on for the fixed 128x128 crops, a one-cycle learning rate, a DataLoader
with four persistent workers and pinned memory, batches copied with ``non_blocking=True`` and
normalised on the GPU, the loss read back every 20 steps, batch 128. ``GradScaler.step`` reads
one flag back per step (did any gradient overflow); that single sync is part of AMP.

Expected diagnosis: nothing at warning level.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from texture_photos import NUM_CLASSES, TexturePhotos  # noqa: E402

nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

BATCH_SIZE = 128
STEPS = 100
LOG_EVERY = 20
DEVICE = torch.device("cuda")
MEAN = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.25, 0.25, 0.25]).view(1, 3, 1, 1) * 255


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        nn.init.zeros_(self.body[-1].weight)  # each block starts as the identity
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x), inplace=True)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = 64
        for width, depth, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for index in range(depth):
                blocks.append(Bottleneck(cin, width, stride if index == 0 else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resnet50_amp_channels_last() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    loader = DataLoader(TexturePhotos(2048, seed=0), batch_size=BATCH_SIZE, shuffle=True,
                        drop_last=True, num_workers=4, pin_memory=True, persistent_workers=True)
    model = ResNet50(NUM_CLASSES).to(DEVICE, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                weight_decay=5e-5)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=STEPS)
    scaler = torch.amp.GradScaler("cuda")
    mean, std = MEAN.to(DEVICE), STD.to(DEVICE)

    logged: list[float] = []
    step = 0
    while step < STEPS:
        for images, labels in loader:
            images = images.to(DEVICE, non_blocking=True, memory_format=torch.channels_last)
            images = (images.float() - mean) / std
            labels = labels.to(DEVICE, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            if step == 1 or step % LOG_EVERY == 0:
                logged.append(loss.item())
                print(f"step {step:3d}  loss {logged[-1]:.4f}  scale {scaler.get_scale():.0f}")
            if step == STEPS:
                break

    assert logged[-1] < 0.7 * logged[0]
