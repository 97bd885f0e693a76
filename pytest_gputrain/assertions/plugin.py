"""Hooks of the GPU assertions: options, markers, finding GPU tests, the ``gpu`` and
``gpu_monitor`` fixtures, xdist pinning; all of them the ``AssertionsPlugin`` object's.

Import-light, as every run loads it: importing this module imports neither torch nor pydantic.
The options' values are read and checked (``assertion_settings.py``) where one is set, and the
plugin object loads the assertions' run-time part (``gpu_checks.py``: requirements,
measurements, limits, OOM clean-up) only when the session needs it: collection found a GPU
test, a test asked for a GPU fixture, a test failed while torch is loaded (a CUDA out-of-memory
error?), or workers are pinned. A run of a suite without GPU tests costs one look at each
module's and class's markers and each test's own. The GPU stack is reached through a backend
(``backend.GpuBackend``), created on first use through the ``pytest_gputrain_backend`` hook, so
tests can replace it.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import feature_plugins, options
from pytest_gputrain.assertions import marker_names
from pytest_gputrain.assertions.options import OPTIONS
from pytest_gputrain.xdist import is_xdist_worker, send_to_controller

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_gputrain.assertions.assertion_settings import AssertionSettings
    from pytest_gputrain.assertions.gpu_checks import GpuAssertions
    from pytest_gputrain.assertions.worker_gpus import XdistPinning
    from pytest_gputrain.collect.sampler import NvmlSampler

PLUGIN_NAME = "gputrain-assertions"
PLUGIN_KEY = pytest.StashKey["AssertionsPlugin"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, OPTIONS)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in marker_names.MARKER_HELP:
        config.addinivalue_line("markers", line)
    settings = None
    if options.any_set(config, OPTIONS):  # checked now: a typo is an error in any run
        from pytest_gputrain.assertions.assertion_settings import read_settings

        settings = read_settings(config)
    plugin = feature_plugins.register(config, PLUGIN_KEY, AssertionsPlugin(config, settings),
                                      PLUGIN_NAME)
    plugin.pin_workers()


def pytest_unconfigure(config: pytest.Config) -> None:
    feature_plugins.unregister(config, PLUGIN_KEY)


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
    return request.config.stash[PLUGIN_KEY].runtime.gpu_device(request.node)


@pytest.fixture
def gpu_monitor(request: pytest.FixtureRequest) -> NvmlSampler:
    """The background NVML sampler of the test's GPU (``collect.sampler.NvmlSampler``).

    Sampling starts when the test's setup starts and stops when its call ends. ``.samples``
    holds ``DeviceSample`` objects (``t`` in seconds since the start, utilization_gpu, memory_used,
    power_draw, temperature, sm_clock, clock_event_reasons); ``.summary()`` gives
    mean/min/p10/p50/p90/max per metric; ``.clock_event_fractions()`` the share of samples with
    each throttle reason. Skips when NVML cannot sample the GPU.
    """
    return request.config.stash[PLUGIN_KEY].runtime.monitor(request.node)


class AssertionsPlugin:
    """The GPU assertions of one session: settings, the run-time part (loaded on first need),
    and the controller's pinning of xdist workers (``--gpu-per-worker``).

    Its wrappers of a test's call, report and teardown are tryfirst, outside the other
    features': they see the test's own outcome, and its verdict (a GPU limit, --gpu-required)
    is the final one.
    """

    def __init__(self, config: pytest.Config, settings: AssertionSettings | None) -> None:
        self.config = config
        self._settings = settings  # None: no option of the assertions is set
        self._runtime: GpuAssertions | None = None
        self.pinning: XdistPinning | None = None
        self.notes_for_controller: list[str] = []  # a worker's, about its pinning

    @property
    def settings(self) -> AssertionSettings:
        """The options' values; where none is set, the defaults (loaded on first need)."""
        if self._settings is None:
            from pytest_gputrain.assertions.assertion_settings import AssertionSettings

            self._settings = AssertionSettings()
        return self._settings

    @property
    def runtime(self) -> GpuAssertions:
        """The run-time part, loaded on first need."""
        if self._runtime is None:
            from pytest_gputrain.assertions.gpu_checks import GpuAssertions

            self._runtime = GpuAssertions(self.config, self.settings)
        return self._runtime

    def pin_workers(self) -> None:
        """A worker: pin it now, before anything initialises CUDA in this process. The
        controller: get ready to give each worker its GPUs."""
        worker = is_xdist_worker(self.config)
        if self._settings is None and not worker:
            return  # --gpu-per-worker is not set: nothing to pin
        settings, count_gpus = self.settings, lambda: self.runtime.count_gpus()
        if worker:
            from pytest_gputrain.assertions.worker_gpus import pin_worker

            pin_worker(self.config, settings.per_worker, settings.share, count_gpus,
                       self.notes_for_controller.append)
        elif settings.per_worker is not None and self.config.pluginmanager.hasplugin("xdist"):
            from pytest_gputrain.assertions.worker_gpus import XdistPinning

            self.pinning = XdistPinning(self.config, settings.per_worker, settings.share,
                                        count_gpus)

    # Collection

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Find the GPU tests (a GPU marker on the test or its module or class, or a GPU fixture)
        and hand them to the run-time part, which parses their markers."""
        names, fixtures = marker_names.GPU_MARKERS, frozenset(marker_names.GPU_FIXTURES)
        inherited: dict[int, list[tuple[str, tuple[Any, ...], Mapping[str, Any]]]] = {}

        def gpu_marks(node: Any) -> list[tuple[str, tuple[Any, ...], Mapping[str, Any]]]:
            # The GPU markers of a node and its parents, closest first (as iter_markers gives
            # them), worked out once per module or class rather than once per test: this loop
            # runs over every collected test of every suite.
            key = id(node)
            if key not in inherited:
                parent = node.parent
                inherited[key] = [(m.name, m.args, m.kwargs) for m in node.own_markers
                                  if m.name in names] + (gpu_marks(parent) if parent else [])
            return inherited[key]

        found = []
        for item in items:  # most tests have no marker of their own and no GPU fixture
            marks = [(m.name, m.args, m.kwargs) for m in item.own_markers
                     if m.name in names] if item.own_markers else []
            parent = item.parent
            if parent is not None:
                marks += gpu_marks(parent)
            if marks or not fixtures.isdisjoint(getattr(item, "fixturenames", ())):
                found.append((item, marks))
        if found:
            self.runtime.adopt(found, items)

    # Each test: the run-time part's, where it is loaded (a GPU test was found, a GPU fixture
    # was used, workers are pinned) or now needed: a test failed while torch is loaded, which
    # may be a CUDA out-of-memory error to explain and clean up after. Otherwise a test is no
    # GPU test's business and costs a look at ``_runtime``.

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self._runtime is not None:
            self._runtime.setup(item)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        if self._runtime is not None:
            self._runtime.call_started(item)
        try:
            return (yield)
        finally:
            if self._runtime is not None:  # a GPU fixture the test asked for in its body
                self._runtime.call_finished(item)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        may_be_oom = (call.when == "call" and call.excinfo is not None
                      and "torch" in sys.modules)
        if self._runtime is not None or may_be_oom:
            self.runtime.judge_report(item, call, report)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            if self._runtime is not None:
                self._runtime.teardown_finished(item)

    # Not tryfirst: pytest's capture of warnings (a tryfirst wrapper) takes the clean-up's.
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, object, object]:
        try:
            return (yield)
        finally:
            if self._runtime is not None:
                self._runtime.protocol_finished(item)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A GPU test's report (on the xdist controller: a worker's, the tests never collected
        # here) goes to the tally.
        if getattr(report, "gputrain_gpu_test", False):
            self.runtime.tally_report(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.pinning is not None:
            for line in self.pinning.worker_notes:
                terminalreporter.write_line(line, yellow=True)
        if self._runtime is not None:
            self._runtime.write_tally(terminalreporter)

    # pytest-xdist: the pinning

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: Sequence[Any]) -> None:
        if self.pinning is not None:
            self.pinning.setup_nodes(specs)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.pinning is not None:
            self.pinning.configure_node(node)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        if self.pinning is not None:
            self.pinning.node_down(node)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.notes_for_controller:  # a worker's
            from pytest_gputrain.assertions.worker_gpus import NOTES_KEY

            send_to_controller(self.config, NOTES_KEY, self.notes_for_controller)
