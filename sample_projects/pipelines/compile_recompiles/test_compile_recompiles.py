"""Fault: ``torch.compile(model, dynamic=False)`` with a sequence-length curriculum.

A token model (embedding, two residual MLP blocks, next-token head; bf16 autocast, data on the
GPU) is compiled with ``dynamic=False`` "for the fastest kernels", and trained with a length
curriculum: 256 tokens for six steps, then 32 more every second step. Every new length fails
the compiled graph's shape guards, and dynamo compiles forward and backward again, seconds per
length, in the middle of training; after eight lengths it hits the recompile limit and runs
the model eagerly for the rest of the process.

Fix: leave ``dynamic`` at its default (the second new length makes that dimension dynamic and
one graph serves every length), ``torch._dynamo.mark_dynamic(tokens, 1)``, or pad to a few
fixed lengths.

Expected diagnosis: GT131 (compilations in a third of the steps after warm-up).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
D_MODEL = 1024
BATCH_SIZE = 128
START_LEN = 256
GROW_EVERY = 2  # steps per curriculum stage after the first
STEPS = 16
DEVICE = torch.device("cuda")


def curriculum_length(step: int) -> int:
    """256 tokens for steps 1-6, then 32 more every second step."""
    if step <= 6:
        return START_LEN
    return START_LEN + 32 * ((step - 7) // GROW_EVERY + 1)


def markov_corpus(n_sequences: int, length: int, seed: int) -> torch.Tensor:
    """Token sequences from one fixed chain with four likely successors per token."""
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


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D_MODEL)
        self.up = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.down = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.Sequential(ResidualMLP(), ResidualMLP())
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_token_model_with_length_curriculum() -> None:
    torch.manual_seed(0)
    longest = curriculum_length(STEPS)
    corpus = markov_corpus(4 * BATCH_SIZE, longest, seed=0)
    model = TokenModel().to(DEVICE)
    compiled = torch.compile(model, dynamic=False)  # fault: every new length recompiles
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    losses = []
    for step in range(1, STEPS + 1):
        length = curriculum_length(step)
        rows = slice((step % 4) * BATCH_SIZE, (step % 4 + 1) * BATCH_SIZE)
        batch = corpus[rows, :length + 1]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:3d}  length {length}  loss {losses[-1]:.4f}")

    assert losses[-1] < losses[0]
