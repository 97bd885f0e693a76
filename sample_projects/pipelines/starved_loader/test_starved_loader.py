"""Fault: the GPU waits for the DataLoader (data-loading starvation).

``ProductPhotos.__getitem__`` decodes and augments every photo on the CPU (a few ms per
sample), and the DataLoader runs it in the training process (``num_workers=0``): each batch of
32 costs on the order of 100 ms of CPU, while the small CNN needs a couple of milliseconds of
GPU time for it. The GPU sits idle most of every step. Everything else is done right (pinned
memory, ``non_blocking`` copies, bf16 autocast, loss read back every 10 steps).

Expected diagnosis: GT102 (time blocked in the loader's ``__next__`` dominates the step).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from product_photos import NUM_CLASSES, ProductPhotos  # noqa: E402

nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

BATCH_SIZE = 32
STEPS = 60
LOG_EVERY = 10
DEVICE = torch.device("cuda")


def small_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True), nn.MaxPool2d(2)]

    return nn.Sequential(
        *block(3, 32), *block(32, 64), *block(64, 128), *block(128, 256),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, NUM_CLASSES),
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_product_classifier_loss_goes_down() -> None:
    torch.manual_seed(0)
    loader = DataLoader(ProductPhotos(BATCH_SIZE * STEPS), batch_size=BATCH_SIZE, shuffle=True,
                        pin_memory=True)  # fault: num_workers defaults to 0
    model = small_cnn().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    running = None
    logged: list[float] = []
    for step, (images, labels) in enumerate(loader, start=1):
        images = images.to(DEVICE, non_blocking=True)
        labels = labels.to(DEVICE, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running = loss.detach() if running is None else 0.8 * running + 0.2 * loss.detach()
        if step % LOG_EVERY == 0:
            logged.append(running.item())
            print(f"step {step:3d}  loss {logged[-1]:.3f}")

    assert logged[-1] < logged[0]
