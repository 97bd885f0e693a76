"""The ``--gpu-diagnose`` session: collect the environment once, judge it, report it.

Registered by plugin.py only when the diagnosis is on, so a plain run pays nothing for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.facts import EnvironmentFacts, FactsFile
from pytest_gputrain.findings import Finding, sort_findings
from pytest_gputrain.options import Settings
from pytest_gputrain.report.markdown import report_markdown
from pytest_gputrain.report.model import build_report, fails, report_json, write_atomically
from pytest_gputrain.report.terminal import findings_lines, header_lines


class DiagnoseSession:
    """State and hooks of one diagnosed session (registered as a plugin object)."""

    def __init__(self, config: pytest.Config, settings: Settings, engine: RuleEngine) -> None:
        self.config = config
        self.settings = settings
        self.engine = engine
        self._environment: EnvironmentFacts | None = None
        self._findings: list[Finding] | None = None
        # Recorded facts from the run probe and the distributed launcher; findings come from
        # them exactly as a replay computes them. Other features add report sections.
        self.runs: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.distributed: list[dict[str, Any]] = []
        self.sections: dict[str, Any] = {}
        self._run_findings: list[Finding] = []
        self._run_findings_key: tuple[int, int, int] = (0, 0, 0)

    @property
    def environment(self) -> EnvironmentFacts:
        if self._environment is None:
            from pytest_gputrain.collect import collect_environment

            self._environment = collect_environment()
        return self._environment

    @property
    def findings(self) -> list[Finding]:
        if self._findings is None:
            self._findings = self.engine.evaluate_environment(self.environment)
        # Run and failure findings come from the recorded facts, exactly as a replay computes
        # them (under xdist the workers' facts arrive at the controller when each worker ends).
        key = (len(self.runs), len(self.failures), len(self.distributed))
        if key != self._run_findings_key:
            self._run_findings = self.engine.evaluate_recorded_runs(self.facts_file())
            self._run_findings_key = key
        return sort_findings(self._findings + self._run_findings)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return header_lines(self.environment)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("=", "gputrain diagnosis")
        width = max(60, terminalreporter._tw.fullwidth - 2)
        verbose = self.config.getoption("verbose", 0) > 0
        for line in findings_lines(self.findings, width=width, verbose=verbose):
            color = {"ERROR": {"red": True}, "WARNING": {"yellow": True}}.get(
                line.split(" ", 1)[0], {})
            terminalreporter.write_line(line, **color)
        if self.runs:
            from pytest_gputrain.probe.summary import runs_lines

            terminalreporter.write_line("")
            for line in runs_lines(self.runs, width=width):
                terminalreporter.write_line(line)
        for path in self.settings.reports:
            terminalreporter.write_line(f"gputrain: report written to {path}")
        if self.settings.facts_out:
            terminalreporter.write_line(f"gputrain: facts written to {self.settings.facts_out}")
        if fails(self.findings, self.settings.fail_on):
            terminalreporter.write_line(
                f"gputrain: failing the run: a finding reached '{self.settings.fail_on}' "
                "(--gpu-fail-on)", red=True, bold=True)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Any:
        # Before the terminal reporter's summary, so the files exist when it names them.
        self._write_outputs()
        failed = fails(self.findings, self.settings.fail_on)
        if failed and session.exitstatus in (pytest.ExitCode.OK,
                                             pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            # A diagnosis of the machine alone (no tests) is a complete, successful run.
            session.exitstatus = pytest.ExitCode.OK
        yield

    # -- pytest-xdist: environment to the workers, run facts back ---------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        from pytest_gputrain.probe.session import WORKER_ENVIRONMENT

        node.workerinput[WORKER_ENVIRONMENT] = self.environment.model_dump_json()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        from pytest_gputrain.probe.session import WORKER_FAILURES, WORKER_RUNS

        output = getattr(node, "workeroutput", None) or {}
        self.runs.extend(output.get(WORKER_RUNS, []))
        self.failures.extend(output.get(WORKER_FAILURES, []))

    def facts_file(self) -> FactsFile:
        return FactsFile(environment=self.environment, runs=self.runs, failures=self.failures,
                         distributed=self.distributed)

    def _write_outputs(self) -> None:
        findings = self.findings
        for extra in self.config.hook.pytest_gputrain_report_sections(config=self.config):
            self.sections.update(extra or {})
        if self.runs:
            from pytest_gputrain.probe.summary import runs_section

            self.sections["runs"] = runs_section(self.runs)
        for path in self.settings.reports:
            report = build_report(self.environment, findings, self.settings.fail_on,
                                  self.sections)
            text = report_json(report) if path.suffix == ".json" else report_markdown(report)
            _write(path, text)
        if self.settings.facts_out:
            _write(self.settings.facts_out, self.facts_file().model_dump_json(indent=1) + "\n")


def _write(path: Path, text: str) -> None:
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise pytest.UsageError(f"gputrain: cannot write {path}: {exc}") from None
