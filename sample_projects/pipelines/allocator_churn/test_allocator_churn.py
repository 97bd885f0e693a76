"""Info: the caching allocator frees and re-allocates its large buffers every step.

A token model (embedding, two residual MLP blocks, bf16 autocast, data on the GPU) trains on
length-bucketed batches that alternate between a short bucket (768 tokens) and a long one (1536
tokens). The job shares its GPU: it caps itself with ``set_per_process_memory_fraction`` at twice
a long step's peak and, following the CUDA notes on ``PYTORCH_CUDA_ALLOC_CONF`` (see
conftest.py), sets ``garbage_collection_threshold:0.5`` to hand cached memory back early and
``max_split_size_mb:128`` against fragmentation. Each bucket's activation buffers are larger
than 128 MiB and of a different size than the other bucket's, so no cached block serves the
other bucket; once the cache passes half the cap, the allocator's garbage collection frees the
other bucket's blocks, and every step cudaMallocs its own again. No out-of-memory error and no
retry; just a cudaFree/cudaMalloc round trip per step.

Fix: pad both buckets to one length, or give the allocator headroom (a higher threshold or no
garbage collection); ``expandable_segments:True`` lets segments grow in place.

Expected diagnosis: nothing at warning level; GT135 as information.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 1024
D_MODEL = 1024
BATCH_SIZE = 32
BUCKETS = (768, 1536)
STEPS = 40
DEVICE = torch.device("cuda")


@pytest.fixture
def memory_cap() -> Iterator[None]:
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)


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


def shifted_copy_batch(length: int, generator: torch.Generator) -> torch.Tensor:
    """Sequences whose next token is the current one plus one: a pattern to learn quickly."""
    start = torch.randint(VOCAB, (BATCH_SIZE, 1), device=DEVICE, generator=generator)
    return (start + torch.arange(length + 1, device=DEVICE)) % VOCAB


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_token_model_on_two_length_buckets(memory_cap: None) -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    model = TokenModel().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(batch: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    # The cap: twice the peak of a long-bucket step, measured once.
    torch.cuda.reset_peak_memory_stats()
    train_step(shifted_copy_batch(BUCKETS[1], generator))
    _, total = torch.cuda.mem_get_info()
    cap = 2 * torch.cuda.max_memory_allocated()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))

    losses = []
    for step in range(STEPS):
        losses.append(train_step(shifted_copy_batch(BUCKETS[step % 2], generator)))
    first, last = float(losses[0]), float(losses[-1])
    print(f"cap {cap / 2**30:.2f} GiB, loss {first:.3f} -> {last:.3f}")
    assert last < first
