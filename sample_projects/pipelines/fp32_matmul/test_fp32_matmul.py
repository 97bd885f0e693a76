"""Fault: a large transformer trains in full fp32 with TF32 off, so tensor cores sit unused.

Two pre-norm transformer blocks of width 4096 (about 0.4 B parameters) on batch 8 x 256 tokens.
The team switched TF32 off "for reproducibility" (``torch.backends.cuda.matmul.allow_tf32 =
False``, which is also PyTorch's default for matmuls) and uses no autocast, so every matrix
product runs on the GPU's plain fp32 units: several times slower than TF32 and an order of
magnitude slower than bf16 on a GPU with tensor cores (compute capability >= 7.0 for fp16,
>= 8.0 for TF32/bf16).

Fix: ``torch.autocast("cuda", dtype=torch.bfloat16)`` around the forward, or at least
``torch.set_float32_matmul_precision("high")``.

Expected diagnosis: GT106 (fp32 matmuls where tensor cores could run them).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
SEQ_LEN = 256
D_MODEL = 4096
HEADS = 32
LAYERS = 2
BATCH_SIZE = 8
STEPS = 60
LOG_EVERY = 10
DEVICE = torch.device("cuda")


def markov_corpus(n_sequences: int, length: int, seed: int) -> torch.Tensor:
    """Token sequences from one fixed random chain (four likely successors per token)."""
    successors = torch.randint(VOCAB, (VOCAB, 4), device=DEVICE,
                               generator=torch.Generator(device=DEVICE).manual_seed(1234))
    weights = torch.tensor([0.4, 0.3, 0.2, 0.1], device=DEVICE).expand(n_sequences, 4)
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    tokens = torch.empty(n_sequences, length + 1, dtype=torch.long, device=DEVICE)
    tokens[:, 0] = torch.randint(VOCAB, (n_sequences,), generator=generator, device=DEVICE)
    for t in range(length):
        pick = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        tokens[:, t + 1] = successors[tokens[:, t], pick]
    return tokens


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.norm2 = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(),
                                 nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(D_MODEL, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, D_MODEL))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Embedding(SEQ_LEN, D_MODEL)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tokens(idx) + self.positions(positions))
        return self.head(self.norm(x))


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_wide_language_model_loss_decreases() -> None:
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # fault: "bit-exact fp32 for reproducibility"
    corpus = markov_corpus(STEPS * BATCH_SIZE, SEQ_LEN, seed=0)
    held_out = markov_corpus(4 * BATCH_SIZE, SEQ_LEN, seed=1)
    model = LanguageModel().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    with torch.no_grad():
        before = lm_loss(model, held_out).item()
    for step, batch in enumerate(corpus.split(BATCH_SIZE), start=1):
        loss = lm_loss(model, batch)  # fault: fp32 end to end, no autocast
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % LOG_EVERY == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    with torch.no_grad():
        after = lm_loss(model, held_out).item()
    print(f"held-out loss {before:.3f} -> {after:.3f}")
    assert after < before - 1.0
