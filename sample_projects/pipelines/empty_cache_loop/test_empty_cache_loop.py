"""Fault: ``torch.cuda.empty_cache()`` after every optimizer step.

A GPT-style language model (four d=1024 blocks, batch 96 x 512 tokens, bf16 autocast, data on
the GPU) is trained with ``torch.cuda.empty_cache()`` after each step, added "to avoid running
out of memory". It frees nothing that tensors hold: it hands the allocator's cached blocks back
to the driver, so the next step allocates every activation buffer again with cudaMalloc, and
the cudaFree calls synchronise the device at the end of each step.

Fix: delete the call (call it once after training if another process needs the memory).

Expected diagnosis: GT119 (empty_cache in every step). GT135 (allocator churn) stands down:
the frees are empty_cache's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
SEQ_LEN = 512
D_MODEL = 1024
LAYERS = 4
HEADS = 16
BATCH_SIZE = 96
STEPS = 60
LOG_EVERY = 20
DEVICE = torch.device("cuda")


def markov_corpus(n_sequences: int, length: int, seed: int) -> torch.Tensor:
    """Token sequences (n, length + 1) from one fixed chain with four likely successors."""
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
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_language_model_with_cache_flushing() -> None:
    torch.manual_seed(0)
    train = markov_corpus(STEPS * BATCH_SIZE, SEQ_LEN, seed=0)
    model = TinyGPT().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    losses = []
    for step in range(STEPS):
        batch = train[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
        loss = lm_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()  # fault: "free memory so we never run out"
        if (step + 1) % LOG_EVERY == 0:
            losses.append(loss.item())
            print(f"step {step + 1:4d}  loss {losses[-1]:.4f}")

    assert losses[-1] < losses[0]
