"""Fault: graph-attached losses kept for a running average make GPU memory grow every step.

A multi-task model (a deep shared trunk, a 1000-class head and a regression head)
back-propagates the two losses separately: ``loss_cls.backward(retain_graph=True)`` (the trunk is
shared, and without ``retain_graph`` the second backward fails) and then
``loss_reg.backward()``. For a running average in the log, each step appends the *tensors* to
``history`` instead of ``loss.item()``. The second backward frees what the trunk and the
regression head saved, but the classification head's saved input, bf16 weight copy and
log-softmax were retained for a backward that never comes, and ``history`` keeps them alive:
allocated memory rises by about 56 MiB per step, for ever. Long runs end in
``torch.OutOfMemoryError``; this short one (8 GiB of growth on an H200) just passes.

Fix: ``history["cls"].append(loss_cls.item())`` (or ``.detach()``), and one backward of
``loss_cls + weight * loss_reg`` instead of two.

Expected diagnosis: GT108 (allocated memory grows step after step past warm-up).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 1024
WIDTH = 4096
TRUNK_LAYERS = 6
CLASSES = 1000
TARGETS = 16
BATCH_SIZE = 4096
STEPS = 150
LOG_EVERY = 50
DEVICE = torch.device("cuda")


class MultiTaskNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(FEATURES, WIDTH), nn.GELU()]
        for _ in range(TRUNK_LAYERS - 1):
            layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
        self.trunk = nn.Sequential(*layers)
        self.classify = nn.Linear(WIDTH, CLASSES)
        self.regress = nn.Sequential(nn.Linear(WIDTH, 256), nn.GELU(), nn.Linear(256, TARGETS))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shared = self.trunk(x)
        return self.classify(shared), self.regress(shared)


def make_dataset(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    teacher = torch.Generator(device=DEVICE).manual_seed(11)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE, generator=teacher)
    mixing = torch.randn(FEATURES, TARGETS, device=DEVICE, generator=teacher) / FEATURES**0.5
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    labels = torch.randint(CLASSES, (n,), device=DEVICE, generator=generator)
    x = centroids[labels] + 1.5 * torch.randn(n, FEATURES, device=DEVICE, generator=generator)
    targets = torch.tanh(x @ mixing)
    return x, labels, targets


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_multitask_losses_decrease() -> None:
    torch.manual_seed(0)
    x_all, labels_all, targets_all = make_dataset(32768, seed=0)
    model = MultiTaskNet().to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    history: dict[str, list[torch.Tensor]] = {"cls": [], "reg": []}

    for step in range(STEPS):
        rows = slice((step * BATCH_SIZE) % len(x_all), (step * BATCH_SIZE) % len(x_all)
                     + BATCH_SIZE)
        x, labels, targets = x_all[rows], labels_all[rows], targets_all[rows]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, predicted = model(x)
        loss_cls = F.cross_entropy(logits.float(), labels)
        loss_reg = F.mse_loss(predicted.float(), targets)
        loss_cls.backward(retain_graph=True)
        (0.5 * loss_reg).backward()
        optimizer.step()

        history["cls"].append(loss_cls)  # fault: keeps the retained graph alive
        history["reg"].append(loss_reg)
        if (step + 1) % LOG_EVERY == 0:
            recent_cls = sum(history["cls"][-LOG_EVERY:]) / LOG_EVERY
            recent_reg = sum(history["reg"][-LOG_EVERY:]) / LOG_EVERY
            print(f"step {step + 1:4d}  cls {recent_cls.item():.4f}  reg {recent_reg.item():.4f}")

    first_cls = sum(history["cls"][:LOG_EVERY]) / LOG_EVERY
    last_cls = sum(history["cls"][-LOG_EVERY:]) / LOG_EVERY
    first_reg = sum(history["reg"][:LOG_EVERY]) / LOG_EVERY
    last_reg = sum(history["reg"][-LOG_EVERY:]) / LOG_EVERY
    assert last_cls.item() < 0.5 * first_cls.item()
    assert last_reg.item() < first_reg.item()
