"""Fault: ``torch._dynamo.config.suppress_errors = True`` hides a compile failure.

A token model uses a custom activation from an in-house op library
(``torch.library.custom_op`` with an autograd formula but no fake kernel). torch.compile cannot
trace an op without a fake kernel and raises; someone set ``suppress_errors = True`` to get past
the error. Dynamo now logs the failure and runs the whole forward eagerly: the test passes and
everyone believes the model is compiled.

Fix: turn ``suppress_errors`` off and give the op a fake kernel
(``scaled_tanh.register_fake(lambda x, scale: torch.empty_like(x))``).

Expected diagnosis: GT133 (frames that failed to compile, with errors suppressed).
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

torch._dynamo.config.suppress_errors = True  # fault: compile errors become a log line


@torch.library.custom_op("sample_ops::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The in-house activation: scale * tanh(x / scale). No fake kernel is registered."""
    return torch.tanh(x / scale) * scale


def _scaled_tanh_backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (output,) = ctx.saved_tensors  # type: ignore[attr-defined]
    scale = ctx.scale  # type: ignore[attr-defined]
    return grad * (1 - (output / scale) ** 2), None


def _scaled_tanh_setup(ctx: object, inputs: tuple[torch.Tensor, float],
                       output: torch.Tensor) -> None:
    ctx.save_for_backward(output)  # type: ignore[attr-defined]
    ctx.scale = inputs[1]  # type: ignore[attr-defined]


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


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
        return x + self.down(scaled_tanh(self.up(self.norm(x)), 3.0))


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.Sequential(ResidualMLP(), ResidualMLP())
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_token_model_with_custom_activation() -> None:
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
