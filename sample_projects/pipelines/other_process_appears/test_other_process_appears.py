"""Fault: a process the test starts takes a large share of the training GPU while it trains.

An end-to-end test trains a classifier while a "scoring server" (a second Python process that
loads its own model onto the same GPU) runs beside it, and stops the server in a ``finally:``
block. The server holds 40 GiB of the GPU for as long as it lives: the training run's memory
budget shrinks by that much and the two processes share the GPU, so the test's timings are not
those of a dedicated GPU. When the test ends the server is gone, so nothing looked wrong
afterwards; the probe's NVML samples saw it while the test trained.

Fix: give the helper process its own GPU (``CUDA_VISIBLE_DEVICES``) or the CPU, or run it in
a separate job.

Expected diagnosis: GT134 (other processes during the run).
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

SERVER_MEMORY = 40 * 2**30
FEATURES = 4096
CLASSES = 256
BATCH_SIZE = 8192
STEPS = 250
DEVICE = torch.device("cuda")

# The scoring server: holds its weights on the GPU until told to stop (or its parent is gone).
SERVER = """
import os, sys, time
import torch
size, ready, stop, parent = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
weights = torch.empty(size, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(ready, "w").close()
deadline = time.monotonic() + 300
while not os.path.exists(stop) and os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    ready, stop = folder / "ready", folder / "stop"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(SERVER_MEMORY), str(ready),
                               str(stop), str(os.getpid())])
    deadline = time.monotonic() + 120
    while not ready.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the scoring server did not start (exit {server.poll()})")
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
def test_classifier_trains_beside_the_scoring_server() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE, generator=generator)
    labels = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE, generator=generator)
    features = centroids[labels] + 2.0 * torch.randn(BATCH_SIZE, FEATURES, device=DEVICE,
                                                     generator=generator)
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.GELU(),
                          nn.Linear(FEATURES, FEATURES), nn.GELU(),
                          nn.Linear(FEATURES, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    with tempfile.TemporaryDirectory() as folder:
        server, stop = start_server(Path(folder))  # fault: on the training GPU
        try:
            for step in range(1, STEPS + 1):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(features), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if step == 1:
                    first_loss = loss.item()
        finally:
            stop_server(server, stop)

    assert loss.item() < first_loss
