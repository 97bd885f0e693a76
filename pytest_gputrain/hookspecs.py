"""The hooks pytest-gputrain adds (registered by plugin.py through ``pytest_addhooks``).

Features hand records and report sections to the diagnosis directly (``diagnosis.py``), not
through hooks.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_gputrain_backend(config: pytest.Config) -> Any:
    """Return the GPU backend the markers and fixtures use, or None for the real one.

    The real backend reads torch and NVML. A conftest (or plugin) may return another object
    with the same methods (see ``pytest_gputrain.assertions.backend.GpuBackend``), e.g. a
    ``pytest_gputrain.assertions.testing.FakeBackend`` to test GPU markers on a CPU machine::

        from pytest_gputrain.assertions.testing import FakeBackend, gpu_inventory

        FAKE = FakeBackend(gpu_inventory())

        def pytest_gputrain_backend(config):
            return FAKE

    Called once per session (and once on the pytest-xdist controller, to count GPUs), lazily:
    only when a collected test uses a GPU marker or fixture, or when workers are pinned.
    """
