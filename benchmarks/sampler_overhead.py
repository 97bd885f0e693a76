"""What the background NVML sampler costs a training loop: the same steps with and without it.

    python benchmarks/sampler_overhead.py                       # CUDA, sampler at 20 Hz
    python benchmarks/sampler_overhead.py --device cpu --rounds 4 --steps 20   # smoke anywhere

A small conv net's training step (forward, backward, SGD with momentum), sized so that one step
takes about 5–10 ms on an H200 (batch chosen by a short calibration), runs ``--rounds`` rounds of
``--steps`` steps with the sampler running (``NvmlSampler``, one NVML read every ``--interval``
seconds on a daemon thread) and as many without, interleaved (on, off, off, on, ...) so that
drift in clocks and temperature hits both alike. Each step is timed on the host clock after
``torch.cuda.synchronize()``, which is where a sampler would show: it competes for the GIL and
the CPU, never for the GPU. The script prints the median step time of each side and their ratio;
the goal is a ratio <= 1.01 (``--check`` makes a miss exit with status 1).

On the CPU (``--device cpu``) the model is an MLP and NVML is usually absent: the sampler then
still wakes every interval and fails its read, which is the same thread cost, minus NVML's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

try:
    import pytest_gputrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_gputrain.collect import nvml
from pytest_gputrain.collect.sampler import NvmlSampler

GOAL = 1.01


from training_step import size_batch  # noqa: E402  (benchmarks/ is on sys.path)


def run_steps(torch: Any, step: Any, device: str, steps: int) -> list[float]:
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    times = []
    sync()
    for _ in range(steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def calibrate(torch: Any, device: str, target: tuple[float, float]) -> tuple[int, Any, float]:
    """A batch whose median step time lands in ``target`` seconds (or the closest tried)."""

    def median_of(step: Any) -> float:
        run_steps(torch, step, device, 5)
        return statistics.median(run_steps(torch, step, device, 20))

    return size_batch(torch, device, target, median_of)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per side (default 20)")
    parser.add_argument("--steps", type=int, default=100, help="steps per round (default 100)")
    parser.add_argument("--interval", type=float, default=0.05,
                        help="sampler interval in seconds (default 0.05: 20 Hz)")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when the ratio is above the goal ({GOAL})")
    args = parser.parse_args(argv)

    import torch

    device = args.device
    if device != "cpu" and not torch.cuda.is_available():
        print("CUDA is not available: use --device cpu", file=sys.stderr)
        return 2
    target = (0.005, 0.010) if device != "cpu" else (0.002, 0.020)
    batch, step, med = calibrate(torch, device, target)
    index = (nvml.index_for_cuda_device(0) or 0) if device != "cpu" else 0
    print(f"device {device}: batch {batch}, calibrated step {med * 1000:.2f} ms; sampler on "
          f"NVML GPU {index} every {args.interval * 1000:.0f} ms "
          f"(NVML {'available' if nvml.shared().available else 'not available'})")
    run_steps(torch, step, device, args.steps)  # warm-up

    with_sampler: list[float] = []
    without: list[float] = []
    reads = 0
    for round_ in range(args.rounds):
        order = (True, False) if round_ % 2 == 0 else (False, True)
        for sampling in order:
            if sampling:
                with NvmlSampler(index, args.interval) as sampler:
                    with_sampler.extend(run_steps(torch, step, device, args.steps))
                reads += sampler.reads
            else:
                without.extend(run_steps(torch, step, device, args.steps))
    on, off = statistics.median(with_sampler), statistics.median(without)
    ratio = on / off
    print(f"median step without sampler: {off * 1000:.3f} ms ({len(without)} steps)")
    print(f"median step with sampler:    {on * 1000:.3f} ms ({len(with_sampler)} steps, "
          f"{reads} NVML reads)")
    print(f"ratio: {ratio:.4f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")
    return 1 if args.check and ratio > GOAL else 0


if __name__ == "__main__":
    sys.exit(main())
