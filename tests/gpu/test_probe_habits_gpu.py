"""The probe's habit readings that need CUDA (written for the lent H200).

Each test drives a small training test through ``pytest --gpu-diagnose`` in a subprocess and
reads the run facts it recorded:

- ``torch.cuda.empty_cache()`` in every step: counted per step, and the cudaMalloc calls it
  forces (the allocator's ``num_device_alloc``) against a loop without it (GT119, GT135);
- small tensors built on the host and copied in the forward: the profiler window's small
  host-to-device copies and the syncs right after them, against tensors made on the device
  (GT129).
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

pytestmark = [SKIP_WITHOUT_CUDA, pytest.mark.requires_cuda, pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240



def _diagnose(tmp_path: Path, source: str) -> dict[str, Any]:
    """Run ``source`` as a test file under --gpu-diagnose; the facts, with the findings."""
    (tmp_path / "test_inner.py").write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "test_inner.py", "--gpu-diagnose",
               "--gpu-fail-on=never", "--gpu-facts-out=facts.json", "--gpu-report=report.json",
               "-p", "no:cacheprovider", "-q"]
    if not any(ep.value.startswith("pytest_gputrain") for ep in entry_points(group="pytest11")):
        command[3:3] = ["-p", "pytest_gputrain.plugin"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    output = done.stdout + done.stderr
    print(output)
    assert done.returncode == 0, output
    facts: dict[str, Any] = json.loads((tmp_path / "facts.json").read_text())
    facts["findings"] = json.loads((tmp_path / "report.json").read_text())["findings"]
    return facts


def _run(facts: dict[str, Any], name: str) -> dict[str, Any]:
    (run,) = [r for r in facts["runs"] if r["nodeid"].endswith("::" + name)]
    assert run["probe_errors"] == [], run["probe_errors"]
    return run


def _codes(facts: dict[str, Any], test: str) -> set[str]:
    return {f["code"] for f in facts["findings"] if f["subject"].endswith("::" + test)}


EMPTY_CACHE = """
import torch

def train(flush):
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048) for _ in range(4))).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4096, 2048, device="cuda")
    for _ in range(40):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if flush:
            torch.cuda.empty_cache()

def test_flush():
    train(True)

def test_keep():
    train(False)
"""


def test_empty_cache_calls_and_the_cudamalloc_calls_they_force(tmp_path: Path) -> None:
    facts = _diagnose(tmp_path, EMPTY_CACHE)
    flush, keep = _run(facts, "test_flush"), _run(facts, "test_keep")
    assert flush["empty_cache_calls"] == 40 and flush["empty_cache_steps_percent"] >= 90
    assert keep["empty_cache_calls"] == 0 and keep["empty_cache_steps_percent"] == 0
    # Every flushed step allocates its activations again; the cache serves the other loop.
    assert flush["memory"]["device_allocs_per_step"] >= 2, flush["memory"]
    assert keep["memory"]["device_allocs_per_step"] == 0, keep["memory"]
    assert flush["memory"]["device_frees_steady"] == 0  # all frees were empty_cache()'s
    assert "GT119" in _codes(facts, "test_flush") and "GT119" not in _codes(facts, "test_keep")
    assert "GT135" not in _codes(facts, "test_flush") | _codes(facts, "test_keep")


HOST_TENSORS = """
import torch

class Block(torch.nn.Module):
    def __init__(self, on_host):
        super().__init__()
        self.fc = torch.nn.Linear(4096, 4096)
        self.on_host = on_host

    def forward(self, x):
        if self.on_host:
            scale = torch.tensor(0.5).cuda()
            noise = torch.randn(4096).cuda()
        else:
            scale = 0.5
            noise = torch.randn(4096, device=x.device)
        return x + self.fc(x) * scale + 0.01 * noise

def train(on_host):
    model = torch.nn.Sequential(*(Block(on_host) for _ in range(4))).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 4096, device="cuda")
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

def test_on_host():
    train(True)

def test_on_device():
    train(False)
"""


def test_small_host_copies_and_their_syncs(tmp_path: Path) -> None:
    facts = _diagnose(tmp_path, HOST_TENSORS)
    host = _run(facts, "test_on_host")["profile"]
    device = _run(facts, "test_on_device")["profile"]
    assert host["captured"] and device["captured"]
    assert host["h2d_small_copies_per_step"] == 8.0, host
    assert host["h2d_small_syncs_per_step"] >= 7.0, host  # each .cuda() syncs the stream
    assert host["h2d_small_host_percent"] > 0
    assert device["h2d_small_copies_per_step"] == 0.0, device
    assert "GT129" not in _codes(facts, "test_on_device")
