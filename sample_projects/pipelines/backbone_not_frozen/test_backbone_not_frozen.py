"""Fault: a fine-tune gives only the new head to the optimizer but never freezes the backbone.

A sentiment classifier on top of a "pretrained" text encoder (a 6-layer transformer encoder,
d=512; random weights stand in for the pretrained ones, nothing is downloaded). The author meant
to train the head only and built the optimizer from ``model.head.parameters()``, but left the
backbone's ``requires_grad`` on. Nothing fails: the backbone is not updated and the head trains.
Yet every backward computes and stores gradients for the backbone's 23 M parameters that no
optimizer reads: most of the step's backward, and 88 MiB of float32 gradients.

Fix: ``model.backbone.requires_grad_(False)`` before building the optimizer; autograd then stops
at the head.

Expected diagnosis: GT145 (gradients nobody uses) at warning level: the backbone's gradient
memory (exact) and the GPU time their backward takes (estimated from their share of the
parameters and the GPU's time per step).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 8192
WIDTH = 512
LAYERS = 6
SEQUENCE = 128
CLASSES = 8
BATCH_SIZE = 64
STEPS = 60
DEVICE = torch.device("cuda")


class SentimentModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=8, dim_feedforward=4 * WIDTH,
                                           batch_first=True, norm_first=True)
        self.backbone = nn.ModuleDict({
            "embed": nn.Embedding(VOCAB, WIDTH),
            "encoder": nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False),
        })
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone["encoder"](self.backbone["embed"](tokens))
        return self.head(hidden.mean(dim=1))


def reviews(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    tokens = torch.randint(VOCAB, (n, SEQUENCE), device=DEVICE, generator=generator)
    labels = tokens[:, :4].sum(dim=1) % CLASSES  # a label the first tokens decide
    return tokens, labels


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_head_fine_tune_trains() -> None:
    torch.manual_seed(0)
    tokens, labels = reviews(8 * BATCH_SIZE, seed=0)
    model = SentimentModel().to(DEVICE)  # "pretrained" backbone + a new head
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)  # the head only...
    # fault: ...but model.backbone.requires_grad_(False) is missing

    losses = []
    for step in range(STEPS):
        rows = slice((step % 8) * BATCH_SIZE, (step % 8 + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(tokens[rows]), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == STEPS - 1:
            losses.append(loss.item())

    assert all(torch.isfinite(torch.tensor(losses)))
