"""Multi-GPU tests: the ``distributed`` fixture and marker, and their diagnosis.

    def test_ddp(distributed):
        losses = distributed.run(train_ddp, world_size=2)     # train_ddp at module level

    @pytest.mark.distributed(world_size=2, backend="gloo")
    def test_all_reduce():                                    # the body runs on every rank
        t = torch.ones(1); dist.all_reduce(t); assert t.item() == 2

Under ``--gpu-diagnose`` every launch made by a test records per-rank facts
(``DistributedRunFacts``), handed to the diagnosis as records of scope ``distributed``; the rules
of that scope (GT301-GT308) are evaluated on them where the test ran, and the findings go to the
test's report section "gputrain diagnosis" and to the session's findings and JSON report
(``sections["distributed"]``; under xdist the records reach the controller with the others).
A test that wraps a model in ``nn.DataParallel`` in its own process is recorded too (GT304).

Importing this module imports neither torch nor pydantic.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import options, scopes

if TYPE_CHECKING:
    from pytest_gputrain.diagnose import Diagnosis

SECTION = "gputrain diagnosis"
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
    from pytest_gputrain.diagnose import diagnosis

    session = diagnosis(config)
    if session is None:
        return
    plugin = DistributedDiagnosis(config, session)
    config.stash[PLUGIN_KEY] = plugin
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    session.add_section("distributed", lambda: session.records(SCOPE) or None)


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.stash.get(PLUGIN_KEY, None)
    if plugin is not None:
        del config.stash[PLUGIN_KEY]
        config.pluginmanager.unregister(plugin)


class ItemRecorder:
    """Collects the launches (and DataParallel use) of one test while it runs."""

    def __init__(self, nodeid: str, probe: bool) -> None:
        self.nodeid = nodeid
        self.probe = probe
        self.facts: list[Any] = []
        self.data_parallel_devices = 0

    def record(self, facts: Any) -> None:
        if getattr(facts, "test", None) is None:
            facts.test = self.nodeid
        self.facts.append(facts)


def _patch_data_parallel(recorder: ItemRecorder) -> Callable[[], None]:
    """Count the GPUs of any nn.DataParallel the test builds in its own process."""
    torch = sys.modules.get("torch")
    parallel = getattr(getattr(torch, "nn", None), "DataParallel", None)
    if parallel is None:
        return lambda: None
    original = parallel.__init__

    @functools.wraps(original)
    def init(module: Any, *args: Any, **kwargs: Any) -> None:
        original(module, *args, **kwargs)
        count = len(getattr(module, "device_ids", None) or [])
        recorder.data_parallel_devices = max(recorder.data_parallel_devices, count)

    parallel.__init__ = init

    def restore() -> None:
        parallel.__init__ = original

    return restore


_RECORDER = pytest.StashKey[ItemRecorder]()


class DistributedDiagnosis:
    """Registered under --gpu-diagnose, in every process that runs tests: records each test's
    launches and judges them there (the records reach the xdist controller with the others)."""

    def __init__(self, config: pytest.Config, session: Diagnosis) -> None:
        self.config = config
        self.session = session

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None]:
        # By module path, as the fixture imports launch(): a package attribute can outlive the
        # module in sys.modules (pytester's in-process runs forget modules they imported).
        from pytest_gputrain.distributed.launcher import reset_recorder, set_recorder

        recorder = ItemRecorder(item.nodeid, probe=True)
        item.stash[_RECORDER] = recorder
        token = set_recorder(recorder)
        restore = _patch_data_parallel(recorder)
        try:
            yield
        finally:
            restore()
            reset_recorder(token)

    # The outermost wrapper: its text follows the probe's in the test's diagnosis section.
    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, Any, None]:
        outcome = yield
        recorder = item.stash.get(_RECORDER, None)
        if recorder is None or call.when != "call":
            return
        launches = list(recorder.facts)
        if recorder.data_parallel_devices:
            from pytest_gputrain.distributed.report import in_process_facts

            launches.append(in_process_facts(item.nodeid, recorder.data_parallel_devices))
        if not launches:
            return
        from pytest_gputrain.distributed.report import section_text

        engine, env = self.session.engine, self.session.environment
        recorded, findings = [], []
        for facts in launches:
            # Judged as recorded: the session's findings (and a replay's) come from these.
            facts = self.session.add_record(SCOPE, facts)
            recorded.append(facts)
            findings.extend(engine.evaluate_record(SCOPE, env, facts))
        text = section_text(recorded, findings)
        if text:
            _add_section(outcome.get_result(), text)


def _add_section(report: pytest.TestReport, text: str) -> None:
    for index, (title, content) in enumerate(report.sections):
        if title == SECTION:
            report.sections[index] = (title, content.rstrip("\n") + "\n" + text)
            return
    report.sections.append((SECTION, text))


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
