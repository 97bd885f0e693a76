"""Pure pieces of the GPU assertions: requirement decisions, allocation replay, timelines."""

from __future__ import annotations

import pytest

from pytest_gputrain.assertions.markers import MaxVram, MinUtilization, RequiresCuda
from pytest_gputrain.assertions.memory import MemoryResult, check_max_vram, top_allocations
from pytest_gputrain.assertions.requirements import (
    CudaDevice,
    FreeMemory,
    Inventory,
    no_gpu_reason,
    unmet,
)
from pytest_gputrain.assertions.testing import cpu_inventory, gpu_inventory
from pytest_gputrain.assertions.utilization import (
    UtilizationResult,
    check_min_utilization,
    sparkline,
    timeline,
)

GiB = 2**30


def no_free_read(index: int) -> FreeMemory:
    raise AssertionError("free memory must only be read for min_free_vram")


def test_a_healthy_gpu_meets_a_plain_requirement_without_reading_free_memory() -> None:
    assert unmet(RequiresCuda(), gpu_inventory(), no_free_read) == []


def test_every_unmet_condition_is_listed() -> None:
    inventory = gpu_inventory(name="Tesla T4", capability=(7, 5), total="16GiB",
                              torch_version="2.0.1", driver_version="470.1")
    spec = RequiresCuda(min_devices=1, min_capability=(8, 0), min_total_vram=24 * GiB,
                        bf16=True, min_torch="2.1", min_driver="535")
    assert unmet(spec, inventory, no_free_read) == [
        "needs torch >= 2.1, have 2.0.1",
        "needs NVIDIA driver >= 535, have 470.1",
        "needs compute capability >= 8.0, cuda:0 (Tesla T4) has 7.5",
        "needs bf16: cuda:0 (Tesla T4) has compute capability 7.5 (bf16 needs >= 8.0)",
        "needs 24 GiB total on cuda:0, Tesla T4 has 16 GiB",
    ]


def test_no_gpu_comes_first_with_the_versions_that_can_still_be_judged() -> None:
    spec = RequiresCuda(min_torch="2.14", min_driver="535")
    reasons = unmet(spec, cpu_inventory(), no_free_read)
    assert reasons[0].startswith("no CUDA GPU: torch 2.13.0+cpu is a CPU-only build; NVIDIA "
                                 "driver not installed")
    assert reasons[1:] == ["needs torch >= 2.14, have 2.13.0+cpu",
                           "needs NVIDIA driver >= 535, driver version: NVIDIA driver not "
                           "installed (libnvidia-ml.so not found: NVML Shared Library Not "
                           "Found)"]


def test_checks_cover_every_required_device() -> None:
    inventory = gpu_inventory(count=2)
    inventory.devices[1].capability = (7, 0)
    assert unmet(RequiresCuda(min_capability=(8, 0)), inventory, no_free_read) == []
    assert unmet(RequiresCuda(min_devices=2, min_capability=(8, 0)), inventory,
                 no_free_read) == ["needs compute capability >= 8.0, cuda:1 (NVIDIA H200) has "
                                   "7.0"]


def test_unknown_facts_are_unmet_with_the_reason() -> None:
    inventory = Inventory(torch_version="2.11", cuda_build="13.0", cuda_available=True,
                          devices=[CudaDevice(0, unknown={"capability": "NotSupported"})])
    assert unmet(RequiresCuda(min_capability=(8, 0), bf16=True), inventory, no_free_read) == [
        "needs compute capability >= 8.0, cuda:0 has an unknown capability (NotSupported)",
        "needs bf16, cuda:0 has an unknown compute capability (NotSupported)"]
    free = unmet(RequiresCuda(min_free_vram=GiB), inventory,
                 lambda i: FreeMemory(free=None, reason="NVML: no; torch: no"))
    assert free == ["needs 1 GiB free on cuda:0, free memory unknown (NVML: no; torch: no)"]


def test_free_memory_message_names_who_holds_it() -> None:
    spec = RequiresCuda(min_free_vram=24 * GiB)
    held = FreeMemory(free=int(7.9 * GiB), total=141 * GiB, other_processes=2,
                      other_memory=131 * GiB, own_memory=2 * GiB)
    assert unmet(spec, gpu_inventory(), lambda i: held) == [
        "needs 24 GiB free on cuda:0, 7.9 GiB free: 2 other processes hold 131 GiB; this test "
        "session's processes hold 2 GiB"]
    lone = FreeMemory(free=GiB, total=141 * GiB, other_processes=0, own_memory=0)
    assert unmet(spec, gpu_inventory(), lambda i: lone) == [
        "needs 24 GiB free on cuda:0, 1 GiB free (no other compute process is listed: see "
        "nvidia-smi)"]


@pytest.mark.parametrize(("inventory", "reason"), [
    (Inventory(torch_error="ModuleNotFoundError: No module named 'torch'", driver_version="580"),
     "no CUDA GPU: torch is not importable (ModuleNotFoundError: No module named 'torch')"),
    (Inventory(torch_version="2.11", cuda_build="13.0", cuda_available=True),
     "no CUDA GPU: torch sees no CUDA device"),
    (Inventory(torch_version="2.11", cuda_build="13.0", nvml_device_count=2,
               cuda_visible_devices="7"), "no CUDA GPU: CUDA_VISIBLE_DEVICES='7' hides all 2 GPUs"),
    (Inventory(torch_version="2.11", cuda_build="13.0",
               nvml_error="the NVIDIA kernel driver is not loaded: Driver Not Loaded"),
     "no CUDA GPU: NVIDIA kernel driver is not loaded: Driver Not Loaded"),
])
def test_no_gpu_reasons(inventory: Inventory, reason: str) -> None:
    assert no_gpu_reason(inventory) == reason


def entry(action: str, addr: int, size: int, line: int = 0,
          filename: str = "/proj/train.py") -> dict[str, object]:
    frames = [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
               "line": 125, "name": "forward"},
              {"filename": filename, "line": line, "name": "step"}]
    return {"action": action, "addr": addr, "size": size, "frames": frames}


def test_top_allocations_are_those_live_at_the_peak() -> None:
    trace = [
        entry("alloc", 1, 4 * GiB, line=10),
        entry("alloc", 2, 1 * GiB, line=11),
        entry("alloc", 3, 1 * GiB, line=11),
        entry("free_requested", 2, 1 * GiB),
        entry("alloc", 4, 2 * GiB, line=12),   # peak: 1 + 3 + 4 = 7 GiB
        entry("free_requested", 4, 2 * GiB),
        entry("free_completed", 4, 2 * GiB),
        entry("alloc", 5, 1 * GiB, line=13),   # after the peak: not listed
        {"action": "segment_alloc", "addr": 99, "size": 20 * GiB},
    ]
    sites = top_allocations(trace)
    assert [(s.line, s.size, s.count) for s in sites] == [(10, 4 * GiB, 1), (12, 2 * GiB, 1),
                                                          (11, 1 * GiB, 1)]
    assert sites[0].function == "step"  # the first frame outside torch
    assert sites[0].describe("/proj") == "     4 GiB  train.py:10 in step (1 block)"
    assert top_allocations([]) == []
    assert len(top_allocations(trace, limit=1)) == 1


def test_max_vram_check() -> None:
    spec = MaxVram(limit=6 * GiB)
    assert check_max_vram(spec, MemoryResult("allocated", peak=6 * GiB)) is None
    failure = check_max_vram(spec, MemoryResult("allocated", peak=9 * GiB, allocated_at_start=0,
                                                history_note="not recorded: no torch"))
    assert failure is not None
    assert failure.summary == ("max_vram: peak allocated GPU memory 9 GiB exceeds the 6 GiB "
                               "limit by 3 GiB (+50 %) on cuda:0")
    assert "allocations: not recorded: no torch" in failure.details
    unknown = check_max_vram(MaxVram(GiB, "device"), MemoryResult("device", reason="no NVML"))
    assert unknown is not None
    assert unknown.summary == ("max_vram: cannot measure the device peak on cuda:0: no NVML "
                               "(limit 1 GiB)")


def test_sparkline_and_timeline() -> None:
    assert sparkline([0, 50, 100]) == "▁▅█"
    assert sparkline([]) == ""
    assert len(sparkline(list(range(1000)), width=40)) == 40
    points = [(i * 0.1, 0.0 if i < 10 else 100.0) for i in range(40)]
    line, step = timeline(points, duration=4.0, warmup=1.0, width=20)
    assert line == "▁▁▁▁▁|" + "█" * 15
    assert step == pytest.approx(0.2)
    assert timeline([], 1.0) == ("", 0.0)


def test_min_utilization_check() -> None:
    spec = MinUtilization(percent=50, warmup=1.0)
    busy = UtilizationResult(points=[(t / 10, 0.0 if t < 10 else 90.0) for t in range(30)],
                             duration=3.0)
    assert check_min_utilization(spec, busy) is None
    idle = UtilizationResult(points=[(t / 10, 20.0) for t in range(30)], duration=3.0,
                             nvml_index=4)
    failure = check_min_utilization(spec, idle)
    assert failure is not None
    assert failure.summary == ("min_utilization: mean GPU utilization 20.0 % is below the 50 % "
                               "minimum on cuda:0 (NVML GPU 4)")
    assert "stats:    mean 20.0 %, p10 20 %, p50 20 %, p90 20 %, max 20 %" in failure.details
