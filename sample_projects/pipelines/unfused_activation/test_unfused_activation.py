"""Info: residual MLP blocks with a hand-written GELU and layer norm, run eagerly.

The blocks were transcribed from a paper's pseudo-code: GELU as
``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`` and layer norm as mean,
variance, subtract, divide, scale, shift, each an eager PyTorch operation. In eager mode every
one of them is its own kernel reading and writing whole activation tensors (and keeping them for
the backward pass), so these memory-bound elementwise kernels take more GPU time than the
matmuls. The training is otherwise sound and GPU-bound: bf16 autocast, a large batch made on the
GPU, a fused optimizer, the loss read every 8 steps.

Fix: ``torch.compile(model)`` fuses each chain into one or two kernels; or use ``F.gelu`` and
``nn.LayerNorm``.

Expected diagnosis: nothing at warning level; info GT128 (unfused elementwise operations).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

WIDTH = 1024
HIDDEN = 4096
BLOCKS = 4
CLASSES = 16
TOKENS = 16384
STEPS = 24
LOG_EVERY = 8
DEVICE = torch.device("cuda")


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class LayerNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(variance + self.eps) * self.weight + self.bias


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(gelu(self.up(self.norm(x))))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_residual_mlp_fits_a_teacher() -> None:
    torch.manual_seed(0)
    teacher = torch.randn(WIDTH, CLASSES, device=DEVICE) / math.sqrt(WIDTH)
    model = nn.Sequential(*[ResidualMLP() for _ in range(BLOCKS)], LayerNorm(WIDTH),
                          nn.Linear(WIDTH, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    logged: list[float] = []
    for step in range(1, STEPS + 1):
        x = torch.randn(TOKENS, WIDTH, device=DEVICE)
        y = (x @ teacher).argmax(dim=1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.7 * logged[0]
