"""Fault: training fits a memory cap set inside the test with under 10 % headroom.

The team deploys this fine-tuning job on a GPU shared with other jobs, so the test simulates
its share: it measures the peak of a few steps, caps the process with
``torch.cuda.set_per_process_memory_fraction`` at that peak + 5 %, trains, and, being a tidy
test, restores the fraction to 1.0 in a ``finally:`` block. The run passes with 5 % to spare;
any longer batch, new layer or allocator rounding tips it over. Read after the test, the
fraction is 1.0 and the peak looks tiny against the whole GPU; the probe reads the fraction in
force at the training steps.

Fix: leave real headroom (15-20 %), or lower the peak (smaller batch with accumulation,
activation checkpointing).

Expected diagnosis: GT107 (peak memory close to the budget in force while training).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 2048
HIDDEN = 8192
CLASSES = 512
BATCH_SIZE = 4096
PROFILE_STEPS = 3
STEPS = 60
HEADROOM = 1.05  # fault: 5 % over the measured peak
DEVICE = torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_finetune_fits_the_shared_gpu_share() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE, generator=generator)
    labels = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE, generator=generator)
    features = centroids[labels] + 2.0 * torch.randn(BATCH_SIZE, FEATURES, device=DEVICE,
                                                     generator=generator)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(features), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(PROFILE_STEPS):
        first_loss = train_step().item()
    torch.cuda.synchronize()
    _, total = torch.cuda.mem_get_info()
    fraction = min(1.0, torch.cuda.max_memory_reserved() * HEADROOM / total)
    torch.cuda.set_per_process_memory_fraction(fraction)  # our share of the shared GPU
    try:
        for _ in range(STEPS):
            loss = train_step()
        assert torch.cuda.max_memory_reserved() <= fraction * total
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)

    assert loss.item() < first_loss
