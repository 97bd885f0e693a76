"""This project's readiness ladder: what pytest-gputrain's ``gpu_ladder`` needs to walk it.

The ladder runs the project's own model, data and training step (train.py), so each rung says
something about the real run.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import torch
from torch.utils.data import DataLoader

from .data import ProductImages
from .model import make_model
from .train import TrainConfig, evaluate, make_optimizer, train_step

IMAGE_SIZE = 64


@cache
def _train_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The whole training split decoded once (1000 images, about 50 MB): the rungs measure the
    model and the GPU, not PNG decoding."""
    dataset = ProductImages("train", IMAGE_SIZE)
    images, labels = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    return torch.stack(images), torch.tensor(labels)


def batches(batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless training batches of any size, sampled with replacement (a batch may be larger
    than the training set: the headroom probes need that)."""
    images, labels = _train_tensors()
    generator = torch.Generator().manual_seed(0)
    pin = torch.cuda.is_available()
    while True:
        index = torch.randint(len(labels), (batch_size,), generator=generator)
        batch = images[index], labels[index]
        yield (batch[0].pin_memory(), batch[1].pin_memory()) if pin else batch


def validation_accuracy(model: torch.nn.Module, device: torch.device, precision: str) -> float:
    loader = DataLoader(ProductImages("val", IMAGE_SIZE), batch_size=125)
    return evaluate(model, loader, device, precision)


def ladder_spec() -> object:
    from pytest_gputrain.ladder import LadderSpec

    return LadderSpec(
        name="product_classifier",
        make_model=lambda: make_model(width=32),
        make_optimizer=lambda model: make_optimizer(model, TrainConfig(lr=2e-3)),
        batches=batches,
        step=train_step,
        evaluate=validation_accuracy,
    )
