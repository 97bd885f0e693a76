"""Healthy: a small GPT-style language model trained in fp32 with TF32 tensor cores on.

No fault. ``torch.set_float32_matmul_precision("high")`` lets fp32 matrix products run on tensor
cores (TF32); the corpus is generated once on the GPU (no host copies per step); batch 64 x 256
tokens through four d=1024 blocks keeps the GPU busy; the loss is read back only every 50 steps;
validation runs under ``torch.no_grad()``.

The corpus comes from a fixed random Markov chain (each token has four likely successors), so a
model that learns the bigram table reaches a loss near the chain's entropy (about 1.3 nats)
from log(1024) = 6.9 at the start.

Expected diagnosis: nothing at warning level.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
SEQ_LEN = 256
D_MODEL = 1024
LAYERS = 4
HEADS = 16
BATCH_SIZE = 64
STEPS = 200
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def markov_corpus(n_sequences: int, length: int, seed: int) -> torch.Tensor:
    """Token sequences (n, length + 1) from one fixed chain; ``seed`` picks the sequences."""
    table = torch.Generator(device=DEVICE).manual_seed(1234)
    successors = torch.randint(VOCAB, (VOCAB, 4), generator=table, device=DEVICE)
    weights = torch.tensor([0.4, 0.3, 0.2, 0.1], device=DEVICE).expand(n_sequences, 4)
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    tokens = torch.empty(n_sequences, length + 1, dtype=torch.long, device=DEVICE)
    tokens[:, 0] = torch.randint(VOCAB, (n_sequences,), generator=generator, device=DEVICE)
    for t in range(length):
        pick = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        tokens[:, t + 1] = successors[tokens[:, t], pick]
    return tokens


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Embedding(SEQ_LEN, D_MODEL)
        block = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)
        mask = nn.Transformer.generate_square_subsequent_mask(SEQ_LEN)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        length = idx.shape[1]
        positions = torch.arange(length, device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        x = self.blocks(x, mask=self.causal_mask[:length, :length], is_causal=True)
        return self.head(self.norm(x))


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, corpus: torch.Tensor) -> float:
    model.eval()
    total = torch.zeros((), device=DEVICE)
    batches = corpus.split(BATCH_SIZE)
    for batch in batches:
        total += lm_loss(model, batch)
    model.train()
    return total.item() / len(batches)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_language_model_learns_the_chain() -> None:
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")  # TF32 tensor cores for fp32 matmuls
    train = markov_corpus(8192, SEQ_LEN, seed=0)
    val = markov_corpus(512, SEQ_LEN, seed=1)

    model = TinyGPT().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=STEPS,
                                                    pct_start=0.1)
    before = evaluate(model, val)
    order = torch.randperm(len(train), device=DEVICE)
    for step in range(1, STEPS + 1):
        start = ((step - 1) * BATCH_SIZE) % len(train)
        batch = train[order[start:start + BATCH_SIZE]]
        loss = lm_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % LOG_EVERY == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")

    after = evaluate(model, val)
    print(f"validation loss {before:.3f} -> {after:.3f}")
    assert after < 2.0 < before
