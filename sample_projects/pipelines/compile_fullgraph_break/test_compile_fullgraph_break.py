"""Failure on purpose: ``torch.compile(fullgraph=True)`` on a forward with a Python branch on a
tensor's value.

A small regression MLP rescales its hidden activations only "when they blow up": ``if
h.abs().max().item() > CLIP``. Eager mode runs it. ``torch.compile(model, fullgraph=True)``
must turn the whole forward into one graph, and a Python ``if`` on a value that exists only on
the GPU cannot be traced: Dynamo raises at the first call (``torch._dynamo.exc.UserError: Could
not guard on data-dependent expression ...``; releases that do not capture ``.item()`` raise
``Unsupported`` for the graph break instead). Dynamo stops before Inductor compiles anything,
so the failure costs only the trace.

Fix: express the branch with tensor ops (``torch.where(h.abs().amax() > CLIP, h / scale, h)``,
or ``torch.clamp``), or drop ``fullgraph=True`` and accept a graph break.

Expected diagnosis: GT214 (compile error), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 64
HIDDEN = 1024
BATCH_SIZE = 512
STEPS = 60
CLIP = 50.0
DEVICE = torch.device("cuda")


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.out = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.inp(x))
        if h.abs().max().item() > CLIP:  # fault: data-dependent Python control flow
            h = h / h.abs().max()
        return self.out(h).squeeze(-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_regressor_fits() -> None:
    torch.manual_seed(0)
    weights = torch.randn(FEATURES, device=DEVICE)
    model = torch.compile(Regressor().to(DEVICE), fullgraph=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    for _ in range(STEPS):
        x = torch.randn(BATCH_SIZE, FEATURES, device=DEVICE)
        loss = F.mse_loss(model(x), x @ weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 2.0
