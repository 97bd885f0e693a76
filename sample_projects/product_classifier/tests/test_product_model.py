"""The model builds, accepts any image size and has the expected head."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from product_classifier.model import (
    NUM_CLASSES,
    ProductResNet,
    SetupError,
    count_parameters,
    make_model,
)


@pytest.mark.parametrize("size", [32, 48, 64])
def test_forward_shape(size: int) -> None:
    model = make_model(width=8).eval()
    with torch.no_grad():
        logits = model(torch.rand(2, 3, size, size))
    assert logits.shape == (2, NUM_CLASSES)


def test_default_is_a_four_stage_resnet() -> None:
    model = make_model()
    assert isinstance(model, ProductResNet)
    assert len(model.stages) == 4
    assert 1_000_000 < count_parameters(model) < 5_000_000
    assert count_parameters(make_model(width=16)) < count_parameters(model)


def test_resnet18_needs_torchvision() -> None:
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises(SetupError, match="torchvision"):
            make_model("resnet18")
    else:
        model = make_model("resnet18").eval()
        with torch.no_grad():
            assert model(torch.rand(1, 3, 64, 64)).shape == (1, NUM_CLASSES)


def test_unknown_arch() -> None:
    with pytest.raises(ValueError, match="unknown arch"):
        make_model("vgg")
