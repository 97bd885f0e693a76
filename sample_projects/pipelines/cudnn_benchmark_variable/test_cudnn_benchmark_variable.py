"""Fault: cuDNN benchmark mode on while every batch brings a new input length.

A keyword-spotting model (1-D convolutions over raw 8 kHz audio) is trained with random-length
crops as augmentation: each batch is cut to a random duration between 2 and 8 seconds in
quarter-second steps, 25 different lengths. ``torch.backends.cudnn.benchmark = True`` was
copied from an image-classification recipe, where shapes never change. With benchmark mode,
cuDNN times every convolution algorithm for each new input shape before it runs, so every
batch of a length not seen before costs many ordinary steps. The test restores the flag in a
``finally:`` block, as tidy tests do; the probe reads it while the test trains.

Fix: turn benchmark mode off for variable shapes, or bucket the crops to a few lengths.

Expected diagnosis: GT120 (cuDNN benchmark with varying input shapes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

SAMPLE_RATE = 8000
DURATIONS = [2.0 + 0.25 * i for i in range(25)]  # seconds: 25 crop lengths
KEYWORDS = 12
BATCH_SIZE = 32
STEPS = 150
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def keyword_spotter() -> nn.Module:
    def block(inputs: int, outputs: int) -> list[nn.Module]:
        return [nn.Conv1d(inputs, outputs, 9, stride=2, padding=4), nn.BatchNorm1d(outputs),
                nn.ReLU()]

    return nn.Sequential(*block(1, 64), *block(64, 128), *block(128, 256), *block(256, 256),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(256, KEYWORDS))


def audio_batch(generator: torch.Generator, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(KEYWORDS, (BATCH_SIZE,), device=DEVICE, generator=generator)
    t = torch.arange(length, device=DEVICE) / SAMPLE_RATE
    tone = torch.sin(2 * torch.pi * (300.0 + 150.0 * labels[:, None]) * t)
    noise = 0.5 * torch.randn(BATCH_SIZE, length, device=DEVICE, generator=generator)
    return (tone + noise).unsqueeze(1), labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_keyword_spotter_trains() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    crops = torch.Generator().manual_seed(1)
    model = keyword_spotter().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    torch.backends.cudnn.benchmark = True  # fault: from an image recipe
    try:
        for step in range(1, STEPS + 1):
            seconds = DURATIONS[int(torch.randint(len(DURATIONS), (1,), generator=crops))]
            x, y = audio_batch(generator, int(seconds * SAMPLE_RATE))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step == 1:
                first_loss = loss.item()
            if step % LOG_EVERY == 0:
                print(f"step {step:3d}  loss {loss.item():.4f}")
    finally:
        torch.backends.cudnn.benchmark = False

    assert loss.item() < first_loss
