"""Overhead of the ``--gpu-diagnose`` run probe on a ResNet-style training loop.

The probe is installed in-process exactly as the plugin installs it around a test call
(``RunProbe.start()`` ... ``RunProbe.stop()``: global hooks, DataLoader wrapper, sync counters,
NVML sampler, profiler window), and the same loop runs in interleaved rounds:

- ``plain``   : no probe (what a run without ``--gpu-diagnose`` executes);
- ``plain2``  : no probe again, to show the noise floor (plain vs plain);
- ``probe``   : the probe installed; step times *outside* its profiler window (and the step right
  after it) are compared;
- ``profiler``: an always-on ``torch.profiler`` over the whole round, for comparison.

Each step copies a pinned batch to the device, runs forward/backward/SGD and reads
``loss.item()`` once (the usual logging sync), so host-clock step times are real step times.
Medians over all rounds are compared. Target on an H200 (ResNet-18, batch 32, fp32, ~10-15 ms per
step; 14.3 ms measured): probe / plain <= 1.03 outside the window.

    python benchmarks/diagnose_overhead.py                   # CUDA, defaults for the H200
    python benchmarks/diagnose_overhead.py --device cpu --steps 20   # smoke run on a CPU
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_gputrain.probe.run import RunProbe
from pytest_gputrain.probe.run_record import StepFlag
from pytest_gputrain.probe.torch_hooks import global_hook_counts


class BasicBlock(nn.Module):
    def __init__(self, inp: int, out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inp != out:
            self.down = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                      nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout (no torchvision needed)."""

    def __init__(self, classes: int = 5, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        channels = width
        for index, out in enumerate((width, width * 2, width * 4, width * 8)):
            stride = 1 if index == 0 else 2
            layers += [BasicBlock(channels, out, stride), BasicBlock(out, out, 1)]
            channels = out
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Ready-made (pinned) batches: the loader adds its own cost, not a collate of images."""

    def __init__(self, count: int, batch: int, size: int, pin: bool) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = []
        for _ in range(count):
            x = torch.randn(batch, 3, size, size, generator=generator)
            y = torch.randint(0, 5, (batch,), generator=generator)
            self.items.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[index]


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any],
                device: torch.device, steps: int) -> list[float]:
    """``steps`` training steps; the host-clock time of each (one loss.item() per step)."""
    times: list[float] = []
    loss_fn = nn.CrossEntropyLoss()
    last = time.perf_counter()
    while len(times) < steps:
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss.item()
            now = time.perf_counter()
            times.append(now - last)
            last = now
            if len(times) == steps:
                break
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=200, help="steps per round and mode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None, help="default 32 (CUDA), 4 (CPU)")
    parser.add_argument("--size", type=int, default=None, help="image size: 224 (CUDA), 64 (CPU)")
    parser.add_argument("--profile-steps", default="3-6", help="the probe's profiler window")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if probe/plain > 1.03 or a hook is left installed")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batch = args.batch or (32 if cuda else 4)
    size = args.size or (224 if cuda else 64)
    first, _, last = args.profile_steps.partition("-")
    window = (int(first), int(last or first)) if args.profile_steps != "off" else None
    torch.manual_seed(0)
    model = ResNet18().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(Batches(16, batch, size, pin=cuda), batch_size=None, shuffle=False)
    torch.backends.cudnn.benchmark = True
    train_steps(model, optimizer, loader, device, 10)  # warm-up: autotuning, allocator, CUPTI-free

    plain_hooks = global_hook_counts(torch)
    results: dict[str, list[float]] = {"plain": [], "plain2": [], "probe": [], "profiler": []}
    window_steps = 0
    probe_errors: list[str] = []
    order = list(results)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for mode in order:
            train_steps(model, optimizer, loader, device, 3)  # settle after the previous mode
            if mode in ("plain", "plain2"):
                assert global_hook_counts(torch) == plain_hooks
                results[mode] += train_steps(model, optimizer, loader, device, args.steps)
            elif mode == "probe":
                probe = RunProbe(torch, "benchmark::probe", profile_steps=window)
                probe.start()
                try:
                    times = train_steps(model, optimizer, loader, device, args.steps)
                finally:
                    probe.stop()
                flags = probe.record.steps.flags
                # Leave out the warm-up, the window and the step after it; steps that began an
                # epoch stay, as they do in the plain rounds.
                kept = [t for i, t in enumerate(times)
                        if i >= 2 and flags[i] in (StepFlag.STEADY, StepFlag.EPOCH_START)]
                window_steps += sum(1 for flag in flags
                                    if flag in (StepFlag.IN_WINDOW, StepFlag.AFTER_WINDOW))
                results[mode] += kept
                probe_errors += probe.errors
                facts = probe.facts()
            else:
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]
                with profile(activities=activities):
                    results[mode] += train_steps(model, optimizer, loader, device, args.steps)
    after = global_hook_counts(torch)

    medians = {mode: statistics.median(times) for mode, times in results.items()}
    ratios = {
        "probe / plain (outside the window)": medians["probe"] / medians["plain"],
        "plain2 / plain (noise floor)": medians["plain2"] / medians["plain"],
        "always-on profiler / plain": medians["profiler"] / medians["plain"],
    }
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    print(f"ResNet-18, batch {batch}, {size}x{size}, fp32, SGD, one loss.item() per step on "
          f"{name}; torch {torch.__version__}")
    print(f"{args.rounds} interleaved rounds x {args.steps} steps per mode; the probe's window "
          f"({args.profile_steps}) and the step after it are left out ({window_steps} steps)")
    for mode, times in results.items():
        print(f"  {mode:9} median {medians[mode] * 1000:8.3f} ms/step over {len(times)} steps "
              f"(p10 {statistics.quantiles(times, n=10)[0] * 1000:.3f}, "
              f"p90 {statistics.quantiles(times, n=10)[-1] * 1000:.3f})")
    for label, value in ratios.items():
        print(f"  {label:38} {value:.4f}")
    print(f"  global torch hooks without the probe: {plain_hooks}")
    print(f"  global torch hooks after the probe rounds: {after}")
    print(f"  last probe run: {facts.steps} steps, profiler window captured "
          f"{facts.profile.captured} ({facts.profile.reason or 'ok'}), busy "
          f"{facts.profile.busy_percent} %, syncs/step {facts.sync.per_step}")
    if probe_errors:
        print(f"  probe errors: {probe_errors}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": name, "batch": batch, "size": size, "medians_s": medians,
            "ratios": ratios, "hooks_plain": plain_hooks, "hooks_after": after,
            "steps": {mode: len(times) for mode, times in results.items()},
        }, indent=2))
    leftover = any(after.values()) or any(plain_hooks.values())
    if args.check and (ratios["probe / plain (outside the window)"] > 1.03 or leftover):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
