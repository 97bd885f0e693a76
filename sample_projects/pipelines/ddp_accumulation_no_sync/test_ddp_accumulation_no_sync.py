"""Fault: gradient accumulation under DistributedDataParallel without ``no_sync()``.

A regression MLP (width 4096, bf16 autocast, data on the GPU) is trained with
DistributedDataParallel and four micro-batches per optimizer step. Every ``loss.backward()``
all-reduces all gradients across the ranks, although only the last one before
``optimizer.step()`` is used: three of the four all-reduces per step are wasted. The test runs
a one-process NCCL group (the smoke test of a multi-GPU script); at N ranks the waste is three
full gradient all-reduces per step.

Fix: ``with model.no_sync():`` around the first three micro-batches' forward and backward.

Expected diagnosis: GT309 (DDP micro-batches that all synchronise gradients).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
WIDTH = 4096
MICRO_BATCH = 2048
ACCUMULATION = 4
STEPS = 30
DEVICE = torch.device("cuda", 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def process_group() -> Iterator[None]:
    torch.cuda.set_device(DEVICE)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, device_id=DEVICE)
    yield
    dist.destroy_process_group()


def regressor() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.GELU(),
                         nn.Linear(WIDTH, WIDTH), nn.GELU(),
                         nn.Linear(WIDTH, WIDTH), nn.GELU(),
                         nn.Linear(WIDTH, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_ddp_regressor_with_gradient_accumulation(process_group: None) -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    features = torch.randn(8 * MICRO_BATCH, FEATURES, device=DEVICE, generator=generator)
    weights = torch.randn(FEATURES, device=DEVICE, generator=generator) / FEATURES ** 0.5
    target = torch.tanh(features @ weights)
    model = nn.parallel.DistributedDataParallel(regressor().to(DEVICE), device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    losses = []
    micro = 0
    for _ in range(STEPS):
        for _ in range(ACCUMULATION):
            rows = slice((micro % 8) * MICRO_BATCH, (micro % 8 + 1) * MICRO_BATCH)
            micro += 1
            with torch.autocast("cuda", dtype=torch.bfloat16):
                prediction = model(features[rows]).squeeze(1)
            loss = F.mse_loss(prediction.float(), target[rows]) / ACCUMULATION
            loss.backward()  # fault: all-reduces on every micro-batch (no model.no_sync())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    first, last = torch.stack(losses[:4]).mean(), torch.stack(losses[-4:]).mean()
    assert float(last) < float(first)
