"""Info: ``torch.compile`` applied to the DistributedDataParallel wrapper.

A regression MLP (width 4096, bf16 autocast, data on the GPU, a one-process NCCL group) is
wrapped in DistributedDataParallel and the wrapper is compiled:
``torch.compile(DistributedDataParallel(model))``. It works, but dynamo then traces DDP's
forward and splits the graph at DDP's gradient buckets; the torch.compile documentation
recommends compiling the inner model and wrapping that.

Fix: ``DistributedDataParallel(torch.compile(model), device_ids=[rank])``.

Expected diagnosis: nothing at warning level; GT136 as information.
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
BATCH_SIZE = 4096
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
def test_compiled_ddp_regressor(process_group: None) -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    features = torch.randn(4 * BATCH_SIZE, FEATURES, device=DEVICE, generator=generator)
    weights = torch.randn(FEATURES, device=DEVICE, generator=generator) / FEATURES ** 0.5
    target = torch.tanh(features @ weights)
    ddp = nn.parallel.DistributedDataParallel(regressor().to(DEVICE), device_ids=[0])
    model = torch.compile(ddp)  # info: compiles the wrapper, not the model inside
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    losses = []
    for step in range(STEPS):
        rows = slice((step % 4) * BATCH_SIZE, (step % 4 + 1) * BATCH_SIZE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            prediction = model(features[rows]).squeeze(1)
        loss = F.mse_loss(prediction.float(), target[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    first, last = torch.stack(losses[:4]).mean(), torch.stack(losses[-4:]).mean()
    assert float(last) < float(first)
