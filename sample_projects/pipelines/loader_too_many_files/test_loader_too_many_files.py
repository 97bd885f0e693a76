"""Failure on purpose: DataLoader workers run out of file descriptors.

A multi-crop augmentation returns each sample as a list of 64 small crops. With workers, every
tensor of a batch travels to the training process through its own shared-memory file, one file
descriptor each, and the batch of 64 stacked crop tensors needs 64 descriptors at once in the
worker. The job runs under a low open-file limit (the test sets the soft limit to what it
already has open plus 48, the way a restrictive ``ulimit -n`` in a container or CI runner
does), so the first batch cannot be shared: the worker fails with "unable to open shared memory
object </torch_...> in read-write mode: Too many open files (24)" (or the training process with
"received 0 items of ancdata" / "Too many open files. Communication with the workers is no
longer possible"). The test restores the limit in ``finally:``.

Fix: raise the limit (``ulimit -n 65536``), return fewer, larger tensors per sample (stack the
crops into one tensor), or ``torch.multiprocessing.set_sharing_strategy("file_system")``.

Expected diagnosis: GT217 (DataLoader worker crash), the test fails.
"""

from __future__ import annotations

import os
import resource

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
Dataset = torch.utils.data.Dataset
DataLoader = torch.utils.data.DataLoader

CROPS = 64
CROP = 16
CLASSES = 10
BATCH_SIZE = 32
HEADROOM = 48
DEVICE = torch.device("cuda")


class MultiCropImages(Dataset[tuple[list[torch.Tensor], int]]):
    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, 64, 64, generator=generator)
        self.labels = torch.randint(CLASSES, (n,), generator=generator).tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[list[torch.Tensor], int]:
        image = self.images[index]
        corners = torch.randint(0, 64 - CROP, (CROPS, 2)).tolist()
        crops = [image[:, top:top + CROP, left:left + CROP].clone() for top, left in corners]
        return crops, self.labels[index]  # fault: 64 tensors per sample, one fd each


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_multicrop_classifier_first_epoch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, CLASSES)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(MultiCropImages(2048), batch_size=BATCH_SIZE, shuffle=True,
                        num_workers=4, pin_memory=True)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + HEADROOM  # a tight `ulimit -n`
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        for crops, labels in loader:
            views = torch.cat(crops).to(DEVICE, non_blocking=True)
            targets = labels.to(DEVICE, non_blocking=True).repeat(CROPS)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(views), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert loss.item() < 2.5
