"""The GPU assertions at run time: requirements, measurements, limits, OOM clean-up, the tally.

Loaded by ``plugin.py`` only when a session needs it: when collection finds a GPU test, a test
asks for a GPU fixture, a test fails while torch is loaded (it may have run out of CUDA
memory), or for xdist pinning. A run of a suite with no GPU test and no torch never imports it
(pytest compiles every module it imports anew where bytecode is not cached, so a plain run pays
for every line it loads).
The hooks are the assertions' plugin object's (``plugin.py``): each calls a method here.

Order of events for a GPU test:

- collection: marker arguments parsed into a ``GpuTestSpec`` (bad ones are a usage error naming
  the test), the ``gpu`` marker added;
- setup (first): ``requires_cuda`` decided (skip, or fail with --gpu-required), measurements
  started (peak counters reset, NVML sampler, allocation history for explicit ``max_vram``);
- call: the call phase timed for ``min_utilization``; measurements stopped after it;
- report: limits judged, a failure gets its own report section; JUnit properties recorded;
- teardown (after): OOM clean-up, ``gpu`` fixture hygiene (leak warning, ``empty_cache``).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain.assertions import markers
from pytest_gputrain.assertions.failure import GpuMemoryWarning, GpuTrainWarning

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_gputrain.assertions.assertion_settings import AssertionSettings
    from pytest_gputrain.assertions.backend import GpuBackend
    from pytest_gputrain.assertions.measure import TestRun
    from pytest_gputrain.assertions.requirements import Inventory
    from pytest_gputrain.collect.sampler import NvmlSampler

LEAK_THRESHOLD = 2**20  # below 1 MiB left allocated is not worth a warning

SPEC_KEY = pytest.StashKey[markers.GpuTestSpec]()
RUN_KEY = pytest.StashKey["TestRun"]()
CHECKED_KEY = pytest.StashKey[bool]()
OOM_KEY = pytest.StashKey[Any]()  # the call's ExceptionInfo of a CUDA out-of-memory error
MarkArgs = tuple[str, tuple[Any, ...], "Mapping[str, Any]"]  # a marker: name, args, kwargs


@dataclass
class _Tally:
    """One GPU test's outcome, counted as pytest counts it: a failed call is a failure, a failed
    setup or teardown an error (which is what a skip --gpu-required refuses at setup becomes)."""

    ran: bool = False
    failed: bool = False
    error: bool = False
    skip_reason: str | None = None


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


class GpuAssertions:
    """The assertions' run-time state for one session (held by the plugin object)."""

    def __init__(self, config: pytest.Config, settings: AssertionSettings) -> None:
        self.config = config
        self.settings = settings
        self._backend: GpuBackend | None = None
        self._inventory: Inventory | None = None
        self.tally: dict[str, _Tally] = {}

    # -- the backend and its facts, created on first use -----------------------------------------

    @property
    def backend(self) -> GpuBackend:
        if self._backend is None:
            found = self.config.hook.pytest_gputrain_backend(config=self.config)
            if found is None:
                from pytest_gputrain.assertions.backend import RealBackend

                found = RealBackend()
            self._backend = found
        return self._backend

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = self.backend.inventory()
        return self._inventory

    def count_gpus(self) -> tuple[int | None, str | None]:
        return self.backend.nvml_device_count()

    # -- collection (called by plugin.py for the tests that use a GPU marker or fixture) ------

    def adopt(self, found: list[tuple[pytest.Item, list[MarkArgs]]],
              items: list[pytest.Item]) -> None:
        """Parse the GPU markers of ``found`` (each test with its GPU markers, closest first);
        add ``gpu``; a bad argument is a collection error.

        A collection error (not a UsageError) so that pytest-xdist workers report it cleanly
        too: the test is removed from ``items`` and the run stops with "error during
        collection", naming the test, the marker, the value and a valid example.
        """
        errors: list[tuple[pytest.Item, str]] = []
        default = self.settings.default_max_vram
        for item, marks in found:
            try:
                spec = markers.build_spec(marks, getattr(item, "fixturenames", ()), default)
            except markers.MarkerError as exc:
                errors.append((item, f"{item.nodeid}: {exc}"))
                continue
            if spec is None:
                continue
            item.stash[SPEC_KEY] = spec
            if not any(name == markers.GPU for name, _, _ in marks):
                item.add_marker(markers.GPU)
        if errors:
            for item, message in errors:
                report = pytest.CollectReport(item.nodeid, "failed", message, [])
                self.config.hook.pytest_collectreport(report=report)
            bad = {id(item) for item, _ in errors}
            items[:] = [item for item in items if id(item) not in bad]

    # -- setup: requirements, then measurements --------------------------------------------------

    def _check(self, item: pytest.Item, spec: markers.GpuTestSpec) -> None:
        from pytest_gputrain.assertions.requirements import unmet

        item.stash[CHECKED_KEY] = True
        reasons: list[str] = []
        for requirement in spec.requires:
            for reason in unmet(requirement, self.inventory, self.backend.free_memory):
                if reason not in reasons:
                    reasons.append(reason)
        if reasons:
            raise pytest.skip.Exception("; ".join(reasons), _use_item_location=True)

    def _start(self, item: pytest.Item, spec: markers.GpuTestSpec) -> TestRun:
        from pytest_gputrain.assertions.measure import TestRun

        run = TestRun(self.backend, spec, history_entries=self.settings.history_entries)
        item.stash[RUN_KEY] = run
        run.start()
        return run

    def setup(self, item: pytest.Item) -> None:
        """Before the test's setup: its requirements, then its measurements."""
        spec = item.stash.get(SPEC_KEY, None)
        if spec is None:
            return
        self._check(item, spec)
        self._start(item, spec)

    def _ensure_run(self, item: pytest.Item, fixture: str) -> TestRun:
        """The test's run; for a fixture requested dynamically (getfixturevalue) start one."""
        run = item.stash.get(RUN_KEY, None)
        if run is not None:
            return run
        spec = item.stash.get(SPEC_KEY, None)
        if spec is None:
            spec = markers.GpuTestSpec(requires=(markers.RequiresCuda(),),
                                       max_vram=self.settings.default_max_vram,
                                       fixtures=frozenset({fixture}))
            item.stash[SPEC_KEY] = spec
        if not item.stash.get(CHECKED_KEY, False):
            self._check(item, spec)
        return self._start(item, spec)

    def gpu_device(self, item: pytest.Item) -> Any:
        """For the ``gpu`` fixture."""
        run = self._ensure_run(item, "gpu")
        run.ensure_cuda()
        return self.backend.device(run.cuda_index)

    def monitor(self, item: pytest.Item) -> NvmlSampler:
        """For the ``gpu_monitor`` fixture."""
        run = self._ensure_run(item, "gpu_monitor")
        if run.sampler is None:
            pytest.skip(f"gpu_monitor: cannot sample cuda:{run.cuda_index} through NVML: "
                        f"{run.sampler_error}")
        return run.sampler

    # -- call ------------------------------------------------------------------------------------

    def call_started(self, item: pytest.Item) -> None:
        run = item.stash.get(RUN_KEY, None)
        if run is not None:
            run.call_started()

    def call_finished(self, item: pytest.Item) -> None:
        """After the test's call, whatever its outcome."""
        run = item.stash.get(RUN_KEY, None)
        if run is not None:
            run.call_finished()
            try:
                item.user_properties.extend(run.properties())
            except Exception as exc:  # a measurement bug must not fail the test
                item.warn(GpuTrainWarning(f"gputrain: no GPU properties recorded: {exc}"))

    # -- reports ---------------------------------------------------------------------------------

    def _is_oom(self, call: pytest.CallInfo[None]) -> bool:
        if call.when != "call" or call.excinfo is None:
            return False
        if self._backend is None and "torch" not in sys.modules:
            return False  # no GPU test ran and torch is not loaded: not a CUDA OOM
        try:
            return self.backend.is_oom(call.excinfo.value)
        except Exception:
            return False

    def judge_report(self, item: pytest.Item, call: pytest.CallInfo[None],
                     report: pytest.TestReport) -> None:
        """The report of one phase: limits judged, an OOM explained, --gpu-required applied."""
        spec = item.stash.get(SPEC_KEY, None)
        oom = self._is_oom(call)
        if spec is None and not oom:
            return
        if spec is not None:
            report.gputrain_gpu_test = True  # type: ignore[attr-defined]  # read by the tally
        if oom:
            item.stash[OOM_KEY] = call.excinfo
            # Under --gpu-diagnose the failure diagnosis (GT201, GT207-GT209) explains the OOM
            # in full; one explanation per report.
            if not self.config.pluginmanager.has_plugin("gputrain-probe"):
                report.sections.append(("gputrain out of memory", _oom_text(self.backend, item)))
        if call.when == "call" and spec is not None:
            self._judge(item, spec, report)
        if (self.settings.required and spec is not None and report.skipped
                and not hasattr(report, "wasxfail")):
            reason = _skip_reason(report)
            report.outcome = "failed"
            # pytest counts a failed setup as an error, a failed call as a failure: say which.
            became = "a failure" if report.when == "call" else "an error at its setup"
            report.longrepr = (f"gpu-required: this GPU test would have been skipped: {reason}\n"
                               f"(--gpu-required / gpu_required makes such a skip {became})")

    def _judge(self, item: pytest.Item, spec: markers.GpuTestSpec,
               report: pytest.TestReport) -> None:
        from pytest_gputrain.assertions.failure import AssertionFailure

        run = item.stash.get(RUN_KEY, None)
        if run is None:
            return
        failures: list[AssertionFailure] = []
        if spec.max_vram is not None:
            from pytest_gputrain.assertions.memory import check_max_vram

            found = check_max_vram(spec.max_vram, run.memory_result(spec.max_vram.measure),
                                   base=str(self.config.rootpath))
            if found is not None:
                failures.append(found)
        if spec.min_utilization is not None:
            from pytest_gputrain.assertions.utilization import check_min_utilization

            found = check_min_utilization(spec.min_utilization, run.utilization_result())
            if found is not None:
                failures.append(found)
        if not failures:
            return
        if report.passed:
            report.outcome = "failed"
            report.longrepr = "\n".join(failure.summary for failure in failures)
            for failure in failures:
                if failure.details:
                    report.sections.append((failure.section_title, failure.details))
        else:  # the test failed on its own: add the measurements, keep its own error first
            for failure in failures:
                report.sections.append((failure.section_title, failure.longrepr()))

    # -- teardown: OOM clean-up and gpu fixture hygiene ------------------------------------------

    def teardown_finished(self, item: pytest.Item) -> None:
        run = item.stash.get(RUN_KEY, None)
        if run is not None:
            run.stop()  # if the call never ran (a setup error)

    def protocol_finished(self, item: pytest.Item) -> None:
        """After the test's whole protocol: pytest drops the test's fixture values
        (item.funcargs) only after the teardown hooks, so memory is judged here, before the
        next test."""
        run = item.stash.get(RUN_KEY, None)
        oom = item.stash.get(OOM_KEY, None)
        if run is None and oom is None:
            return
        if run is not None:
            del item.stash[RUN_KEY]  # items live all session: drop the samples
        try:
            if oom is not None:
                del item.stash[OOM_KEY]
                self._recover(oom, run.cuda_index if run is not None else 0)
            elif run is not None and "gpu" in run.spec.fixtures:
                self._tidy(item, run)
        except Exception as exc:
            item.warn(GpuTrainWarning(f"gputrain: GPU clean-up after the test failed: "
                                      f"{type(exc).__name__}: {exc}"))

    def _recover(self, excinfo: Any, cuda_index: int) -> None:
        """Drop what an out-of-memory traceback keeps alive, then give the memory back."""
        exc = excinfo.value
        # pytest keeps the failure in sys.last_value / last_traceback (for post-mortem
        # debuggers); its frames hold the test's tensors. Debuggers have run by now.
        if exc in (getattr(sys, "last_value", None), getattr(sys, "last_exc", None)):
            for name in ("last_exc", "last_value", "last_traceback", "last_type"):
                if hasattr(sys, name):
                    setattr(sys, name, None)
        tb = excinfo.tb
        traceback.clear_frames(tb)
        while tb is not None:  # Python < 3.13: refresh f_locals snapshots taken for the report
            with contextlib.suppress(Exception):
                _ = tb.tb_frame.f_locals
            tb = tb.tb_next
        del exc, excinfo, tb
        backend = self.backend
        backend.release(cuda_index)
        if backend.cuda_initialized():
            backend.reset_peak(cuda_index)

    def _tidy(self, item: pytest.Item, run: TestRun) -> None:
        from pytest_gputrain.assertions.markers import describe_size

        backend = self.backend
        backend.release(run.cuda_index)
        if not backend.cuda_initialized():
            return
        before = run.start_memory.allocated if run.start_memory is not None else 0
        after = backend.memory(run.cuda_index).allocated
        left = after - before
        if left >= LEAK_THRESHOLD:
            item.warn(GpuMemoryWarning(
                f"gputrain: the test left {describe_size(left)} allocated on "
                f"cuda:{run.cuda_index} after its teardown ({describe_size(before)} before its "
                f"setup, {describe_size(after)} after): tensors still referenced by a module "
                "or session fixture, a global, a cache or a kept exception; later tests start "
                "with less memory"))

    # -- the session summary ---------------------------------------------------------------------

    def tally_report(self, report: pytest.TestReport) -> None:
        """A report of a GPU test, in the tally."""
        if not getattr(report, "gputrain_gpu_test", False):
            return
        tally = self.tally.setdefault(report.nodeid, _Tally())
        xfail = hasattr(report, "wasxfail")
        if report.failed and report.when == "call":
            tally.failed = True
        elif report.failed:
            tally.error = True
        if report.skipped and not xfail:
            tally.skip_reason = _skip_reason(report)
        elif report.when == "call":
            tally.ran = True

    def write_tally(self, terminalreporter: Any) -> None:
        """The GPU tests' tally, for the terminal summary."""
        _write_tally(terminalreporter, list(self.tally.values()), self.settings.required,
                     _no_gpu_explained_by(self.config))


def _oom_text(backend: GpuBackend, item: pytest.Item) -> str:
    """What a test that ran out of CUDA memory is told: the memory then, and what to do."""
    from pytest_gputrain.assertions.markers import describe_size

    run = item.stash.get(RUN_KEY, None)
    index = run.cuda_index if run is not None else 0
    lines = []
    try:
        memory = backend.memory(index)
        lines.append(f"cuda:{index} when the test failed: allocated "
                     f"{describe_size(memory.allocated)}, reserved "
                     f"{describe_size(memory.reserved)}, peak reserved "
                     f"{describe_size(memory.peak_reserved)}")
        free = backend.free_memory(index)
        if free.free is not None and free.total is not None:
            text = f"device: {describe_size(free.free)} free of {describe_size(free.total)}"
            if free.other_processes:
                text += (f"; {free.other_processes} other process(es) hold "
                         f"{describe_size(free.other_memory or 0)}")
            lines.append(text)
    except Exception as exc:
        lines.append(f"memory not readable: {exc}")
    lines.append("gputrain frees what this test's traceback kept alive after its teardown "
                 "(gc.collect, torch.cuda.empty_cache), so the next tests start clean.")
    lines.append("fix: lower the batch size, train in bf16/fp16 autocast, accumulate "
                 "gradients, checkpoint activations; if reserved is much larger than "
                 "allocated, try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    return "\n".join(lines)


def _no_gpu_explained_by(config: pytest.Config) -> str | None:
    """Said once: the code of the diagnosis's finding that explains why CUDA is unusable, to
    which the no-GPU skips refer, or None (no diagnosis, or no such finding)."""
    from pytest_gputrain.diagnosis import diagnosis

    session = diagnosis(config)
    return session.explained_by("torch.cuda_available") if session is not None else None


def _write_tally(terminalreporter: Any, tallies: list[_Tally], required: bool,
                 no_gpu_explained_by: str | None = None) -> None:
    """The GPU tests' tally, for the terminal summary, fitted to its width; a skip for want of
    a usable GPU names the finding that explains it (``no_gpu_explained_by``), where one
    does."""
    from pytest_gputrain.assertions.requirements import NO_GPU
    from pytest_gputrain.report.text import wrap

    if not tallies:
        return
    ran = sum(t.ran for t in tallies)
    failed = sum(t.failed for t in tallies)
    errors = sum(t.error for t in tallies)
    skipped = [t.skip_reason for t in tallies
               if t.skip_reason is not None and not (t.failed or t.error)]
    total = len(tallies)
    text = (f"gputrain: {total} GPU test{'s' if total != 1 else ''}: {ran} ran, "
            f"{len(skipped)} skipped, {failed} failed")
    if errors:  # named as pytest's summary names them
        text += f", {errors} error{'s' if errors != 1 else ''}"
    if required:
        text += " (--gpu-required: no GPU test may skip)"
    bad = failed or errors
    markup = {"red": True} if bad else {"yellow": True} if skipped else {"green": True}
    terminalreporter.write_line(text, **markup)
    width = terminalreporter._tw.fullwidth
    for reason, count in Counter(skipped).most_common(3):
        if no_gpu_explained_by and reason.startswith(f"{NO_GPU}: "):
            reason = f"{NO_GPU}: see {no_gpu_explained_by} in the diagnosis below"
        for line in wrap(reason, width, " " * 4, first=f"  skipped {count}: "):
            terminalreporter.write_line(line)
