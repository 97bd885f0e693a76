"""Activation checkpointing on a real CUDA GPU (GT158): what the CPU tests
(tests/test_probe_recompute.py) cannot run.

Eight 4096-wide blocks at a batch of 8192, the last seven through ``torch.utils.checkpoint``:

- the recomputations of four steady steps are timed between CUDA events with no sync while the
  test trains: from step 8 on (the steps timed included) the loop runs under
  ``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising call;
- the activations the recomputed blocks of one backward allocate are read from the allocator
  (each block's recomputed output, 128 MiB, at least), for ``use_reentrant`` True and False;
  the backward reentrant checkpointing starts for each segment is no backward of a step;
- with the whole GPU to spare GT158 is a warning (the recomputation is about a fifth of an fp32
  step); under a memory fraction of 1.6 times the peak the estimate with checkpointing off is
  above half the budget and GT158 stays quiet; without checkpointing nothing is counted.

One subprocess runs all the inner tests (see test_probe_gpu.py for the harness).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_probe_gpu import _codes, _diagnose, _run

pytestmark = [pytest.mark.requires_cuda, pytest.mark.gpu]

STEPS, CHECKPOINTED = 24, 7
ACTIVATION = 8192 * 4096 * 4  # one block's output in fp32

INNER = """
import torch
from torch.utils.checkpoint import checkpoint

DEVICE = torch.device("cuda")
WIDTH, DEPTH, BATCH = 4096, 8, 8192


def train(mode, steps=24, sync_free_from=None, cap=None):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
        for _ in range(DEPTH)).to(DEVICE)
    head = torch.nn.Linear(WIDTH, 10).to(DEVICE)
    optimizer = torch.optim.SGD([*layers.parameters(), *head.parameters()], lr=1e-3)
    x = torch.randn(BATCH, WIDTH, device=DEVICE)
    y = torch.randint(0, 10, (BATCH,), device=DEVICE)
    total = torch.cuda.get_device_properties(DEVICE).total_memory
    reentrant = mode == "reentrant"
    try:
        for step in range(steps):
            if step == sync_free_from:
                torch.cuda.set_sync_debug_mode("error")
            if step == 3 and cap is not None:  # a share of the GPU: 1.6 x the peak so far
                torch.cuda.set_per_process_memory_fraction(
                    cap * torch.cuda.max_memory_allocated() / total)
            h = layers[0](x)  # its output requires grad: the checkpointed blocks recompute
            for layer in layers[1:]:
                h = layer(h) if mode == "off" else checkpoint(layer, h, use_reentrant=reentrant)
            loss = torch.nn.functional.cross_entropy(head(h), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_a_tight_share():
    torch.cuda.empty_cache()
    train("non-reentrant", cap=1.6)


def test_non_reentrant():
    train("non-reentrant", sync_free_from=7)


def test_reentrant():
    train("reentrant")


def test_off():
    train("off")
"""


def test_checkpointing_on_the_gpu(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, INNER)
    assert code == 0, output  # no sync in the steps timed: set_sync_debug_mode("error") held
    segments = CHECKPOINTED * STEPS
    for name, reentrant in (("test_non_reentrant", 0), ("test_reentrant", segments)):
        run = _run(facts, name)
        recompute = run["recompute"]
        assert recompute["calls"] == recompute["recomputes"] == segments, (name, recompute)
        assert recompute["reentrant_calls"] == reentrant
        assert run["backwards"] == run["loss"]["backwards"] == STEPS  # a segment's is no step's
        assert recompute["recomputes_per_step"] == CHECKPOINTED
        assert recompute["segments"] == ["Sequential"]
        assert recompute["site"].startswith("`h = layer(h) if mode == ") and (
            "test_inner.py:" in recompute["site"])
        assert recompute["timed_steps"] == 4 and recompute["clock"] == "CUDA events"
        assert recompute["step_time"] > recompute["time_per_step"], recompute  # the GPU's step
        assert 5 <= recompute["step_percent"] <= 60, recompute
        assert recompute["activation_bytes"] >= 0.9 * CHECKPOINTED * ACTIVATION, recompute
        assert recompute["peak_without"] == (run["memory"]["peak_memory"]
                                             + recompute["activation_bytes"])
        assert recompute["peak_without_percent"] < 50
    assert "GT158" in _codes(facts, "test_non_reentrant")

    tight = _run(facts, "test_a_tight_share")
    assert tight["memory"]["fraction"] < 1.0
    assert tight["recompute"]["peak_without_percent"] > 50, tight["recompute"]
    assert "GT158" not in _codes(facts, "test_a_tight_share", ("info", "warning"))

    off = _run(facts, "test_off")
    assert off["recompute"]["calls"] == off["recompute"]["recomputes"] == 0
    assert "GT158" not in _codes(facts, "test_off", ("info", "warning"))
