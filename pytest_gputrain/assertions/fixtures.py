"""The ``gpu`` and ``gpu_monitor`` fixtures (imported into ``assertions/plugin.py``).

Import-light: the fixtures find the plugin object in ``config.stash`` at run time; torch is
touched only when a test asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gputrain.assertions.runtime import GpuAssertions
    from pytest_gputrain.collect.sampler import NvmlSampler

PLUGIN_NAME = "gputrain-assertions"
PLUGIN_KEY = pytest.StashKey["GpuAssertions"]()


def _plugin(request: pytest.FixtureRequest) -> GpuAssertions:
    plugin = request.config.stash.get(PLUGIN_KEY, None)
    if plugin is None:  # pragma: no cover - registered when collection finds a GPU test, and
        # before any test runs
        raise RuntimeError("pytest-gputrain's assertions plugin is not registered")
    return plugin


@pytest.fixture
def gpu(request: pytest.FixtureRequest) -> Any:
    """The test's CUDA device as a ``torch.device`` (``cuda:0``: the first GPU this process sees;
    under ``--gpu-per-worker`` the worker's own GPU).

    Makes the test a GPU test (skipped without a usable CUDA GPU, failed with --gpu-required),
    initialises CUDA and resets the peak memory counters. After the teardown it collects
    garbage, warns (GpuMemoryWarning) when the test left memory allocated, and releases the
    cache with ``torch.cuda.empty_cache()``. After a ``torch.OutOfMemoryError`` it also frees
    what the failed test's traceback kept alive, so that the next tests start clean.
    """
    return _plugin(request).gpu_device(request.node)


@pytest.fixture
def gpu_monitor(request: pytest.FixtureRequest) -> NvmlSampler:
    """The background NVML sampler of the test's GPU (``collect.sampler.NvmlSampler``).

    Sampling starts when the test's setup starts and stops when its call ends. ``.samples``
    holds ``DeviceSample`` objects (``t`` in seconds since the start, utilization_gpu, memory_used,
    power_draw, temperature, sm_clock, clock_event_reasons); ``.summary()`` gives
    mean/min/p10/p50/p90/max per metric; ``.clock_event_fractions()`` the share of samples with
    each throttle reason. Skips when NVML cannot sample the GPU.
    """
    return _plugin(request).monitor(request.node)
