"""Power of the regression gate on a real training step: does it catch a 5 % slowdown, and does
it stay quiet when nothing changed?

    python benchmarks/regression_power.py                      # CUDA: 20 + 20 trials
    python benchmarks/regression_power.py --device cpu --trials 3   # smoke run anywhere

A small conv net's training step (forward, backward, SGD) is sized to take 5–10 ms on the GPU
(an MLP step on the CPU). The *slowed* step is the same step plus extra work calibrated to
``--slowdown`` (5 %) of its median time: on CUDA a spinning kernel (``torch.cuda._sleep``) queued
on the same stream, on the CPU a busy-wait; the calibration is then checked by measurement.

Each trial times a baseline side and another side (slowed, or the unchanged step) with the
``gpu_benchmark`` machinery (CUDA events, ``--warmup`` untimed steps, ``--rounds`` <= 100 timed
steps per side, NVML throttle flags), and asks the gate (Mann–Whitney one-sided, ``--alpha``,
median change above ``--threshold``) for a verdict. Trials of the two kinds alternate so that
drift in clocks or temperature hits both alike. Goal: >= 19/20 slowdowns caught and <= 1/20
false alarms.

The threshold (default 2.5 %) is the smallest change the gate reports: a slowdown well above it
(here 5 %) should be caught nearly every time; one right at it only half the time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

try:
    import pytest_gputrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training_step import size_batch as shared_size_batch

from pytest_gputrain.regression.benchmark import BenchmarkOptions, BenchmarkResult, measure
from pytest_gputrain.regression.compare import GateSettings, compare_test
from pytest_gputrain.regression.output import format_p, format_seconds
from pytest_gputrain.regression.stats import median
from pytest_gputrain.regression.store import ResultRecord


def timed(step: Any, device: str, rounds: int, warmup: int) -> BenchmarkResult:
    options = BenchmarkOptions(warmup=warmup, min_rounds=rounds, max_rounds=rounds,
                               max_time=3600.0)
    return measure(step, options=options, device=device, fingerprint=False)


def size_batch(torch: Any, device: str, target: tuple[float, float]) -> tuple[int, Any, float]:
    """A batch whose step median lands in ``target`` seconds (or the closest tried)."""
    return shared_size_batch(torch, device, target,
                             lambda step: timed(step, device, 30, 10).median, tries=6)


class ExtraWork:
    """Honest extra work of a chosen duration: a spinning GPU kernel, or a CPU busy-wait."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.device = device
        self.amount = 0.0  # GPU: kernel cycles; CPU: seconds
        self.per_second = 1.0
        if device != "cpu":
            self.per_second = self._cycles_per_second()

    def _cycles_per_second(self) -> float:
        cuda = self.torch.cuda
        cycles = 2_000_000
        for _ in range(3):
            cuda._sleep(cycles)
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return 20 * cycles / (start.elapsed_time(end) / 1000)

    def set_seconds(self, seconds: float) -> None:
        self.amount = seconds * self.per_second

    @property
    def seconds(self) -> float:
        return self.amount / self.per_second

    def __call__(self) -> None:
        if self.device == "cpu":
            end = time.perf_counter() + self.amount
            while time.perf_counter() < end:
                pass
        elif self.amount >= 1:
            self.torch.cuda._sleep(int(self.amount))


def calibrate(step: Any, extra: ExtraWork, device: str, slowdown: float, rounds: int,
              warmup: int) -> float:
    """Size the extra work to ``slowdown`` of the median step, then measure what it does
    (three interleaved pairs of blocks); returns the measured slowdown. The extra work runs in
    series with the step (same stream, or the same thread), so its time adds to the step's."""

    def slowed() -> None:
        step()
        extra()

    base = median([timed(step, device, rounds, warmup).median for _ in range(3)])
    extra.set_seconds(slowdown * base)
    base_medians, slow_medians = [], []
    for _ in range(3):
        base_medians.append(timed(step, device, rounds, warmup).median)
        slow_medians.append(timed(slowed, device, rounds, warmup).median)
    return median(slow_medians) / median(base_medians) - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--trials", type=int, default=20, help="trials of each kind (20)")
    parser.add_argument("--rounds", type=int, default=100, help="timed steps per side (<= 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per side (10)")
    parser.add_argument("--slowdown", type=float, default=0.05, help="injected slowdown (0.05)")
    parser.add_argument("--threshold", type=float, default=0.025,
                        help="gate: smallest median change reported (0.025 = 2.5 %%)")
    parser.add_argument("--alpha", type=float, default=0.01, help="gate: significance (0.01)")
    parser.add_argument("--json", metavar="PATH", help="also write every trial as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 100:
        parser.error("--rounds must be between 1 and 100")

    import torch

    device = args.device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            parser.error("CUDA is not available here; use --device cpu")
        torch.backends.cudnn.benchmark = True
        name = torch.cuda.get_device_name(torch.device(device))
        target = (0.005, 0.010)
    else:
        torch.set_num_threads(min(4, torch.get_num_threads()))
        name = "CPU"
        target = (0.001, 0.003)
    batch, step, step_median = size_batch(torch, device, target)
    extra = ExtraWork(torch, device)
    measured = calibrate(step, extra, device, args.slowdown, args.rounds, args.warmup)
    model = "MLP (512-1024-1024-10)" if device == "cpu" else "conv net (4 conv + linear, 64x64)"
    print(f"device: {name} ({device}), torch {torch.__version__}")
    print(f"step: {model}, batch {batch}, SGD training step, median "
          f"{format_seconds(step_median)}")
    how = "spinning kernel torch.cuda._sleep" if device != "cpu" else "CPU busy-wait"
    print(f"slowdown: extra work of {format_seconds(extra.seconds)} per step ({how}), "
          f"calibrated to {args.slowdown * 100:g} %, measured {measured * 100:+.2f} %")
    print(f"gate: step_time threshold {args.threshold * 100:g} %, alpha {args.alpha:g}, "
          f"Mann-Whitney one-sided; {args.rounds} timed steps per side after {args.warmup} "
          "warm-up steps; throttled rounds left out")
    print()

    def slowed() -> None:
        step()
        extra()

    gate = GateSettings({"step_time": args.threshold}, alpha=args.alpha)
    rows: list[dict[str, Any]] = []
    header = (f"{'trial':>5}  {'kind':<9}  {'baseline':>10}  {'other':>10}  {'change':>8}  "
              f"{'p-value':>8}  {'throttled':>9}  verdict")
    print(header)
    for trial in range(1, args.trials + 1):
        for kind, other_step in (("slowed", slowed), ("unchanged", step)):
            base = timed(step, device, args.rounds, args.warmup)
            other = timed(other_step, device, args.rounds, args.warmup)
            base.nodeid = other.nodeid = "power"
            record = ResultRecord("power", {}, "", base.rounds, base.metrics(), base.summary())
            (row,) = compare_test(other, record, gate)
            throttled = f"{base.throttled_count}/{other.throttled_count}"
            print(f"{trial:>5}  {kind:<9}  {format_seconds(row.baseline_median):>10}  "
                  f"{format_seconds(row.current_median):>10}  "
                  f"{(row.change or 0) * 100:>+7.2f}%  {format_p(row.p_value):>8}  "
                  f"{throttled:>9}  {row.label}", flush=True)
            rows.append({"trial": trial, "kind": kind, **row.to_json()})
    caught = sum(1 for r in rows if r["kind"] == "slowed" and r["verdict"] == "regression")
    alarms = sum(1 for r in rows if r["kind"] == "unchanged" and r["verdict"] == "regression")
    n = args.trials
    caught_goal, alarm_goal = -(-19 * n // 20), n // 20
    print()
    print(f"slowed by {args.slowdown * 100:g} %: {caught}/{n} caught "
          f"(goal >= {caught_goal}/{n})")
    print(f"unchanged: {alarms}/{n} false alarms (goal <= {alarm_goal}/{n})")
    ok = caught >= caught_goal and alarms <= alarm_goal
    print(f"result: {'PASS' if ok else 'MISS'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": name, "batch": batch, "step_median": step_median,
            "extra_seconds": extra.seconds, "measured_slowdown": measured,
            "threshold": args.threshold, "alpha": args.alpha, "rounds": args.rounds,
            "caught": caught, "false_alarms": alarms, "trials": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
