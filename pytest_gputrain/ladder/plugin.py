"""The ``gpu_ladder`` fixture and the ladder table at the end of the session.

Import-light: the ladder's modules load only when a test asks for the fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gputrain import feature_plugins
from pytest_gputrain.xdist import (
    is_xdist_worker,
    send_to_controller,
    sent_by_worker,
    worker_number,
)

if TYPE_CHECKING:
    from pytest_gputrain.ladder.rungs import LadderResults

PLUGIN_NAME = "gputrain-ladder"
PLUGIN_KEY = pytest.StashKey["LadderTables"]()
WORKER_OUTPUT = "gputrain_ladder"


class LadderTables:
    """Every ladder's results of this session, printed as tables at its end.

    Under pytest-xdist the rungs run on the workers: each worker sends its results to the
    controller when it ends (``send_to_controller``), and the controller prints and reports them,
    rows ordered by worker (gw0, gw1, ...) and, within a worker, as they ran.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: dict[str, LadderResults] = {}
        # controller: each ladder's results as each worker sent them
        self._from_workers: dict[str, dict[str, LadderResults]] = {}

    def results_for(self, name: str) -> LadderResults:
        if name not in self.results:
            from pytest_gputrain.diagnosis import diagnosis
            from pytest_gputrain.ladder import LadderResults

            result = self.results[name] = LadderResults(name)
            session = diagnosis(self.config)
            if session is not None:  # the table goes to the report files (JSON and Markdown)
                session.add_section(f"ladder: {name}", lambda: _report_section(result))
        return self.results[name]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.results and is_xdist_worker(self.config):
            send_to_controller(self.config, WORKER_OUTPUT,
                               [results.as_dict() for results in self.results.values()])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        from pytest_gputrain.ladder import LadderResults

        worker = str((getattr(node, "workerinput", None) or {}).get("workerid", ""))
        for data in sent_by_worker(node, WORKER_OUTPUT, []):
            received = LadderResults.from_dict(data)
            by_worker = self._from_workers.setdefault(received.name, {})
            by_worker[worker] = received
            merged = self.results_for(received.name)  # the same object the report section reads
            ordered = [by_worker[w] for w in sorted(by_worker, key=_worker_order)]
            merged.rungs = [rung for part in ordered for rung in part.rungs]
            merged.headroom = [item for part in ordered for item in part.headroom]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.results:
            return
        from pytest_gputrain.ladder.table import render

        for name, result in self.results.items():
            if not (result.rungs or result.headroom):
                continue
            terminalreporter.write_sep("=", f"gputrain readiness ladder: {name}")
            width = terminalreporter._tw.fullwidth
            for line in render(result, width=width).splitlines():
                terminalreporter.write_line(line)



def _worker_order(worker: str) -> tuple[int, str]:
    """gw2 before gw10."""
    number = worker_number(worker)
    return (-1 if number is None else number, worker)


# tryfirst: registered before the assertions' plugin object, the tables follow its tally of GPU
# tests in the terminal summary (hooks of later registered plugins run first).
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    feature_plugins.register(config, PLUGIN_KEY, LadderTables(config), PLUGIN_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    feature_plugins.unregister(config, PLUGIN_KEY)


def _report_section(result: LadderResults) -> dict[str, Any]:
    from pytest_gputrain.ladder.table import render

    section = result.as_dict()
    section["markdown"] = render(result, tablefmt="github")
    return section


@pytest.fixture(scope="session")
def gpu_ladder(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """``gpu_ladder(spec)`` returns the project's :class:`~pytest_gputrain.ladder.Ladder`;
    its rungs' rows are printed as a table at the end of the session and added to the
    ``--gpu-report`` files (section ``ladder: NAME``)."""
    from pytest_gputrain.ladder import Ladder, LadderSpec

    tables = request.config.stash[PLUGIN_KEY]

    def ladder_for(spec: LadderSpec) -> Ladder:
        return Ladder(spec, tables.results_for(spec.name))

    return ladder_for
