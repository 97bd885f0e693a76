"""Fault: the CUDA allocator's history recording, turned on during an out-of-memory hunt, was
never turned off.

A tabular classifier (an MLP of six 512-wide layers) trains at batch 512 under bf16 autocast.
Weeks ago someone chased an out-of-memory error with a memory snapshot
(``torch.cuda.memory._record_memory_history``); the call stayed. With history recording on, the
caching allocator captures a stack trace (Python and C++ frames, the default) at every
allocation and free, a few hundred per step, and keeps them in host memory. The step was
already launch-bound; the stack captures make the host slower still, and the GPU waits for it.

Fix: ``torch.cuda.memory._record_memory_history(enabled=None)`` after dumping the snapshot, or
record in a separate debugging run (see ``healthy_memory_snapshot``).

Expected diagnosis: GT144 (debugging instrument left on) at warning level, with the allocator
calls per step; the launch-bound finding (GT137, info) defers to it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 64
HIDDEN = 512
LAYERS = 6
CLASSES = 16
BATCH_SIZE = 512
STEPS = 400
LOG_EVERY = 100
DEVICE = torch.device("cuda")


def tabular_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE,
                            generator=torch.Generator(device=DEVICE).manual_seed(7))
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    rows = centroids[labels] + torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    return rows, labels


def mlp() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(FEATURES, HIDDEN), nn.GELU()]
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(HIDDEN, CLASSES))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tabular_classifier_trains() -> None:
    torch.manual_seed(0)
    rows, labels = tabular_data(16 * BATCH_SIZE, seed=0)
    model = mlp().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # fault: left from an out-of-memory hunt; never turned off, never dumped
    torch.cuda.memory._record_memory_history(max_entries=100_000)

    first = None
    for step in range(STEPS):
        start = (step % 16) * BATCH_SIZE
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(rows[start:start + BATCH_SIZE]),
                                   labels[start:start + BATCH_SIZE])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % LOG_EVERY == 0:
            value = loss.item()
            first = value if first is None else first

    assert loss.item() < first
