"""Failure on purpose: a CUDA graph capture of a training step that logs the loss inside it.

The training step of a small MLP is captured into a CUDA graph the way PyTorch's CUDA notes
show (static input tensors, three warm-up iterations on a side stream, forward, loss, backward
and optimizer step inside ``torch.cuda.graph``), with one addition: the loss is logged inside
the capture. ``loss.item()`` waits for a result, which a capturing stream cannot give, so CUDA
refuses with ``operation not permitted when stream is capturing``; the capture is invalidated and
ending it raises ``CUDA error: operation failed due to a previous error during capture``.

Fix: log after ``g.replay()``, reading the static loss tensor outside the capture.

Expected diagnosis: GT213 (CUDA graph capture error), the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 512
HIDDEN = 2048
CLASSES = 10
BATCH_SIZE = 1024
WARMUP = 3
REPLAYS = 50
DEVICE = torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_training_step_learns() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Linear(HIDDEN, CLASSES)).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE)
    static_y = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE)
    static_x = centroids[static_y] + torch.randn(BATCH_SIZE, FEATURES, device=DEVICE)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_x), static_y).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = F.cross_entropy(model(static_x), static_y)
        print(f"captured loss {static_loss.item():.4f}")  # fault: a sync inside the capture
        static_loss.backward()
        optimizer.step()

    for _ in range(REPLAYS):
        labels = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE)
        static_x.copy_(centroids[labels] + torch.randn(BATCH_SIZE, FEATURES, device=DEVICE))
        static_y.copy_(labels)
        graph.replay()
    assert static_loss.item() < 0.5
