"""The regression gate on a real GPU: CUDA-event timing, peak VRAM per phase, NVML samples from
the sampler thread given to rounds, the session's conditions, and sessions saved and compared
that catch a slowed CUDA step. Skipped without CUDA."""

from __future__ import annotations

import json
import statistics
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
    assert result.peak_vram is not None and 1 <= len(result.peak_vram) <= 2  # one per phase
    assert min(result.peak_vram) >= 2 * 2048 * 2048 * 4  # x and x @ x, fp32
    assert result.fingerprint["gpu_name"]
    assert result.fingerprint["torch_cuda"]
    assert result.conditions["cudnn_benchmark"] == torch.backends.cudnn.benchmark
    assert result.conditions["tf32_matmul"] == torch.backends.cuda.matmul.allow_tf32
    print(json.dumps(result.summary(), indent=1))
    if result.sm_clock is not None:  # NVML answered: every round has the nearest sample
        assert len(result.sm_clock) == result.rounds
        assert all(c for c in result.sm_clock)
        assert result.clock_event_reasons is not None
        assert result.conditions["sm_clock_median"] > 0


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
    for _ in range(3):  # a baseline of three sessions
        saved = pytester.runpytest(*plugin, "--gpu-save=base")
        assert saved.ret == 0, saved.stdout.str()
    same = pytester.runpytest(*plugin, "--gpu-compare=base")
    print(same.stdout.str())
    assert same.ret == 0
    monkeypatch.setenv("REPEATS", "5")  # +25 % work
    out = tmp_path / "gate.json"
    compared = pytester.runpytest(*plugin, "--gpu-compare=base",
                                  f"--gpu-benchmark-json={out}")
    print(compared.stdout.str())
    assert compared.ret == 1
    document = json.loads(out.read_text())
    (row,) = [c for c in document["comparisons"] if c["metric"] == "step_time"]
    assert row["verdict"] == "regression"
    assert row["baseline"]["sessions"] == 3 and row["current"]["sessions"] == 1
    assert 0.15 < row["change"] < 0.35
    assert row["detectable_change"] < 0.15


def _small_kernels_step(sync: bool = False) -> object:
    """Many small launches: the host's pace, not the GPU's, sets this step's wall time."""
    x = torch.ones(256, device="cuda")
    for _ in range(200):
        x = x * 1.0001 + 0.0001
    return float(x.sum().item()) if sync else x


def test_gpu_time_of_a_launch_bound_step() -> None:
    """Queued behind a spin kernel, the rounds time the GPU's work: less than the host-paced
    step time, from nearly every round; a step that reads a value back has none."""
    options = BenchmarkOptions(warmup=5, min_rounds=30, max_rounds=30, max_time=10.0)
    result = measure(_small_kernels_step, options=options, gpu_time=True)
    assert result.gpu_time is not None and len(result.gpu_time) == 30
    print(json.dumps(result.summary(), indent=1))
    assert len(result.gpu_times) >= 25  # queued in time
    assert statistics.median(result.gpu_times) < statistics.median(result.step_time)
    synced = measure(_small_kernels_step, (True,), options=options, gpu_time=True)
    assert synced.gpu_time == [None] * 30


def test_gpu_time_of_a_gpu_bound_step_matches_its_step_time() -> None:
    options = BenchmarkOptions(warmup=3, min_rounds=20, max_rounds=20, max_time=10.0)
    result = measure(_step, options=options, gpu_time=True)
    assert result.gpu_times and len(result.gpu_times) >= 18
    ratio = statistics.median(result.gpu_times) / statistics.median(result.step_time)
    assert 0.9 < ratio < 1.1
