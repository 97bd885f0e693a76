"""Fault: autograd anomaly detection left on for the whole training loop of a test.

The loss of this denoising MLP once went NaN, and while chasing it someone wrapped the training
in ``torch.autograd.set_detect_anomaly(True)`` and restored it in a ``finally:`` block. The NaN
is long fixed; the switch stayed. Every forward op now records a traceback and every backward
node's result is checked for NaN (a host-device synchronisation per check), so each step runs
several times slower. The test passes, so nobody notices. Read at the end of the test, the switch
is already off again; the probe reads it at each backward pass.

Fix: remove it from the training loop; keep ``with torch.autograd.detect_anomaly():`` for a single
diagnostic step in a test of its own.

Expected diagnosis: GT115 (anomaly detection during training).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

WIDTH = 4096
BATCH_SIZE = 8192
STEPS = 60
LOG_EVERY = 20
DEVICE = torch.device("cuda")


def noisy_signals(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    clean = torch.randn(n, WIDTH, device=DEVICE, generator=generator).cumsum(1) / WIDTH**0.5
    return clean + 0.3 * torch.randn(n, WIDTH, device=DEVICE, generator=generator), clean


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_denoiser_learns() -> None:
    torch.manual_seed(0)
    noisy, clean = noisy_signals(BATCH_SIZE, seed=0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.GELU(),
        nn.Linear(WIDTH, WIDTH), nn.GELU(),
        nn.Linear(WIDTH, WIDTH),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    torch.autograd.set_detect_anomaly(True)  # fault: left from a NaN hunt
    try:
        for step in range(1, STEPS + 1):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.mse_loss(model(noisy), clean)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step == 1:
                first_loss = loss.item()
            if step % LOG_EVERY == 0:
                print(f"step {step:3d}  loss {loss.item():.4f}")
    finally:
        torch.autograd.set_detect_anomaly(False)

    assert loss.item() < first_loss
