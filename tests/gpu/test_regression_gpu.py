"""The regression gate on a real GPU: CUDA-event timing, peak VRAM per phase, NVML samples from
the sampler thread given to rounds, the session's conditions, and sessions saved and compared
that catch a slowed CUDA step. Skipped without CUDA."""

from __future__ import annotations

import json
import os
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


# -- the counting pass on CUDA -------------------------------------------------------------------


def _counted(step: object, *args: object) -> dict:
    from pytest_gputrain.regression import process_state

    options = BenchmarkOptions(warmup=5, min_rounds=10, max_rounds=10, max_time=10.0)
    result = measure(step, args, options=options, counters=True, gpu_time=True)  # type: ignore
    assert result.counters is not None
    print(json.dumps({k: v for k, v in result.counters.items()
                      if k not in ("host_cpu", "instructions")}, indent=1)[:4000])
    if os.environ.get("TEARDOWN_CUPTI") == "1":  # the pass's profiler detached CUPTI...
        assert process_state.profiler_ran() is not True  # ...and is no "profiler before"
    return result.counters


def test_kernels_copies_and_syncs_are_counted_exactly_with_their_call_sites() -> None:
    """Known work: 200 multiply-add pairs of kernels on a small tensor, then, in the variants,
    one .item() (a sync and a 4-byte copy to the host) and one pageable copy of 1 MiB to the
    device: counted the same in every step, the sync and the copy at this file's lines."""
    plain = _counted(_small_kernels_step)
    per_step = plain["per_step"]
    assert per_step["kernels"] >= 400 and per_step["syncs"] == 0
    assert per_step["h2d_copies"] == 0 and per_step["d2h_copies"] == 0
    assert plain["varies"] == {}
    assert plain["bound"]["kind"] == "launch"  # the host sets this step's pace
    assert sum(plain["kernel_names"].values()) == per_step["kernels"]
    assert plain["ops_by_name"]["aten::mul"] == 200 and plain["ops_by_name"]["aten::add"] == 200
    assert plain["gpu_busy"] > 0 and len(plain["host_cpu"]) >= 8
    assert "kernels" not in plain["unavailable"]
    # the loop's Python, the same count every step (sys.monitoring on 3.12+), named by function
    assert per_step["bytecodes"] >= 200 * 4 and "bytecodes" not in plain["unavailable"]
    assert any(name.startswith("_small_kernels_step (test_regression_gpu.py:")
               for name in plain["bytecodes_by_function"])

    synced = _counted(_small_kernels_step, True)
    assert synced["per_step"]["syncs"] == 1 and synced["per_step"]["d2h_copies"] == 1
    assert synced["per_step"]["d2h_bytes"] == 4
    (site,) = synced["sync_sites"]
    assert site["op"] == "aten::_local_scalar_dense"
    assert site["site"].endswith("test_regression_gpu.py:" + str(
        _small_kernels_step.__code__.co_firstlineno + 5))
    assert "item()" in site["code"]

    host = torch.empty(1 << 18, dtype=torch.float32)  # 1 MiB, pageable

    def copying() -> object:
        return host.to("cuda")

    copied = _counted(copying)
    assert copied["per_step"]["h2d_copies"] == 1
    assert copied["per_step"]["h2d_bytes"] == 1 << 20
    assert copied["copies"]["h2d"]["pageable"] == 1
    (copy,) = copied["copy_sites"]
    assert copy["memory"] == "pageable" and copy["bytes"] == 1 << 20
    assert copy["code"] == "return host.to(\"cuda\")"


def test_an_allocation_the_cache_cannot_serve_is_a_cuda_malloc() -> None:
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip("torch.cuda.MemPool is new in torch 2.5")

    def allocating() -> object:
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            buffer = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        del buffer, pool
        return _step()

    counted = _counted(allocating)
    plain = _counted(_step)
    assert counted["per_step"]["cuda_mallocs"] >= 1 and plain["per_step"]["cuda_mallocs"] == 0
    assert counted["per_step"]["allocs"] == plain["per_step"]["allocs"] + 1


def test_a_gpu_bound_step_is_judged_so_and_later_launches_pay_nothing() -> None:
    """A large matmul keeps the GPU busy: GPU-bound. The profiler of the pass detached CUPTI:
    a launch-bound step timed after it runs as fast as before it."""
    assert _counted(_step)["bound"]["kind"] == "gpu"
    options = BenchmarkOptions(warmup=5, min_rounds=30, max_rounds=30, max_time=10.0)
    before = measure(_small_kernels_step, options=options).min
    _counted(_small_kernels_step)
    after = measure(_small_kernels_step, options=options).min
    print(f"fastest step before the counting pass {before * 1e3:.3f} ms, after {after * 1e3:.3f}")
    assert after < before * 1.10  # CUPTI left attached would slow every launch by far more


def test_an_extra_sync_fails_the_gate_and_names_its_line(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_sync_step="""
        import os
        import torch

        x = torch.ones(256, device="cuda")

        def step():
            y = x
            for _ in range(100):
                y = y * 1.0001
            if os.environ.get("SYNC"):
                print(y.sum().item())
            return y

        def test_step(gpu_benchmark):
            gpu_benchmark(step, rounds=30, warmup=5)
    """)
    plugin = ("-p", "pytest_gputrain.regression.plugin", "-p", "no:cacheprovider", "-s")
    monkeypatch.delenv("SYNC", raising=False)
    for _ in range(2):
        assert pytester.runpytest(*plugin, "--gpu-save=base").ret == 0
    monkeypatch.setenv("SYNC", "1")
    compared = pytester.runpytest(*plugin, "--gpu-compare=base")
    print(compared.stdout.str())
    assert compared.ret == 1
    compared.stdout.fnmatch_lines([
        "*REGRESSION test_sync_step.py::test_step syncs: +1 sync per step (Tensor.item() "
        "at test_sync_step.py:11 `print(y.sum().item())`), past any rise; exact*"])
