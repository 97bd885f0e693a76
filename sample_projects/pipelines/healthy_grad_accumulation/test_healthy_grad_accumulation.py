"""Healthy: a GPT-style language model trained with gradient accumulation.

No fault. The effective batch of 64 sequences does not fit the memory plan, so each optimizer
step accumulates the gradients of four micro-batches of 16 sequences x 512 tokens: each
micro-batch's loss is divided by four and back-propagated, the optimizer steps once, and the
gradients are cleared after it. bf16 autocast, a fused AdamW, causal attention through
``scaled_dot_product_attention``, the corpus generated once on the GPU, the loss read back every
10 optimizer steps, validation under ``torch.no_grad()`` in eval mode.

Every forward is back-propagated (no GT109), one forward per micro-batch is normal accumulation
(the probe counts optimizer steps), and the step synchronises with the host only when logging.

Expected diagnosis: nothing at warning level.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
SEQ_LEN = 512
D_MODEL = 1024
HEADS = 16
LAYERS = 4
MICRO_BATCH = 16
ACCUMULATION = 4
STEPS = 60
LOG_EVERY = 10
DEVICE = torch.device("cuda")


def markov_corpus(n_sequences: int, length: int, seed: int) -> torch.Tensor:
    """Token sequences (n, length + 1) from one fixed chain with four likely successors."""
    table = torch.Generator(device=DEVICE).manual_seed(99)
    successors = torch.randint(VOCAB, (VOCAB, 4), generator=table, device=DEVICE)
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
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, HEADS, -1).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
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
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_accumulated_steps_learn_the_chain() -> None:
    torch.manual_seed(0)
    train = markov_corpus(STEPS * ACCUMULATION * MICRO_BATCH, SEQ_LEN, seed=0)
    val = markov_corpus(2 * MICRO_BATCH, SEQ_LEN, seed=1)
    model = LanguageModel().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.01, fused=True)

    micro_batches = train.split(MICRO_BATCH)
    logged: list[float] = []
    for step in range(STEPS):
        running = torch.zeros((), device=DEVICE)
        for micro in micro_batches[step * ACCUMULATION:(step + 1) * ACCUMULATION]:
            loss = lm_loss(model, micro) / ACCUMULATION
            loss.backward()  # gradients add up over the micro-batches
            running += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0 or (step + 1) % LOG_EVERY == 0:
            logged.append(running.item())
            print(f"step {step + 1:3d}  loss {logged[-1]:.4f}")

    model.eval()
    with torch.no_grad():
        val_loss = sum(lm_loss(model, batch).item() for batch in val.split(MICRO_BATCH)) / 2
    model.train()
    print(f"validation loss {val_loss:.3f}")
    assert logged[-1] < 0.7 * logged[0]
    assert val_loss < 0.7 * logged[0]
