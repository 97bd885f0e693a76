"""Fault: training silently runs on the CPU although a GPU is available.

The test picks ``device = "cuda" if torch.cuda.is_available() else "cpu"`` and even prints it,
but never moves the model or the batches there (no ``.to(device)``): every parameter, batch and
kernel stays on the CPU while the GPU idles. The test still passes, only slower, which is why
this goes unnoticed. Kept short (a few seconds of CPU work).

Expected diagnosis: GT101 (CUDA available, training on the CPU).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 16
HIDDEN = 512
BATCH_SIZE = 256
EPOCHS = 4


def make_churn_table(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic customer table: standardised features and a churned / stayed label."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=generator)
    score = x[:, 0] + 0.8 * x[:, 1] * x[:, 2] + torch.sin(2 * x[:, 3]) - 0.5 * x[:, 4].abs() + 0.3
    flip = torch.rand(n, generator=generator) < 0.05  # label noise
    y = ((score > 0) ^ flip).long()
    return x, y


class ChurnModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="the fault is training on the CPU while a GPU is available")
def test_churn_model_beats_majority_baseline() -> None:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"training on {device}")
    x_train, y_train = make_churn_table(16384, seed=0)
    x_val, y_val = make_churn_table(4096, seed=1)

    model = ChurnModel()  # fault: never model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(EPOCHS):
        order = torch.randperm(len(x_train))
        for start in range(0, len(x_train), BATCH_SIZE):
            rows = order[start:start + BATCH_SIZE]
            xb, yb = x_train[rows], y_train[rows]  # fault: the batch stays on the CPU too
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}  loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_val).argmax(1) == y_val).float().mean().item()
    baseline = max(y_val.float().mean().item(), 1 - y_val.float().mean().item())
    print(f"validation accuracy {accuracy:.3f} (majority baseline {baseline:.3f})")
    assert accuracy > baseline + 0.2
