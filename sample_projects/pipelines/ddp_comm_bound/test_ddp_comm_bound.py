"""Info: DDP on two GPUs with a wide model at a tiny batch: every step waits for the all-reduce.

A 270 M-parameter regression model (four 8192x8192 linear layers) trained with
``DistributedDataParallel`` over NCCL on two GPUs at 4 samples per GPU. The forward and backward
passes take about a millisecond; the all-reduce of 1 GiB of fp32 gradients takes several, and
little of it overlaps the backward pass. Rank 0 trains in the test process and starts rank 1 as
a second process, as a quick two-GPU check does. Nothing is misconfigured (NCCL, one GPU per
rank, TF32 on), so this is information: the step is communication-bound.

Fix: a larger batch per GPU, gradient accumulation with ``no_sync()``, or a compression hook
(``bf16_compress_hook``).

Expected diagnosis (rank 0): nothing at warning level; info GT311 (communication-bound).
Needs two GPUs.
"""

from __future__ import annotations

import multiprocessing
import socket

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed
nn = torch.nn
F = torch.nn.functional

WIDTH = 8192
LAYERS = 4
BATCH_PER_GPU = 4
WORLD_SIZE = 2
STEPS = 30
LOG_EVERY = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wide_regressor() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def train(rank: int, port: int) -> tuple[list[float], bool]:
    """One rank's training; returns the logged losses and whether the ranks' weights agree."""
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    torch.set_float32_matmul_precision("high")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        torch.manual_seed(0)  # the same initial model on both ranks
        teacher = torch.randn(WIDTH, 1, device=device) / WIDTH ** 0.5
        model = nn.parallel.DistributedDataParallel(wide_regressor().to(device),
                                                    device_ids=[rank])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator(device=device).manual_seed(1000 + rank)
        logged: list[float] = []
        for step in range(1, STEPS + 1):
            x = torch.randn(BATCH_PER_GPU, WIDTH, device=device, generator=generator)
            loss = F.mse_loss(model(x), x @ teacher)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step == 1 or step % LOG_EVERY == 0:
                logged.append(loss.item())
                if rank == 0:
                    print(f"step {step:3d}  loss {logged[-1]:.4f}")
        checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
        sums = [torch.zeros_like(checksum) for _ in range(WORLD_SIZE)]
        dist.all_gather(sums, checksum)
        return logged, all(torch.allclose(other, sums[0]) for other in sums)
    finally:
        dist.destroy_process_group()


def _peer(rank: int, port: int) -> None:
    train(rank, port)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < WORLD_SIZE,
                    reason="needs two CUDA GPUs")
def test_wide_regressor_on_two_gpus() -> None:
    port = free_port()
    peer = multiprocessing.get_context("spawn").Process(target=_peer, args=(1, port))
    peer.start()
    try:
        logged, in_sync = train(0, port)
    finally:
        peer.join(timeout=120)
        if peer.is_alive():
            peer.kill()
    assert peer.exitcode == 0
    assert in_sync, "the ranks' weights diverged"
    assert all(loss == loss and loss < 1e3 for loss in logged)  # finite, not diverging
