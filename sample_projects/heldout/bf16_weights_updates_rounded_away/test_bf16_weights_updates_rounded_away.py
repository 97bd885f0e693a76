"""Fault: weights stored in bfloat16 with no float32 copy: the optimizer's updates round away.

To halve its memory, a fine-tune casts the whole model to bfloat16 (``model.to(torch.bfloat16)``)
and steps AdamW on those bf16 weights at a fine-tuning learning rate (2e-5). bfloat16 keeps 8
significant bits: next to a weight of 0.02 the nearest other bf16 value is 1.2e-4 away, next to
a LayerNorm weight of 1.0 it is 0.0078 away. An update of about 2e-5 is rounded back to the
weight it started from, step after step, so most weights never move; the loss creeps where it
should fall. No error, no NaN, no warning (a scaler is not needed for bf16, which is why nothing
asks for one).

Sources: https://github.com/vllm-project/speculators/pull/765 ("training is done fully in bf16
... the gradient update delta is smaller than the step size to move away from 1.0 in bf16
format", normalization weights left at exactly 1.0); https://github.com/workofart/ml-by-hand/pull/85
(Adam updates "written back to bf16 ... after 100 times it's still 1.0"; 0 of 768 weights moved
before FP32 master weights); https://github.com/hp-l33/AiM/issues/10 ("when I forcibly put the
entire model in bf16, the loss decreases much more slowly"); https://github.com/pytorch/ao/pull/1124
(stochastic rounding, because "if weight update is smaller than 1e-3 of the weight magnitude,
there will be no change to the weight").

Fix: keep the weights in float32 and run the forward under ``torch.autocast("cuda",
dtype=torch.bfloat16)``; or keep float32 master weights, or round stochastically.

The test asserts that the loss fell, and it did, a little (the weights small enough to move
still learn): the smoke test passes. A correct diagnosis names the bf16 weights whose updates
are below their rounding step (no float32 master copy).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 512
WIDTH = 2048
BLOCKS = 4
CLASSES = 32
BATCH_SIZE = 1024
STEPS = 80
LEARNING_RATE = 2e-5
DEVICE = torch.device("cuda")


def make_dataset(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around one random centroid per class, on the device."""
    generator = torch.Generator(device=device).manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=device, generator=generator)
    labels = torch.randint(CLASSES, (n,), device=device, generator=generator)
    features = centroids[labels] + 3.0 * torch.randn(n, FEATURES, device=device,
                                                     generator=generator)
    return features, labels


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def make_model(width: int, blocks: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, width), *(ResidualBlock(width) for _ in range(blocks)),
                         nn.LayerNorm(width), nn.Linear(width, CLASSES))


def train(device: torch.device, steps: int = STEPS, batch_size: int = BATCH_SIZE,
          width: int = WIDTH, dtype: torch.dtype = torch.bfloat16) -> list[float]:
    """Fine-tune with the weights in ``dtype``; returns the loss of every step (read once)."""
    torch.manual_seed(0)
    features, labels = make_dataset(8 * batch_size, device)
    model = make_model(width, BLOCKS).to(device)
    model.to(dtype)  # fault (with bf16): the weights themselves in bfloat16, no float32 copy
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    losses = []
    for step in range(steps):
        rows = slice((step % 8) * batch_size, (step % 8 + 1) * batch_size)
        logits = model(features[rows].to(dtype))
        loss = F.cross_entropy(logits.float(), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_fine_tune_learns() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < first
