"""``history --html DIR``: the branch history as a static site.

``DIR/index.html`` lists every test's series (branch and metric) with a sparkline (plain SVG,
``report.sparkline.series_svg``), its latest value and its latest step; ``DIR/tests/<id>.html``
is one page per test: each series drawn with uPlot (the HTML report's charting part,
``report.html.assets``), its steps marked, and its steps and sessions listed with their runs,
commits and environments. Every page is rendered with Jinja2 from ``templates/`` and inlines
its scripts, styles and data under the HTML report's Content-Security-Policy (no request of any
kind), so the folder opens offline, from a CI artifact or GitHub Pages alike.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gputrain.outputs import Claims, OutputPathError, check_folder, write_folder
from pytest_gputrain.regression.branch_history import Series
from pytest_gputrain.regression.change_text import format_confidence, format_value, what_changed
from pytest_gputrain.regression.history_errors import HistoryError
from pytest_gputrain.report.page import anchor_of
from pytest_gputrain.report.sparkline import series_svg

INDEX = "index.html"
TESTS = "tests"
SCRIPT = "history.js"
# How a metric is drawn: its unit on the chart's axis, and the factor from the stored unit.
UNITS = {"step_time": ("ms", 1e3), "peak_vram": ("MiB", 1 / 2**20)}


@dataclass
class SeriesView:
    series: Series
    anchor: str
    sparkline: str

    @property
    def latest(self) -> str:
        return format_value(self.series.metric, self.series.values[-1])

    def chart(self) -> dict[str, Any]:
        """What the page's script draws: the sessions' values, each step's place and label."""
        series = self.series
        unit, scale = UNITS.get(series.metric, ("", 1.0))
        return {"label": f"{series.name} {series.metric}", "unit": unit,
                "x": list(range(1, len(series.sessions) + 1)),
                "y": [value * scale for value in series.values],
                "runs": [session.run.id for session in series.sessions],
                "changes": [{"x": change.step.index + 1,
                             "label": f"{change.step.change * 100:+.2f} % from run "
                                      f"#{change.first.run.id}"} for change in series.changes]}


@dataclass
class TestPage:
    __test__ = False  # not a test class, whatever pytest collects

    nodeid: str
    path: str  # relative to the site's folder
    series: list[SeriesView]


def _series_anchor(series: Series) -> str:
    return "series-" + re.sub(r"[^A-Za-z0-9_-]+", "-", f"{series.name}-{series.metric}")


def pages(series: list[Series]) -> list[TestPage]:
    found: dict[str, TestPage] = {}
    for one in series:
        page = found.setdefault(one.nodeid, TestPage(
            one.nodeid, f"{TESTS}/{anchor_of(one.nodeid)}.html", []))
        marks = [change.step.index for change in one.changes]
        page.series.append(SeriesView(one, _series_anchor(one), series_svg(
            one.values, marks, label=f"{one.name} {one.metric} across "
                                     f"{len(one.sessions)} sessions")))
    return sorted(found.values(), key=lambda page: page.nodeid)


@functools.cache
def _environment() -> Any:
    from pytest_gputrain.report.visible_text import page_environment

    environment = page_environment("pytest_gputrain.regression")
    environment.filters.update(confidence=format_confidence, what_changed=what_changed)
    environment.globals.update(value=format_value)
    return environment


@functools.cache
def _script() -> str:
    from importlib import resources

    text = (resources.files("pytest_gputrain.regression") / "static" / SCRIPT).read_text(
        encoding="utf-8")
    if "</script" in text.lower():
        raise ValueError(f"{SCRIPT} holds a closing tag and cannot be inlined")
    return text


def check_site_folder(folder: Path) -> None:
    """``HistoryError`` when ``folder`` cannot take the site: a symbolic link, or not a
    folder (``outputs.check_folder``)."""
    try:
        check_folder(folder, [])
    except OutputPathError as exc:
        raise HistoryError(f"--html {folder}: {exc}") from None


def write_site(folder: Path, series: list[Series], where: str, claims: Claims) -> Path:
    """Write the index and one page per test into ``folder``: a new folder, or one a site was
    written into before (other files in it are left alone), never through a symbolic link at
    or below it (``outputs.write_folder``); each page claimed as an output of the command
    (none may be the store). The index's path."""
    from pytest_gputrain import __version__
    from pytest_gputrain.report.html import assets

    check_site_folder(folder)
    environment = _environment()
    found = pages(series)
    common = {"assets": assets(), "version": __version__, "where": where}
    rendered = {INDEX: environment.get_template("history_index.html.j2").render(
        pages=found, sessions=sum(len(s.sessions) for s in series), **common)}
    for page in found:
        data = {"series": [view.chart() for view in page.series]}
        rendered[page.path] = environment.get_template("history_test.html.j2").render(
            page=page, data=data, script=_script(), **common)
    try:
        check_folder(folder, rendered)
        claims.claim("--html", [folder / name for name in rendered])
        write_folder(folder, {name: text.encode("utf-8") for name, text in rendered.items()})
    except OutputPathError as exc:
        raise HistoryError(f"--html {folder}: {exc}") from None
    except OSError as exc:
        raise HistoryError(f"--html {folder}: cannot write the site: "
                           f"{exc.strerror or exc}") from None
    return folder / INDEX
