"""Info: a compiled model whose forward prints an activation statistic on every call.

A token model (embedding, two residual MLP blocks, next-token head; bf16 autocast, data on the
GPU) is compiled with ``torch.compile``. Its forward prints the mean activation after the first
block, for debugging, on every call: ``.item()`` and ``print`` cannot go into a graph, so dynamo
breaks the forward in two graphs with Python in between, and the fusion across the break is
lost. Nothing is wrong with the results; it costs some speed.

Fix: log from the training loop every N steps (outside the compiled model), or wrap the logging
helper in ``torch.compiler.disable``.

Expected diagnosis: nothing at warning level; GT132 as information.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
D_MODEL = 1024
BATCH_SIZE = 128
SEQ_LEN = 256
STEPS = 30
DEVICE = torch.device("cuda")


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
        self.first = ResidualMLP()
        self.second = ResidualMLP()
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.first(self.embed(tokens))
        print(f"mean activation {h.detach().float().mean().item():+.4f}")  # a graph break
        return self.head(self.second(h))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_token_model_trains() -> None:
    torch.manual_seed(0)
    corpus = markov_corpus(4 * BATCH_SIZE, SEQ_LEN, seed=0)
    model = TokenModel().to(DEVICE)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    losses = []
    for step in range(STEPS):
        batch = corpus[(step % 4) * BATCH_SIZE:(step % 4 + 1) * BATCH_SIZE]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % 10 == 0:
            losses.append(loss.item())

    assert losses[-1] < losses[0]
