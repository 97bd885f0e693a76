"""``ProbePlugin``: the probe's hooks, registered by ``plugin.py`` under ``--gpu-diagnose`` (in
every process that runs tests: the single process, or each pytest-xdist worker).

Per test it runs a ``RunProbe`` around the call and records a ``RunFacts`` (when the test
trained, ran a module, loaded data or used CUDA) and, when the test failed on a GPU error, a
``FailureFacts``; it hands both to the diagnosis (``add_test_record``), which judges them with
the session's findings and replays them from the facts file, and writes the findings of both in
the test's report section "gputrain diagnosis". The table of probed runs is a section of the
session's reports.

Loaded only when the diagnosis runs; importing it imports neither torch nor pydantic.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain.probe.probe_settings import ProbeSettings, read_probe_settings

if TYPE_CHECKING:
    from pytest_gputrain.diagnosis import Diagnosis
    from pytest_gputrain.probe.failure_facts import FailureFacts
    from pytest_gputrain.probe.run import RunProbe

PROBE_KEY = pytest.StashKey["RunProbe"]()
STATE_KEY = pytest.StashKey[dict[str, Any]]()


def add_runs_section(session: Diagnosis) -> None:
    """The table of probed runs, in the report files and the terminal summary."""
    session.add_section("runs", lambda: _runs_section(session),
                        terminal=lambda width: _runs_lines(session, width),
                        markdown=lambda: _runs_markdown(session))


def _runs_section(session: Diagnosis) -> list[dict[str, Any]] | None:
    runs = session.records("run")
    if not runs:
        return None
    from pytest_gputrain.probe.summary import runs_section

    return runs_section(runs)


def _runs_lines(session: Diagnosis, width: int) -> list[str]:
    runs = session.records("run")
    if not runs:
        return []
    from pytest_gputrain.probe.summary import runs_lines

    return runs_lines(runs, width=width)


def _runs_markdown(session: Diagnosis) -> str | None:
    runs = session.records("run")
    if not runs:
        return None
    from pytest_gputrain.probe.summary import runs_markdown

    return runs_markdown(runs)


class ProbePlugin:
    """The per-test probe and failure diagnosis (a pytest plugin object)."""

    def __init__(self, config: pytest.Config, session: Diagnosis,
                 settings: ProbeSettings | None = None) -> None:
        self.config = config
        self.session = session
        self.settings = settings or read_probe_settings(config)
        self.internal_errors: list[str] = []

    # -- the probe around the call --------------------------------------------------------------

    def _start(self, item: pytest.Item) -> RunProbe | None:
        torch = sys.modules.get("torch")
        if not self.settings.enabled or torch is None or not hasattr(torch, "optim"):
            return None  # a test session that never imported torch pays nothing
        from pytest_gputrain.probe.run import RunProbe

        probe = RunProbe(torch, item.nodeid, profile_steps=self.settings.profile_steps,
                         reset_peak=item.get_closest_marker("max_vram") is None)
        probe.record.cpu_parametrized = cpu_parametrized(item)
        probe.start()
        return probe

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            probe = self._start(item)
        except Exception as exc:  # never let the probe break a test
            self.internal_errors.append(f"{item.nodeid}: probe start: {exc}")
            probe = None
        if probe is None:
            return (yield)
        try:
            result = yield
        except BaseException as exc:  # the test failed (or was skipped): stop, then re-raise
            self._stop(item, probe, exc)
            raise
        self._stop(item, probe, None)
        return result

    def _stop(self, item: pytest.Item, probe: RunProbe, error: BaseException | None) -> None:
        try:
            from pytest_gputrain.probe.failures import NO_CUDA_CALLS, classify_exception, snapshot

            state: dict[str, Any] = {}
            cuda_ok = True
            if error is not None:
                kind = classify_exception(error)
                cuda_ok = kind not in NO_CUDA_CALLS
                state = snapshot(probe.torch, kind, probe.cuda_index)
            probe.stop(cuda_ok=cuda_ok)
            item.stash[PROBE_KEY] = probe
            item.stash[STATE_KEY] = state
        except Exception as exc:
            self.internal_errors.append(f"{item.nodeid}: probe stop: {exc}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        try:
            self._diagnose(item, call, report)
        except Exception as exc:
            self.internal_errors.append(f"{item.nodeid}: diagnosis: {type(exc).__name__}: {exc}")
        return report

    def _diagnose(self, item: pytest.Item, call: pytest.CallInfo[None],
                  report: pytest.TestReport) -> None:
        probe = item.stash.get(PROBE_KEY, None) if call.when == "call" else None
        failure: FailureFacts | None = None
        if call.excinfo is not None and report.failed:
            from pytest_gputrain.probe.failures import build_failure, classify_exception, snapshot

            exc, tb = call.excinfo.value, call.excinfo.tb
            torch = sys.modules.get("torch")
            if call.when == "call":
                state = item.stash.get(STATE_KEY, {})
            else:
                state = snapshot(torch, classify_exception(exc), None)
            failure = build_failure(item.nodeid, call.when, exc, tb, probe, torch, state)
        # The diagnosis judges them together when the report is made (a failure with its run).
        if probe is not None and probe.trained():
            self.session.add_test_record(item, "run", probe.facts())
        if failure is not None:
            self.session.add_test_record(item, "failure", failure)


def cpu_parametrized(item: pytest.Item) -> bool:
    """The test's parameters (``parametrize`` or fixture params) include a CPU device: the
    string ``"cpu"`` (or ``"cpu:0"``) or a ``torch.device("cpu")``. Such a test runs on the
    CPU on purpose, whatever GPU the machine has."""
    callspec = getattr(item, "callspec", None)
    params = getattr(callspec, "params", None) or {}
    return any(_is_cpu_device(value) for value in params.values())


def _is_cpu_device(value: Any) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        return text == "cpu" or text.startswith("cpu:")
    return type(value).__name__ == "device" and getattr(value, "type", None) == "cpu"
