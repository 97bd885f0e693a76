"""Hooks of the GPU assertions: options, markers, finding GPU tests, the ``gpu`` and
``gpu_monitor`` fixtures, xdist pinning; all of them the ``AssertionsPlugin`` object's.

Import-light: importing this module imports neither torch nor pydantic, and the plugin object
loads the assertions' run-time part (``gpu_checks.py``: requirements, measurements, limits, OOM
clean-up) only when the session needs it: collection found a GPU test, tests are about to run,
or workers are pinned to GPUs. A collect-only run of a suite without GPU tests costs one look
at each module's and class's markers and each test's own. The GPU stack is reached through a
backend (``backend.GpuBackend``), created on first use through the ``pytest_gputrain_backend``
hook, so tests can replace it.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import feature_plugins, options
from pytest_gputrain.assertions import marker_names
from pytest_gputrain.assertions.assertion_settings import DEFAULT_HISTORY, AssertionSettings
from pytest_gputrain.xdist import is_xdist_worker, send_to_controller

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_gputrain.assertions.gpu_checks import GpuAssertions
    from pytest_gputrain.assertions.worker_gpus import XdistPinning
    from pytest_gputrain.collect.sampler import NvmlSampler

PLUGIN_NAME = "gputrain-assertions"
PLUGIN_KEY = pytest.StashKey["AssertionsPlugin"]()

OPTIONS: tuple[options.Option, ...] = (
    options.Option(
        "--gpu-required", "gpu_required",
        "GPU tests that would be skipped (no usable GPU, unmet requires_cuda) fail instead: "
        "for GPU CI runners that must not pass vacuously", kind="bool", default=False),
    options.Option(
        "--gpu-max-vram", "gpu_max_vram",
        "peak-VRAM limit for every GPU test without its own max_vram marker: SIZE or "
        "SIZE:MEASURE, e.g. 20GiB or 20GiB:reserved", metavar="SIZE"),
    options.Option(
        "--gpu-vram-history", "gpu_vram_history",
        "allocator events to record (Python stacks) in tests with a max_vram marker, to show "
        f"the top allocations when one fails; 0 turns recording off (default {DEFAULT_HISTORY})",
        default=str(DEFAULT_HISTORY), metavar="ENTRIES"),
    options.Option(
        "--gpu-per-worker", "gpu_per_worker",
        "pytest-xdist: give each worker N GPUs through CUDA_VISIBLE_DEVICES, taken from the "
        "caller's CUDA_VISIBLE_DEVICES when set; more workers than GPUs is an error without "
        "--gpu-share", metavar="N"),
    options.Option(
        "--gpu-share", "gpu_share",
        "pytest-xdist with --gpu-per-worker: let workers share GPUs round-robin when there are "
        "more workers than GPUs", kind="bool", default=False),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, OPTIONS)


def read_settings(config: pytest.Config) -> AssertionSettings:
    """The assertion options, validated; a bad value is a usage error that names it."""
    read = options.read
    default_text = read(config, "gpu_max_vram")
    default = None
    if default_text not in (None, ""):
        from pytest_gputrain.assertions import markers

        try:
            default = markers.parse_default_max_vram(str(default_text))
        except markers.MarkerError as exc:
            raise pytest.UsageError(f"gpu_max_vram / --gpu-max-vram: {exc}") from None
    history_text = str(read(config, "gpu_vram_history") or "0").strip()
    # ASCII digits only (int() refuses some that isdigit() accepts), and few of them.
    if not re.fullmatch(r"[0-9]{1,9}", history_text):
        from pytest_gputrain.units import shown

        raise pytest.UsageError(
            f"gpu_vram_history / --gpu-vram-history: {shown(history_text)} is not a whole "
            f"number of entries from 0 to 999999999 (e.g. --gpu-vram-history={DEFAULT_HISTORY}, "
            "0 turns it off)")
    return AssertionSettings(
        required=bool(read(config, "gpu_required")),
        default_max_vram=default,
        history_entries=int(history_text),
        per_worker=_per_worker(read(config, "gpu_per_worker")),
        share=bool(read(config, "gpu_share")),
    )


def _per_worker(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None  # the usual case: the pinning's module is not even imported
    from pytest_gputrain.assertions.worker_gpus import parse_per_worker

    return parse_per_worker(value)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in marker_names.MARKER_HELP:
        config.addinivalue_line("markers", line)
    plugin = feature_plugins.register(config, PLUGIN_KEY,
                                      AssertionsPlugin(config, read_settings(config)),
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

    def __init__(self, config: pytest.Config, settings: AssertionSettings) -> None:
        self.config = config
        self.settings = settings
        self._runtime: GpuAssertions | None = None
        self.pinning: XdistPinning | None = None
        self.notes_for_controller: list[str] = []  # a worker's, about its pinning

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
        settings, count_gpus = self.settings, lambda: self.runtime.count_gpus()
        if is_xdist_worker(self.config):
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
        names, fixtures = marker_names.GPU_MARKERS, marker_names.GPU_FIXTURES
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
        for item in items:
            own = [(m.name, m.args, m.kwargs) for m in item.own_markers if m.name in names]
            parent = item.parent
            marks = own + gpu_marks(parent) if parent is not None else own
            fixturenames = getattr(item, "fixturenames", ())
            if marks or any(name in fixturenames for name in fixtures):
                found.append((item, marks))
        if found:
            self.runtime.adopt(found, items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Tests are about to run: any of them may run out of CUDA memory, so the run-time part
        (OOM clean-up, the GPU tests' tally) is in place from the first."""
        if not session.config.option.collectonly:
            _ = self.runtime  # loads it

    # Each test: the run-time part's (loaded by now)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.runtime.setup(item)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        self.runtime.call_started(item)
        try:
            return (yield)
        finally:
            self.runtime.call_finished(item)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        self.runtime.judge_report(item, call, report)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            self.runtime.teardown_finished(item)

    # Not tryfirst: pytest's capture of warnings (a tryfirst wrapper) takes the clean-up's.
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, object, object]:
        try:
            return (yield)
        finally:
            self.runtime.protocol_finished(item)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self._runtime is not None:
            self._runtime.tally_report(report)

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
