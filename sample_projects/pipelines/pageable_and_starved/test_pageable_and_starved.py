"""Faults: the loader starves the GPU, and its batches are copied from pageable memory.

A scan classifier trains on 3x224x224 scans that were preprocessed once and cached in RAM as
normalised float32. The Dataset flips each scan at random; the DataLoader runs in the training
process (``num_workers=0``) with ``pin_memory`` off. Each step therefore waits while 96 scans are
gathered and stacked into a 55 MiB batch on the CPU (the loader wait), then copies that batch
from pageable memory: the copy goes through the driver's staging buffer and blocks the host, so
``non_blocking=True`` does nothing. The GPU sits idle through both.

Two fixes, both needed: ``DataLoader(..., num_workers=4, pin_memory=True,
persistent_workers=True)``, and better still cache uint8 and normalise on the GPU (a quarter of
the bytes to stack and copy).

Expected diagnosis: GT102 (the loader wait) and GT103 (pageable copies, each a noticeable share
of the step of its own).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

SIZE = 224
CLASSES = 4
POOL = 256
BATCH_SIZE = 96
STEPS = 40
LOG_EVERY = 10
DEVICE = torch.device("cuda")


class CachedScans(torch.utils.data.Dataset):
    """``POOL`` preprocessed float32 scans in RAM (a bright lesion in one quadrant: the class),
    served ``length`` times over with a random flip as augmentation."""

    def __init__(self, length: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.length = length
        self.labels = torch.randint(CLASSES, (POOL,), generator=generator)
        coords = torch.arange(SIZE, dtype=torch.float32)
        centre_y = torch.where(self.labels >= 2, 0.75, 0.25) * SIZE
        centre_x = torch.where(self.labels % 2 == 1, 0.75, 0.25) * SIZE
        distance = ((coords[None, :, None] - centre_y[:, None, None]) ** 2
                    + (coords[None, None, :] - centre_x[:, None, None]) ** 2)
        lesion = torch.exp(-distance / (2 * 18.0**2))
        scans = 0.3 + 0.5 * lesion[:, None] + 0.1 * torch.randn(POOL, 3, SIZE, SIZE,
                                                                generator=generator)
        self.scans = (scans.clamp(0, 1) - 0.35) / 0.2  # normalised once, kept as float32

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        scan = self.scans[index % POOL]
        label = self.labels[index % POOL]
        if torch.rand(()) < 0.5:  # a left-right flip moves the lesion to the other side
            scan = scan.flip(2)
            label = label ^ 1
        return scan, label


def scan_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True), nn.MaxPool2d(2)]

    return nn.Sequential(
        nn.Conv2d(3, 32, 4, stride=4, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        *block(32, 64), *block(64, 128), *block(128, 256),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, CLASSES),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scan_classifier_learns_the_lesion_side() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    loader = DataLoader(CachedScans(STEPS * BATCH_SIZE), batch_size=BATCH_SIZE,
                        shuffle=True)  # faults: num_workers=0 and pin_memory=False (defaults)
    model = scan_cnn().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)

    logged: list[float] = []
    for step, (scans, labels) in enumerate(loader, start=1):
        scans = scans.to(DEVICE, non_blocking=True)  # pageable: blocks despite non_blocking
        labels = labels.to(DEVICE, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(scans), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.5 * logged[0]
