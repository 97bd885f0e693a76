"""Fault: the model and optimizer state are written with ``torch.save`` after every step.

A residual MLP regressor (about 17 M parameters) trains in bf16 on data already on the GPU; the
step itself takes a millisecond or two. After every optimizer step the loop saves a resumable
checkpoint, the model's and AdamW's state dicts (some 200 MB: the weights and two moments per
parameter), to the test's temporary folder. Each save copies every tensor to the host, pickles it
and writes it: the saves take most of the training time.

Fix: checkpoint every N steps or once per epoch (and at the end), not every step.

Expected diagnosis: GT140 (checkpoint every step) at warning level, naming torch.save and its
share of the step; no GT104 advice about read-backs (those are the save's copies) and no GT117
(the host work is the save).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

WIDTH = 2048
BLOCKS = 4
FEATURES = 256
BATCH_SIZE = 1024
STEPS = 60
DEVICE = torch.device("cuda")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.linear(self.norm(x)))


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x))).squeeze(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_regressor_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(8 * BATCH_SIZE, FEATURES, device=DEVICE, generator=generator)
    y = torch.sin(x[:, :8].sum(1))
    model = Regressor().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint = tmp_path / "last.pt"

    for step in range(STEPS):
        rows = slice((step % 8) * BATCH_SIZE, (step % 8 + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            prediction = model(x[rows])
        loss = F.mse_loss(prediction.float(), y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # The fault: a full, resumable checkpoint after every step.
        torch.save({"step": step, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict()}, checkpoint)
        if (step + 1) % 20 == 0:
            print(f"step {step + 1:3d}  loss {loss.item():.4f}")

    state = torch.load(checkpoint, map_location=DEVICE)
    assert state["step"] == STEPS - 1
    resumed = Regressor().to(DEVICE)
    resumed.load_state_dict(state["model"])
    with torch.no_grad():
        assert torch.allclose(resumed(x[:16]), model(x[:16]))
