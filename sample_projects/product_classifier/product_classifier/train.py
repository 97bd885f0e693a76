"""Train the product classifier: a plain PyTorch loop with a small CLI.

    python -m product_classifier.train --device cuda --batch-size 32 --precision bf16 --steps 200

The functions here (build_loaders, make_model, train_step, evaluate, train) are also what the
tests and the readiness ladder call, so that every rung runs the same code as a real run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .data import DEFAULT_RESOLUTION, ProductImages
from .model import ARCHS, SetupError, make_model

__all__ = [
    "PRECISIONS",
    "Loaders",
    "SetupError",
    "TrainConfig",
    "TrainResult",
    "autocast",
    "build_loaders",
    "evaluate",
    "main",
    "make_model",
    "resolve_device",
    "train",
    "train_step",
]

log = logging.getLogger("product_classifier")

PRECISIONS = ("fp32", "bf16", "fp16")
Batch = tuple[torch.Tensor, torch.Tensor]  # what a loader yields: images, labels
Loader = DataLoader[tuple[torch.Tensor, int]]  # typed by the Dataset's items


# --------------------------------------------------------------------------------------------
# Device and precision
# --------------------------------------------------------------------------------------------


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """Turn "auto", "cpu", "cuda" or "cuda:N" into a device, refusing CUDA that is not there."""
    if isinstance(name, torch.device):
        name = str(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        log.warning("device auto: CUDA is not available, training on the CPU")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                why = f"this torch ({torch.__version__}) is a CPU-only build"
            else:
                why = (
                    f"torch {torch.__version__} was built for CUDA {torch.version.cuda} but "
                    "finds no usable GPU (no GPU, driver too old, or CUDA_VISIBLE_DEVICES hides "
                    "it; run nvidia-smi)"
                )
            raise SetupError(f"device {name!r} requested but CUDA is not available: {why}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SetupError(
                f"device {name!r} requested but only {torch.cuda.device_count()} GPU(s) visible"
            )
    elif device.type != "cpu":
        raise ValueError(f"unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    return device


def _check_precision(device: torch.device, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise SetupError(
            f"bf16 autocast needs compute capability >= 8.0; {torch.cuda.get_device_name(device)}"
            " lacks it: use --precision fp16"
        )


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """Autocast for bf16/fp16; fp32 runs without it."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


class Loaders(NamedTuple):
    train: Loader
    val: Loader
    test: Loader


def build_loaders(
    batch_size: int = 32,
    image_size: int = DEFAULT_RESOLUTION,
    num_workers: int = 2,
    device: str | torch.device = "cpu",
    eval_batch_size: int | None = None,
    data_root: str | None = None,
    seed: int = 0,
    pin_memory: bool | None = None,
) -> Loaders:
    """Train/val/test loaders; pinned memory by default when the batches go to a GPU."""
    on_cuda = resolve_device(device).type == "cuda"
    pin = on_cuda if pin_memory is None else pin_memory
    common: dict[str, Any] = {
        "num_workers": num_workers,
        "pin_memory": pin,
        # Workers keep their decoded-image cache across epochs instead of restarting.
        "persistent_workers": num_workers > 0,
    }
    train_set = ProductImages("train", image_size, root=data_root)
    train_loader = DataLoader(
        train_set,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,  # constant batch shape: steady step times, no tiny last batch
        generator=torch.Generator().manual_seed(seed),
        **common,
    )
    eval_bs = eval_batch_size or batch_size * 2
    val_loader = DataLoader(
        ProductImages("val", image_size, root=data_root), batch_size=eval_bs, **common
    )
    test_loader = DataLoader(
        ProductImages("test", image_size, root=data_root), batch_size=eval_bs, **common
    )
    return Loaders(train_loader, val_loader, test_loader)


def _forever(loader: Loader) -> Iterator[Batch]:
    while True:
        yield from loader


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------


def train_step(
    model: nn.Module,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    device: torch.device | str,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """One optimisation step; returns the detached loss, still on the device (no sync)."""
    device = torch.device(device)
    images, labels = batch
    images = images.to(device, non_blocking=True)
    labels = labels.to(device, non_blocking=True)
    with autocast(device, precision):
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss.detach()


def evaluate(
    model: nn.Module,
    loader: Loader,
    device: torch.device | str,
    precision: str = "fp32",
) -> float:
    """Top-1 accuracy over `loader`, without autograd; restores the model's train/eval mode."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    try:
        with torch.no_grad(), autocast(device, precision):
            for images, labels in loader:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                correct += (model(images).argmax(dim=1) == labels).sum()
                seen += labels.numel()
    finally:
        model.train(was_training)
    # One host sync for the whole evaluation, not one per batch.
    return correct.item() / max(seen, 1)


# --------------------------------------------------------------------------------------------
# Training run
# --------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    device: str = "auto"
    precision: str = "fp32"
    batch_size: int = 32
    steps: int = 200
    optimizer: str = "adamw"
    lr: float | None = None  # None: the optimizer's default below
    weight_decay: float | None = None  # None: the optimizer's default below
    num_workers: int = 2
    image_size: int = DEFAULT_RESOLUTION
    arch: str = "resnet"
    width: int = 32
    warmup_steps: int = 10  # excluded from the step-time median (allocator, cuDNN autotune)
    log_every: int = 20
    eval_batch_size: int | None = None
    seed: int = 0
    data_root: str | None = None
    pin_memory: bool | None = None
    evaluate: bool = True


@dataclass(frozen=True)
class TrainResult:
    steps: int
    seconds_per_step: float  # median over the steps after warm-up
    final_loss: float
    val_accuracy: float | None  # None when evaluation was switched off
    peak_vram_bytes: int | None  # torch.cuda.max_memory_allocated; None on CPU
    # What the caching allocator held (closer to nvidia-smi); includes blocks still cached
    # from earlier runs in the same process, so compare it only across fresh processes.
    peak_reserved_bytes: int | None = None
    device: str = "cpu"
    precision: str = "fp32"
    batch_size: int = 0
    total_seconds: float = 0.0
    step_seconds: tuple[float, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# (lr, weight decay) per optimizer, tuned for 200 steps from scratch at batch 32: a short run
# needs a high learning rate (AdamW 4e-3 reached ~94 % val accuracy where 1e-3 reached ~75 %).
OPTIMIZER_DEFAULTS = {"adamw": (4e-3, 0.05), "sgd": (0.2, 5e-4)}


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer not in OPTIMIZER_DEFAULTS:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_DEFAULTS)}")
    default_lr, default_wd = OPTIMIZER_DEFAULTS[config.optimizer]
    lr = config.lr if config.lr is not None else default_lr
    wd = config.weight_decay if config.weight_decay is not None else default_wd
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=wd
        )
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)


def _schedule(steps: int) -> Any:
    # Short linear warm-up then cosine decay: converges in a few hundred steps from scratch.
    warm = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, steps - warm)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def train(config: TrainConfig | None = None) -> TrainResult:
    """Run `config.steps` optimisation steps and report timing, loss, accuracy and memory."""
    config = config or TrainConfig()
    if config.steps < 1:
        raise ValueError("steps must be >= 1")
    device = resolve_device(config.device)
    _check_precision(device, config.precision)
    torch.manual_seed(config.seed)

    loaders = build_loaders(
        batch_size=config.batch_size,
        image_size=config.image_size,
        num_workers=config.num_workers,
        device=device,
        eval_batch_size=config.eval_batch_size,
        data_root=config.data_root,
        seed=config.seed,
        pin_memory=config.pin_memory,
    )
    model = make_model(config.arch, width=config.width).to(device)
    optimizer = make_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config.steps))
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)

    log.info(
        "training %s on %s, %s, batch %d, %d steps",
        config.arch,
        device,
        config.precision,
        config.batch_size,
        config.steps,
    )
    model.train()
    # On CUDA, per-step times come from events recorded between steps and read after one
    # final synchronize: exact GPU-timeline intervals without stalling the loop every step.
    events: list[torch.cuda.Event] = []
    host_marks: list[float] = []
    batches = _forever(loaders.train)
    loss = torch.zeros(())
    started = time.perf_counter()
    for step in range(config.steps):
        if on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            events.append(event)
        else:
            host_marks.append(time.perf_counter())
        loss = train_step(model, next(batches), optimizer, device, config.precision, scaler)
        scheduler.step()
        if config.log_every and ((step + 1) % config.log_every == 0 or step == 0):
            # .item() syncs with the GPU, so it happens only at log points.
            log.info("step %4d/%d  loss %.4f", step + 1, config.steps, loss.item())
    if on_cuda:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        events.append(end)
        torch.cuda.synchronize(device)
        step_seconds = [a.elapsed_time(b) / 1000 for a, b in itertools.pairwise(events)]
    else:
        host_marks.append(time.perf_counter())
        step_seconds = [b - a for a, b in itertools.pairwise(host_marks)]
    total = time.perf_counter() - started
    final_loss = float(loss.item())

    skip = min(config.warmup_steps, len(step_seconds) - 1)
    seconds_per_step = statistics.median(step_seconds[skip:])

    val_accuracy = None
    if config.evaluate:
        val_accuracy = evaluate(model, loaders.val, device, config.precision)
    peak = reserved = None
    if on_cuda:
        peak = torch.cuda.max_memory_allocated(device)
        reserved = torch.cuda.max_memory_reserved(device)

    result = TrainResult(
        steps=config.steps,
        seconds_per_step=seconds_per_step,
        final_loss=final_loss,
        val_accuracy=val_accuracy,
        peak_vram_bytes=peak,
        peak_reserved_bytes=reserved,
        device=str(device),
        precision=config.precision,
        batch_size=config.batch_size,
        total_seconds=total,
        step_seconds=tuple(step_seconds),
    )
    log.info(
        "done: %.4f s/step (median), final loss %.4f, val accuracy %s, peak VRAM %s",
        result.seconds_per_step,
        result.final_loss,
        "n/a" if val_accuracy is None else f"{val_accuracy:.1%}",
        "n/a" if peak is None else f"{peak / 2**20:.0f} MiB",
    )
    return result


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m product_classifier.train",
        description="Train the 5-class product-photo classifier.",
    )
    d = TrainConfig()
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--precision", choices=PRECISIONS, default=d.precision)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--optimizer", choices=tuple(OPTIMIZER_DEFAULTS), default=d.optimizer)
    p.add_argument("--lr", type=float, default=d.lr, help="default 4e-3 (AdamW) / 0.2 (SGD)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="default 0.05 / 5e-4")
    p.add_argument("--num-workers", type=int, default=d.num_workers)
    p.add_argument("--image-size", type=int, default=d.image_size)
    p.add_argument("--arch", choices=ARCHS, default=d.arch)
    p.add_argument("--width", type=int, default=d.width, help="channels of the first stage")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--data-root", default=d.data_root, help="default: $PRODUCT_CLASSIFIER_DATA")
    p.add_argument("--no-eval", dest="evaluate", action="store_false")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    as_json = args.pop("json")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        result = train(TrainConfig(**args))
    except SetupError as exc:
        # The machine or install cannot run this configuration: a message, not a traceback.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        summary = result.to_dict()
        summary.pop("step_seconds")
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
