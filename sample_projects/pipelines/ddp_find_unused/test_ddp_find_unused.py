"""Info: ``DistributedDataParallel(find_unused_parameters=True)`` on a model that uses every
parameter.

A regression MLP (width 4096, bf16 autocast, data on the GPU) is wrapped in
DistributedDataParallel with ``find_unused_parameters=True``, copied from a multi-task model
that had optional heads. This model uses every parameter in every forward, so DDP's extra
traversal of the autograd graph after each forward finds nothing; it still costs time every
step. DDP itself prints a warning to stderr once; nothing else shows it.

Fix: drop ``find_unused_parameters=True``.

Expected diagnosis: nothing at warning level; GT310 as information.
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
def test_ddp_regressor(process_group: None) -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    features = torch.randn(4 * BATCH_SIZE, FEATURES, device=DEVICE, generator=generator)
    weights = torch.randn(FEATURES, device=DEVICE, generator=generator) / FEATURES ** 0.5
    target = torch.tanh(features @ weights)
    model = nn.parallel.DistributedDataParallel(regressor().to(DEVICE), device_ids=[0],
                                                find_unused_parameters=True)  # not needed
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
