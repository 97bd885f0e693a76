"""Multi-GPU tests: the ``distributed`` fixture and marker, and their diagnosis.

    def test_ddp(distributed):
        losses = distributed.run(train_ddp, world_size=2)     # train_ddp at module level

    @pytest.mark.distributed(world_size=2, backend="gloo")
    def test_all_reduce():                                    # the body runs on every rank
        t = torch.ones(1); dist.all_reduce(t); assert t.item() == 2

Under ``--gpu-diagnose`` every launch made by a test records per-rank facts
(``DistributedRunFacts``), handed to the diagnosis as records of scope ``distributed``; the
diagnosis evaluates the rules of that scope (GT301-GT308) on them where the test ran, and writes
the findings to the test's report section "gputrain diagnosis" and to the session's findings and
JSON report (``sections["distributed"]``; under xdist the records reach the controller with the
others).
A test that wraps a model in ``nn.DataParallel`` in its own process is recorded too (GT304).
That part is ``diagnosis.py``, loaded only when the diagnosis runs; the fixture's runner and the
marker's launch are ``runner.py``, loaded when a test uses either.

Importing this module imports neither torch nor pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_gputrain import feature_plugins, options, scopes

if TYPE_CHECKING:
    from pytest_gputrain.distributed.diagnosis import (  # noqa: F401 (stash key type)
        DistributedDiagnosis,
    )
    from pytest_gputrain.distributed.runner import DistributedRunner

MARKER = "distributed"
SCOPE = "distributed"
PLUGIN_NAME = "gputrain-distributed"
PLUGIN_KEY = pytest.StashKey["DistributedDiagnosis"]()

# The rule scope of launches, registered by distributed/facts.py when rules load.
scopes.declare("pytest_gputrain.distributed.facts")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "distributed(world_size=2, backend=None, timeout=120, collective_timeout=None, env=None):"
        " run the test function on world_size ranks, one process each (NCCL on GPUs, gloo on "
        "CPU); fixture values are pickled to the ranks; the test fails if any rank fails or "
        "the ranks hang past timeout seconds")
    if not options.diagnosing(config):
        return
    from pytest_gputrain.diagnosis import diagnosis

    session = diagnosis(config)
    if session is None:
        return
    from pytest_gputrain.distributed.diagnosis import DistributedDiagnosis

    feature_plugins.register(config, PLUGIN_KEY, DistributedDiagnosis(config, session),
                             PLUGIN_NAME)
    session.add_section("distributed", lambda: session.records(SCOPE) or None)


def pytest_unconfigure(config: pytest.Config) -> None:
    feature_plugins.unregister(config, PLUGIN_KEY)


# ------------------------------------------------------------------------------------------
# Fixture and marker: what they do is runner.py's, loaded when a test uses one


@pytest.fixture
def distributed(request: pytest.FixtureRequest) -> DistributedRunner:
    """Run module-level functions on N ranks (one process per GPU; gloo on CPU)."""
    from pytest_gputrain.distributed.runner import DistributedRunner, marker_options

    return DistributedRunner(request.node.nodeid,
                             marker_options(request.node.nodeid,
                                            request.node.get_closest_marker(MARKER)))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return None
    from pytest_gputrain.distributed.runner import run_marked

    return run_marked(pyfuncitem, marker)
