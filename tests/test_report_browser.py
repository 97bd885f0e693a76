"""The HTML report in a real browser: Chromium (the distribution's package) driven by Playwright.

Each case of tests/report_cases.py is written as a report and opened from its file: the page
must load with no console error and no request but the file itself, show every test and
finding, filter, and draw each test's timeline with its series and markers. A screenshot of
each case is kept under .gputrain/screenshots/ (CI keeps that folder as an artifact).

The tests skip only where Chromium or Playwright is missing; .ci/run installs both.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import report_cases

from pytest_gputrain.facts import FactsFile
from pytest_gputrain.report.html import report_html
from pytest_gputrain.report.page import anchor_of

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

SCREENSHOTS = Path(__file__).resolve().parent.parent / ".gputrain" / "screenshots"
MANY_MAX_BYTES = 6_000_000  # a report of 500 tests stays a few MB (test_report_html.py too)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """The distribution's Chromium, else one Playwright installed (``playwright install``)."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM)
        except sync_api.Error as exc:
            if CHROMIUM is not None:
                raise
            pytest.skip("no Chromium: `apt-get install -y chromium` (.ci/run installs it) or "
                        f"`python -m playwright install chromium` ({str(exc).splitlines()[0]})")
        yield launched
        launched.close()


class Opened:
    """A report open in a page, with what the page logged and requested."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.url = path.as_uri()
        started = time.perf_counter()
        self.page.goto(self.url)
        self.page.wait_for_function("window.gputrain && window.gputrain.ready")
        self.load_seconds = time.perf_counter() - started

    def open_all(self) -> None:
        """Open every test, as a reader would, and let its charts draw."""
        self.page.evaluate("document.querySelectorAll('details.test')"
                           ".forEach(d => { d.open = true; })")
        self.page.wait_for_timeout(200)

    def charts(self) -> list[dict[str, Any]]:
        charts: list[dict[str, Any]] = self.page.evaluate("""
            Array.from(document.querySelectorAll('details.test .chart')).map(chart => ({
              test: chart.closest('details').id,
              title: (chart.querySelector('figcaption') || {}).textContent || 'lanes',
              series: +chart.dataset.series, steps: +chart.dataset.stepMarkers,
              failure: chart.dataset.failureMarker === '1', window: chart.dataset.window === '1',
              canvas: !!chart.querySelector('canvas'),
            }))""")
        return charts

    def shown(self) -> list[str]:
        shown: list[str] = self.page.evaluate(
            "Array.from(document.querySelectorAll('details.test:not([hidden])')).map(d => d.id)")
        return shown

    def screenshot(self, name: str, full_page: bool = True) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def open_case(browser: Any, tmp_path: Path) -> Iterator[Any]:
    opened: list[Opened] = []

    def open_(case: report_cases.Case) -> tuple[Opened, Any]:
        report = case.report()
        path = tmp_path / f"{case.name}.html"
        path.write_text(report_html(report, case.facts), encoding="utf-8")
        page = Opened(browser, path)
        opened.append(page)
        return page, report

    yield open_
    for page in opened:
        page.close()


def _loaded_cleanly(page: Opened) -> None:
    assert page.errors == []
    assert page.requests == [page.url]  # the file itself, nothing else


@pytest.mark.parametrize("name", sorted(report_cases.CASES))
def test_each_case_loads_offline_with_every_test_and_finding(open_case: Any, name: str) -> None:
    case = report_cases.CASES[name]()
    page, report = open_case(case)
    _loaded_cleanly(page)
    page.open_all()
    nodeids = {r.get("nodeid") or r.get("test") for records in case.facts.records.values()
               for r in records}
    summaries = page.page.eval_on_selector_all(
        "details.test > summary > code", "codes => codes.map(c => c.textContent)")
    assert set(summaries) == nodeids
    shown = page.page.eval_on_selector_all(
        "details.test .finding", "items => items.map(i => i.dataset.code)")
    assert sorted(shown) == sorted(f.code for f in report.findings if f.scope not in (
        "session", "device"))
    for finding in report.findings:
        assert page.page.locator(f'.finding[data-code="{finding.code}"]').first.is_visible()
    page.page.wait_for_timeout(100)
    page.screenshot(name)
    _loaded_cleanly(page)  # opening the tests drew charts and fetched nothing


def test_a_gpu_run_draws_four_charts_on_one_axis_with_its_markers(open_case: Any) -> None:
    page, _ = open_case(report_cases.out_of_memory())
    page.open_all()
    charts = {c["title"]: c for c in page.charts()}
    assert {title: c["series"] for title, c in charts.items()} == {
        "GPU utilisation and SM clock": 2, "Memory": 5, "Power and temperature": 2,
        "Steps and DataLoader waits": 2}
    for chart in charts.values():
        assert chart["canvas"] and chart["steps"] == 40 and chart["failure"] and chart["window"]
    # One time axis: every chart's plot area starts and ends at the same place.
    boxes = page.page.evaluate("window.gputrain.charts.map(u => [u.bbox.left, u.bbox.width])")
    assert len({tuple(box) for box in boxes}) == 1


def test_a_run_without_nvml_says_why_its_gpu_charts_are_missing(open_case: Any) -> None:
    case = report_cases.healthy()
    case.facts.records["run"][0]["timeline"] = report_cases.recorded_timeline(
        case.facts.records["run"][0]["step_times"])  # a CPU run: no NVML, no allocator
    page, _ = open_case(case)
    page.open_all()
    assert [(c["title"], c["series"]) for c in page.charts()] == [
        ("Steps and DataLoader waits", 2)]
    assert page.page.get_by_text("no GPU timeline: utilisation, SM clock, power and "
                                 "temperature were not sampled").is_visible()


def test_a_straggler_shows_as_one_lane_per_rank(open_case: Any) -> None:
    page, _ = open_case(report_cases.straggler())
    charts = page.charts()  # the test has a warning: open from the start, drawn when seen
    assert [(c["title"], c["series"], c["steps"]) for c in charts] == [("lanes", 2, 40)]
    legend = page.page.locator(".lanes .u-legend").inner_text()
    assert "rank 1 (straggler)" in legend and "20 steps" in legend


def test_the_benchmark_shows_each_side_s_sessions(open_case: Any) -> None:
    page, _ = open_case(report_cases.benchmark_comparison())
    series = page.page.eval_on_selector_all(".bench-points", "c => c.map(e => +e.dataset.series)")
    assert series == [4]  # both sides' sessions and their means
    assert page.page.get_by_text("step_time: REGRESSION").is_visible()


def test_the_ladder_shows_its_rungs_and_its_memory_per_batch_fit(open_case: Any) -> None:
    page, _ = open_case(report_cases.ladder())
    rows = page.page.locator("#ladder > table tr").count()
    assert rows == 4  # the header and three rungs
    fit = page.page.locator(".ladder-fit")
    # the probes, the fitted line, the budget and the verified run
    assert fit.get_attribute("data-series") == "4"
    assert page.page.get_by_text("Largest batch that fits: 2591").is_visible()


def test_filters_by_severity_code_and_outcome(open_case: Any) -> None:
    data = json.loads(report_cases.out_of_memory().facts.model_dump_json())
    for case, nodeid in ((report_cases.starved_loader(), "tests/test_data.py::test_loader"),
                         (report_cases.healthy(), "tests/test_ok.py::test_fine")):
        run = json.loads(case.facts.model_dump_json())["runs"][0]
        data["runs"].append({**run, "nodeid": nodeid})
    merged = report_cases.Case("filters", FactsFile.model_validate(data))
    page, _ = open_case(merged)
    oom, loader, fine = (anchor_of(n) for n in (
        report_cases.NODE, "tests/test_data.py::test_loader", "tests/test_ok.py::test_fine"))
    assert sorted(page.shown()) == sorted([oom, loader, fine])
    page.page.uncheck('input[name="severity"][value="error"]')
    assert sorted(page.shown()) == sorted([loader, fine])
    page.page.uncheck('input[name="severity"][value="none"]')
    assert page.shown() == [loader]
    page.page.click('button[type="reset"]')
    page.page.select_option('select[name="code"]', "GT201")
    assert page.shown() == [oom]
    page.page.select_option('select[name="code"]', "")
    page.page.uncheck('input[name="outcome"][value="passed"]')
    assert page.shown() == [oom]
    assert page.page.locator("#shown-count").inner_text() == "1 of 3 tests shown"


def test_a_permalink_opens_its_test(open_case: Any) -> None:
    page, _ = open_case(report_cases.healthy())
    anchor = anchor_of(report_cases.NODE)
    assert page.page.evaluate(f"document.getElementById('{anchor}').open") is False
    page.page.goto(f"{page.url}#{anchor}")
    page.page.wait_for_function(f"document.getElementById('{anchor}').open")
    page.page.wait_for_timeout(100)
    assert len(page.charts()) == 4  # utilisation, memory, power and temperature, steps


def test_printing_shows_every_test_opened(open_case: Any) -> None:
    page, _ = open_case(report_cases.healthy())
    page.page.emulate_media(media="print")
    page.page.evaluate("window.dispatchEvent(new Event('beforeprint'))")
    assert page.page.evaluate("Array.from(document.querySelectorAll('details.test'))"
                              ".every(d => d.open)")
    assert not page.page.locator("#filters").is_visible()


def test_a_500_test_report_opens_quickly(browser: Any, tmp_path: Path) -> None:
    case = report_cases.many_tests(500)
    path = tmp_path / "many.html"
    path.write_text(report_html(case.report(), case.facts), encoding="utf-8")
    page = Opened(browser, path)
    try:
        _loaded_cleanly(page)
        count = page.page.locator("details.test").count()
        print(f"\n500-test report: {path.stat().st_size / 1e6:.2f} MB, opened in "
              f"{page.load_seconds:.2f} s")
        assert count == 500 and path.stat().st_size < MANY_MAX_BYTES  # no bound on the time
        page.screenshot("many_tests", full_page=False)
    finally:
        page.close()


def test_a_history_site_opens_offline_with_its_steps_marked(browser: Any, tmp_path: Path
                                                            ) -> None:
    """``history --html``: the index links each test's page; the page draws each series with
    its steps marked, loads with no console error and requests nothing but itself."""
    import random

    from pytest_gputrain.cli import main as cli_main
    from pytest_gputrain.regression import fingerprint
    from pytest_gputrain.regression.store import ResultRecord
    from pytest_gputrain.regression.store_backends import open_store

    store, site = tmp_path / "benchmarks.sqlite", tmp_path / "site"
    rng = random.Random(1)
    print_ = fingerprint.collect("cpu")
    with open_store(store) as opened:
        for i in range(30):
            value = 0.010 * (1.03 if i >= 12 else 1) * (1.05 if i >= 22 else 1)
            value *= 1 + rng.gauss(0, 0.002)
            rounds = [value * (1 + k / 1000) for k in range(20)]
            opened.save_run("main", print_, fingerprint.fingerprint_hash(print_), f"{i:040x}",
                            [ResultRecord("tests/perf.py::test_step", print_,
                                          fingerprint.fingerprint_hash(print_), 20,
                                          {"step_time": rounds, "peak_vram": [2**30]}, {})])
    assert cli_main(["history", "--store", str(store), "--html", str(site)]) == 0
    index = browser.new_page()
    try:
        requests: list[str] = []
        errors: list[str] = []
        index.on("request", lambda request: requests.append(request.url))
        index.on("console", lambda m: errors.append(m.text)
                 if m.type in ("error", "warning") else None)
        index.on("pageerror", lambda error: errors.append(str(error)))
        index.goto((site / "index.html").as_uri())
        assert index.locator("tr.series-row").count() == 2  # step time and peak VRAM
        assert index.locator("tr.series-row svg.sparkline line").count() == 2  # two steps
        index.click("text=tests/perf.py::test_step >> nth=0")
        index.wait_for_function("window.gputrain && window.gputrain.ready")
        drawn = index.eval_on_selector_all("figure.history-chart", """charts => charts.map(c =>
            [+c.dataset.points, +c.dataset.changes, !!c.querySelector('canvas')])""")
        assert drawn == [[30, 2, True], [30, 0, True]]
        assert index.locator("table.changes tr").count() == 3  # the header and two steps
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        index.screenshot(path=str(SCREENSHOTS / "history_test_page.png"), full_page=True)
        assert [url.split("/")[-1].split("#")[0] for url in requests] == [
            "index.html", index.url.split("/")[-1].split("#")[0]]
        assert errors == []
    finally:
        index.close()
