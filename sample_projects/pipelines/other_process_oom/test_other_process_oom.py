"""Failure on purpose: out of memory because a process the test started holds most of the GPU.

An end-to-end test starts a "feature server" (a second Python process that caches embeddings
on the same GPU) and then trains a wide classifier head on its output. The server grabs nearly
all of the GPU's free memory, so the head's first forward pass cannot get its 8 GiB of logits:
``torch.OutOfMemoryError``. The test stops the server in a ``finally:`` block, so by the time
pytest reports the failure the GPU is empty again; only the failure's own moment (PyTorch's
message and the allocator's out-of-memory observer) shows who held the memory.

Fix: give the server its own GPU (``CUDA_VISIBLE_DEVICES``) or cap its cache; the model itself
fits.

Expected diagnosis: GT201 (out of memory) and GT208 (other processes held the memory); the test
fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

LEFT_FREE = 6 * 2**30  # what the server leaves of the GPU's free memory
FEATURES = 4096
CLASSES = 131072  # logits: 16384 x 131072 float32 = 8 GiB
BATCH_SIZE = 16384
DEVICE = torch.device("cuda")

# The feature server: caches its tensors on the GPU until told to stop (or its parent is gone).
SERVER = """
import os, sys, time
import torch
size, ready, stop, parent = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
cache = torch.empty(size, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(ready, "w").close()
deadline = time.monotonic() + 300
while not os.path.exists(stop) and os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def start_server(folder: Path, size: int) -> tuple[subprocess.Popen[bytes], Path]:
    ready, stop = folder / "ready", folder / "stop"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(size), str(ready), str(stop),
                               str(os.getpid())])
    deadline = time.monotonic() + 120
    while not ready.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the feature server did not start (exit {server.poll()})")
        time.sleep(0.05)
    return server, stop


def stop_server(server: subprocess.Popen[bytes], stop: Path) -> None:
    stop.touch()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_head_trains_on_served_features() -> None:
    torch.manual_seed(0)
    head = nn.Linear(FEATURES, CLASSES).to(DEVICE)  # 2 GiB of weights
    optimizer = torch.optim.SGD(head.parameters(), lr=1e-2)
    features = torch.randn(BATCH_SIZE, FEATURES, device=DEVICE)
    labels = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE)
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()

    with tempfile.TemporaryDirectory() as folder:
        # fault: the server shares the training GPU and takes nearly all of it
        server, stop = start_server(Path(folder), free - LEFT_FREE)
        try:
            for _ in range(3):
                loss = F.cross_entropy(head(features), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        finally:
            stop_server(server, stop)
