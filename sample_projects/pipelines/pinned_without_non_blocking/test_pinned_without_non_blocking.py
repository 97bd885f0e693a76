"""Info: the DataLoader pins every batch, but the loop copies it with a plain ``.to(device)``.

A click-through-rate model on dense features: the loader has 4 persistent workers and
``pin_memory=True``, which is right, but the copies are made without ``non_blocking=True``, so
each one waits for the GPU to finish the previous step's queued work and for the copy itself
(PyTorch synchronises the stream after a blocking copy). With a GPU-bound step the cost is
small, which is why this is information; the fix costs one argument.

Fix: ``features.to(device, non_blocking=True)`` and the same for the labels.

Expected diagnosis: nothing at warning level; info GT130 (blocking pinned copies).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
DataLoader = torch.utils.data.DataLoader

FEATURES = 256
HIDDEN = 8192
BATCH_SIZE = 4096
BATCHES = 64
LOG_EVERY = 16
DEVICE = torch.device("cuda")


class ClickLog(torch.utils.data.Dataset):
    """Pre-batched rows of an impression log: item i is batch i (features and click labels)."""

    def __init__(self, batches: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.features = torch.randn(batches, BATCH_SIZE, FEATURES, generator=generator)
        weights = torch.randn(FEATURES, generator=generator)
        self.clicks = (self.features @ weights > 0).float()

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[index].clone(), self.clicks[index].clone()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_click_model_learns() -> None:
    torch.manual_seed(0)
    loader = DataLoader(ClickLog(BATCHES, seed=0), batch_size=None, shuffle=True,
                        num_workers=4, pin_memory=True, persistent_workers=True)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    logged: list[float] = []
    for step, (features, clicks) in enumerate(loader, start=1):
        features = features.to(DEVICE)  # fault: pinned, but a blocking copy
        clicks = clicks.to(DEVICE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(features).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits.float(), clicks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.6 * logged[0]
