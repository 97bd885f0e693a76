"""The run probe's host cost per training step, on any machine (a CPU is enough).

A small training step (an MLP, a loss module, SGD or foreach AdamW, batches from a DataLoader
or not) runs with and without a ``RunProbe`` installed in-process, as the plugin installs it
around a test call (no NVML sampler; the profiler window needs CUDA). Two measures:

- time: thread CPU time per step, the mean of the fastest tenth of ``--blocks`` blocks of
  ``--steps`` steps (the fastest blocks are the ones other processes disturbed least), for
  each side in turn, ``--repeat`` times; the smallest of each side's results is kept;
- work: the Python and C calls made per step (``sys.setprofile``), which no other process can
  disturb, counted after the probe's first forwards (their graphs are all watched).

``diagnose_overhead.py`` measures the whole cost on a GPU (allocator reads, CUPTI, NVML); this
script isolates what the hooks cost the training thread, to compare two versions of the probe:

    python benchmarks/probe_host_cost.py
    python benchmarks/probe_host_cost.py --no-loader --blocks 500
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    import pytest_gputrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from pytest_gputrain.probe.run import RunProbe


def make_step(use_loader: bool, optimizer_name: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer: torch.optim.Optimizer
    if optimizer_name == "adamw":  # foreach AdamW: .item() on each parameter's step counter
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))

    def batches() -> Iterator[Any]:
        while True:
            if use_loader:
                yield from torch.utils.data.DataLoader([batch] * 1000, batch_size=None)
            else:
                yield batch

    stream = batches()

    def step() -> None:
        x, y = next(stream)
        loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def fastest(step: Callable[[], None], blocks: int, steps: int) -> float:
    """Mean thread CPU time per step (s) of the fastest tenth of the blocks."""
    clock = time.thread_time
    times = []
    for _ in range(blocks):
        started = clock()
        for _ in range(steps):
            step()
        times.append((clock() - started) / steps)
    times.sort()
    best = times[:max(1, blocks // 10)]
    return sum(best) / len(best)


def calls_per_step(step: Callable[[], None], steps: int) -> tuple[float, float]:
    counts = [0, 0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[0] += 1
        elif event == "c_call":
            counts[1] += 1

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    return counts[0] / steps, counts[1] / steps


def probed(action: Callable[[], Any]) -> Any:
    probe = RunProbe(torch, "benchmark::probe", profile_steps=None, sampler=False)
    probe.start()
    try:
        return action()
    finally:
        probe.stop()
        if probe.errors:
            raise RuntimeError(f"probe errors: {probe.errors}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-loader", action="store_true", help="no DataLoader in the step")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--blocks", type=int, default=300, help="timed blocks per side")
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--repeat", type=int, default=3, help="alternations of the two sides")
    args = parser.parse_args(argv)
    if min(args.blocks, args.steps, args.repeat) < 1:
        parser.error("--blocks, --steps and --repeat must be at least 1")
    torch.set_num_threads(1)
    step = make_step(not args.no_loader, args.optimizer)
    for _ in range(50):  # warm-up
        step()
    plain_times, probe_times = [], []
    for _ in range(args.repeat):
        plain_times.append(fastest(step, args.blocks, args.steps))
        probe_times.append(probed(lambda: fastest(step, args.blocks, args.steps)))
    plain, probe = min(plain_times), min(probe_times)
    plain_calls = calls_per_step(step, 100)

    def counted() -> tuple[float, float]:
        for _ in range(50):  # past the first forwards, whose graphs are all watched
            step()
        return calls_per_step(step, 100)

    probe_calls = probed(counted)
    loader = "without a DataLoader" if args.no_loader else "with a DataLoader"
    print(f"torch {torch.__version__}, one thread, {loader}, {args.optimizer}")
    print(f"  thread CPU time per step: plain {plain * 1e6:.1f} µs, probe {probe * 1e6:.1f} µs "
          f"(+{(probe - plain) * 1e6:.1f} µs)")
    print(f"  Python calls per step: plain {plain_calls[0]:.0f}, probe {probe_calls[0]:.0f} "
          f"(+{probe_calls[0] - plain_calls[0]:.0f}); C calls: plain {plain_calls[1]:.0f}, "
          f"probe {probe_calls[1]:.0f} (+{probe_calls[1] - plain_calls[1]:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
