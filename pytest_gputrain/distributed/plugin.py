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
That part is ``diagnosis.py``, loaded only when the diagnosis runs.

Importing this module imports neither torch nor pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import feature_plugins, options, scopes

if TYPE_CHECKING:
    from pytest_gputrain.distributed.diagnosis import (  # noqa: F401 (stash key type)
        DistributedDiagnosis,
    )

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
# Fixture and marker


def _marker_options(item: pytest.Item) -> dict[str, Any]:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return {}
    options = dict(marker.kwargs)
    if marker.args:
        options.setdefault("world_size", marker.args[0])
    unknown = set(options) - {"world_size", "backend", "timeout", "collective_timeout", "env",
                              "init_process_group"}
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.distributed got unknown option(s) "
            f"{', '.join(sorted(unknown))}; allowed: world_size, backend, timeout, "
            "collective_timeout, env, init_process_group")
    return options


class DistributedRunner:
    """The ``distributed`` fixture: launches rank functions for the current test.

    ``run(fn, world_size=..., ...)`` returns the per-rank results (see ``run_ranks``);
    ``launch(...)`` returns the whole :class:`Launch` (results, pids, facts); ``last`` is the
    latest launch. Defaults come from the test's ``@pytest.mark.distributed(...)`` if any.
    """

    def __init__(self, nodeid: str, defaults: Mapping[str, Any]) -> None:
        self.nodeid = nodeid
        self.defaults = dict(defaults)
        self.last: Any = None

    def launch(self, fn: Callable[..., Any], world_size: int | None = None,
               backend: str | None = None, timeout: float | None = None,
               args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
               env: Mapping[str, str] | None = None, **options: Any) -> Any:
        from pytest_gputrain.distributed.launcher import launch

        settings = dict(self.defaults)
        for key, value in (("world_size", world_size), ("backend", backend),
                           ("timeout", timeout), ("env", env)):
            if value is not None:
                settings[key] = value
        settings.update(options)
        self.last = launch(fn, args=args, kwargs=kwargs, test=self.nodeid, **settings)
        return self.last

    def run(self, fn: Callable[..., Any], world_size: int | None = None,
            backend: str | None = None, timeout: float | None = None,
            args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None, **options: Any) -> list[Any]:
        launched = self.launch(fn, world_size, backend, timeout, args, kwargs, env, **options)
        return list(launched.results)


@pytest.fixture
def distributed(request: pytest.FixtureRequest) -> DistributedRunner:
    """Run module-level functions on N ranks (one process per GPU; gloo on CPU)."""
    return DistributedRunner(request.node.nodeid, _marker_options(request.node))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker(MARKER) is None:
        return None
    if "distributed" in pyfuncitem.fixturenames:
        return None  # the test launches ranks itself; the marker only gives defaults
    from pytest_gputrain.distributed.launcher import in_rank, launch

    if in_rank():
        return None
    function = pyfuncitem.obj
    if "." in getattr(function, "__qualname__", ""):
        raise pytest.UsageError(
            f"{pyfuncitem.nodeid}: @pytest.mark.distributed runs module-level test functions "
            "only (each rank imports the function by name); move it out of its class")
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    launch(function, kwargs=kwargs, test=pyfuncitem.nodeid, **_marker_options(pyfuncitem))
    return True
