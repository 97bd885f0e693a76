"""The diagnosis on each test's own report: outcomes for the HTML report, findings as JUnit XML
properties and pytest-html extras, and GitHub Actions annotations at the test's line.

``TestOutputs`` is registered with the diagnosis (plugin.py). Everything happens in
``pytest_runtest_logreport``, which sees every report in the process that ran the test and, under
pytest-xdist, again on the controller:

- each test's outcome, duration, location and failure report (pytest's traceback) are kept
  for the HTML report and the annotations;
- at a test's teardown report, the records the features added about that test are judged (as
  the features judged them, so the findings are the same) and, where a JUnit XML file or a
  pytest-html report is being written, the findings are added to the report: as properties
  (``user_properties``: junitxml writes those of the teardown report) and as an HTML extra
  (``extras``: pytest-html shows those of every phase). This runs before junitxml, pytest-html
  and pytest-xdist (which sends the report to the controller) read the report;
- at the end, the controller prints the session's warning-or-worse findings about tests as
  workflow annotations (``--gpu-annotations``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_gputrain import feature_plugins, scopes

if TYPE_CHECKING:
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.facts import EnvironmentFacts
    from pytest_gputrain.findings import Finding


class Diagnosis(Protocol):
    """What judging one test needs of the session (``diagnosis.Diagnosis``, which registers
    this module's plugin: named by its parts so that this module stays below it)."""

    @property
    def environment(self) -> EnvironmentFacts: ...

    @property
    def engine(self) -> RuleEngine: ...

    def records(self, scope: str) -> list[dict[str, Any]]: ...

PLUGIN_NAME = "gputrain-test-outputs"
PLUGIN_KEY = pytest.StashKey["TestOutputs"]()
JUNIT_PROPERTY = "gpu_finding"
MAX_TRACEBACK = 20_000  # characters of a failure's report kept for the HTML report


@dataclass(frozen=True)
class TestResult:
    """What pytest said about a test: its outcome, the call's duration, its file and line."""

    __test__ = False  # not a test class, whatever pytest collects

    outcome: str  # passed, failed, error, skipped, xfailed, xpassed
    duration: float | None = None
    path: str | None = None  # relative to the rootdir, as pytest reports it
    line: int | None = None  # 1-based line of the test function
    traceback: str | None = None  # pytest's report of a failure or error (capped)


def register(config: pytest.Config, session: Diagnosis, annotations: bool) -> None:
    feature_plugins.register(config, PLUGIN_KEY, TestOutputs(config, session, annotations),
                             PLUGIN_NAME)


def unregister(config: pytest.Config) -> None:
    feature_plugins.unregister(config, PLUGIN_KEY)


def test_results(config: pytest.Config) -> dict[str, TestResult] | None:
    """Each test's outcome so far (None when the diagnosis did not follow the tests)."""
    plugin = config.stash.get(PLUGIN_KEY, None)
    return dict(plugin.results) if plugin is not None else None


def _last(text: str, limit: int) -> str:
    """The end of ``text`` (a traceback ends with the error), at most ``limit`` characters."""
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def belongs_to(subject: str, nodeid: str) -> bool:
    """A finding's subject names the test: its node id, or a launch of it ('ID [2 ranks…]')."""
    return subject == nodeid or subject.startswith(nodeid + " [")


class TestOutputs:
    __test__ = False

    def __init__(self, config: pytest.Config, session: Diagnosis, annotations: bool) -> None:
        self.config = config
        self.session = session
        self.annotations = annotations
        self.results: dict[str, TestResult] = {}
        self._judged: dict[str, int] = {}  # records of each scope already looked at
        self.junit = bool(config.getoption("xmlpath", None))
        self.html = bool(config.getoption("htmlpath", None))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._keep_result(report)
        # The pytest-xdist controller runs no test: its workers attached what they found.
        if report.when == "teardown" and (self.junit or self.html) and \
                not self.config.pluginmanager.has_plugin("dsession"):
            recorded, findings = self._judge(report.nodeid)
            if self.junit and findings:
                report.user_properties.extend(
                    (JUNIT_PROPERTY, f"{f.code} [{f.severity}] {f.title}: {f.message} "
                                     f"Fix: {f.fix}") for f in findings)
            if self.html and (recorded or findings):
                extra = pytest_html_extra(report.nodeid, findings, self.session)
                if extra is not None:
                    report.extras = [*getattr(report, "extras", []), extra]  # type: ignore[attr-defined]

    def _keep_result(self, report: pytest.TestReport) -> None:
        category = self.config.hook.pytest_report_teststatus(report=report,
                                                             config=self.config)[0]
        known = self.results.get(report.nodeid)
        path, line = report.location[0], report.location[1]
        if category and (known is None or category in ("failed", "error")):
            traceback = _last(report.longreprtext, MAX_TRACEBACK) \
                if category in ("failed", "error") and report.longrepr else None
            self.results[report.nodeid] = TestResult(
                outcome=category, duration=known.duration if known else None, path=path,
                line=line + 1 if line is not None else None,
                traceback=traceback or (known.traceback if known else None))
        if report.when == "call" and report.nodeid in self.results:
            result = self.results[report.nodeid]
            self.results[report.nodeid] = replace(result, duration=report.duration)

    def _judge(self, nodeid: str) -> tuple[bool, list[Finding]]:
        """Whether the features recorded anything about ``nodeid`` since the last test, and the
        findings of those records, judged as the features judged them."""
        from pytest_gputrain.findings import sort_findings

        added: dict[str, list[Any]] = {}
        for scope in scopes.recorded():
            records = self.session.records(scope.name)
            seen = self._judged.get(scope.name, 0)
            self._judged[scope.name] = len(records)
            for data in records[seen:]:
                record = scope.model.model_validate(data)
                if belongs_to(scope.subject(record), nodeid):
                    added.setdefault(scope.name, []).append(record)
        env, engine = self.session.environment, self.session.engine
        findings = [finding for scope, records in added.items() for record in records
                    for finding in engine.evaluate_record(scope, env, record, added)]
        return bool(added), sort_findings(findings)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.annotations:
            return
        from pytest_gputrain.report.annotations import annotation

        findings = getattr(self.session, "findings", None)
        if not findings:
            return
        for finding in findings:
            result = (self.results.get(finding.subject)
                      or self.results.get(finding.subject.split(" [", 1)[0]))
            if result is None:  # about the session or a GPU, not a test
                continue
            line = annotation(finding, self._workspace_path(result.path), result.line)
            if line is not None:
                terminalreporter.write_line(line)

    def _workspace_path(self, path: str | None) -> str | None:
        """The test file relative to the checkout (GITHUB_WORKSPACE), as annotations name it."""
        if path is None:
            return None
        absolute = Path(self.config.rootpath, path).resolve()
        workspace = os.environ.get("GITHUB_WORKSPACE")
        if workspace:
            try:
                return absolute.relative_to(Path(workspace).resolve()).as_posix()
            except ValueError:
                pass
        return Path(path).as_posix()


def pytest_html_extra(nodeid: str, findings: list[Finding], session: Diagnosis
                      ) -> dict[str, Any] | None:
    """pytest-html's HTML extra: the findings, and the compact timeline of the test's run."""
    try:
        from pytest_html import extras
    except ImportError:
        return None
    from pytest_gputrain.report.sparkline import timeline_svg
    from pytest_gputrain.report.timeline import run_timeline
    from pytest_gputrain.report.visible_text import html_text as escape

    parts = ['<div class="gputrain"><h4>GPU diagnosis (pytest-gputrain)</h4><ul>']
    for f in findings:
        parts.append(f"<li><strong>{f.severity.upper()}</strong> <code>{escape(f.code)}</code> "
                     f"{escape(f.title)}: {escape(f.message)} <em>Fix:</em> {escape(f.fix)}</li>")
    parts.append("</ul>")
    runs = [r for r in session.records("run") if r.get("nodeid") == nodeid]
    failures = [r for r in session.records("failure") if r.get("nodeid") == nodeid]
    if runs:
        svg = timeline_svg(run_timeline(runs[-1], failures[-1] if failures else None, 120))
        parts.append(svg)
    parts.append("</div>")
    return extras.html("".join(parts))  # type: ignore[no-any-return]
