"""Hooks of the performance regression gate: the ``gpu_benchmark`` fixture, ``--gpu-save``,
``--gpu-compare``, ``--gpu-regression``, ``--gpu-benchmark-disable``/``-skip`` and their ini
twins.

Kept light, as every run loads it: importing this module imports neither torch, pydantic,
sqlite3 nor psycopg; the options' values are read and checked (``settings.py``) only where one is
set or a test uses ``gpu_benchmark``, and a session that uses none of the options and no
``gpu_benchmark`` opens no store.

xdist: each worker keeps its tests' results and sends them to the controller when it finishes;
the controller alone compares, saves (one run, one transaction) and reports, and sets the exit
status. Under ``--gpu-diagnose`` the gate's verdict is also a section of the ``--gpu-report``
files (``benchmarks``).
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import feature_plugins, options
from pytest_gputrain.regression.options import OPTIONS
from pytest_gputrain.xdist import is_xdist_worker, send_to_controller, sent_by_worker

if TYPE_CHECKING:
    from pytest_gputrain.regression.benchmark import GpuBenchmark
    from pytest_gputrain.regression.compare import GateReport
    from pytest_gputrain.regression.settings import RegressionSettings

PLUGIN_NAME = "gputrain-regression"
PLUGIN_KEY = pytest.StashKey["RegressionPlugin"]()
WORKER_OUTPUT = "gputrain_benchmarks"
WORKER_DESELECTED = "gputrain_not_benchmarks"  # how many tests --gpu-benchmark-only deselected
# A test's ``gpu_benchmark`` (one per test), read when its report is made.
BENCHMARK_KEY = pytest.StashKey["GpuBenchmark"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, OPTIONS)


def pytest_configure(config: pytest.Config) -> None:
    settings = None
    if options.any_set(config, OPTIONS):  # checked now: a typo is an error in any run
        from pytest_gputrain.regression.settings import read_settings

        settings = read_settings(config)
        if settings.uses_store and not is_xdist_worker(config):
            from pytest_gputrain.regression.gate import check_store

            check_store(settings)
    plugin = RegressionPlugin(config, settings)
    feature_plugins.register(config, PLUGIN_KEY, plugin, PLUGIN_NAME)
    if options.diagnosing(config):
        from pytest_gputrain.diagnosis import diagnosis

        session = diagnosis(config)
        if session is not None:
            session.add_section("benchmarks", plugin.report_section)


def pytest_unconfigure(config: pytest.Config) -> None:
    feature_plugins.unregister(config, PLUGIN_KEY)


@pytest.fixture
def gpu_benchmark(request: pytest.FixtureRequest) -> GpuBenchmark:
    """Time a training step: ``gpu_benchmark(step, *args, rounds=50, warmup=5)``.

    CUDA events on the current stream (``time.perf_counter`` on the CPU), a warm-up, then 30 to
    100 rounds (ini ``gpu_benchmark_*``), with nothing else on the host between rounds; NVML is
    sampled by a thread (utilization, SM clock, throttling per round) and the peak VRAM read at
    the two synchronisations; with ``gpu_time`` in ``--gpu-regression`` or under its default
    policy (or ``gpu_time=True``) also the GPU's own time per step, queued rounds behind a spin
    kernel; then, untimed, the counting pass (kernels, syncs, copies, allocations, ATen
    operators, the host's CPU time and instructions per step; ``counters=False`` or
    ``--no-gpu-benchmark-counters`` leaves it out; ``bound="launch"`` or ``"gpu"`` states the
    step's kind for the default policy). Returns a ``BenchmarkResult`` (``.median``, ``.iqr``,
    ``.peak_vram_max``, ``.throttled_count``, ``.conditions``, ``.counters``...). Results of
    passing tests feed ``--gpu-save`` and ``--gpu-compare``. Under ``--gpu-benchmark-disable``
    the step runs once, untimed (``.disabled``).
    """
    from pytest_gputrain.regression.benchmark import BenchmarkOptions, GpuBenchmark

    settings = request.config.stash[PLUGIN_KEY].settings
    defaults = BenchmarkOptions()
    try:
        defaults = defaults.override(warmup=settings.warmup, min_rounds=settings.min_rounds,
                                     max_rounds=settings.max_rounds, max_time=settings.max_time)
    except ValueError as exc:
        raise pytest.UsageError(f"gpu_benchmark_*: {exc}") from None
    # The default policy gates a GPU-bound step's GPU time: measured wherever it may be gated.
    gpu_time = "gpu_time" in settings.thresholds or (settings.auto
                                                     and "gpu_time" not in settings.off)
    bench = GpuBenchmark(request.node.nodeid, defaults, disabled=settings.disable,
                         gpu_time=gpu_time, counters=settings.counters)
    request.node.stash[BENCHMARK_KEY] = bench
    return bench


class RegressionPlugin:
    """The gate of one session: its settings, the results of its benchmarks (a worker's, or on
    the controller every worker's), and the gate's report once the session finished."""

    def __init__(self, config: pytest.Config, settings: RegressionSettings | None) -> None:
        self.config = config
        self._settings = settings  # None: no option of the gate is set
        self.results: list[dict[str, Any]] = []
        self.report: GateReport | None = None
        self.not_benchmarks = 0  # the tests --gpu-benchmark-only deselected

    @property
    def settings(self) -> RegressionSettings:
        """The options' values; where none is set, the defaults (read on first need: a test
        uses ``gpu_benchmark``)."""
        if self._settings is None:
            from pytest_gputrain.regression.settings import read_settings

            self._settings = read_settings(self.config)
        return self._settings

    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """``--gpu-benchmark-skip``: skip every test that uses the ``gpu_benchmark`` fixture;
        ``--gpu-benchmark-only``: deselect every other test."""
        settings = self._settings
        if settings is None or not (settings.skip or settings.only):
            return
        marker = pytest.mark.skip(reason="uses gpu_benchmark (--gpu-benchmark-skip)")
        kept: list[pytest.Item] = []
        deselected: list[pytest.Item] = []
        for item in items:
            benchmark = "gpu_benchmark" in getattr(item, "fixturenames", ())
            if settings.skip and benchmark:
                item.add_marker(marker)
            (kept if benchmark or not settings.only else deselected).append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept
            self.not_benchmarks = len(deselected)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Watch for torch profilers once torch's profiler is loaded: one that ran earlier in
        the process slows every later kernel launch, and a benchmark's result says so."""
        if "torch.autograd.profiler" in sys.modules:
            from pytest_gputrain.regression.process_state import watch_profiler

            watch_profiler()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "call":
            bench = item.stash.get(BENCHMARK_KEY, None)
            if (bench is not None and bench.result is not None and not bench.result.disabled
                    and report.passed):
                self.results.append(bench.result.to_record())
        return report

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: collect the results a worker sent."""
        self.results.extend(sent_by_worker(node, WORKER_OUTPUT, []))
        # Every worker collects, and deselects, the same tests.
        self.not_benchmarks = max(self.not_benchmarks, sent_by_worker(node, WORKER_DESELECTED, 0))

    # tryfirst: the outermost wrapper, so the gate has run before the diagnosis (inside it)
    # writes the --gpu-report files that show it.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session,
                             exitstatus: int) -> Generator[None, None, None]:
        if is_xdist_worker(self.config):
            if self.results:
                send_to_controller(self.config, WORKER_OUTPUT, self.results)
            if self.not_benchmarks:
                send_to_controller(self.config, WORKER_DESELECTED, self.not_benchmarks)
            return (yield)
        self.report = self._run_gate(exitstatus)
        result = yield
        # After the inner hooks, the diagnosis's among them: a run the diagnosis found
        # complete (a diagnosis without tests) still fails on a regression.
        report = self.report
        if (report is not None and (report.failed or report.errors)
                and session.exitstatus == pytest.ExitCode.OK):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return result

    def _run_gate(self, exitstatus: int) -> GateReport | None:
        if self.config.option.collectonly:
            return None
        settings = self._settings
        asked = settings is not None and (settings.uses_store or settings.json_path is not None)
        if not self.results and not asked:
            return None
        from pytest_gputrain.regression.gate import finish

        interrupted = exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
        return finish(self.config, self.settings, self.results, save=not interrupted)

    # trylast: after the GPU tests' tally and the ladder tables, before the diagnosis.
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.not_benchmarks:  # beside pytest's own "N deselected", which does not say why
            terminalreporter.write_line(
                f"gputrain: {self.not_benchmarks} deselected: not benchmarks "
                "(--gpu-benchmark-only runs only the tests that use gpu_benchmark)")
        if self.report is None:
            return
        from pytest_gputrain.regression.output import has_content, terminal_lines

        if has_content(self.report):
            terminalreporter.section("gpu benchmarks")
            for line, markup in terminal_lines(self.report):
                terminalreporter.write_line(line, **markup)

    def report_section(self) -> dict[str, Any] | None:
        """``sections["benchmarks"]`` of the --gpu-report files, when the gate ran."""
        if self.report is None:
            return None
        from pytest_gputrain.regression.output import has_content, report_section

        return report_section(self.report) if has_content(self.report) else None
