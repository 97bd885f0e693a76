"""Fault: a full Python garbage collection after every training step.

A text classifier (a transformer encoder over token ids, bf16 autocast, data on the GPU) frees
"what the step left behind" after each optimizer step: ``del logits, loss`` and
``gc.collect()``. CPython already frees those tensors when their last reference goes; the
collection only walks every object the process holds to look for reference cycles (about
180,000 once torch, pytest and this plugin are imported), on the host, each time, while the GPU,
which finished the step's few milliseconds of work long before, waits for the next launch.

Sources: https://github.com/huggingface/peft/pull/2894 (a training script "calling
cuda.empty_cache() and gc.collect() after each step ... slows down training considerably";
removing ``gc.collect()`` alone took 250 steps from 108 s to 65 s with the same memory);
https://github.com/Mikubill/sd-webui-controlnet/issues/1462 ("Calling gc.collect() can
sometimes cause blocking for 200ms"); https://github.com/NVIDIA/Megatron-Energon/pull/66
("GC collect is slowing down the iteration").

Fix: drop the per-step ``gc.collect()`` (collect every few hundred steps at most, or at epoch
ends, as torchtitan's and torchtnt's ``GarbageCollector`` do).

A correct diagnosis names ``gc.collect()`` (the garbage collection) as the host time between
steps.
"""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 4096
CLASSES = 8
WIDTH = 256
LAYERS = 4
SEQ_LEN = 128
BATCH_SIZE = 256
STEPS = 60
DEVICE = torch.device("cuda")


def make_corpus(n: int, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences whose class decides which quarter of the vocabulary most tokens come
    from (the rest is noise from the whole vocabulary)."""
    generator = torch.Generator(device=device).manual_seed(0)
    labels = torch.randint(CLASSES, (n,), device=device, generator=generator)
    band = VOCAB // CLASSES
    topical = labels[:, None] * band + torch.randint(band, (n, length), device=device,
                                                     generator=generator)
    noise = torch.randint(VOCAB, (n, length), device=device, generator=generator)
    mix = torch.rand(n, length, device=device, generator=generator) < 0.6
    return torch.where(mix, topical, noise), labels


class TextClassifier(nn.Module):
    def __init__(self, width: int, layers: int, length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Parameter(torch.zeros(length, width))
        layer = nn.TransformerEncoderLayer(width, nhead=width // 64, dim_feedforward=4 * width,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.tokens(ids) + self.positions[: ids.shape[1]])
        return self.head(x.mean(1))


def train(device: torch.device, steps: int = STEPS, batch_size: int = BATCH_SIZE,
          seq_len: int = SEQ_LEN, width: int = WIDTH) -> list[float]:
    """Train the classifier; returns the loss of every step (read once, at the end)."""
    torch.manual_seed(0)
    ids, labels = make_corpus(8 * batch_size, seq_len, device)
    model = TextClassifier(width, LAYERS, seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    losses = []
    for step in range(steps):
        rows = slice((step % 8) * batch_size, (step % 8 + 1) * batch_size)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(ids[rows])
        loss = F.cross_entropy(logits.float(), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        del logits, loss
        gc.collect()  # fault: "free memory after every step"
    return torch.stack(losses).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_text_classifier_learns_the_topics() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < 0.5 * first
