"""Fault: causal attention through scaled_dot_product_attention with a materialised mask.

A GPT-style language model at 4096 tokens of context computes its attention with
``F.scaled_dot_product_attention(q, k, v, attn_mask=self.causal[:t, :t])``, the lower-triangular
boolean buffer kept from the attention it replaced (``softmax(q @ k.T + mask) @ v``). The result
is right, but PyTorch's flash-attention kernel takes no arbitrary mask: the call falls back to a
kernel that reads the 4096 x 4096 mask for every head and computes the blocks above the diagonal
only to mask them, where ``is_causal=True`` skips them. At this context length attention does
more arithmetic than the rest of each layer, so the whole step pays.

Sources: https://github.com/PKU-YuanGroup/Open-Sora-Plan/issues/109 ("Flash Attention doesn't
support attention mask": forcing the flash kernel with an ``attn_mask``, in test code from the
PyTorch forum thread https://discuss.pytorch.org/t/flash-attention/174955, fails);
https://github.com/lucidrains/muse-maskgit-pytorch/issues/35 (SDPA "will use flash attention when
mask is None, but I guess your mask is usually defined"); and
https://github.com/jingyaogong/minimind/pull/497 ("Improve performance by using is_causal=True
when possible").

Fix: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` and no mask buffer.

A correct diagnosis names the explicit ``attn_mask`` (or the missing ``is_causal=True``) that
keeps the flash kernel out. The healthy neighbour is ``healthy_sdpa_is_causal``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 8192
WIDTH = 512
HEADS = 8
LAYERS = 4
SEQ_LEN = 4096
BATCH_SIZE = 8
STEPS = 40
DEVICE = torch.device("cuda")


def markov_tokens(n: int, length: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Token sequences from a fixed random chain: each token has four likely successors,
    drawn with Zipf's law over the vocabulary (frequent tokens follow many others, as in text),
    so the tokens' frequencies alone are learnt within a few dozen steps (about 5 nats of
    unigram entropy against ln 8192 = 9.0 at the start), and the successors after them."""
    table = torch.Generator(device=device).manual_seed(1234)
    zipf = 1.0 / torch.arange(1, VOCAB + 1, device=device, dtype=torch.float)
    successors = torch.multinomial(zipf, 4 * VOCAB, replacement=True,
                                   generator=table).view(VOCAB, 4)
    generator = torch.Generator(device=device).manual_seed(seed)
    picks = torch.randint(4, (n, length), device=device, generator=generator)
    tokens = torch.empty(n, length, dtype=torch.long, device=device)
    tokens[:, 0] = torch.randint(VOCAB, (n,), device=device, generator=generator)
    for t in range(1, length):
        tokens[:, t] = successors[tokens[:, t - 1], picks[:, t]]
    return tokens


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        # fault: the mask of the hand-written attention this module used to compute, kept
        self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.causal[:t, :t])
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, max_len)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, width: int, heads: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(max_len, width)
        self.blocks = nn.Sequential(*(Block(width, heads, max_len) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.tokens.weight  # tied
        for embedding in (self.tokens, self.positions):
            nn.init.normal_(embedding.weight, std=0.02)  # GPT-2's initialisation

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        return self.head(self.ln_f(self.blocks(x)))


def train(device: torch.device, steps: int = STEPS, seq_len: int = SEQ_LEN,
          batch_size: int = BATCH_SIZE, width: int = WIDTH, layers: int = LAYERS) -> list[float]:
    """Train the language model on the chain; returns the loss of every step (read once)."""
    torch.manual_seed(0)
    corpus = markov_tokens(4 * batch_size, seq_len + 1, device)
    model = TinyGPT(width, HEADS, layers, seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                                  fused=device.type == "cuda")
    generator = torch.Generator(device=device).manual_seed(1)
    losses = []
    for _ in range(steps):
        rows = torch.randint(len(corpus), (batch_size,), device=device, generator=generator)
        batch = corpus[rows]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_long_context_language_model_learns_the_chain() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < first - 0.5  # nats: the chain is being learnt
