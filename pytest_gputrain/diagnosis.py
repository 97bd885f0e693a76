"""The ``--gpu-diagnose`` session: collect the environment once, judge it, report it.

Started by plugin.py only when the diagnosis is on, so a plain run pays nothing for it. Features
find it with ``diagnosis(config)`` (None when the diagnosis is off) and hand it what they found
through one door each:

- ``add_record(scope, record)``: facts of a registered scope (a test's run, a failure, a
  launch). The session's findings come from its records exactly as a replay of the facts file
  computes them; the facts file (``--gpu-facts-out``) keeps them.
- ``add_test_record(item, scope, record, details)``: the same, for a record of the test
  ``item`` made while pytest makes the report of one of its phases (setup, call, teardown).
  The diagnosis judges the phase's records together (a failure with its run), as a replay
  does, and writes their findings, then the ``details`` lines, as the report's one "gputrain
  diagnosis" section.
- ``add_section(name, section, terminal=..., markdown=...)``: a section of the report files,
  and optionally lines for the terminal summary and Markdown for the Markdown report.

On a pytest-xdist worker the diagnosis is a ``WorkerDiagnosis``: it judges with the
controller's environment and sends its records to the controller when the worker ends; the
controller alone reports (sections added on a worker are not reported: derive them from records,
which reach the controller).

Import-light: importing this module imports neither torch nor pydantic.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import options, scopes
from pytest_gputrain.xdist import send_to_controller, sent_by_worker

if TYPE_CHECKING:
    from pydantic import BaseModel

    from pytest_gputrain.diagnosis_settings import Settings
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.facts import EnvironmentFacts, FactsFile
    from pytest_gputrain.findings import Finding
    from pytest_gputrain.report.terminal import PrintedReport

PLUGIN_NAME = "gputrain-diagnose"
# The title of the section the diagnosis adds to a test's report.
_SESSION_KEY = pytest.StashKey[pytest.Session]()
# The records a test's current phase handed in: (scope, record as kept, details), in order.
_TEST_RECORDS = pytest.StashKey[list[tuple[str, Any, tuple[str, ...]]]]()
# pytest-xdist: the controller's environment goes to the workers, their records come back.
WORKER_ENVIRONMENT = "gputrain_environment"
WORKER_RECORDS = "gputrain_records"

TerminalLines = Callable[[int], list[str]]
MarkdownText = Callable[[], "str | None"]


def diagnosis(config: pytest.Config) -> Diagnosis | None:
    """The session's diagnosis, or None when ``--gpu-diagnose`` is off."""
    session: Diagnosis | None = config.stash.get(options.DIAGNOSIS_KEY, None)
    return session


class Diagnosis:
    """What every diagnosed process holds: the rules, the environment, the features' records."""

    def __init__(self, config: pytest.Config, engine: RuleEngine) -> None:
        self.config = config
        self.engine = engine
        self._environment: EnvironmentFacts | None = None
        # The user's variables as the session began: the environment is read when first
        # needed, and by then torch (its profiler, in the probe's window) may have set some.
        self._environ = dict(os.environ)
        self._records: dict[str, list[dict[str, Any]]] = {}
        self._sections: dict[str, tuple[Any, TerminalLines | None, MarkdownText | None]] = {}

    @property
    def environment(self) -> EnvironmentFacts:
        if self._environment is None:
            self._environment = self._read_environment()
        return self._environment

    def _read_environment(self) -> EnvironmentFacts:
        from pytest_gputrain.collect import collect_environment

        return collect_environment(environ=self._environ)

    def add_record(self, scope: str, record: BaseModel) -> Any:
        """Keep one record of ``scope`` (a registered scope that records, e.g. ``run``).

        Returns the record as the facts file keeps it (read back from its JSON), so that a
        feature judging it now judges exactly what a replay will.
        """
        spec = scopes.get(scope)
        if not spec.recorded:
            raise ValueError(f"scope {scope!r} takes no records: its facts come from the "
                             "environment")
        if not isinstance(record, spec.model):
            raise TypeError(f"a {scope!r} record must be a {spec.model.__qualname__}, "
                            f"got {type(record).__qualname__}")
        data = record.model_dump(mode="json")
        self._records.setdefault(scope, []).append(data)
        return spec.model.model_validate(data)

    def add_test_record(self, item: pytest.Item, scope: str, record: BaseModel,
                        details: Sequence[str] = ()) -> None:
        """Keep one record of ``scope`` (as ``add_record``) made by the test ``item`` in the
        phase whose report pytest is making: judged with the phase's other records when the
        report is made, its findings and ``details`` (lines that describe the record) in the
        report's "gputrain diagnosis" section."""
        kept = self.add_record(scope, record)
        item.stash.setdefault(_TEST_RECORDS, []).append((scope, kept, tuple(details)))

    # The outermost wrapper (tryfirst): every feature's wrapper, inside it, has handed its
    # records of the phase by the time the report comes back here.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        handed = item.stash.get(_TEST_RECORDS, None)
        if handed:
            del item.stash[_TEST_RECORDS]
            text = self._test_section(handed)
            if text:
                from pytest_gputrain.report.terminal import REPORT_SECTION

                report.sections.append((REPORT_SECTION, text))
        return report

    def _test_section(self, handed: list[tuple[str, Any, tuple[str, ...]]]) -> str:
        """The findings of one test's phase, as a replay gives them (a failure judged with its
        run), most severe first; then each record's details, by scope, in the order given."""
        from pytest_gputrain.findings import sort_findings
        from pytest_gputrain.report.terminal import section_text

        handed = sorted(handed, key=lambda entry: entry[0])  # stable: records keep their order
        related: dict[str, list[Any]] = {}
        for scope, record, _ in handed:
            related.setdefault(scope, []).append(record)
        try:
            findings = [finding for scope, record, _ in handed
                        for finding in self.engine.evaluate_record(
                            scope, self.environment, record, related)]
        except Exception as exc:  # never let the diagnosis break a test's report
            return f"gputrain: this test's records could not be judged: " \
                   f"{type(exc).__name__}: {exc}"
        details = [line for _, _, lines in handed for line in lines]
        width = max(MIN_WIDTH, shutil.get_terminal_size().columns)  # as pytest: COLUMNS, or 80
        return section_text(sort_findings(findings), width, details)

    def explained_by(self, fact: str) -> str | None:
        """The code of the session's finding that cites ``fact`` as evidence (GT001 cites
        ``nvml.reason``), or None: a line that would repeat a cause names the finding instead,
        so that the output says it once. Only the process that reports judges (None here)."""
        return None

    def records(self, scope: str) -> list[dict[str, Any]]:
        """The records of ``scope`` so far, as plain JSON data."""
        return list(self._records.get(scope, []))

    def add_section(self, name: str, section: Any, terminal: TerminalLines | None = None,
                    markdown: MarkdownText | None = None) -> None:
        """A section of the report files: ``sections[name]`` in the JSON report; a ``markdown``
        string in it is printed by the Markdown report.

        ``section`` is the value, or a function that gives it when the reports are written
        (None leaves it out), so that a section built from records is complete. ``terminal``
        gives the section's lines for the terminal summary (its argument: the width), printed
        after the findings; ``markdown`` gives its Markdown (or None), for a section whose JSON
        value is not an object with a ``markdown`` string.
        """
        self._sections[name] = (section, terminal, markdown)

    def sections(self) -> dict[str, Any]:
        """The report sections, computed now."""
        result: dict[str, Any] = {}
        for name, (section, _, _) in self._sections.items():
            value = section() if callable(section) else section
            if value is not None:
                result[name] = value
        return result

    def terminal_lines(self, width: int) -> list[list[str]]:
        """Each section's terminal lines, where it has some."""
        blocks = []
        for _, terminal, _ in self._sections.values():
            lines = terminal(width) if terminal is not None else []
            if lines:
                blocks.append(lines)
        return blocks

    def markdown_sections(self) -> dict[str, str]:
        """The Markdown of each section that gives its own, by name."""
        result: dict[str, str] = {}
        for name, (_, _, markdown) in self._sections.items():
            text = markdown() if markdown is not None else None
            if text:
                result[name] = text
        return result

    def facts_file(self) -> FactsFile:
        from pytest_gputrain.facts import FactsFile

        return FactsFile(environment=self.environment, records=self._records)


class DiagnosisSession(Diagnosis):
    """The diagnosis of the single process, or of the pytest-xdist controller: it reports."""

    def __init__(self, config: pytest.Config, settings: Settings, engine: RuleEngine) -> None:
        super().__init__(config, engine)
        self.settings = settings
        self._environment_findings: list[Finding] | None = None
        self._record_findings: list[Finding] = []
        self._record_findings_count = 0
        self._findings: list[Finding] | None = None  # computed when the session finishes
        self.outputs: list[Output] = []
        self.interrupted = False

    @property
    def findings(self) -> list[Finding]:
        from pytest_gputrain.findings import sort_findings

        environment_findings = self.environment_findings
        # Records only ever grow: judge them again when there are more (under xdist the
        # workers' records arrive when each worker ends).
        count = sum(len(records) for records in self._records.values())
        if count != self._record_findings_count:
            self._record_findings = self.engine.evaluate_records(self.facts_file())
            self._record_findings_count = count
        return sort_findings(environment_findings + self._record_findings)

    @property
    def environment_findings(self) -> list[Finding]:
        """The findings about the environment alone, judged once."""
        if self._environment_findings is None:
            self._environment_findings = self.engine.evaluate_environment(self.environment)
        return self._environment_findings

    def explained_by(self, fact: str) -> str | None:
        return next((finding.code for finding in self.environment_findings
                     if finding.scope == "session"
                     and any(evidence.name == fact for evidence in finding.evidence)), None)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from pytest_gputrain.report.terminal import header_lines

        return header_lines(self.environment, width=config.get_terminal_writer().fullwidth,
                            no_gpu_explained_by=self.explained_by("nvml.reason"))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        try:
            self._summary(terminalreporter)
        except KeyboardInterrupt:
            self.interrupted = True
            terminalreporter.write_line("")
        if self.interrupted:
            # As pytest ends on Ctrl-C: exit status 2, after saying what was left undone.
            terminalreporter.write_line(
                "gputrain: interrupted (Ctrl-C) while finishing the diagnosis: the outputs "
                "listed as written are complete, the others were not written", red=True,
                bold=True)
            session = self.config.stash.get(_SESSION_KEY, None)
            if session is not None:
                session.exitstatus = pytest.ExitCode.INTERRUPTED

    def _summary(self, terminalreporter: Any) -> None:
        from pytest_gputrain.report.model import fails
        from pytest_gputrain.report.terminal import findings_lines
        from pytest_gputrain.units import printable

        terminalreporter.write_sep("=", "gputrain diagnosis")
        findings = self._findings
        if findings is None:
            terminalreporter.write_line("gputrain: no findings to show: the session was "
                                        "interrupted before the rules were evaluated")
        else:
            width = max(MIN_WIDTH, terminalreporter._tw.fullwidth)
            verbose = self.config.getoption("verbose", 0) > 0
            for line in findings_lines(findings, width=width, verbose=verbose,
                                       printed=_printed_reports(terminalreporter)):
                color = {"ERROR": {"red": True}, "WARNING": {"yellow": True}}.get(
                    line.split(" ", 1)[0], {})
                terminalreporter.write_line(line, **color)
            for lines in self.terminal_lines(width):
                terminalreporter.write_line("")
                for line in lines:
                    terminalreporter.write_line(printable(line))
        for output in self.outputs:
            if output.error is None:
                terminalreporter.write_line(f"gputrain: {output.what} written to {output.path}")
            else:
                terminalreporter.write_line(
                    f"gputrain: could not write the {output.what} {output.path}: {output.error}",
                    red=True, bold=True)
        if findings is not None and fails(findings, self.settings.fail_on):
            terminalreporter.write_line(
                f"gputrain: failing the run: a finding reached '{self.settings.fail_on}' "
                "(--gpu-fail-on)", red=True, bold=True)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session,
                             exitstatus: int) -> Generator[None, None, None]:
        from pytest_gputrain.report.model import fails

        self.config.stash[_SESSION_KEY] = session
        # Before the terminal reporter's summary, so the files exist when it names them.
        try:
            self._findings = self.findings
        except KeyboardInterrupt:
            self.interrupted = True
        self.outputs = self._write_outputs(self._findings)
        failed = self._findings is not None and fails(self._findings, self.settings.fail_on)
        unwritten = any(output.error is not None for output in self.outputs)
        if self.interrupted:
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        elif (failed or unwritten) and session.exitstatus in (
                pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            # A diagnosis of the machine alone (no tests) is a complete, successful run.
            session.exitstatus = pytest.ExitCode.OK
        return (yield)

    # -- pytest-xdist: environment to the workers, records back -----------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_ENVIRONMENT] = self.environment.model_dump_json()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        for scope, records in sent_by_worker(node, WORKER_RECORDS, {}).items():
            self._records.setdefault(scope, []).extend(records)

    def _write_outputs(self, findings: list[Finding] | None) -> list[Output]:
        """Every report and the facts file: each that can be written is, whatever happens to
        the others (a bad path, Ctrl-C); the failures are listed, not raised."""
        from pytest_gputrain.outputs import append_text, write_output

        outputs: list[Output] = []

        def attempt(what: str, path: Path, text: Callable[[], str], append: bool) -> None:
            try:
                (append_text if append else write_output)(path, text())
                outputs.append(Output(what, path))
            except OSError as exc:
                outputs.append(Output(what, path, exc.strerror or str(exc)))
            except ValueError as exc:  # text that cannot be encoded, a value JSON refuses
                outputs.append(Output(what, path, str(exc)))
            except KeyboardInterrupt:  # the others are still written: each takes a moment
                self.interrupted = True
                outputs.append(Output(what, path, "not written: interrupted (Ctrl-C)"))

        for target in self.settings.reports:
            if findings is None:
                outputs.append(Output("report", target.path, "not written: interrupted "
                                      "(Ctrl-C) before the rules were evaluated"))
                continue
            attempt("report", target.path,
                    functools.partial(self._report_text, target.format, findings), target.append)
        if self.settings.facts_out:
            attempt("facts", self.settings.facts_out,
                    lambda: self.facts_file().model_dump_json(indent=1) + "\n", False)
        return outputs

    def _report_text(self, form: str, findings: list[Finding]) -> str:
        from pytest_gputrain.report.markdown import report_markdown
        from pytest_gputrain.report.model import build_report, report_json

        report = build_report(self.environment, findings, self.settings.fail_on, self.sections())
        if form == "html":
            from pytest_gputrain.report.html import report_html
            from pytest_gputrain.report.test_outputs import test_results

            return report_html(report, self.facts_file(), test_results(self.config))
        if form == "json":
            return report_json(report)
        return report_markdown(report, self.markdown_sections())


# Narrower terminals get lines of this width (they wrap): shorter ones would hold a word a line.
MIN_WIDTH = 40


def _printed_reports(terminalreporter: Any) -> dict[str, PrintedReport]:
    """The tests' reports pytest printed above the summary, with their diagnosis sections:
    those of failed tests, and of passed ones with ``-rP``/``-rA``; none when it printed no
    report sections (``--tb=no``, ``--tb=line``, ``--show-capture`` other than ``all``)."""
    from pytest_gputrain.report.terminal import shown_in_reports

    option = terminalreporter.config.option
    if option.tbstyle in ("no", "line") or option.showcapture != "all":
        return {}
    names = {"failed": "failure report", "error": "error report"}
    if terminalreporter.hasopt("P"):
        names["passed"] = "report"
    return shown_in_reports((report.nodeid, name, report.sections) for key, name in names.items()
                            for report in terminalreporter.stats.get(key, []))


@dataclass(frozen=True)
class Output:
    """One output file of the session and, when it could not be written, why."""

    what: str  # "report" or "facts"
    path: Path
    error: str | None = None


class WorkerDiagnosis(Diagnosis):
    """The diagnosis on a pytest-xdist worker: the controller's environment; records go back."""

    def _read_environment(self) -> EnvironmentFacts:
        from pytest_gputrain.facts import EnvironmentFacts

        text = getattr(self.config, "workerinput", {}).get(WORKER_ENVIRONMENT)
        if text:
            return EnvironmentFacts.model_validate_json(text)
        return super()._read_environment()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        send_to_controller(self.config, WORKER_RECORDS, self._records)

