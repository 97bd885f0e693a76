"""The ``distributed`` fixture's runner and the ``distributed`` marker's launch, loaded by
``plugin.py`` when a test uses either (the launcher loads when a launch is made).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

MARKER_OPTIONS = ("world_size", "backend", "timeout", "collective_timeout", "env",
                  "init_process_group")


def marker_options(nodeid: str, marker: pytest.Mark | None) -> dict[str, Any]:
    """The launch settings a test's ``@pytest.mark.distributed(...)`` gives; a usage error naming
    the test for an option the launcher does not take."""
    if marker is None:
        return {}
    options = dict(marker.kwargs)
    if marker.args:
        options.setdefault("world_size", marker.args[0])
    unknown = set(options) - set(MARKER_OPTIONS)
    if unknown:
        raise pytest.UsageError(
            f"{nodeid}: @pytest.mark.distributed got unknown option(s) "
            f"{', '.join(sorted(unknown))}; allowed: {', '.join(MARKER_OPTIONS)}")
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


def run_marked(pyfuncitem: pytest.Function, marker: pytest.Mark) -> bool | None:
    """``pytest_pyfunc_call`` of a test with the marker: run its body on every rank; None where
    pytest calls it as usual (the test launches ranks itself, or this is a rank)."""
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
    launch(function, kwargs=kwargs, test=pyfuncitem.nodeid,
           **marker_options(pyfuncitem.nodeid, marker))
    return True
