"""Failure on purpose: out of memory under a memory cap the test sets and restores itself.

The test checks that the model trains on the 4 GiB share of a GPU the team deploys it on:
it caps the process with ``torch.cuda.set_per_process_memory_fraction`` and restores 1.0 in a
``finally:`` block. The classifier head's logits for a batch of 16384 are 8 GiB, twice the cap,
so the first forward raises ``torch.OutOfMemoryError`` while the device itself has well over a
hundred GiB free. By the time pytest reports the failure the fraction is 1.0 again; only the
failure's own moment (the allocator's limit, PyTorch's message, the fraction read at the
training steps) shows the 4 GiB budget the test really had.

Fix: fit the 4 GiB share (a smaller batch with gradient accumulation, bf16 logits, a chunked
loss), or give the test a larger share.

Expected diagnosis: GT201 (out of memory) and GT209 (at the memory fraction, not the device's
limit); the test fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

SHARE = 4 * 2**30  # the deployment's share of the GPU
FEATURES = 1024
CLASSES = 131072  # logits: 16384 x 131072 float32 = 8 GiB
SMALL_BATCH, BATCH_SIZE = 512, 16384
DEVICE = torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_head_trains_in_the_deployment_share() -> None:
    torch.manual_seed(0)
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(SHARE / total)
    try:
        head = nn.Linear(FEATURES, CLASSES).to(DEVICE)  # 512 MiB of weights
        optimizer = torch.optim.SGD(head.parameters(), lr=1e-2)
        for batch in (SMALL_BATCH, SMALL_BATCH, BATCH_SIZE):  # the full batch does not fit
            features = torch.randn(batch, FEATURES, device=DEVICE)
            labels = torch.randint(CLASSES, (batch,), device=DEVICE)
            loss = F.cross_entropy(head(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
