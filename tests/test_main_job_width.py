"""The main job's output on a machine without a GPU, as an 80-column terminal shows it: every
line the plugin writes fits, and the reason there is no GPU is said once (by the finding that
explains it) and referred to elsewhere. The README's own main job is checked the same way, with
the slow tests (``tests/test_readme_samples.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from gputrain_fake import fake_project
from terminal_width import too_wide

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

TESTS = """
import pytest
import torch
from pytest_gputrain.ladder import LadderSpec

def batches(size):
    while True:
        yield torch.randn(size, 4), torch.zeros(size, dtype=torch.long)

def step(model, batch, optimizer, device, precision):
    loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    return loss.detach()

SPEC = LadderSpec("a_project_with_a_rather_long_name", lambda: torch.nn.Linear(4, 2),
                  lambda m: torch.optim.SGD(m.parameters(), lr=0.1), batches, step)

def test_one_batch_on_cpu(gpu_ladder):
    gpu_ladder(SPEC).one_batch("cpu", batch_size=8)

def test_trains_a_little_on_the_cpu_with_a_test_name_long_enough_to_need_two_lines():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(64, 4), torch.zeros(64, dtype=torch.long)), batch_size=8)
    for x, y in data:
        step(model, (x, y), optimizer, "cpu", "fp32")

@pytest.mark.requires_cuda
@pytest.mark.parametrize("n", range(3))
def test_on_the_gpu(n):
    pass
"""


def test_the_main_job_fits_80_columns_and_says_why_there_is_no_gpu_once(
        pytester: pytest.Pytester, use_facts: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    use_facts("cpu_laptop")  # the header and findings of a machine without the driver
    fake_project(pytester, "cpu_inventory()")  # and the GPU tests' view of the same machine
    pytester.makepyfile(TESTS)
    monkeypatch.setenv("COLUMNS", "80")
    result = pytester.runpytest("-p", "no:cacheprovider", "--gpu-diagnose")
    result.assert_outcomes(passed=2, skipped=3)
    out = result.stdout.str()
    assert not too_wide(out), too_wide(out)
    result.stdout.fnmatch_lines([
        "gputrain: no NVIDIA GPU visible: see GT001 in the diagnosis below",
        "gputrain: 3 GPU tests: 0 ran, 3 skipped, 0 failed",
        "  skipped 3: no CUDA GPU: see GT001 in the diagnosis below",
        "*gputrain readiness ladder: a_project_with_a_rather_long_name*",
        "run*batch*step time",
        "not shown, as no rung measured them: *",
        "*= gputrain diagnosis =*",
        "WARNING GT001 no-nvidia-driver: *",
    ])
    assert out.count("NVML Shared Library Not Found") == 1, out


def test_without_the_diagnosis_the_tally_says_why_itself(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake_project(pytester, "cpu_inventory()")
    pytester.makepyfile(TESTS)
    monkeypatch.setenv("COLUMNS", "80")
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "gpu")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["  skipped 3: no CUDA GPU: torch * is a CPU-only build;*"])
    assert not too_wide(result.stdout.str()), too_wide(result.stdout.str())
