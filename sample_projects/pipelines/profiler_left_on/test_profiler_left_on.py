"""Fault: a torch.profiler left around the training loop of a test.

Someone profiled this training test once to find a slow layer, and the ``with
torch.profiler.profile(...)`` block stayed. The trace is never exported or read. Every op and
kernel is still recorded, so the steps run slower than training does, and the collected events
cost host memory and a long post-processing pause at the end. The probe cannot open its own
profiler window while the test's profiler records.

Fix: remove the profiler, or profile a few steps with ``schedule=torch.profiler.schedule(...)``
in a dedicated test or script.

Expected diagnosis: GT116 (debugging APIs during training) at warning level: the profiler cost
this run measurably (the GPU waited for the host while it recorded every step; its own start and
stop are timed), so severity follows that cost.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
ProfilerActivity = torch.profiler.ProfilerActivity

FEATURES = 1024
CLASSES = 100
BATCH_SIZE = 4096
STEPS = 30
DEVICE = torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classifier_trains() -> None:
    torch.manual_seed(0)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    centroids = torch.randn(CLASSES, FEATURES, device=DEVICE, generator=generator)
    labels = torch.randint(CLASSES, (BATCH_SIZE,), device=DEVICE, generator=generator)
    features = centroids[labels] + torch.randn(BATCH_SIZE, FEATURES, device=DEVICE,
                                               generator=generator)
    model = nn.Sequential(nn.Linear(FEATURES, 2048), nn.GELU(), nn.Linear(2048, 2048),
                          nn.GELU(), nn.Linear(2048, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # fault: left from a profiling session; the trace is never exported
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                record_shapes=True):
        for step in range(1, STEPS + 1):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step == 1:
                first_loss = loss.item()

    assert loss.item() < first_loss
