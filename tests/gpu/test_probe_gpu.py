"""The run probe on a real CUDA GPU (written for the lent H200: torch 2.11, CUDA 13).

Every test is marked ``requires_cuda`` and skips without a usable CUDA GPU. Each drives a small
training test through ``pytest --gpu-diagnose`` in a subprocess (its own CUDA context, allocator
and profiler state) and reads the run facts it recorded (``--gpu-facts-out``):

- kernel busy time, kernel count and mean duration from the profiler window;
- host-to-device copies from pageable vs pinned memory;
- tensor-core kernels under bf16 autocast vs plain FP32 with TF32 off (GT106);
- allocated memory that grows when graph-attached losses are kept (GT108);
- an out-of-memory failure under ``set_per_process_memory_fraction`` (GT201, GT209);
- host-device syncs counted per step, and no hook left behind;
- the facts that keep the run rules from crying wolf: the busy share outside the profiler window,
  CUDA graph launches, syncs made inside C++ and the host's wait in them, the power limits, the
  allocator backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from cuda_usable import SKIP_WITHOUT_CUDA

pytestmark = [SKIP_WITHOUT_CUDA, pytest.mark.requires_cuda,
              pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240



def _installed() -> bool:
    return any(ep.value.startswith("pytest_gputrain") for ep in entry_points(group="pytest11"))


def _diagnose(tmp_path: Path, source: str, *extra: str) -> tuple[dict[str, Any], str, int]:
    """Run ``source`` as a test file under --gpu-diagnose; return (facts, output, exit code)."""
    (tmp_path / "test_inner.py").write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "test_inner.py", "--gpu-diagnose",
               "--gpu-fail-on=never", "--gpu-facts-out=facts.json", "--gpu-report=report.json",
               "-p", "no:cacheprovider", "-q", *extra]
    if not _installed():
        command[3:3] = ["-p", "pytest_gputrain.plugin"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    output = done.stdout + done.stderr
    print(output)
    assert (tmp_path / "facts.json").is_file(), output
    facts = json.loads((tmp_path / "facts.json").read_text())
    facts["findings"] = json.loads((tmp_path / "report.json").read_text())["findings"]
    return facts, output, done.returncode


def _run(facts: dict[str, Any], name: str) -> dict[str, Any]:
    (run,) = [r for r in facts["runs"] if r["nodeid"].endswith("::" + name)]
    assert run["probe_errors"] == [], run["probe_errors"]
    return run


def _codes(facts: dict[str, Any], test: str, severities: tuple[str, ...] = ("warning", "error")
           ) -> set[str]:
    return {f["code"] for f in facts["findings"]
            if f["subject"].endswith("::" + test) and f["severity"] in severities}


LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

DEVICE = torch.device("cuda")


def mlp(width=2048, depth=4):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(DEVICE)


def train(model, batches, steps, autocast=False, syncs=1, keep=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0
    while step < steps:
        for x, y in batches:
            x = x.to(DEVICE, non_blocking=True)
            y = y.to(DEVICE, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward(retain_graph=keep is not None)
            optimizer.step()
            for _ in range(syncs):
                loss.item()
            if keep is not None:
                keep.append(loss)
            step += 1
            if step == steps:
                break


def loader(batch, width=2048, n=None, pin=True, workers=2):
    n = n or batch * 8
    data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))
    return DataLoader(data, batch_size=batch, pin_memory=pin, num_workers=workers,
                      persistent_workers=workers > 0)
"""


def test_probe_records_kernels_copies_syncs_and_memory(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, LOOP + """
import threading

from pytest_gputrain.probe.torch_hooks import global_hook_counts


def os_threads():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_bf16_loop():
    # The probe is installed by now; its NVML sampler thread starts at the first CUDA step.
    assert [t.name for t in threading.enumerate()] == ["MainThread"]
    model = mlp()
    # CUDA's own threads make the process multi-threaded before the probe samples anything,
    # so a DataLoader fork warns on Python 3.12+ with or without the sampler thread.
    assert os_threads() > 1
    torch.backends.cudnn.benchmark = True
    train(model, loader(512), steps=16, autocast=True, syncs=5)


def test_no_hooks_left_after_the_previous_test():
    counts = global_hook_counts(torch)
    assert counts["_global_optimizer_post_hooks"] == 1   # this test's own probe
    assert counts["patched_attributes"] >= 10
    assert not [t for t in threading.enumerate() if t.name.startswith("gputrain-nvml")]
""")
    assert code == 0, output
    run = _run(facts, "test_bf16_loop")
    assert run["device"] == "cuda:0" and run["cuda_used"] is True
    assert run["steps"] == 16 and run["backwards"] == 16 and run["autocast_forwards"] == 32
    assert run["compute_capability"] and run["device_name"]
    profile = run["profile"]
    assert profile["captured"] is True, profile["reason"]
    assert (profile["first_step"], profile["last_step"], profile["steps"]) == (3, 6, 4)
    assert 0 < profile["busy_percent"] <= 100
    assert profile["kernels_per_step"] > 10 and profile["kernel_mean"] > 0
    assert profile["gemm_percent"] > 20
    assert profile["tensor_core_percent"] > 50, profile["top_kernels"]
    assert profile["h2d_pinned_copies"] >= 8 and profile["h2d_pageable_copies"] == 0
    assert profile["syncs_per_step"] >= 5
    assert run["sync"]["per_step"] == 5 and run["sync"]["by_call"] == ["Tensor.item: 80"]
    memory = run["memory"]
    assert memory["peak_allocated"] > 0 and memory["peak_reserved"] >= memory["peak_allocated"]
    assert len(memory["allocated_per_step"]) == 16 and memory["total"] > 0
    assert memory["fraction"] == 1.0 and memory["budget"] > 0
    assert memory["growth_rising_percent"] == 0.0
    assert run["loader"]["batch_pinned"] is True and run["loader"]["num_workers"] == 2
    if run["nvml"]["index"] is not None:
        assert run["nvml"]["samples"] > 0 and run["nvml"]["utilization_mean"] is not None
    assert profile["cupti_teardown"] is True, profile["cupti_teardown_reason"]
    assert not ({"GT103", "GT106", "GT108"} & _codes(facts, "test_bf16_loop"))


def test_pageable_and_pinned_copies_are_told_apart(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, LOOP + """

def test_pageable():
    train(mlp(), loader(1024, pin=False, workers=2), steps=12, autocast=True)


def test_pinned():
    train(mlp(), loader(1024, pin=True, workers=2), steps=12, autocast=True)
""")
    assert code == 0, output
    pageable = _run(facts, "test_pageable")["profile"]
    pinned = _run(facts, "test_pinned")["profile"]
    assert pageable["captured"] and pinned["captured"]
    assert pageable["h2d_pageable_copies"] >= 4 and pageable["h2d_pinned_copies"] == 0
    batch_bytes = 1024 * 2048 * 4
    if pageable["h2d_pageable_bytes_per_step"] is not None:
        assert pageable["h2d_pageable_bytes_per_step"] >= batch_bytes
    assert pinned["h2d_pageable_copies"] == 0 and pinned["h2d_pinned_copies"] >= 4
    assert _run(facts, "test_pinned")["loader"]["batch_pinned"] is True
    assert _run(facts, "test_pageable")["loader"]["batch_pinned"] is False


def test_tensor_cores_under_bf16_and_none_in_fp32_without_tf32(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, LOOP + """
import pytest


@pytest.fixture
def no_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    torch.set_float32_matmul_precision(precision)


def data():
    batches = [(torch.randn(4096, 4096, device=DEVICE), torch.randint(0, 10, (4096,),
                device=DEVICE)) for _ in range(4)]
    return batches


def test_fp32(no_tf32):
    train(mlp(4096), data(), steps=12)


def test_bf16(no_tf32):
    train(mlp(4096), data(), steps=12, autocast=True)
""")
    assert code == 0, output
    fp32 = _run(facts, "test_fp32")
    bf16 = _run(facts, "test_bf16")
    assert fp32["tf32_matmul"] is False and fp32["autocast_forwards"] == 0
    assert fp32["profile"]["gemm_percent"] > 30, fp32["profile"]["top_kernels"]
    assert fp32["profile"]["tensor_core_percent"] < 5, fp32["profile"]["top_kernels"]
    assert bf16["profile"]["tensor_core_percent"] > 50, bf16["profile"]["top_kernels"]
    assert "GT106" in _codes(facts, "test_fp32")
    assert "GT106" not in _codes(facts, "test_bf16")


def test_graph_attached_losses_make_memory_grow(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, LOOP + """
def data():
    return [(torch.randn(256, 2048, device=DEVICE), torch.randint(0, 10, (256,), device=DEVICE))
            for _ in range(4)]


def test_leak():
    kept = []
    train(mlp(), data(), steps=40, autocast=True, keep=kept)


def test_no_leak():
    train(mlp(), data(), steps=40, autocast=True)
""")
    assert code == 0, output
    leak = _run(facts, "test_leak")["memory"]
    flat = _run(facts, "test_no_leak")["memory"]
    assert leak["growth_per_step"] > 1024 * 1024 and leak["growth_rising_percent"] >= 90
    assert leak["steps_to_exhaust"] is not None
    assert abs(flat["growth_per_step"]) < 4096 and flat["growth_rising_percent"] < 50
    assert "GT108" in _codes(facts, "test_leak")
    assert "GT108" not in _codes(facts, "test_no_leak")


def test_window_facts_of_graphs_masks_and_the_step_outside_the_window(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, LOOP + """

def graph_batches():
    static_x = torch.randn(4096, 2048, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture, as the CUDA notes say
        static_x.mul(2).add_(1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_in = static_x.mul(2).add_(1)
    labels = torch.randint(0, 10, (4096,), device=DEVICE)
    while True:
        graph.replay()  # one cudaGraphLaunch per step
        yield static_in, labels


def test_graph_replay():
    train(mlp(), graph_batches(), steps=12, autocast=True)


def test_mask_syncs():
    model = mlp(width=256)  # small: the syncs, not the kernels, set the pace
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 256, device=DEVICE)
    y = torch.randint(-1, 10, (512, 8), device=DEVICE)
    for _ in range(12):
        logits = model(x)
        losses = []
        for column in range(8):
            known = y[:, column] >= 0
            losses.append(torch.nn.functional.cross_entropy(logits[known], y[known, column]))
        loss = torch.stack(losses).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
""")
    assert code == 0, output
    graphs = _run(facts, "test_graph_replay")
    profile = graphs["profile"]
    assert profile["captured"], profile["reason"]
    assert profile["graph_launches_per_step"] >= 1
    assert profile["kernel_time_per_step"] > 0
    # Outside the window the profiler no longer slows the launches: at least as busy.
    assert profile["busy_percent_unprofiled"] >= 0.8 * profile["busy_percent"]
    assert graphs["memory"]["allocator_backend"] == "native"
    nvml = graphs["nvml"]
    if nvml["index"] is not None:
        assert nvml["power_limit"] and nvml["power_limit_default"]
        assert nvml["power_limit"] <= nvml["power_limit_default"] * 1.01
    masks = _run(facts, "test_mask_syncs")
    assert masks["sync"]["per_step"] == 0  # no Python-level sync in the loop
    assert masks["sync"]["profiled_per_step"] >= 16  # two boolean masks per column
    assert masks["profile"]["sync_wait_percent"] > 0
    assert "GT104" in _codes(facts, "test_mask_syncs")


def test_oom_under_a_memory_fraction_is_diagnosed(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, """
import torch


def test_oom():
    torch.cuda.set_per_process_memory_fraction(0.02)
    total = torch.cuda.get_device_properties(0).total_memory
    keep = torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda")
    too_big = torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
""")
    assert code == 1, output
    (failure,) = facts["failures"]
    assert failure["kind"] == "oom" and failure["sticky"] is False
    assert failure["fraction"] == pytest.approx(0.02)
    assert failure["total"] > 0 and failure["free"] > failure["requested"] > 0
    assert failure["allocated"] >= 0.009 * failure["total"]
    assert failure["budget"] == pytest.approx(0.02 * failure["total"], rel=0.01)
    assert _codes(facts, "test_oom", ("error",)) >= {"GT201", "GT209"}
    assert "ERROR GT201 cuda-out-of-memory" in output
    assert "ERROR GT209 oom-memory-fraction" in output


def test_the_profiler_window_leaves_launches_as_fast_as_before(tmp_path: Path) -> None:
    """Kineto is asked to detach CUPTI after the window (TEARDOWN_CUPTI=1): launches after it,
    in this test and the next, cost what they cost before it, and the next test's window still
    captures (CUPTI re-attaches for it)."""
    facts, output, code = _diagnose(tmp_path, LOOP + """
import os
import statistics
import time


def launches(model, x, rounds=7, iterations=100):
    # Forward and backward without an optimizer step: no step boundary, so no window opens.
    per_iteration = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(iterations):
            model(x).sum().backward()
        torch.cuda.synchronize()
        per_iteration.append((time.perf_counter() - started) / iterations)
    return statistics.median(per_iteration)


def before_and_after_the_window():
    model = mlp(width=64, depth=8)  # tiny kernels: the loop is bound by launches
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device=DEVICE)
    y = torch.randint(0, 10, (32,), device=DEVICE)

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    launches(model, x, rounds=2)  # warm-up; the probe watches the model's first forwards
    step()  # step 1: from here on no training forward of this model is watched
    before = launches(model, x)
    for _ in range(8):  # steps 2-9; the profiler window covers steps 3-6
        step()
    after = launches(model, x)
    return before, after


def test_window_then_launches():
    before, after = before_and_after_the_window()
    assert os.environ.get("TEARDOWN_CUPTI") == "1"
    assert after < 1.10 * before, (before, after)


def test_the_next_test_profiles_again():
    before, after = before_and_after_the_window()
    assert after < 1.10 * before, (before, after)
""")
    assert code == 0, output
    for name in ("test_window_then_launches", "test_the_next_test_profiles_again"):
        profile = _run(facts, name)["profile"]
        assert profile["captured"] is True, profile["reason"]
        assert profile["cupti_teardown"] is True, profile["cupti_teardown_reason"]


def test_the_readings_that_name_the_exact_cause(tmp_path: Path) -> None:
    """Issue 32's readings on a GPU: explicit waits by kind and line, autocast for the wrong
    device, allocator history and the sync debug mode read while training, gradients no
    optimizer holds, and the loss's values kept at the finiteness checks (no sync per step)."""
    facts, output, code = _diagnose(tmp_path, LOOP + """
import torch.nn.functional as F


def test_explicit_waits():
    model = mlp(width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512, device=DEVICE), torch.randint(0, 10, (256,), device=DEVICE)
    for _ in range(16):
        loss = F.cross_entropy(model(x), y)
        torch.cuda.synchronize()                       # times the forward
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.cuda.synchronize()                       # times the backward
        optimizer.step()
        torch.cuda.current_stream().synchronize()      # times the step
        done = torch.cuda.Event()
        done.record()
        done.synchronize()                             # and once more, by an event


def test_cpu_autocast_around_a_cuda_model():
    model = mlp(width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512, device=DEVICE), torch.randint(0, 10, (256,), device=DEVICE)
    for _ in range(12):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def test_instruments_left_on():
    model = mlp(width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512, device=DEVICE), torch.randint(0, 10, (256,), device=DEVICE)
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for _ in range(40):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss.item()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.memory._record_memory_history(enabled=None)


def test_head_only_optimizer():
    backbone = mlp(width=512)
    head = torch.nn.Linear(10, 4).to(DEVICE)
    optimizer = torch.optim.SGD(head.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512, device=DEVICE), torch.randint(0, 4, (256,), device=DEVICE)
    for _ in range(12):
        loss = F.cross_entropy(head(backbone(x)), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def test_diverging_loss():
    probe = torch.nn.Linear(256, 128).to(DEVICE)
    optimizer = torch.optim.SGD(probe.parameters(), lr=1e4)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    centroids = torch.randn(128, 256, device=DEVICE, generator=gen)
    labels = torch.randint(128, (8 * 4096,), device=DEVICE, generator=gen)
    x = centroids[labels] + 6.0 * torch.randn(8 * 4096, 256, device=DEVICE, generator=gen)
    for step in range(60):  # eight batches in turn: too many rows to memorise
        rows = slice((step % 8) * 4096, (step % 8 + 1) * 4096)
        loss = F.cross_entropy(probe(x[rows]), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
""")
    assert code == 0, output
    waits = _run(facts, "test_explicit_waits")["sync"]
    assert waits["per_step"] == 4.0
    assert waits["by_call"] == ["torch.cuda.synchronize: 32", "Event.synchronize: 16",
                                "Stream.synchronize: 16"]
    assert all("test_inner.py:" in site for site in waits["by_site"]), waits["by_site"]
    assert "GT104" in _codes(facts, "test_explicit_waits")
    autocast = _run(facts, "test_cpu_autocast_around_a_cuda_model")
    assert autocast["autocast_other_forwards"] == 12 and autocast["autocast_forwards"] == 0
    assert autocast["autocast_other_devices"] == ["cpu"]
    instruments = _run(facts, "test_instruments_left_on")
    assert instruments["memory_history"] is True and instruments["sync_debug_mode"] == "warn"
    assert instruments["memory"]["allocator_calls_per_step"] > 0
    assert "GT144" in _codes(facts, "test_instruments_left_on", ("info", "warning"))
    grads = _run(facts, "test_head_only_optimizer")["grads"]
    assert grads["unused_params"] == 4 * 512 * 512 + 4 * 512 + 512 * 10 + 10
    assert grads["unused_bytes"] == 4 * grads["unused_params"] and grads["unused_ahead"] is True
    assert grads["backward_time_estimate"] is not None  # the window measured the GPU time
    loss = _run(facts, "test_diverging_loss")["loss"]
    assert loss["nonfinite_checks"] == 0 and loss["growth_orders"] >= 2.0, loss
    assert "GT146" in _codes(facts, "test_diverging_loss")
