"""Run rules against whole fault signatures: each fault fires its own rule and nothing else at
warning level, and a healthy run fires nothing.

A signature is what a faulty training loop does to *all* the run facts, side effects included:
a starving loader also lowers GPU utilization and usually copies from pageable memory; a
launch-bound loop has short kernels and an idle GPU; training on the CPU leaves every GPU signal
unknown. The rule files' own cases (tests/rule_cases/GT1*.toml) test one rule at a time.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.facts import FactsFile
from pytest_gputrain.probe.facts import RunFacts

BASE = json.loads((Path(__file__).parent / "facts" / "run_healthy_h200.json").read_text())
GiB = 2**30

UNKNOWN_GPU = {
    "profile.captured": False, "profile.busy_percent": None, "profile.kernel_mean": None,
    "profile.gemm_percent": None, "profile.tensor_core_percent": None,
    "profile.h2d_pageable_copies": None, "profile.h2d_pageable_bytes_per_step": None,
    "profile.h2d_pageable_percent": None, "profile.host_wait_percent": None,
    "nvml.utilization_mean": None, "nvml.throttle_percent": None, "nvml.samples": 0,
    "memory.peak_reserved_percent": None, "memory.budget": None, "memory.growth_steps": None,
    "memory.growth_rising_percent": None, "memory.growth_per_step": None,
    "memory.growth_total": None, "memory.num_alloc_retries": None,
    "memory.inactive_split": None, "memory.inactive_split_percent": None,
    "memory.expandable_segments": None,
}

SIGNATURES: dict[str, tuple[set[str], dict[str, Any]]] = {
    "healthy": (set(), {}),
    "training on the CPU": ({"GT101"}, {
        **UNKNOWN_GPU, "device": "cpu", "cuda_used": False, "param_devices": ["cpu"],
        "input_devices": ["cpu"], "step_time": 0.49, "autocast_forwards": 0,
        "compute_capability": None, "loader.num_workers": 0, "loader.pin_memory": False,
        "loader.wait_percent": 9.0, "sync.per_step": 0.0}),
    "starving loader": ({"GT102"}, {
        "loader.num_workers": 0, "loader.pin_memory": False, "loader.persistent_workers": False,
        "loader.prefetch_factor": None, "loader.batch_pinned": False,
        "loader.wait_percent": 71.0, "loader.wait_per_step": 0.11, "step_time": 0.155,
        "profile.busy_percent": 19.0, "nvml.utilization_mean": 22.0,
        "profile.h2d_pageable_copies": 8, "profile.h2d_pageable_bytes_per_step": 80740352.0,
        "profile.h2d_pageable_percent": 4.1, "profile.host_wait_percent": 97.0}),
    "pageable copies": ({"GT103"}, {
        "loader.pin_memory": False, "loader.batch_pinned": False, "loader.wait_percent": 0.6,
        "profile.h2d_pageable_copies": 8, "profile.h2d_pageable_bytes_per_step": 16777216.0,
        "profile.h2d_pageable_percent": 24.0, "profile.h2d_pinned_copies": 0,
        "profile.busy_percent": 61.0, "nvml.utilization_mean": 63.0}),
    "sync-heavy steps": ({"GT104"}, {
        "sync.per_step": 2048.0, "sync.max_per_step": 2050, "sync.total": 200000,
        "sync.by_call": ["item: 199000", "tolist: 1000"], "profile.busy_percent": 9.0,
        "profile.kernel_mean": 11.0, "profile.host_wait_percent": 99.0,
        "nvml.utilization_mean": 12.0, "step_time": 0.41}),
    "launch-bound tiny batch": ({"GT105"}, {
        "profile.busy_percent": 13.0, "profile.kernel_mean": 5.8,
        "profile.short_kernel_percent": 100.0, "profile.kernels_per_step": 58.0,
        "profile.host_wait_percent": 94.0, "profile.gemm_percent": 31.0,
        "profile.tensor_core_percent": 100.0, "nvml.utilization_mean": 18.0,
        "step_time": 0.0021, "memory.batch_size": 8, "conv_layers": 0}),
    # The H200's batch-8 MLP: Adam (default foreach) over 6 tensors is a quarter of the step,
    # and the early window steps' one-time host work is not the loop's (GT117 stays quiet).
    "launch-bound tiny batch, the optimizer a quarter of the step": ({"GT105"}, {
        "profile.busy_percent": 1.8, "profile.kernel_mean": 2.2,
        "profile.short_kernel_percent": 100.0, "profile.kernels_per_step": 33.0,
        "profile.host_wait_percent": 99.9, "profile.host_silent_percent": 52.7,
        "profile.host_work_percent": 52.7, "profile.host_work_percent_steady": 0.0,
        "profile.loader_wait_percent": 0.0, "nvml.utilization_mean": 6.0,
        "step_time": 0.0012, "memory.batch_size": 8, "conv_layers": 0,
        "optimizer.name": "Adam", "optimizer.param_tensors": 6,
        "optimizer.step_host_percent": 24.6}),
    "fp32 without tensor cores": ({"GT106"}, {
        "autocast_forwards": 0, "tf32_matmul": False, "float32_matmul_precision": "highest",
        "profile.gemm_percent": 78.0, "profile.tensor_core_percent": 0.0,
        "profile.tensor_core_kernels": 0, "profile.busy_percent": 95.0, "conv_layers": 0}),
    "OOM risk": ({"GT107"}, {
        "memory.fraction": 0.2, "memory.budget": 30 * GiB, "memory.peak_reserved": 29 * GiB,
        "memory.peak_reserved_percent": 96.7, "memory.oom_batch_estimate": 4200}),
    "memory growth": ({"GT108"}, {
        "memory.growth_steps": 97, "memory.growth_rising_percent": 100.0,
        "memory.growth_per_step": 6291456.0, "memory.growth_total": 603979776,
        "memory.steps_to_exhaust": 22000.0, "memory.peak_reserved_percent": 4.0}),
    "evaluation without no_grad": ({"GT109"}, {
        "forwards_without_backward": 40, "no_grad_forwards": 0}),
    "fragmentation": ({"GT110"}, {
        "memory.num_alloc_retries": 23, "memory.inactive_split": 6 * GiB,
        "memory.inactive_split_percent": 21.0, "memory.peak_reserved_percent": 64.0,
        "input_shape_count": 8}),
    "throttled GPU": ({"GT112"}, {
        "nvml.throttle_percent": 42.0, "nvml.throttle_reasons": ["hw_thermal_slowdown"],
        "nvml.sm_clock_min": 1100.0}),
    "loader settings": ({"GT113"}, {
        "loader.num_workers": 32, "loader.persistent_workers": False, "loader.epochs": 15,
        "loader.epoch_start_wait": 4.0, "loader.epoch_start_percent": 31.0,
        "loader.wait_percent": 3.5, "profile.busy_percent": 78.0}),
    # Two faults at once: each costs a noticeable share of the step, both are reported.
    "starving loader and pageable copies": ({"GT102", "GT103"}, {
        "loader.num_workers": 0, "loader.pin_memory": False, "loader.batch_pinned": False,
        "loader.wait_percent": 45.0, "loader.wait_per_step": 0.018, "step_time": 0.04,
        "profile.busy_percent": 6.0, "profile.step_time": 0.043, "nvml.utilization_mean": 20.0,
        "profile.h2d_pageable_copies": 8, "profile.h2d_pageable_bytes_per_step": 57802752.0,
        "profile.h2d_pageable_percent": 17.0, "profile.host_wait_percent": 97.0,
        "memory.batch_size": 96, "profile.kernel_mean": 18.0}),
    "starving loader and mask syncs": ({"GT102", "GT104"}, {
        "loader.num_workers": 0, "loader.wait_percent": 40.0, "loader.wait_per_step": 0.02,
        "step_time": 0.05, "profile.busy_percent": 12.0, "nvml.utilization_mean": 15.0,
        "sync.per_step": 0.0, "sync.profiled_per_step": 16.0,
        "sync.profiled_readbacks_per_step": 16.0, "profile.sync_wait_percent": 22.0}),
    "partly starving loader beside a busy GPU": ({"GT102"}, {
        "loader.num_workers": 0, "loader.wait_percent": 28.0, "loader.wait_per_step": 0.014,
        "step_time": 0.05, "profile.busy_percent": 64.0, "nvml.utilization_mean": 70.0}),
    "boolean-mask syncs made in C++": ({"GT104"}, {
        "sync.per_step": 0.0, "sync.max_per_step": 0, "sync.by_call": [],
        "sync.profiled_per_step": 16.0, "sync.profiled_readbacks_per_step": 16.0,
        "profile.busy_percent": 14.0, "profile.kernel_mean": 9.0, "profile.host_wait_percent": 95.0,
        "memory.batch_size": 512}),
    # Healthy setups that looked like faults to the earlier conditions.
    "small model at a large batch (launch-bound, info only)": (set(), {
        "profile.busy_percent": 9.0, "profile.kernel_mean": 5.5,
        "profile.short_kernel_percent": 100.0, "profile.kernels_per_step": 38.0,
        "profile.host_wait_percent": 96.0, "profile.kernel_time_per_step": 0.00009,
        "profile.busy_percent_unprofiled": 10.0, "profile.busy_percent_without_waits": 10.0,
        "profile.idle_without_waits_percent": 90.0, "step_time": 0.0009,
        "memory.batch_size": 4096, "conv_layers": 0}),
    "compile caches that grew 9 MiB": (set(), {
        "memory.growth_steps": 97, "memory.growth_rising_percent": 95.0,
        "memory.growth_per_step": 97300.0, "memory.growth_late_per_step": 97000.0,
        "memory.growth_total": 9437184, "memory.steps_to_exhaust": 262438.0}),
    "power cap at the default limit under load": (set(), {
        "nvml.throttle_percent": 0.0, "nvml.power_cap_percent": 96.0,
        "nvml.throttle_reasons": ["sw_power_cap"], "nvml.power_max": 674.0,
        "nvml.power_limit": 700.0, "nvml.power_limit_default": 700.0,
        "nvml.utilization_mean": 99.0}),
}


def _run_with(patch: dict[str, Any]) -> FactsFile:
    data = copy.deepcopy(BASE)
    run = data["runs"][0]
    for path, value in patch.items():
        node, model = run, RunFacts
        *parents, last = path.split(".")
        for part in parents:
            model = model.model_fields[part].annotation
            node = node.setdefault(part, {})  # a group the recorded file predates
        # A fact the recorded file predates is still a fact of the model.
        assert last in node or last in model.model_fields, f"no run fact {path}"
        node[last] = value
    return FactsFile.model_validate(data)


@pytest.fixture(scope="module")
def engine() -> RuleEngine:
    return RuleEngine.load()


@pytest.mark.parametrize("fault", sorted(SIGNATURES))
def test_each_fault_fires_its_own_rule_only(engine: RuleEngine, fault: str) -> None:
    expected, patch = SIGNATURES[fault]
    findings = engine.evaluate_records(_run_with(patch))
    loud = {f.code for f in findings if f.severity in ("warning", "error")}
    assert loud == expected, [f"{f.code}: {f.message[:160]}" for f in findings]
    assert not any("could not be evaluated" in f.title for f in findings)
