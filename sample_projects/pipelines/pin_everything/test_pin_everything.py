"""Info: the whole training set is loaded into pinned host memory up front.

1.2 M images of 72x72 (17.4 GiB) are preloaded into one pinned tensor "so that every copy is
fast". Page-locked memory cannot be swapped or reclaimed, and PyTorch's pinned allocator rounds
the block up to the next power of two: the process holds 32 GiB of the host's RAM locked for the
whole run. Training itself is sound: shuffled contiguous batches copied with
``non_blocking=True``, random crops on the GPU, a channels_last bf16 CNN.

Fix: keep the dataset in ordinary (or memory-mapped) memory and let the DataLoader pin each batch
(``pin_memory=True``), or pin a few staging buffers and copy batches into them.

Expected diagnosis: nothing at warning level; info GT138 (pinned host memory pressure).
Heavy: pinning and filling 32 GiB takes several seconds of host time.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

IMAGES = 1_200_000
STORED = 72  # stored size; random 64x64 crops are trained on
CROP = 64
CLASSES = 10
BANK = 4096  # distinct synthetic images, repeated to fill the set
BATCH_SIZE = 512
STEPS = 40
LOG_EVERY = 10
DEVICE = torch.device("cuda")


def synthetic_bank(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy images whose class sets the mean colour: uint8 NCHW and int64 labels."""
    labels = torch.randint(0, CLASSES, (BANK,), generator=generator)
    palette = torch.rand(CLASSES, 3, 1, 1, generator=generator) * 160 + 40
    noise = torch.randn(BANK, 3, STORED, STORED, generator=generator) * 30
    return (palette[labels] + noise).clamp(0, 255).to(torch.uint8), labels


def small_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True), nn.MaxPool2d(2)]

    return nn.Sequential(*block(3, 64), *block(64, 128), *block(128, 256), *block(256, 512),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_on_a_pinned_dataset() -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    bank, bank_labels = synthetic_bank(generator)
    # fault: the whole set, pinned (17.4 GiB, a 32 GiB pinned block)
    images = torch.empty(IMAGES, 3, STORED, STORED, dtype=torch.uint8, pin_memory=True)
    repeats = IMAGES // BANK
    images[: repeats * BANK].view(repeats, BANK, 3, STORED, STORED).copy_(
        bank.expand(repeats, *bank.shape))
    images[repeats * BANK:].copy_(bank[: IMAGES - repeats * BANK])
    labels = bank_labels.repeat(repeats + 1)[:IMAGES].pin_memory()

    model = small_cnn().to(DEVICE, memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    starts = torch.randperm(IMAGES // BATCH_SIZE, generator=generator)[:STEPS] * BATCH_SIZE

    logged: list[float] = []
    for step, start in enumerate(starts.tolist(), start=1):
        x = images[start:start + BATCH_SIZE].to(DEVICE, non_blocking=True)
        y = labels[start:start + BATCH_SIZE].to(DEVICE, non_blocking=True)
        top, left = torch.randint(0, STORED - CROP + 1, (2,), generator=generator).tolist()
        x = x[:, :, top:top + CROP, left:left + CROP].float().sub_(127.0).div_(64.0)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.5 * logged[0]
