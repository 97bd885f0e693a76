"""Fault: variable-length batches fragment the CUDA caching allocator under a tight budget.

A deep-averaging document classifier (token embeddings, residual MLP blocks applied to every
token, a masked mean, a linear head) pads each batch to its own longest document (dynamic
padding, as ``DataCollatorWithPadding`` does). Document lengths are long-tailed (log-normal,
16-2048 tokens), so every step asks the allocator for activation buffers of a different size.
The job's memory budget (``set_per_process_memory_fraction``) was sized from one max-length
batch plus 20 %.

Why the allocator has to retry (``memory_stats()["num_alloc_retries"] > 0``): the caching
allocator keeps every freed block in the segment it was cut from and serves a request from the
smallest cached free block that is large enough, splitting it; if none fits, it asks cudaMalloc
for a new segment. Batches of changing length leave the cache full of segments cut to the wrong
sizes: unconstrained, this run reserves more than its peak of allocated memory. Under the
budget, a request that fits no cached block and would push the reserved total past the budget
makes the allocator free every wholly unused cached segment and try again: a retry. Live
tensors never exceed a max-length step, which fits the budget with 20 % to spare, so the retry
succeeds and the test passes; but each retry is a synchronising cudaFree/cudaMalloc round, and
with less slack the segments that are only partly in use make the same request fail, with
memory "reserved by PyTorch but unallocated" in the OOM message.

Measured on an H200 (torch 2.11, CUDA 13): budget 4.16 GiB, one retry, peak reserved 98 % of
the budget, test passed, identical in repeated fresh processes. The window is narrow: +25 %
gives no retry, and at batch 8 or 16 the retries end in OOM instead. Another GPU, torch or
cuBLAS version can move it either way.

Fix: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; bucket batches by length or pad to a
few fixed lengths.

Expected diagnosis: GT110 (allocator retries: fragmentation). The reserved memory runs up to the
budget before each retry, so GT107 (peak reserved > 90 % of the budget) comes with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
pad_sequence = torch.nn.utils.rnn.pad_sequence

VOCAB = 8192
PAD = 0
TOPICS = 4
D_MODEL = 512
BLOCKS = 4
BATCH_SIZE = 32
MIN_LEN, MAX_LEN = 16, 2048
STEPS = 200
HEADROOM = 1.2  # budget = peak of a max-length step + 20 %
LOG_EVERY = 50
DEVICE = torch.device("cuda")


@pytest.fixture
def memory_budget() -> Iterator[None]:
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def corpus(n: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Pre-tokenised documents of log-normal length; a topic sets a third of the words."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    raw = torch.randn(n, device=DEVICE, generator=generator) * 0.9 + math.log(300)
    lengths = raw.exp().round().clamp(MIN_LEN, MAX_LEN).long().tolist()
    topics = torch.randint(TOPICS, (n,), device=DEVICE, generator=generator)
    topic_words = VOCAB // 2 // TOPICS
    documents = []
    for length, topic in zip(lengths, topics.tolist(), strict=True):
        words = torch.randint(VOCAB // 2, VOCAB, (length,), device=DEVICE, generator=generator)
        on_topic = torch.rand(length, device=DEVICE, generator=generator) < 0.33
        topical = 1 + topic * topic_words + torch.randint(
            topic_words - 1, (length,), device=DEVICE, generator=generator)
        documents.append(torch.where(on_topic, topical, words))
    return documents, topics


class ResidualMLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class DocumentClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=PAD)
        self.blocks = nn.Sequential(*(ResidualMLP(D_MODEL) for _ in range(BLOCKS)))
        self.head = nn.Linear(D_MODEL, TOPICS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keep = (tokens != PAD).unsqueeze(-1)
        x = self.blocks(self.embed(tokens))
        pooled = (x * keep).sum(1) / keep.sum(1)
        return self.head(pooled)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_document_classifier_with_dynamic_padding(memory_budget: None) -> None:
    torch.manual_seed(0)
    documents, topics = corpus(STEPS * BATCH_SIZE, seed=0)
    model = DocumentClassifier().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def train_step(batch: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(batch), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    # Size the job's budget from one max-length batch, plus 20 %.
    longest = torch.randint(1, VOCAB, (BATCH_SIZE, MAX_LEN), device=DEVICE)
    first_loss = train_step(longest, topics[:BATCH_SIZE]).item()
    peak = torch.cuda.max_memory_allocated()
    _, total = torch.cuda.mem_get_info()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, peak * HEADROOM / total))
    print(f"memory budget {peak * HEADROOM / 2**30:.2f} GiB of {total / 2**30:.0f} GiB")

    losses = []
    for step in range(STEPS):
        rows = slice(step * BATCH_SIZE, (step + 1) * BATCH_SIZE)
        batch = pad_sequence(documents[rows], batch_first=True, padding_value=PAD)
        loss = train_step(batch, topics[rows])
        if (step + 1) % LOG_EVERY == 0:
            losses.append(loss.item())
            print(f"step {step + 1:4d}  tokens/batch {batch.numel():6d}  loss {losses[-1]:.4f}")

    assert losses[-1] < 0.5 * first_loss
