"""The regression gate on a real GPU: CUDA-event timing, per-round peak VRAM and NVML samples,
and a save/compare session that catches a slowed CUDA step. Skipped without CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gputrain.regression.benchmark import BenchmarkOptions, measure

torch = pytest.importorskip("torch")
# The plugin's own marker: skips with the reason on CPU runners, fails under --gpu-required,
# and adds the `gpu` marker so `pytest -m gpu` selects these tests.
pytestmark = pytest.mark.requires_cuda


def _step() -> object:
    x = torch.randn(2048, 2048, device="cuda")
    return (x @ x).sum()


def test_cuda_timing_and_vram() -> None:
    options = BenchmarkOptions(warmup=3, min_rounds=20, max_rounds=40, max_time=1.0)
    result = measure(_step, options=options)
    assert result.timer == "cuda_event"
    assert result.device.startswith("cuda:")
    assert 20 <= result.rounds <= 40
    assert all(t > 0 for t in result.step_time)
    assert result.peak_vram is not None
    assert min(result.peak_vram) >= 2 * 2048 * 2048 * 4  # x and x @ x, fp32
    assert result.fingerprint["gpu_name"]
    assert result.fingerprint["torch_cuda"]
    print(json.dumps(result.summary(), indent=1))
    if result.sm_clock is not None:  # NVML answered
        assert any(c for c in result.sm_clock if c)
        assert result.clock_event_reasons is not None


def test_cuda_save_and_compare(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                               tmp_path: Path) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_cuda_step="""
        import os
        import torch

        x = torch.randn(4096, 4096, device="cuda")

        def step(repeats):
            for _ in range(repeats):
                y = x @ x
            return y

        def test_step(gpu_benchmark):
            repeats = int(os.environ["REPEATS"])
            result = gpu_benchmark(step, repeats, rounds=40, warmup=5)
            assert result.timer == "cuda_event"
    """)
    monkeypatch.setenv("REPEATS", "4")
    plugin = ("-p", "pytest_gputrain.regression.plugin", "-p", "no:cacheprovider")
    saved = pytester.runpytest(*plugin, "--gpu-save=base")
    assert saved.ret == 0, saved.stdout.str()
    monkeypatch.setenv("REPEATS", "5")  # +25 % work
    out = tmp_path / "gate.json"
    compared = pytester.runpytest(*plugin, "--gpu-compare=base",
                                  f"--gpu-benchmark-json={out}")
    print(compared.stdout.str())
    assert compared.ret == 1
    document = json.loads(out.read_text())
    (row,) = [c for c in document["comparisons"] if c["metric"] == "step_time"]
    assert row["verdict"] == "regression"
    assert 0.15 < row["change"] < 0.35
