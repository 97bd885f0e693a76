"""Fault: every 25 steps the training loop stops for CPU-side metrics over recent predictions.

A multi-label tagger (24 tags) trained on feature vectors made on the GPU, in bf16 with a
large batch and a fused optimizer: each step keeps the GPU busy for a few milliseconds. The loop
keeps the last 25 steps' predictions in a preallocated GPU buffer, and every 25 steps it copies
them (5 M scores) to the host and computes a precision-recall curve over 200 thresholds in NumPy,
written to a CSV file. That
report takes far longer than the 25 steps it summarises, and the GPU has nothing to do
meanwhile. No epoch boundary, validation pass or checkpoint explains the long steps.

Fix: accumulate the counts per threshold on the GPU each step (a few hundred numbers) and read
them back at the report, or compute the report in another process.

Expected diagnosis: GT118 (training stalls).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

FEATURES = 256
HIDDEN = 4096
TAGS = 24
BATCH_SIZE = 8192
STEPS = 110
REPORT_EVERY = 25
THRESHOLDS = np.linspace(0.0, 1.0, 200, dtype=np.float32)
DEVICE = torch.device("cuda")


def precision_recall_curve(scores: np.ndarray, truth: np.ndarray) -> list[tuple[float, ...]]:
    rows = []
    positives = truth.sum()
    for threshold in THRESHOLDS:
        predicted = scores >= threshold
        hits = np.count_nonzero(predicted & truth)
        flagged = np.count_nonzero(predicted)
        rows.append((float(threshold), hits / max(flagged, 1), hits / max(positives, 1)))
    return rows


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tagger_learns_and_reports(tmp_path: Path) -> None:
    torch.manual_seed(0)
    teacher = torch.randn(FEATURES, TAGS, device=DEVICE)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, TAGS),
    ).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)

    scores = torch.empty(REPORT_EVERY, BATCH_SIZE, TAGS, device=DEVICE)
    truth = torch.empty(REPORT_EVERY, BATCH_SIZE, TAGS, dtype=torch.bool, device=DEVICE)
    reports: list[Path] = []
    losses: list[float] = []
    for step in range(1, STEPS + 1):
        x = torch.randn(BATCH_SIZE, FEATURES, device=DEVICE)
        y = x @ teacher > 0
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.binary_cross_entropy_with_logits(logits.float(), y.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        slot = (step - 1) % REPORT_EVERY
        scores[slot] = torch.sigmoid(logits.detach().float())
        truth[slot] = y
        if step == 1:
            losses.append(loss.item())
        if step % REPORT_EVERY == 0:  # fault: a CPU report over 5 M scores inside the loop
            curve = precision_recall_curve(scores.cpu().numpy().ravel(),
                                           truth.cpu().numpy().ravel())
            report = tmp_path / f"pr_step{step}.csv"
            with report.open("w", newline="") as stream:
                csv.writer(stream).writerows(curve)
            reports.append(report)
            losses.append(loss.item())
            print(f"step {step:4d}  loss {losses[-1]:.4f}  report {report.name}")

    assert len(reports) == STEPS // REPORT_EVERY
    assert losses[-1] < 0.6 * losses[0]
