"""The ``gpu_ladder`` fixture and the ladder table at the end of the session.

Import-light: the ladder's modules load only when a test asks for the fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

_RESULTS = pytest.StashKey[dict[str, Any]]()


@pytest.fixture(scope="session")
def gpu_ladder(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """``gpu_ladder(spec)`` returns the project's :class:`~pytest_gputrain.ladder.Ladder`;
    its rungs' rows are printed as a table at the end of the session and added to the
    ``--gpu-report`` files (section ``ladder``)."""
    from pytest_gputrain.ladder import Ladder, LadderResults, LadderSpec

    stash = request.config.stash.setdefault(_RESULTS, {})

    def ladder_for(spec: LadderSpec) -> Ladder:
        results = stash.setdefault(spec.name, LadderResults(spec.name))
        return Ladder(spec, results)

    return ladder_for


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS, {})
    if not results:
        return
    from pytest_gputrain.ladder.table import render

    for name, result in results.items():
        if not (result.rungs or result.headroom):
            continue
        terminalreporter.write_sep("=", f"gputrain readiness ladder: {name}")
        for line in render(result).splitlines():
            terminalreporter.write_line(line)


def pytest_gputrain_report_sections(config: pytest.Config) -> dict[str, Any] | None:
    """The ladder tables for the diagnosis reports (JSON and Markdown)."""
    results = config.stash.get(_RESULTS, {})
    if not results:
        return None
    from pytest_gputrain.ladder.table import render

    sections: dict[str, Any] = {}
    for name, result in results.items():
        section = result.as_dict()
        section["markdown"] = render(result, tablefmt="github")
        sections[f"ladder: {name}"] = section
    return sections
