"""``ProbePlugin``: runs a ``RunProbe`` around each test call and diagnoses GPU failures.

Registered by plugin.py only under ``--gpu-diagnose``: in the single process, next to the
``DiagnoseSession``; on each pytest-xdist worker alone (workers send their run and failure facts
to the controller through ``config.workeroutput``; the controller's session evaluates them).

Per test it records a ``RunFacts`` (when the test trained, ran a module, loaded data or used
CUDA) and, when the test failed on a GPU error, a ``FailureFacts``; the findings of both are
appended to the test's report as a "gputrain diagnosis" section.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_gputrain.facts import EnvironmentFacts
from pytest_gputrain.findings import Finding, sort_findings
from pytest_gputrain.probe.failures import STICKY, build_failure, classify, snapshot
from pytest_gputrain.probe.run import RunProbe
from pytest_gputrain.run_facts import FailureFacts, RunFacts

SECTION = "gputrain diagnosis"
PROBE_KEY = pytest.StashKey[RunProbe]()
STATE_KEY = pytest.StashKey[dict[str, Any]]()
WORKER_RUNS = "gputrain_runs"
WORKER_FAILURES = "gputrain_failures"
WORKER_ENVIRONMENT = "gputrain_environment"
DEFAULT_PROFILE_STEPS = "3-6"


@dataclass(frozen=True)
class ProbeSettings:
    enabled: bool = True
    profile_steps: tuple[int, int] | None = (3, 6)


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """``"3-6"`` -> (3, 6); ``"5"`` -> (5, 5); ``"off"`` -> None. Raises ValueError."""
    value = (text if text is not None else DEFAULT_PROFILE_STEPS).strip().lower()
    if value in ("", "off", "none", "no", "false", "0"):
        return None
    first, sep, last = value.partition("-")
    try:
        start = int(first)
        end = int(last) if sep else start
    except ValueError:
        raise ValueError(f"{text!r} is not a step range (e.g. 3-6, or off)") from None
    if start < 2 or end < start:
        raise ValueError(f"{text!r}: the window must start at step 2 or later and end at or "
                         "after its start (e.g. 3-6)")
    return start, end


def read_probe_settings(config: pytest.Config) -> ProbeSettings:
    from pytest_gputrain.options import read

    probe = str(read(config, "gpu_probe") or "on").strip().lower()
    if probe not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
        raise pytest.UsageError(f"gpu_probe / --gpu-probe: {probe!r} must be on or off")
    try:
        steps = parse_profile_steps(read(config, "gpu_profile_steps"))
    except ValueError as exc:
        raise pytest.UsageError(f"gpu_profile_steps / --gpu-profile-steps: {exc}") from None
    return ProbeSettings(enabled=probe in ("on", "true", "1", "yes"), profile_steps=steps)


def section_text(findings: list[Finding], width: int = 100) -> str:
    lines: list[str] = []
    for finding in findings:
        lines.append(f"{finding.severity.upper()} {finding.code} {finding.name}: {finding.title}")
        lines.append(textwrap.fill(finding.message, width=width, initial_indent="    ",
                                   subsequent_indent="    "))
        lines.append(textwrap.fill("fix: " + finding.fix, width=width, initial_indent="    ",
                                   subsequent_indent="    "))
        lines.append("")
    lines.append("details: python -m pytest_gputrain explain CODE")
    return "\n".join(lines)


class ProbePlugin:
    """The per-test probe and failure diagnosis (a pytest plugin object)."""

    def __init__(self, config: pytest.Config, engine: Any,
                 environment: Callable[[], EnvironmentFacts],
                 runs: list[dict[str, Any]] | None = None,
                 failures: list[dict[str, Any]] | None = None,
                 settings: ProbeSettings | None = None) -> None:
        self.config = config
        self.engine = engine
        self._environment = environment
        self.runs: list[dict[str, Any]] = runs if runs is not None else []
        self.failures: list[dict[str, Any]] = failures if failures is not None else []
        self.settings = settings or read_probe_settings(config)
        self.internal_errors: list[str] = []

    @classmethod
    def for_worker(cls, config: pytest.Config, engine: Any,
                   settings: ProbeSettings | None = None) -> ProbePlugin:
        """On an xdist worker: the controller's environment facts, facts sent back at the end."""
        cached: list[EnvironmentFacts] = []

        def environment() -> EnvironmentFacts:
            if not cached:
                text = getattr(config, "workerinput", {}).get(WORKER_ENVIRONMENT)
                if text:
                    cached.append(EnvironmentFacts.model_validate_json(text))
                else:
                    from pytest_gputrain.collect import collect_environment

                    cached.append(collect_environment())
            return cached[0]

        return cls(config, engine, environment, settings=settings)

    # -- the probe around the call --------------------------------------------------------------

    def _start(self, item: pytest.Item) -> RunProbe | None:
        torch = sys.modules.get("torch")
        if not self.settings.enabled or torch is None or not hasattr(torch, "optim"):
            return None  # a test session that never imported torch pays nothing
        probe = RunProbe(torch, item.nodeid, profile_steps=self.settings.profile_steps,
                         reset_peak=item.get_closest_marker("max_vram") is None)
        probe.start()
        return probe

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, None]:
        try:
            probe = self._start(item)
        except Exception as exc:  # never let the probe break a test
            self.internal_errors.append(f"{item.nodeid}: probe start: {exc}")
            probe = None
        outcome = yield
        if probe is None:
            return
        try:
            state: dict[str, Any] = {}
            cuda_ok = True
            excinfo = outcome.excinfo
            if excinfo is not None:
                error = excinfo[1]
                kind = classify(_type_name(error), str(error))
                cuda_ok = kind not in STICKY
                state = snapshot(probe.torch, kind, probe.cuda_index)
            probe.stop(cuda_ok=cuda_ok)
            item.stash[PROBE_KEY] = probe
            item.stash[STATE_KEY] = state
        except Exception as exc:
            self.internal_errors.append(f"{item.nodeid}: probe stop: {exc}")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
        outcome = yield
        try:
            self._diagnose(item, call, outcome.get_result())
        except Exception as exc:
            self.internal_errors.append(f"{item.nodeid}: diagnosis: {type(exc).__name__}: {exc}")

    def _diagnose(self, item: pytest.Item, call: pytest.CallInfo[None],
                  report: pytest.TestReport) -> None:
        probe = item.stash.get(PROBE_KEY, None) if call.when == "call" else None
        run: RunFacts | None = None
        failure: FailureFacts | None = None
        if call.excinfo is not None and report.failed:
            exc, tb = call.excinfo.value, call.excinfo.tb
            torch = sys.modules.get("torch")
            if call.when == "call":
                state = item.stash.get(STATE_KEY, {})
            else:
                state = snapshot(torch, classify(_type_name(exc), str(exc)), None)
            failure = build_failure(item.nodeid, call.when, exc, tb, probe, torch, state)
        if probe is not None and probe.trained():
            run = probe.facts()
        if run is None and failure is None:
            return
        findings: list[Finding] = []
        env = self._environment()
        if run is not None:
            data = run.model_dump(mode="json")
            self.runs.append(data)
            run = RunFacts.model_validate(data)
            findings.extend(self.engine.evaluate_run(env, run))
        if failure is not None:
            data = failure.model_dump(mode="json")
            self.failures.append(data)
            failure = FailureFacts.model_validate(data)
            findings.extend(self.engine.evaluate_failure(env, failure, run))
        if findings:
            report.sections.append((SECTION, section_text(sort_findings(findings))))

    # -- xdist: send the facts to the controller ------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        output = getattr(self.config, "workeroutput", None)
        if output is not None:
            output[WORKER_RUNS] = self.runs
            output[WORKER_FAILURES] = self.failures


def _type_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
