"""Helpers for the assertion tests: a pytester project whose GPU is a FakeBackend.

The conftest written here answers the ``pytest_gputrain_backend`` hook with a fake built from
``inventory`` (an expression over ``gpu_inventory`` / ``cpu_inventory`` / ``FreeMemory``), and
offers a ``fake`` fixture so the tests inside can allocate, set utilization and so on.
"""

from __future__ import annotations

# Imported here (at the outer session's collection) so that pytester's in-process runs find
# them in sys.modules instead of importing (with assertion rewriting), then forgetting, them in
# every run: hypothesis's pytest plugin alone would cost a second per run.
import hypothesis.internal.observability  # noqa: F401
import pytest

import pytest_gputrain.assertions.backend
import pytest_gputrain.assertions.measure
import pytest_gputrain.assertions.memory
import pytest_gputrain.assertions.requirements
import pytest_gputrain.assertions.testing
import pytest_gputrain.assertions.utilization
import pytest_gputrain.assertions.worker_gpus
import pytest_gputrain.collect.sampler  # noqa: F401

CONFTEST = """
import pytest
from pytest_gputrain.assertions.requirements import CudaDevice, FreeMemory, Inventory
from pytest_gputrain.assertions.testing import FakeBackend, cpu_inventory, gpu_inventory

FAKE = FakeBackend({inventory}{options})


def pytest_gputrain_backend(config):
    return FAKE


@pytest.fixture
def fake():
    return FAKE
"""


def fake_project(pytester: pytest.Pytester, inventory: str = "gpu_inventory()",
                 options: str = "") -> None:
    """Write a conftest whose GPU is ``FakeBackend(<inventory>, <options>)``."""
    pytester.makeconftest(CONFTEST.format(inventory=inventory,
                                          options=f", {options}" if options else ""))
