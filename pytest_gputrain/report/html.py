"""The HTML report (``--gpu-report=html:PATH``): one self-contained page.

The page is rendered with Jinja2 from ``templates/report.html.j2``; uPlot (``static/``, MIT, see
``static/uPlot.LICENSE``) draws the charts. Everything is inlined, the scripts, the styles and
the data, and the page's Content-Security-Policy forbids any request, so it opens from a CI
artifact offline. docs/report-html.md says why these two were chosen.

Imported only when an HTML report is written: Jinja2 is not loaded by a plain pytest run.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import jinja2

from pytest_gputrain.facts import FactsFile
from pytest_gputrain.report.model import Report
from pytest_gputrain.report.page import SEVERITY_WORDS, build_page
from pytest_gputrain.report.visible_text import page_environment
from pytest_gputrain.units import format_bytes

if TYPE_CHECKING:
    from pytest_gputrain.report.test_outputs import TestResult

TEMPLATE = "report.html.j2"
ASSETS = {"uplot_js": "uPlot.iife.min.js", "uplot_css": "uPlot.min.css",
          "report_js": "report.js", "report_css": "report.css"}


@functools.cache
def assets() -> dict[str, str]:
    """The scripts and styles the page inlines, read from the package."""
    folder = resources.files("pytest_gputrain.report") / "static"
    found = {key: (folder / name).read_text(encoding="utf-8") for key, name in ASSETS.items()}
    for key, text in found.items():
        # Inlined in <script>/<style>: a closing tag inside would end the element early.
        if "</script" in text.lower() or "</style" in text.lower():
            raise ValueError(f"{ASSETS[key]} holds a closing tag and cannot be inlined")
    return found


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _value(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@functools.cache
def _environment() -> jinja2.Environment:
    # Every value shown as itself, controls and bidirectional marks written out (visible_text).
    environment = page_environment("pytest_gputrain.report")
    environment.filters.update(bytes=format_bytes, seconds=_seconds, value=_value)
    return environment


def report_html(report: Report, facts: FactsFile,
                results: Mapping[str, TestResult] | None = None) -> str:
    """The page of ``report`` and the records of ``facts``; ``results``: pytest's outcome of
    each test (None in a replay: derived from the records)."""
    from pytest_gputrain import __version__

    page = build_page(report, facts, results)
    template = _environment().get_template(TEMPLATE)
    return template.render(page=page, report=report, data=page.data(), assets=assets(),
                           words=SEVERITY_WORDS, version=__version__)
