"""Healthy: a ResNet-18-style image classifier trained the way the performance guides say.

No fault. DataLoader with 4 worker processes, pinned memory and persistent workers; uint8
batches copied with ``non_blocking=True`` and normalised on the GPU; bf16 autocast;
``cudnn.benchmark`` on for the fixed 128x128 input; batch 256; the loss read back (``.item()``)
only every 50 steps; evaluation under ``torch.no_grad()``.

Expected diagnosis: nothing at warning level.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from grating_images import GratingImages, normalize  # noqa: E402

nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

STEPS = 200
BATCH_SIZE = 256
IMAGE_SIZE = 128
NUM_CLASSES = 10
LOG_EVERY = 50
DEVICE = torch.device("cuda")


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class ResNet18(nn.Module):
    """ResNet-18 layout: 7x7 stride-2 stem, max-pool, four stages of two basic blocks."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        layers, channels = [], 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(channels, width, stride), BasicBlock(width, width)]
            channels = width
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=DEVICE)
    seen = 0
    for images, labels in loader:
        images = normalize(images.to(DEVICE, non_blocking=True))
        labels = labels.to(DEVICE, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
        correct += (logits.argmax(1) == labels).sum()
        seen += len(labels)
    model.train()
    return correct.item() / seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resnet_learns_grating_orientation() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    train_set = GratingImages(2048, IMAGE_SIZE, NUM_CLASSES, seed=0, train=True)
    val_set = GratingImages(512, IMAGE_SIZE, NUM_CLASSES, seed=1, train=False)
    train_loader = DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
                              num_workers=4, pin_memory=True, persistent_workers=True)
    val_loader = DataLoader(val_set, batch_size=BATCH_SIZE, num_workers=2, pin_memory=True)

    model = ResNet18(NUM_CLASSES).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2, total_steps=STEPS)

    logged: list[float] = []
    step = 0
    while step < STEPS:
        for images, labels in train_loader:
            images = normalize(images.to(DEVICE, non_blocking=True))
            labels = labels.to(DEVICE, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == 1 or step % LOG_EVERY == 0:
                logged.append(loss.item())
                print(f"step {step:4d}  loss {logged[-1]:.4f}")
            if step == STEPS:
                break

    accuracy = evaluate(model, val_loader)
    print(f"validation accuracy {accuracy:.3f}")
    assert logged[-1] < 0.5 * logged[0]
    assert accuracy > 0.85
