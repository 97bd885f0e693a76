"""Hooks of the performance regression gate: the ``gpu_benchmark`` fixture, ``--gpu-save``,
``--gpu-compare``, ``--gpu-regression``, ``--gpu-benchmark-disable``/``-skip`` and their ini
twins.

Kept light: importing this module imports neither torch, pydantic, sqlite3 nor psycopg, and a
session that uses none of the options and no ``gpu_benchmark`` opens no store.

xdist: each worker keeps its tests' results and hands them to the controller through
``workeroutput`` when it finishes; the controller alone compares, saves (one run, one
transaction) and reports, and sets the exit status.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain.regression import settings as regression_settings
from pytest_gputrain.regression.settings import RegressionSettings
from pytest_gputrain.xdist import is_xdist_worker as _is_worker

if TYPE_CHECKING:
    from pytest_gputrain.regression.benchmark import GpuBenchmark
    from pytest_gputrain.regression.compare import GateReport  # noqa: F401 (stash key type)

WORKER_OUTPUT = "gputrain_benchmarks"

settings_key = pytest.StashKey[RegressionSettings]()
results_key = pytest.StashKey[list[dict[str, Any]]]()
report_key = pytest.StashKey["GateReport"]()
benchmark_key = pytest.StashKey["GpuBenchmark"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    regression_settings.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    settings = regression_settings.read_settings(config)
    config.stash[settings_key] = settings
    config.stash[results_key] = []
    if settings.uses_store and not _is_worker(config):
        from pytest_gputrain.regression.gate import check_store

        check_store(settings)


@pytest.fixture
def gpu_benchmark(request: pytest.FixtureRequest) -> GpuBenchmark:
    """Time a training step: ``gpu_benchmark(step, *args, rounds=50, warmup=5)``.

    CUDA events on the current stream (``time.perf_counter`` on the CPU), a warm-up, then 30 to
    100 rounds (ini ``gpu_benchmark_*``), with nothing else on the host between rounds; NVML is
    sampled by a thread (utilization, SM clock, throttling per round) and the peak VRAM read at
    the two synchronisations. Returns a ``BenchmarkResult`` (``.median``, ``.iqr``,
    ``.peak_vram_max``, ``.throttled_count``, ``.conditions``...). Results of passing tests feed
    ``--gpu-save`` and ``--gpu-compare``. Under ``--gpu-benchmark-disable`` the step runs once,
    untimed (``.disabled``).
    """
    from pytest_gputrain.regression.benchmark import BenchmarkOptions, GpuBenchmark

    settings = request.config.stash[settings_key]
    defaults = BenchmarkOptions()
    try:
        defaults = defaults.override(warmup=settings.warmup, min_rounds=settings.min_rounds,
                                     max_rounds=settings.max_rounds, max_time=settings.max_time)
    except ValueError as exc:
        raise pytest.UsageError(f"gpu_benchmark_*: {exc}") from None
    bench = GpuBenchmark(request.node.nodeid, defaults, disabled=settings.disable)
    request.node.stash[benchmark_key] = bench
    return bench


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--gpu-benchmark-skip``: skip every test that uses the ``gpu_benchmark`` fixture."""
    if not config.stash[settings_key].skip:
        return
    marker = pytest.mark.skip(reason="uses gpu_benchmark (--gpu-benchmark-skip)")
    for item in items:
        if "gpu_benchmark" in getattr(item, "fixturenames", ()):
            item.add_marker(marker)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Watch for torch profilers once torch's profiler is loaded: one that ran earlier in the
    process slows every later kernel launch, and a benchmark's result says so."""
    if "torch.autograd.profiler" in sys.modules:
        from pytest_gputrain.regression.conditions import watch_profiler

        watch_profiler()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "call":
        bench = item.stash.get(benchmark_key, None)
        if (bench is not None and bench.result is not None and not bench.result.disabled
                and report.passed):
            item.config.stash[results_key].append(bench.result.to_record())
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect the results a worker sent back."""
    text = (getattr(node, "workeroutput", None) or {}).get(WORKER_OUTPUT)
    if text:
        node.config.stash[results_key].extend(json.loads(text))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if settings_key not in config.stash:
        return
    records = config.stash[results_key]
    if _is_worker(config):
        if records:
            config.workeroutput[WORKER_OUTPUT] = json.dumps(records)  # type: ignore[attr-defined]
        return
    settings = config.stash[settings_key]
    if config.option.collectonly:
        return
    if not records and not settings.uses_store and settings.json_path is None:
        return
    from pytest_gputrain.regression.gate import finish

    interrupted = exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
    report = finish(config, settings, records, save=not interrupted)
    config.stash[report_key] = report
    if (report.failed or report.errors) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    report = config.stash.get(report_key, None)
    if report is None or (not report.benchmarks and not report.compare_spec
                          and not report.notes and report.saved_run is None):
        return
    from pytest_gputrain.regression.output import terminal_lines

    terminalreporter.section("gpu benchmarks")
    for line, markup in terminal_lines(report):
        terminalreporter.write_line(line, **markup)
