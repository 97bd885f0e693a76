"""The training loop's own facts on a real CUDA GPU (GT140-GT143): what the CPU tests
(tests/test_probe_loop.py) cannot run.

- the loss's finiteness checks add no sync: after the profiler window, a loop with no sync of
  its own trains under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any
  synchronising call, while the probe checks its loss (backwards 17, 25 and 33), and the NaN
  those checks queued is found when the test ends;
- float16 autocast is told from bfloat16 at each top-level forward, and a GradScaler's loss
  scaling is counted (GT141 only on float16 without it);
- a loss computed on a CPU copy of the outputs is counted against a model on the GPU (GT143);
- ``torch.save`` of CUDA state is timed, and a profiler window that saved leaves its read-backs
  unknown (no GT104 for the save's copies).

One subprocess runs all the inner tests (see test_probe_gpu.py for the harness).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_probe_gpu import LOOP, _codes, _diagnose, _run

pytestmark = [pytest.mark.requires_cuda, pytest.mark.gpu]

INNER = LOOP + """
import torch.nn.functional as F


def steps(model, optimizer, count, loss_of, scaler=None, dtype=None):
    x = torch.randn(512, 2048, device=DEVICE)
    y = torch.randint(0, 10, (512,), device=DEVICE)
    for step in range(count):
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(x)
        loss = loss_of(out, y, step)
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


def test_nan_found_without_a_sync():
    model = mlp(depth=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    def loss_of(out, y, step, first=0):
        loss = F.cross_entropy(out.float(), y)
        return loss * float("nan") if first + step >= 20 else loss
    steps(model, optimizer, 10, loss_of)  # the profiler window (steps 3-6) syncs when it closes
    torch.cuda.set_sync_debug_mode("error")  # from here on any synchronising call raises
    try:
        steps(model, optimizer, 30, lambda out, y, step: loss_of(out, y, step, first=10))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_fp16_without_scaler():
    model = mlp(depth=2)
    steps(model, torch.optim.SGD(model.parameters(), lr=1e-3), 16,
          lambda out, y, _: F.cross_entropy(out.float(), y), dtype=torch.float16)


def test_fp16_with_scaler():
    model = mlp(depth=2)
    steps(model, torch.optim.SGD(model.parameters(), lr=1e-3), 16,
          lambda out, y, _: F.cross_entropy(out.float(), y), dtype=torch.float16,
          scaler=torch.amp.GradScaler("cuda"))


def test_bf16_without_scaler():
    model = mlp(depth=2)
    steps(model, torch.optim.SGD(model.parameters(), lr=1e-3), 16,
          lambda out, y, _: F.cross_entropy(out.float(), y), dtype=torch.bfloat16)


def test_loss_on_cpu():
    model = mlp(depth=2)
    steps(model, torch.optim.SGD(model.parameters(), lr=1e-3), 16,
          lambda out, y, _: F.cross_entropy(out.float().cpu(), y.cpu()))


def test_checkpoint_every_step(tmp_path):
    model = mlp(depth=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    def loss_of(out, y, step):
        torch.save(model.state_dict(), tmp_path / "last.pt")
        return F.cross_entropy(out.float(), y)
    steps(model, optimizer, 16, loss_of)
"""


def test_the_loop_facts_on_the_gpu(tmp_path: Path) -> None:
    facts, output, code = _diagnose(tmp_path, INNER)
    assert code == 0, output
    nan = _run(facts, "test_nan_found_without_a_sync")
    loss = nan["loss"]
    assert loss["backwards"] == 40 and loss["cpu_backwards"] == 0
    assert loss["nonfinite_checks"] >= 2 and loss["first_nonfinite_step"] == 25
    assert loss["last_finite"] is False
    assert "GT142" in _codes(facts, "test_nan_found_without_a_sync")

    for name, fp16, scales in (("test_fp16_without_scaler", 16, 0),
                               ("test_fp16_with_scaler", 16, 16),
                               ("test_bf16_without_scaler", 0, 0)):
        amp = _run(facts, name)["amp"]
        assert (amp["fp16_forwards"], amp["scaler_scales"]) == (fp16, scales), (name, amp)
    assert "GT141" in _codes(facts, "test_fp16_without_scaler")
    assert "GT141" not in _codes(facts, "test_fp16_with_scaler")
    assert "GT141" not in _codes(facts, "test_bf16_without_scaler")
    assert _run(facts, "test_fp16_with_scaler")["loss"]["last_finite"] is True

    cpu = _run(facts, "test_loss_on_cpu")
    assert cpu["loss"]["cpu_backwards"] == 16 and cpu["loss"]["cpu_percent"] == 100.0
    assert "GT117" not in _codes(facts, "test_loss_on_cpu")

    saved = _run(facts, "test_checkpoint_every_step")
    assert saved["checkpoint"]["saves"] == 16 and saved["checkpoint"]["steps_percent"] == 100.0
    assert saved["checkpoint"]["time_percent"] > 0
    assert saved["sync"]["profiled_readbacks_per_step"] is None
    assert "torch.save" in saved["sync"]["unknown"]["profiled_readbacks_per_step"]
    assert "GT104" not in _codes(facts, "test_checkpoint_every_step")
