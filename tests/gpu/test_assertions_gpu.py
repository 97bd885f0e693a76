"""The GPU assertions on a real CUDA GPU (written for the lent H200: torch 2.11, CUDA 13).

Every test is marked ``requires_cuda`` (so also ``gpu``) and drives small pytest projects
through pytester: in-process where the outer process's CUDA context is harmless, in a
subprocess where the inner run changes process-wide CUDA state (the OOM budget).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytestmark = [pytest.mark.requires_cuda,
              pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")]

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]


def _installed() -> bool:
    return any(ep.value.startswith("pytest_gputrain") for ep in entry_points(group="pytest11"))


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Arguments that load the plugin in inner runs, installed or not (subprocesses too)."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))
    return ["-p", "no:cacheprovider"] + ([] if _installed() else ["-p", "pytest_gputrain.plugin"])


def _free_bytes() -> int:
    import torch

    free, _ = torch.cuda.mem_get_info(0)
    return int(free)


# -- max_vram ------------------------------------------------------------------------------------

def test_allocating_past_max_vram_fails_with_the_allocating_line(
        pytester: pytest.Pytester, plugin: list[str]) -> None:
    pytester.makepyfile(test_vram="""
        import time
        import pytest
        import torch

        @pytest.mark.max_vram("1GiB")
        def test_too_big():
            x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
            del x

        @pytest.mark.max_vram("3GiB")
        def test_fits():
            x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
            del x

        @pytest.mark.max_vram("2GiB", measure="device")
        def test_device_memory():
            x = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
            time.sleep(0.5)   # the NVML sampler reads every 50 ms
            del x
    """)
    result = pytester.runpytest(*plugin, "-p", "no:randomly", "--junitxml=out.xml")
    print(result.stdout.str())
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "max_vram: peak allocated GPU memory 2* GiB exceeds the 1 GiB limit by 1* GiB (+*%) on "
        "cuda:0",
        "*- gputrain max_vram -*",
        "live at the peak, by allocating line:",
        "*2 GiB  test_vram.py:7 in test_too_big (1 block)",
    ])
    result.stdout.fnmatch_lines([
        "max_vram: peak device GPU memory * GiB exceeds the 2 GiB limit by * on cuda:0"])
    tree = ET.parse(pytester.path / "out.xml")
    peaks = {case.get("name"): int(prop.get("value") or 0) for case in tree.iter("testcase")
             for prop in case.iter("property") if prop.get("name") == "gpu_peak_vram_bytes"}
    assert 2 * GiB <= peaks["test_fits"] < 3 * GiB
    assert peaks["test_device_memory"] >= 4 * GiB  # tensors + context, as NVML sees them


# -- min_utilization -----------------------------------------------------------------------------

def test_starved_loop_fails_min_utilization_and_busy_loop_passes(
        pytester: pytest.Pytester, plugin: list[str]) -> None:
    pytester.makepyfile(test_util="""
        import time
        import pytest
        import torch

        @pytest.mark.min_utilization(70, warmup=1.0)
        def test_busy():
            a = torch.randn(8192, 8192, device="cuda")
            end = time.monotonic() + 3.5
            while time.monotonic() < end:
                for _ in range(4):
                    b = a @ a
                torch.cuda.synchronize()

        @pytest.mark.min_utilization(70, warmup=1.0)
        def test_starved():
            x = torch.randn(1024, device="cuda")
            end = time.monotonic() + 3.5
            while time.monotonic() < end:
                x.add_(1)
                torch.cuda.synchronize()
                time.sleep(0.05)   # a "data loader" that keeps the GPU waiting
    """)
    result = pytester.runpytest(*plugin, "-p", "no:randomly", "--junitxml=out.xml")
    print(result.stdout.str())
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_starved _*",
        "min_utilization: mean GPU utilization * % is below the 70 % minimum on cuda:0 (NVML "
        "GPU *)",
        "*- gputrain min_utilization -*",
        "window:   * s of the call phase after a 1 s warm-up: * samples, one every 50 ms",
        "stats:    mean * %, p10 * %, p50 * %, p90 * %, max * %",
        "timeline: ▁ 0 % … █ 100 %, * s per block, | = end of warm-up",
    ])
    tree = ET.parse(pytester.path / "out.xml")
    means = {case.get("name"): float(prop.get("value") or 0) for case in tree.iter("testcase")
             for prop in case.iter("property") if prop.get("name") == "gpu_mean_utilization"}
    assert means["test_busy"] >= 70
    assert means["test_starved"] < 70


# -- requires_cuda ---------------------------------------------------------------------------------

def test_requirements_met_and_unmet_on_this_gpu(pytester: pytest.Pytester,
                                                plugin: list[str]) -> None:
    pytester.makepyfile(test_req="""
        import pytest

        @pytest.mark.requires_cuda(min_capability=(9, 0), bf16=True, min_total_vram="80GiB",
                                   min_torch="2.1", min_driver="535")
        def test_h200():
            pass

        @pytest.mark.requires_cuda(min_devices=64)
        def test_many():
            pass

        @pytest.mark.requires_cuda(min_capability="12.0")
        def test_future():
            pass
    """)
    result = pytester.runpytest(*plugin, "-rs")
    print(result.stdout.str())
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines_random([
        "SKIPPED*needs 64 CUDA GPUs, * visible*",
        "SKIPPED*needs compute capability >= 12.0, cuda:0 (NVIDIA *) has 9.0",
    ])
    result = pytester.runpytest(*plugin, "--gpu-required")
    result.assert_outcomes(passed=1, errors=2)


def test_min_free_vram_skips_while_another_process_holds_memory(
        pytester: pytest.Pytester, plugin: list[str]) -> None:
    hold = 20 * GiB
    free_before = _free_bytes()
    need = free_before - 10 * GiB  # met now, not once 20 GiB are held
    pytester.makepyfile(test_free=f"""
        import pytest

        @pytest.mark.requires_cuda(min_free_vram={need})
        def test_needs_room():
            pass
    """)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, torch\n"
         f"x = torch.empty({hold}, dtype=torch.uint8, device='cuda')\n"
         "torch.cuda.synchronize()\n"
         "print('holding', flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        held = pytester.runpytest(*plugin, "-rs")
        print(held.stdout.str())
        held.assert_outcomes(skipped=1)
        held.stdout.fnmatch_lines(["SKIPPED*needs * GiB free on cuda:0, * GiB free*"])
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    deadline = time.monotonic() + 20
    while _free_bytes() < need + GiB and time.monotonic() < deadline:
        time.sleep(0.2)  # the driver takes a moment to hand the memory back
    pytester.runpytest(*plugin).assert_outcomes(passed=1)


# -- OOM hygiene -----------------------------------------------------------------------------------

def test_an_oom_does_not_fail_the_next_tests(pytester: pytest.Pytester, plugin: list[str]
                                             ) -> None:
    """In a subprocess: the memory budget (5 % of the GPU, about 7 GiB) is process-wide."""
    pytester.makeconftest("""
        import torch

        def pytest_configure(config):
            torch.cuda.set_per_process_memory_fraction(0.05, 0)
    """)
    pytester.makepyfile(test_oom="""
        import torch

        def budget():
            return int(0.05 * torch.cuda.get_device_properties(0).total_memory)

        def test_1_runs_out_of_memory(gpu):
            held = []
            for _ in range(1000):   # 1 GiB blocks until the budget is gone
                held.append(torch.empty(2**30, dtype=torch.uint8, device=gpu))

        def test_2_needs_most_of_the_budget(gpu):
            big = torch.empty(int(budget() * 0.7), dtype=torch.uint8, device=gpu)
            del big

        def test_3_starts_clean(gpu):
            assert torch.cuda.memory_allocated(gpu) < 2**28
    """)
    result = pytester.runpytest_subprocess(*plugin, "-p", "no:randomly")
    print(result.stdout.str())
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([
        "*OutOfMemoryError*",
        "*- gputrain out of memory -*",
        "cuda:0 when the test failed: allocated * GiB, reserved * GiB, peak reserved * GiB",
        "gputrain frees what this test's traceback kept alive after its teardown*",
    ])


def test_gpu_fixture_warns_about_memory_left_allocated(pytester: pytest.Pytester,
                                                       plugin: list[str]) -> None:
    pytester.makepyfile(test_leak="""
        import torch

        KEEP = []

        def test_keeps_a_tensor(gpu):
            KEEP.append(torch.empty(256 * 2**20, dtype=torch.uint8, device=gpu))

        def test_clean(gpu):
            x = torch.randn(4096, 4096, device=gpu)
            y = x @ x   # cuBLAS workspace: released by the fixture, not a leak
            del x, y
    """)
    result = pytester.runpytest(*plugin, "-p", "no:randomly")
    print(result.stdout.str())
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*GpuMemoryWarning: gputrain: the test left 256 MiB allocated "
                                 "on cuda:0 after its teardown*"])
    assert result.stdout.str().count("GpuMemoryWarning") == 1


def test_gpu_monitor_reads_the_real_gpu(pytester: pytest.Pytester, plugin: list[str]) -> None:
    pytester.makepyfile(test_monitor="""
        import time
        import torch

        def test_watch(gpu, gpu_monitor):
            a = torch.randn(8192, 8192, device=gpu)
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                b = a @ a
                torch.cuda.synchronize()
            summary = gpu_monitor.summary()
            print("SUMMARY", {k: round(v.mean, 1) for k, v in summary.items()})
            assert summary["utilization_gpu"].max > 50
            assert summary["memory_used"].max > 256 * 2**20
            assert summary["power_draw"].mean > 0
            assert summary["sm_clock"].max > 0
            assert len(gpu_monitor.samples) >= 20
    """)
    result = pytester.runpytest(*plugin, "-s")
    print(result.stdout.str())
    result.assert_outcomes(passed=1)


# -- xdist -----------------------------------------------------------------------------------------

def _first_visible() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    return entries[0] if entries else "0"


def test_two_xdist_workers_share_one_gpu(pytester: pytest.Pytester, plugin: list[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    first = _first_visible()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", first)  # one GPU, whatever the machine has
    pytester.makepyfile(test_workers=f"""
        import os
        import pytest
        import torch

        @pytest.mark.parametrize("i", range(4))
        def test_worker_sees_its_gpu(i, gpu, worker_id):
            assert os.environ["CUDA_VISIBLE_DEVICES"] == {first!r}
            assert torch.cuda.device_count() == 1
            x = torch.ones(1024, device=gpu)
            assert x.sum().item() == 1024
    """)
    result = pytester.runpytest(*plugin, "-n", "2", "--gpu-per-worker=1", "--gpu-share")
    print(result.stdout.str())
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([f"gputrain: pinning 2 xdist workers to GPUs "
                                 f"(CUDA_VISIBLE_DEVICES, shared): gw0={first} gw1={first}"])
    refused = pytester.runpytest(*plugin, "-n", "2", "--gpu-per-worker=1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: gputrain: 2 xdist workers x 1 GPU each need 2 GPUs, "
                                  "1 available*--gpu-share*"])


@pytest.mark.requires_cuda(min_devices=2)
def test_two_xdist_workers_get_different_gpus(pytester: pytest.Pytester,
                                              plugin: list[str]) -> None:
    pytester.makepyfile(test_workers="""
        import os
        import pytest
        import torch

        @pytest.mark.parametrize("i", range(4))
        def test_worker_gpu(i, gpu, worker_id):
            assert torch.cuda.device_count() == 1
            name = os.environ["CUDA_VISIBLE_DEVICES"]
            print("WORKER", worker_id, name)
            torch.ones(1, device=gpu)
    """)
    result = pytester.runpytest(*plugin, "-n", "2", "--gpu-per-worker=1")
    print(result.stdout.str())
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["gputrain: pinning 2 xdist workers to GPUs "
                                 "(CUDA_VISIBLE_DEVICES): gw0=* gw1=*"])
    line = next(ln for ln in result.stdout.lines if ln.startswith("gputrain: pinning"))
    gw0, gw1 = (part.split("=")[1] for part in line.rsplit(": ", 1)[1].split())
    assert gw0 != gw1
