"""Failure on purpose: CUDA out of memory when a hand-written attention meets a long context.

A small language model with a textbook attention (``softmax(q @ k.T / sqrt(d)) @ v``, which
materialises the full length x length score matrix) trains fine at 1k context. The
long-context stage then asks for 32k tokens at batch 16: the score tensor alone is 16 x 16
heads x 32768^2 bf16 values = 512 GiB, far past any GPU, and the first forward raises
``torch.OutOfMemoryError``.

Fix: ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels never materialise the
scores), a smaller batch with gradient accumulation, activation checkpointing.

Expected diagnosis: GT201 (out of memory), the test fails.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
D_MODEL = 512
HEADS = 16
LAYERS = 2
SHORT_CONTEXT, SHORT_BATCH, SHORT_STEPS = 1024, 16, 50
LONG_CONTEXT, LONG_BATCH = 32768, 16
DEVICE = torch.device("cuda")


class NaiveAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, L)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, length, D_MODEL))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attention = NaiveAttention()
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(),
                                 nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Embedding(max_len, D_MODEL)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.blocks(self.tokens(idx) + self.positions(positions)))


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, context: int, batch: int,
                steps: int) -> float:
    generator = torch.Generator(device=DEVICE).manual_seed(context)
    for _ in range(steps):
        # a repetitive corpus: each sequence repeats a random 64-token phrase
        phrase = torch.randint(VOCAB, (batch, 64), device=DEVICE, generator=generator)
        tokens = phrase.repeat(1, context // 64 + 1)[:, :context + 1]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return loss.item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_context_extension_to_32k() -> None:
    torch.manual_seed(0)
    model = LanguageModel(max_len=LONG_CONTEXT).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    short_loss = train_steps(model, optimizer, SHORT_CONTEXT, SHORT_BATCH, SHORT_STEPS)
    print(f"1k-context loss {short_loss:.3f}; extending to {LONG_CONTEXT} tokens")
    long_loss = train_steps(model, optimizer, LONG_CONTEXT, LONG_BATCH, steps=10)
    assert long_loss < short_loss
