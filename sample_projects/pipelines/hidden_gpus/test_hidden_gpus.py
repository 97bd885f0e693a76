"""Failure on purpose: every GPU hidden from the process by ``CUDA_VISIBLE_DEVICES``.

A CI job meant to pin tests to GPU 0 exported ``CUDA_VISIBLE_DEVICES=`` (empty: a variable
expanded from an unset one). torch then sees no device: ``torch.cuda.is_available()`` is False,
and a training test that assumes the GPU fails at ``model.to("cuda")`` with ``RuntimeError: No
CUDA GPUs are available``. The variable is read once, when CUDA starts, so the runner sets it
for this sample's process (``env`` in EXPECTED.toml). On a CPU-only torch build the same test
fails with "Torch not compiled with CUDA enabled": the same finding, another cause.

Fix: set ``CUDA_VISIBLE_DEVICES`` to an existing index (or unset it) before Python starts, and
mark GPU tests ``requires_cuda`` so that a machine without a usable GPU skips them with the
reason instead of failing.

Expected diagnosis: GT216 (CUDA unavailable at use), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB = 64
LENGTH = 16
BATCH_SIZE = 256
STEPS = 40
DEVICE = torch.device("cuda")


def test_embedding_model_trains() -> None:  # fault in the environment: no visible GPU
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 64), nn.Flatten(), nn.Linear(LENGTH * 64, 2))
    model = model.to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    for _ in range(STEPS):
        tokens = torch.randint(VOCAB, (BATCH_SIZE, LENGTH), device=DEVICE)
        labels = tokens[:, 0] % 2  # the parity of the first token
        loss = F.cross_entropy(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.3
