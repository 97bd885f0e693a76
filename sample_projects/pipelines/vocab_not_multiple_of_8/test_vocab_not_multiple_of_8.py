"""Info: a GPT-style language model with the GPT-2 vocabulary of 50257 tokens, trained in bf16.

The output head shares its weight with the token embedding (weight tying), so the largest matmul
of every step, hidden states x head, has 50257 output columns: not a multiple of 8, so the
tensor-core kernels cannot tile it evenly. The head holds more than half of the model's matmul
weights. Everything else follows the usual recipe (bf16 autocast, fused attention, fused AdamW,
data on the GPU, loss read every 10 steps).

Fix: pad the vocabulary to 50304 (a multiple of 64); the extra rows are never targets.

Expected diagnosis: nothing at warning level; info GT127 (tensor-core unfriendly shapes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 50257  # GPT-2's tokenizer
WIDTH = 768
HEADS = 12
LAYERS = 4
CONTEXT = 256
BATCH_SIZE = 16
STEPS = 60
LOG_EVERY = 10
DEVICE = torch.device("cuda")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(WIDTH, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # weight tying
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))  # type: ignore[no-any-return]


def cycle_corpus(count: int, generator: torch.Generator) -> torch.Tensor:
    """Token sequences that walk a fixed cycle of 512 vocabulary entries (a tiny domain's text
    under GPT-2's tokenizer): each token determines the next."""
    used = torch.randperm(VOCAB, device=DEVICE, generator=generator)[:512]
    starts = torch.randint(0, 512, (count, 1), device=DEVICE, generator=generator)
    return used[(starts + torch.arange(CONTEXT + 1, device=DEVICE)) % 512]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt_learns_the_corpus() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    corpus = cycle_corpus(BATCH_SIZE * STEPS, generator)
    model = TinyGPT().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    logged: list[float] = []
    for step, tokens in enumerate(corpus.split(BATCH_SIZE), start=1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % LOG_EVERY == 0:
            logged.append(loss.item())
            print(f"step {step:3d}  loss {logged[-1]:.4f}")

    assert logged[-1] < 0.5 * logged[0]
