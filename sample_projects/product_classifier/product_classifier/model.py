"""A small ResNet for the product photos (and torchvision's ResNet-18 when it is installed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .data import CLASSES

NUM_CLASSES = len(CLASSES)
ARCHS = ("resnet", "resnet18")


class SetupError(RuntimeError):
    """The machine or the install cannot run what was asked (no CUDA, no torchvision...)."""


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = self.relu(out + self.shortcut(x))
        return out


class ProductResNet(nn.Module):
    """ResNet-18 layout scaled down for 32-128 px photos.

    A stride-2 3x3 stem (no max-pool) keeps enough resolution for 64x64 inputs; four stages
    double the width and halve the resolution; global average pooling makes the network
    independent of the input size.
    """

    def __init__(
        self,
        num_classes: int = NUM_CLASSES,
        width: int = 32,
        blocks: Sequence[int] = (2, 2, 2, 2),
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        channels = width
        for i, count in enumerate(blocks):
            out_channels = width * 2**i
            stride = 1 if i == 0 else 2
            layers = [BasicBlock(channels, out_channels, stride)]
            layers += [BasicBlock(out_channels, out_channels) for _ in range(count - 1)]
            stages.append(nn.Sequential(*layers))
            channels = out_channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        # Zero the last BatchNorm of each block: every residual branch starts as identity,
        # which makes the first few hundred steps noticeably more stable.
        for module in self.modules():
            if isinstance(module, BasicBlock):
                nn.init.zeros_(module.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features: torch.Tensor = self.stages(self.stem(x))
        logits: torch.Tensor = self.head(torch.flatten(self.pool(features), 1))
        return logits


def make_model(
    arch: str = "resnet",
    width: int = 32,
    num_classes: int = NUM_CLASSES,
    blocks: Sequence[int] = (2, 2, 2, 2),
) -> nn.Module:
    """Build the classifier; `arch="resnet18"` uses torchvision's (randomly initialised)."""
    if arch == "resnet":
        return ProductResNet(num_classes=num_classes, width=width, blocks=blocks)
    if arch == "resnet18":
        try:
            from torchvision.models import resnet18
        except ImportError as exc:
            raise SetupError(
                "--arch resnet18 needs torchvision, which is not installed; install the "
                "torchvision build that matches your torch (same CUDA variant), or use "
                "--arch resnet"
            ) from exc
        model: nn.Module = resnet18(weights=None, num_classes=num_classes)
        return model
    raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHS}")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
