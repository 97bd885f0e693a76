"""Facts as the test ran, on a real CUDA GPU (written for the lent H200).

Each test runs a small inner test file under ``pytest --gpu-diagnose`` in a subprocess and
reads the facts it recorded and the findings it reported:

- a memory fraction set inside a test and restored in ``finally:``: the run's budget is the
  fraction's (GT107 at 95 % of it), and an out-of-memory error under it is judged against it
  (GT201's message names the 4 GiB budget; GT209);
- another process started during the test (a real process that allocates with torch and waits
  for a signal file): without an OOM the run facts carry its memory and the budget shrinks
  (GT134); with an OOM, GT208 names its memory although it has exited by the end of the test;
- a cache left large by an earlier test: the next tests' figures (runs table, OOM message) are
  their own;
- peaks the test resets itself (``gpu_benchmark``) are kept.

The helper processes stop when their test ends, even when it fails (signal file in
``finally:``, and they exit when their parent does). The outer pytest process must not hold GPU
memory of its own (it would count as another process in the inner runs): this module never
initialises CUDA here.
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

pytestmark = [SKIP_WITHOUT_CUDA, pytest.mark.gpu, pytest.mark.requires_cuda,
              pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
GiB = 2**30



def _release_outer_cache() -> None:
    """This pytest process is "another process" to the one it starts: give back the GPU memory
    it cached in earlier in-process GPU tests (its CUDA context alone stays under the 1 GiB
    from which other processes count, GT134/GT208)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _diagnose(tmp_path: Path, source: str) -> tuple[dict[str, Any], str]:
    """Run ``source`` as a test file under --gpu-diagnose; return (facts + report, output)."""
    (tmp_path / "test_inner.py").write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "test_inner.py", "--gpu-diagnose",
               "--gpu-fail-on=never", "--gpu-facts-out=facts.json", "--gpu-report=report.json",
               "-p", "no:cacheprovider", "-q", "-rs"]
    if not any(ep.value.startswith("pytest_gputrain") for ep in entry_points(group="pytest11")):
        command[3:3] = ["-p", "pytest_gputrain.plugin"]
    _release_outer_cache()
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    output = done.stdout + done.stderr
    print(output)
    assert (tmp_path / "facts.json").is_file(), output
    facts = json.loads((tmp_path / "facts.json").read_text())
    report = json.loads((tmp_path / "report.json").read_text())
    facts["findings"] = report["findings"]
    facts["runs_section"] = report.get("sections", {}).get("runs") or []
    return facts, output


def _run(facts: dict[str, Any], name: str) -> dict[str, Any]:
    (run,) = [r for r in facts["runs"] if r["nodeid"].endswith("::" + name)]
    assert run["probe_errors"] == [], run["probe_errors"]
    return run


def _failure(facts: dict[str, Any], name: str) -> dict[str, Any]:
    (failure,) = [f for f in facts["failures"] if f["nodeid"].endswith("::" + name)]
    return failure


def _findings(facts: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    return {f["code"]: f for f in facts["findings"] if f["subject"].endswith("::" + name)}


def _loud(facts: dict[str, Any], name: str) -> set[str]:
    return {code for code, f in _findings(facts, name).items()
            if f["severity"] in ("warning", "error") and f["scope"] in ("run", "failure")}


def _skipped_for_pid_namespace(output: str) -> None:
    if "NVML lists this process under another PID" in output:
        pytest.skip("NVML lists processes under another PID namespace: other processes' memory "
                    "cannot be told from this one's on this machine")


def test_a_memory_fraction_set_and_restored_inside_the_test(tmp_path: Path) -> None:
    facts, _ = _diagnose(tmp_path, """
import torch
import torch.nn.functional as F

GiB = 2**30


def test_peak_close_to_the_cap():
    model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),
                                torch.nn.Linear(8192, 512)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 2048, device="cuda")
    y = torch.randint(512, (4096,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(torch.cuda.max_memory_reserved() * 1.05 / total)
    try:
        for _ in range(20):
            step()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_oom_under_the_cap():
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(4 * GiB / total)
    try:
        head = torch.nn.Linear(1024, 131072).cuda()
        optimizer = torch.optim.SGD(head.parameters(), lr=1e-2)
        for batch in (512, 512, 16384):       # 16384 x 131072 float32 logits: 8 GiB
            x = torch.randn(batch, 1024, device="cuda")
            loss = head(x).logsumexp(1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert torch.cuda.get_per_process_memory_fraction() == 1.0
""")
    run = _run(facts, "test_peak_close_to_the_cap")
    memory = run["memory"]
    assert memory["fraction"] < 0.5 and memory["budget"] < 0.5 * memory["total"]
    assert memory["budget"] == pytest.approx(memory["fraction"] * memory["total"], rel=1e-3)
    assert 90 < memory["peak_reserved_percent"] <= 100, memory
    assert any(change.startswith("memory_fraction: 1.0 -> ") for change in run["settings_changes"])
    assert "GT107" in _loud(facts, "test_peak_close_to_the_cap")

    failure = _failure(facts, "test_oom_under_the_cap")
    assert failure["kind"] == "oom" and failure["oom_observed"] is True
    assert failure["fraction_limit"] == pytest.approx(4 * GiB, rel=1e-3)
    assert failure["budget"] == pytest.approx(4 * GiB, rel=1e-3)
    assert failure["fraction"] == pytest.approx(4 * GiB / failure["total"], abs=1e-4)
    assert failure["free"] > 100 * GiB and failure["requested"] >= 8 * GiB
    findings = _findings(facts, "test_oom_under_the_cap")
    assert {"GT201", "GT209"} <= _loud(facts, "test_oom_under_the_cap")
    assert "GT208" not in findings
    assert "budget 4.0 GiB" in findings["GT201"]["message"], findings["GT201"]["message"]
    assert "4.0 GiB of" in findings["GT209"]["message"], findings["GT209"]["message"]


HELPER = '''
import os, subprocess, sys, time
from pathlib import Path

import pytest
import torch

GiB = 2**30
SERVER = """
import os, sys, time
import torch
size, ready, stop, parent = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
held = torch.empty(size, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open(ready, "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(stop) and os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def nvml_sees_this_process():
    from pytest_gputrain.collect import nvml

    listed = nvml.read_processes(nvml.index_for_cuda_device(torch.cuda.current_device()))
    if not listed.ok or os.getpid() not in [p.pid for p in listed.value]:
        pytest.skip("NVML lists this process under another PID")


class Server:
    """A real process that holds `size` bytes on the GPU until the test ends."""

    def __init__(self, folder, size):
        self.ready, self.stop = Path(folder) / "ready", Path(folder) / "stop"
        self.process = subprocess.Popen([sys.executable, "-c", SERVER, str(size),
                                         str(self.ready), str(self.stop), str(os.getpid())])

    def __enter__(self):
        deadline = time.monotonic() + 120
        while not self.ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError("the helper process did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.stop.touch()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
'''


def test_another_process_started_during_the_test(tmp_path: Path) -> None:
    facts, output = _diagnose(tmp_path, HELPER + """

def train_steps(model, optimizer, x, steps):
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def test_server_beside_training(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 4096)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(8192, 4096, device="cuda")
    nvml_sees_this_process()
    with Server(tmp_path, 40 * GiB):
        train_steps(model, optimizer, x, 200)
    train_steps(model, optimizer, x, 20)     # the server is gone by the end of the test


def test_server_takes_the_gpu(tmp_path):
    head = torch.nn.Linear(4096, 131072).cuda()
    optimizer = torch.optim.SGD(head.parameters(), lr=1e-2)
    x = torch.randn(16384, 4096, device="cuda")
    torch.cuda.synchronize()
    nvml_sees_this_process()
    free, _ = torch.cuda.mem_get_info()
    with Server(tmp_path, free - 6 * GiB):
        loss = head(x).logsumexp(1).mean()   # 8 GiB of logits
        loss.backward()
        optimizer.step()
""")
    _skipped_for_pid_namespace(output)
    run = _run(facts, "test_server_beside_training")
    assert run["nvml"]["other_process_memory_max"] >= 40 * GiB, run["nvml"]
    assert run["nvml"]["other_process_count_max"] >= 1
    memory = run["memory"]
    assert memory["other_processes"] >= 40 * GiB
    assert memory["budget"] <= memory["total"] - 40 * GiB
    assert "GT134" in _loud(facts, "test_server_beside_training")

    failure = _failure(facts, "test_server_takes_the_gpu")
    assert failure["kind"] == "oom" and failure["other_processes"] >= 100 * GiB, failure
    assert failure["other_process_count"] >= 1
    findings = _findings(facts, "test_server_takes_the_gpu")
    assert {"GT201", "GT208"} <= _loud(facts, "test_server_takes_the_gpu")
    from pytest_gputrain.units import format_bytes

    assert format_bytes(failure["other_processes"]) in findings["GT208"]["message"]


def test_a_cache_left_by_an_earlier_test_is_not_the_next_tests(tmp_path: Path) -> None:
    facts, _ = _diagnose(tmp_path, """
import torch

GiB = 2**30


def train(width, batch, steps):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device="cuda")
    for _ in range(steps):
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def test_a_grows_the_cache():
    train(1024, 256, 5)
    block = torch.empty(20 * GiB, dtype=torch.uint8, device="cuda")
    del block                                 # freed, but the cache keeps it reserved


def test_b_small_training():
    assert torch.cuda.memory_reserved() >= 20 * GiB
    train(1024, 256, 20)


def test_c_oom_under_a_small_cap():
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(0.03)
    try:
        train(1024, 256, 3)
        too_big = torch.empty(24 * GiB, dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
""")
    from pytest_gputrain.units import format_bytes

    small = _run(facts, "test_b_small_training")["memory"]
    assert small["reserved_start"] >= 20 * GiB and small["reserved_grown"] < 64 * 2**20, small
    assert small["peak_reserved"] >= 20 * GiB  # the allocator's figure, the earlier cache in it
    assert small["peak_memory"] < 2 * GiB and small["peak_reserved_percent"] < 5, small
    (row,) = [r for r in facts["runs_section"] if r["nodeid"].endswith("::test_b_small_training")]
    assert row["memory.peak_memory"] == small["peak_memory"], row

    failure = _failure(facts, "test_c_oom_under_a_small_cap")
    assert failure["reserved_start"] >= 20 * GiB and failure["peak_memory"] < 2 * GiB, failure
    assert failure["fraction"] == pytest.approx(0.03, abs=1e-3)
    message = _findings(facts, "test_c_oom_under_a_small_cap")["GT201"]["message"]
    assert f"before the failure: {format_bytes(failure['peak_memory'])} (" in message, message
    assert {"GT201", "GT209"} <= _loud(facts, "test_c_oom_under_a_small_cap")


def test_peaks_survive_a_reset_inside_the_test(tmp_path: Path) -> None:
    facts, output = _diagnose(tmp_path, """
import torch

GiB = 2**30


def test_benchmarked_step(gpu_benchmark):
    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")

    def step():
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()
    scratch = torch.empty(6 * GiB, dtype=torch.uint8, device="cuda")   # the test's own peak
    del scratch
    result = gpu_benchmark(step)            # resets the peak statistics for its own reading
    assert result.peak_vram_max < 1 * GiB   # the benchmark still measures only its rounds
""")
    assert "1 passed" in output, output
    memory = _run(facts, "test_benchmarked_step")["memory"]
    assert memory["peak_allocated"] >= 6 * GiB, memory
    assert memory["peak_memory"] >= 6 * GiB
