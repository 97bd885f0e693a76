"""`python -m product_classifier.train` works as documented in the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "product_classifier.train", *args],
        cwd=PROJECT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_trains_and_prints_json() -> None:
    proc = _run(
        "--device", "cpu", "--steps", "3", "--batch-size", "8", "--image-size", "32",
        "--width", "8", "--num-workers", "1", "--warmup-steps", "1", "--log-every", "1",
        "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["device"] == "cpu"
    assert 0.0 <= summary["val_accuracy"] <= 1.0
    assert "loss" in proc.stderr  # the log lines


def test_cli_cuda_without_a_gpu_says_why() -> None:
    # Hiding every GPU makes this true on any machine, CPU-only build or not.
    proc = _run("--device", "cuda", "--steps", "1", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr
    assert "Traceback" not in proc.stderr
