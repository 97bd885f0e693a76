"""How close the ladder's batch-headroom prediction comes to the true largest batch.

    python benchmarks/headroom_accuracy.py [--model product|resnet50] [--budget-gib 12]
                                           [--fraction 0.1] [--precision bf16] [--image-size 160]

Lowers the memory budget with torch.cuda.set_per_process_memory_fraction, predicts the largest
batch from at most three probes (Ladder.largest_batch, which must not run out of memory), then
finds the true largest batch by bisection (which may), and prints both and their ratio (goal:
0.97 to 1.00, no OOM during prediction).

Models: ``product`` (the sample project's own ladder spec) and ``resnet50`` (torchvision's
ResNet-50, random weights, SGD with momentum, random images of ``--image-size``), which the
ladder's constants were not tuned on.
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

from pytest_gputrain.ladder import Ladder, LadderSpec  # noqa: E402


def resnet50_spec(image_size: int) -> LadderSpec:
    import itertools

    import torchvision

    def batches(size: int):  # one pinned batch per size, repeated: the probes measure memory
        images = torch.randn(size, 3, image_size, image_size).pin_memory()
        labels = torch.randint(1000, (size,)).pin_memory()
        return itertools.repeat((images, labels))

    def step(model, batch, optimizer, device, precision):
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return LadderSpec(
        name="resnet50", make_model=lambda: torchvision.models.resnet50(weights=None),
        make_optimizer=lambda model: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        batches=batches, step=step)


def make_spec(model: str, image_size: int) -> LadderSpec:
    if model == "resnet50":
        return resnet50_spec(image_size)
    from product_classifier.ladder import ladder_spec

    return ladder_spec()  # type: ignore[no-any-return]


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
    parser.add_argument("--model", choices=("product", "resnet50"), default="product")
    parser.add_argument("--fraction", type=float, default=0.1,
                        help="memory fraction (default 0.1); --budget-gib overrides it")
    parser.add_argument("--budget-gib", type=float, help="the budget in GiB")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--image-size", type=int, default=160, help="resnet50's image side")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    if args.budget_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        args.fraction = args.budget_gib * 2**30 / total
    torch.cuda.set_per_process_memory_fraction(args.fraction)
    spec = make_spec(args.model, args.image_size)
    ladder = Ladder(spec)
    started = time.perf_counter()
    ooms_before = torch.cuda.memory_stats().get("num_ooms", 0)
    result = ladder.largest_batch(precision=args.precision, start_batch=32)
    ooms_in_prediction = torch.cuda.memory_stats().get("num_ooms", 0) - ooms_before
    predict_seconds = time.perf_counter() - started
    print(f"{args.model}: budget {result.budget / 2**30:.2f} GiB (fraction {args.fraction:.4f}),"
          f" precision {args.precision}")
    print(f"probes: {result.probes}")
    print(f"predicted largest batch {result.predicted}, verified={result.verified} "
          f"(peak {result.verified_peak}, {result.note or 'no note'}), "
          f"OOMs during prediction: {ooms_in_prediction}, {predict_seconds:.1f} s")

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
    print(f"predicted / true = {ratio:.3f} (goal: 0.97 to 1.00 with no OOM, "
          f"{'OK' if 0.97 <= ratio <= 1.0 and ooms_in_prediction == 0 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
