"""How close the ladder's batch-headroom prediction comes to the true largest batch.

    python benchmarks/headroom_accuracy.py [--fraction 0.1] [--precision bf16]

Lowers the memory budget with torch.cuda.set_per_process_memory_fraction, predicts the largest
batch of the product-classifier sample from at most three probes (Ladder.largest_batch, which
must not run out of memory), then finds the true largest batch by bisection (which may), and
prints both and their ratio (goal: within 10 %, no OOM during prediction).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_projects" / "product_classifier"))

from product_classifier.ladder import ladder_spec  # noqa: E402

from pytest_gputrain.ladder import Ladder  # noqa: E402


def fits(ladder: Ladder, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         precision: str, batch: int) -> bool:
    try:
        ladder._peak(model, optimizer, torch.device("cuda"), precision, batch)
        return True
    except torch.OutOfMemoryError:
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    torch.cuda.set_per_process_memory_fraction(args.fraction)
    spec = ladder_spec()
    ladder = Ladder(spec)  # type: ignore[arg-type]
    started = time.perf_counter()
    ooms_before = torch.cuda.memory_stats().get("num_ooms", 0)
    result = ladder.largest_batch(precision=args.precision, start_batch=32)
    ooms_in_prediction = torch.cuda.memory_stats().get("num_ooms", 0) - ooms_before
    predict_seconds = time.perf_counter() - started
    print(f"budget {result.budget / 2**30:.2f} GiB (fraction {args.fraction}), "
          f"precision {args.precision}")
    print(f"probes: {result.probes}")
    print(f"predicted largest batch {result.predicted}, verified={result.verified} "
          f"(peak {result.verified_peak}), OOMs during prediction: {ooms_in_prediction}, "
          f"{predict_seconds:.1f} s")

    model = spec.make_model().cuda()
    optimizer = spec.make_optimizer(model)
    ladder._run_steps(model, optimizer, torch.device("cuda"), args.precision, spec.batches(32), 1)
    low = result.predicted or 32
    if not fits(ladder, model, optimizer, args.precision, low):
        low = 32
    high = int(low * 1.25)
    while fits(ladder, model, optimizer, args.precision, high):
        low, high = high, int(high * 1.25)
    trials = 0
    while high - low > max(1, low // 200):
        middle = (low + high) // 2
        trials += 1
        if fits(ladder, model, optimizer, args.precision, middle):
            low = middle
        else:
            high = middle
    true_largest = low
    ratio = (result.predicted or 0) / true_largest
    print(f"true largest batch (bisection, {trials} trials): {true_largest}")
    print(f"predicted / true = {ratio:.3f} (goal: 0.90 to 1.00, "
          f"{'OK' if 0.9 <= ratio <= 1.0 and ooms_in_prediction == 0 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
