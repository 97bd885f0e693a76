"""The HTML partial that draws one compared test's explanation (report/templates/
benchmark_explanation.html.j2), rendered by the report's own Jinja environment and opened in
Chromium: escaped, open where a counter changed, shut where nothing did, no console error under
the report's Content-Security-Policy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_regression_counters import ITEM, NODE, counted, sides

from pytest_gputrain.regression import explain

HOSTILE = "tests/t.py::test[<script>alert(1)</script>]"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _partial() -> Any:
    from pytest_gputrain.report.html import _environment

    return _environment().get_template("benchmark_explanation.html.j2").module


def _page(explanations: list[dict[str, Any]]) -> str:
    """A page as report.html.j2 would hold the partial: its style once, an explanation each."""
    module = _partial()
    body = "".join(str(module.benchmark_explanation(x)) for x in explanations)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
            f"<title>explanations</title>{module.benchmark_explanation_style()}</head>"
            f"<body><section id=\"benchmarks\">{body}</section></body></html>")


def _explanations() -> list[dict[str, Any]]:
    changed = explain.explain(HOSTILE, *sides(counted(), counted(
        syncs=1, sync_sites=[{**ITEM, "code": "x = y.item()  # </td><b>bold</b>"}])))
    same = explain.explain(NODE, *sides(counted(), counted()))
    assert changed is not None and same is not None
    return [changed, same]


def test_the_partial_draws_an_explanation_escaped() -> None:
    html = _page(_explanations())
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html
    assert '<details class="explanation changed" open' in html
    assert "+1 sync per step" in html and "<td>0</td><td>1</td>" in html
    assert "not counted: instructions" in html
    assert "no exact counter changed" in html


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM)
        except sync_api.Error as exc:
            if CHROMIUM is not None:
                raise
            pytest.skip(f"no Chromium ({str(exc).splitlines()[0]})")
        yield launched
        launched.close()


def test_the_partial_in_a_browser(browser: Any, tmp_path: Path) -> None:
    path = tmp_path / "explanations.html"
    path.write_text(_page(_explanations()), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    changed, same = page.locator("details.explanation").all()
    assert changed.get_attribute("open") is not None and same.get_attribute("open") is None
    assert changed.get_attribute("data-nodeid") == HOSTILE
    text = changed.inner_text()
    assert HOSTILE in text and "+1 sync per step" in text
    assert changed.locator("table.counters").is_visible()
    assert "Tensor.item() at train.py:42" in changed.locator("table.histogram").inner_text()
    assert not same.locator("table.counters").is_visible()  # shut: nothing changed
    same.locator("summary").click()
    assert same.locator("table.counters").is_visible()
    rose = changed.locator("td.rose").first
    assert rose.inner_text() == "+1"
    assert rose.evaluate("e => getComputedStyle(e).fontWeight") in ("700", "bold")
    assert errors == []
    page.close()
