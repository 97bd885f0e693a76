"""The training steps the overhead and power benchmarks time: a small conv net on the GPU (about
8 ms at batch 512 on an H200, GPU-bound), an MLP on the CPU for smoke runs, and ResNet-18 at a
small batch, which is launch-bound on a fast GPU. (``diagnose_overhead.py`` writes the same
ResNet-18 into the test file its processes run: that file is plain user code, imports nothing
of ours.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def scaled(torch: Any) -> Any:
    """A module that multiplies by 1.0: one more small elementwise kernel forward, one more
    backward (the ``kernel`` injection of ``injections.py``)."""

    class Scaled(torch.nn.Module):  # type: ignore[misc, name-defined]
        def forward(self, x: Any) -> Any:
            return x * 1.0

    return Scaled()


def build_step(torch: Any, device: str, batch: int, extra_kernel: bool = False) -> Any:
    """A small conv net (the GPU-bound step) or an MLP on the CPU; ``extra_kernel`` adds one
    elementwise multiply after the last block (the last convolution, or the last hidden
    layer)."""
    nn = torch.nn
    torch.manual_seed(0)
    extra = [scaled(torch)] if extra_kernel else []
    if device == "cpu":
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              *extra, nn.Linear(1024, 10))
        inputs = torch.randn(batch, 512)
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), *extra,
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
        ).to(device, memory_format=torch.channels_last)
        inputs = torch.randn(batch, 3, 64, 64, device=device).to(
            memory_format=torch.channels_last)
    return sgd_step(torch, model.to(device), inputs, device)


def sgd_step(torch: Any, model: Any, inputs: Any, device: str, classes: int = 10) -> Any:
    """One training step of ``model`` on fixed ``inputs``: forward, cross-entropy, backward,
    SGD with momentum; the step returns the loss (a tensor on the device: no sync)."""
    targets = torch.randint(0, classes, (inputs.shape[0],), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    return step


def build_resnet18_step(torch: Any, device: str, batch: int, size: int, width: int = 64,
                        extra_kernel: bool = False) -> Any:
    """ResNet-18 (torchvision's layout, ``width`` channels in the first stage) on a fixed fp32
    batch of ``size`` x ``size`` images; ``extra_kernel`` multiplies each block's output by
    1.0 (8 more small elementwise kernels forward, 8 backward)."""
    torch.manual_seed(0)
    model = resnet18(torch, classes=10, width=width, extra_kernel=extra_kernel).to(device)
    inputs = torch.randn(batch, 3, size, size, device=device)
    return sgd_step(torch, model, inputs, device)


def resnet18(torch: Any, classes: int, width: int, extra_kernel: bool = False) -> Any:
    """torchvision's ResNet-18 layout (BasicBlocks of two 3x3 convolutions, batch norms, a 1x1
    projection where the shape changes), ``width`` channels in the first stage; with
    ``extra_kernel`` each block's output is multiplied by 1.0."""
    nn = torch.nn

    class BasicBlock(nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self, inp: int, out: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(inp, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out),
                nn.ReLU(inplace=True), nn.Conv2d(out, out, 3, 1, 1, bias=False),
                nn.BatchNorm2d(out))
            self.down = (nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                       nn.BatchNorm2d(out))
                         if stride != 1 or inp != out else nn.Identity())

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.body(x) + self.down(x))
            return out * 1.0 if extra_kernel else out

    layers, channels = [], width
    for index, out in enumerate((width, width * 2, width * 4, width * 8)):
        layers += [BasicBlock(channels, out, 1 if index == 0 else 2), BasicBlock(out, out, 1)]
        channels = out
    return nn.Sequential(
        nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(channels, classes))


def size_batch(torch: Any, device: str, target: tuple[float, float],
               median_of: Callable[[Any], float], tries: int = 7) -> tuple[int, Any, float]:
    """A batch whose step median (``median_of(step)``, seconds) lands in ``target``, or the
    closest one tried: doubling or halving from a start that suits the device."""
    batch = 64 if device == "cpu" else 128
    best: tuple[int, Any, float] | None = None
    for _ in range(tries):
        step = build_step(torch, device, batch)
        med = median_of(step)
        if best is None or abs(med - sum(target) / 2) < abs(best[2] - sum(target) / 2):
            best = (batch, step, med)
        if med < target[0]:
            batch *= 2
        elif med > target[1] and batch > 8:
            batch //= 2
        else:
            break
    assert best is not None
    return best
