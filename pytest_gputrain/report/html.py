"""The HTML report (``--gpu-report=html:PATH``): one self-contained page.

The page is rendered with Jinja2 from ``templates/report.html.j2``; uPlot (``static/``, MIT, see
``static/uPlot.LICENSE``) draws the charts, tablesort (MIT, ``static/tablesort.LICENSE``) sorts
the summary table, and markdown-it-py renders the rules' texts (``prose.py``). Everything is
inlined, the scripts, the styles and the data, and the page's Content-Security-Policy forbids
any request, so it opens from a CI artifact offline. docs/report-html.md says why these were
chosen.

Imported only when an HTML report is written: Jinja2 and markdown-it-py are not loaded by a
plain pytest run.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import jinja2

from pytest_gputrain.facts import FactsFile
from pytest_gputrain.findings import Evidence
from pytest_gputrain.report.model import Report
from pytest_gputrain.report.page import SEVERITY_WORDS, build_page
from pytest_gputrain.report.prose import linked, markdown_html
from pytest_gputrain.report.visible_text import page_environment
from pytest_gputrain.severity import SEVERITY_RANK
from pytest_gputrain.units import format_bytes

if TYPE_CHECKING:
    from pytest_gputrain.report.test_outputs import TestResult

TEMPLATE = "report.html.j2"
ASSETS = {"uplot_js": ("uPlot.iife.min.js",), "uplot_css": ("uPlot.min.css",),
          "tablesort_js": ("tablesort.min.js", "tablesort.number.min.js"),
          "report_js": ("report.js",), "report_css": ("report.css",)}
OUTCOME_RANK = {"failed": 5, "error": 4, "xpassed": 3, "passed": 2, "xfailed": 1, "skipped": 0}


@functools.cache
def assets() -> dict[str, str]:
    """The scripts and styles the page inlines, read from the package."""
    folder = resources.files("pytest_gputrain.report") / "static"
    found = {key: "\n".join((folder / name).read_text(encoding="utf-8") for name in names)
             for key, names in ASSETS.items()}
    for key, text in found.items():
        # Inlined in <script>/<style>: a closing tag inside would end the element early.
        if "</script" in text.lower() or "</style" in text.lower():
            raise ValueError(f"{ASSETS[key]} holds a closing tag and cannot be inlined")
    return found


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _sort_key(value: float | None) -> str:
    """A number for tablesort: unknown sorts below every known value."""
    return "-1" if value is None else f"{value:.5g}"


def _evidence_lines(evidence: list[Evidence]) -> str:
    """A finding's evidence, a fact a line: its name, padded, then its value (and why it is
    unknown)."""
    width = max((len(item.name) for item in evidence), default=0)
    return "\n".join(f"{item.name.ljust(width)}  {item.display}"
                     + (f" ({item.why_unknown})" if item.why_unknown else "")
                     for item in evidence)


_BETWEEN_TAGS = re.compile(r">[ \t]*\n\s*<")  # a line break between tags: layout only


def _spaceless(text: str) -> str:
    """Markup without the line breaks (and indents) between its tags: each would be a text
    node of its own, and a page of hundreds of tests has tens of thousands. Spaces within a
    line stay (they separate words); no <pre> of the page holds a tag."""
    return _BETWEEN_TAGS.sub("><", text)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} %"


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
    # The page's data as compact JSON (no spaces after separators): a tenth of a large page.
    environment.policies["json.dumps_kwargs"] = {"sort_keys": True, "separators": (",", ":")}
    environment.filters.update(bytes=format_bytes, seconds=_seconds, value=_value,
                               percent=_percent, sortkey=_sort_key, markdown=markdown_html,
                               linked=linked, evidence_lines=_evidence_lines,
                               spaceless=_spaceless)
    return environment


def report_html(report: Report, facts: FactsFile,
                results: Mapping[str, TestResult] | None = None) -> str:
    """The page of ``report`` and the records of ``facts``; ``results``: pytest's outcome of
    each test (None in a replay: derived from the records)."""
    from pytest_gputrain import __version__

    page = build_page(report, facts, results)
    template = _environment().get_template(TEMPLATE)
    return template.render(page=page, report=report, data=page.data(), assets=assets(),
                           words=SEVERITY_WORDS, version=__version__,
                           outcome_rank=OUTCOME_RANK, severity_rank=SEVERITY_RANK)
