"""GitHub Actions workflow annotations of findings: ``::warning file=…,line=…::message``.

A line in this form on a step's output becomes an annotation on the run's summary and, for a
file of the commit, on the pull request's diff at that line. Values are escaped as the runner
expects (``%``, carriage return and newline everywhere; ``:`` and ``,`` in properties too).
https://docs.github.com/actions/reference/workflow-commands-for-github-actions
"""

from __future__ import annotations

from pytest_gputrain.findings import Finding

# Info findings are not annotated: an annotation asks the reader to act.
COMMAND = {"warning": "warning", "error": "error"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding, path: str | None, line: int | None) -> str | None:
    """The workflow command of one finding about a test at ``path``:``line`` (None for an
    info finding, which is not annotated)."""
    command = COMMAND.get(finding.severity)
    if command is None:
        return None
    where = []
    if path:
        where.append(f"file={_property(path)}")
        if line:
            where.append(f"line={line}")
    where.append(f"title={_property(f'{finding.code} {finding.name}')}")
    return f"::{command} {','.join(where)}::{_data(f'{finding.message} Fix: {finding.fix}')}"
