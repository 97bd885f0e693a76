"""Fault: reentrant activation checkpointing after a frozen stem: the blocks never train.

A fine-tune keeps its pretrained stem frozen (``requires_grad_(False)``) and trains the residual
blocks and the head, with activation checkpointing on every block through
``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)`` (the variant older code and
older framework defaults pass). The reentrant variant only connects the block to autograd when
one of its tensor *inputs* requires grad; the frozen stem's output does not, so no block output
requires grad, no gradient reaches any block parameter, and the optimizer steps the head alone.
PyTorch says so once, in a ``UserWarning`` ("None of the inputs have requires_grad=True.
Gradients will be None") that a test run hides among its warnings; the loss still falls (the
head learns a linear probe), so the smoke test passes.

Sources: https://github.com/mlfoundations/open_clip/issues/573 (the warning at fine-tune start;
passing ``use_reentrant=False`` "also increased performance in the train/val loss");
https://github.com/pytorch/pytorch/issues/7617 ("checkpoint(function, *args) should has the same
requires_grad as function(*args)"); https://github.com/Victorwz/LLaVA-Llama-3/issues/4 (the same
warning, answered "has no effects to the training").

Fix: ``checkpoint(block, x, use_reentrant=False)``, or make the blocks' input require grad
(Hugging Face's ``model.enable_input_require_grads()``).

A correct diagnosis names the reentrant checkpoint (``use_reentrant=True``) whose inputs do not
require grad, and the parameters it left without gradients.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
checkpoint = torch.utils.checkpoint.checkpoint

FEATURES = 512
WIDTH = 1024
BLOCKS = 6
CLASSES = 50
BATCH_SIZE = 1024
STEPS = 60
DEVICE = torch.device("cuda")


def make_dataset(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around one random centroid per class, on the device."""
    generator = torch.Generator(device=device).manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=device, generator=generator)
    labels = torch.randint(CLASSES, (n,), device=device, generator=generator)
    features = centroids[labels] + 2.0 * torch.randn(n, FEATURES, device=device,
                                                     generator=generator)
    return features, labels


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class FineTuned(nn.Module):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(FEATURES, width), nn.LayerNorm(width))
        self.stem.requires_grad_(False)  # the pretrained part this fine-tune keeps
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(blocks))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            # fault: reentrant checkpointing, and x does not require grad
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(x)


def train(device: torch.device, steps: int = STEPS, batch_size: int = BATCH_SIZE,
          width: int = WIDTH, blocks: int = BLOCKS) -> list[float]:
    """Fine-tune the blocks and the head; returns the loss of every step (read once)."""
    torch.manual_seed(0)
    features, labels = make_dataset(8 * batch_size, device)
    model = FineTuned(width, blocks).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, fused=device.type == "cuda")
    losses = []
    for step in range(steps):
        rows = slice((step % 8) * batch_size, (step % 8 + 1) * batch_size)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(features[rows])
        loss = F.cross_entropy(logits.float(), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fine_tune_with_activation_checkpointing_learns() -> None:
    losses = train(DEVICE)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}")
    assert last < 0.7 * first
