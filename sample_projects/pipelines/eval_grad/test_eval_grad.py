"""Fault: the validation loop runs with autograd on (no ``torch.no_grad()``).

A review-sentiment transformer is validated every 50 steps. The loop calls ``model.eval()``,
which switches dropout and normalisation to inference behaviour but does *not* turn off gradient
tracking, and forgets ``torch.no_grad()`` / ``torch.inference_mode()``. Every validation forward
builds an autograd graph and keeps all its activations until the output is dropped, although no
backward follows: validation costs about as much memory as a training step and runs slower.

Expected diagnosis: GT109 (forwards in grad mode with no backward).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 4096
SEQ_LEN = 256
D_MODEL = 512
LAYERS = 4
HEADS = 8
BATCH_SIZE = 128
STEPS = 200
EVAL_EVERY = 50
LOG_EVERY = 50
DEVICE = torch.device("cuda")


def reviews(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences; positive reviews use more 'good' words (ids 0-63) than 'bad' (64-127)."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    tokens = torch.randint(128, VOCAB, (n, SEQ_LEN), device=DEVICE, generator=generator)
    labels = torch.randint(2, (n,), device=DEVICE, generator=generator)
    n_sentiment = 24
    positions = torch.rand(n, SEQ_LEN, device=DEVICE, generator=generator).argsort(1)
    positions = positions[:, :n_sentiment]
    polarity = torch.rand(n, n_sentiment, device=DEVICE, generator=generator) < 0.75
    polarity = polarity == labels.bool()[:, None]  # mostly matches the label
    words = torch.randint(64, (n, n_sentiment), device=DEVICE, generator=generator)
    words = torch.where(polarity, words, words + 64)
    tokens.scatter_(1, positions, words)
    return tokens, labels


class SentimentModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Parameter(torch.zeros(SEQ_LEN, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.embed(tokens) + self.positions)
        return self.head(x.mean(1))


def validate(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()  # fault: eval() does not disable autograd, and there is no torch.no_grad()
    correct = 0
    for batch, target in zip(tokens.split(BATCH_SIZE), labels.split(BATCH_SIZE), strict=True):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch)
        correct += (logits.argmax(1) == target).sum().item()
    model.train()
    return correct / len(labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sentiment_model_validation_accuracy() -> None:
    torch.manual_seed(0)
    train_tokens, train_labels = reviews(STEPS * BATCH_SIZE, seed=0)
    val_tokens, val_labels = reviews(16 * BATCH_SIZE, seed=1)
    model = SentimentModel().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    accuracies = []
    for step in range(1, STEPS + 1):
        rows = slice((step - 1) * BATCH_SIZE, step * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(train_tokens[rows]), train_labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % LOG_EVERY == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
        if step % EVAL_EVERY == 0:
            accuracies.append(validate(model, val_tokens, val_labels))
            print(f"step {step:4d}  validation accuracy {accuracies[-1]:.3f}")

    assert accuracies[-1] > 0.9
