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
# Headless, as CI runs it: no sandbox (root in a container), no GPU, nothing fetched in the back.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """The distribution's Chromium, else one Playwright installed (``playwright install``)."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="Playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except sync_api.Error as exc:
            if CHROMIUM is not None:
                raise
            pytest.skip("no Chromium: `apt-get install -y chromium` (.ci/run installs it) or "
                        f"`python -m playwright install chromium` ({str(exc).splitlines()[0]})")
        yield launched
        launched.close()


class Opened:
    """A report open in a page, with what the page logged and requested."""

    def __init__(self, browser: Any, path: Path, viewport: dict[str, int] | None = None,
                 **options: Any) -> None:
        self.context = browser.new_context(viewport=viewport or DESKTOP, **options)
        self.page = self.context.new_page()
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
        """Open every test, as a reader would (Expand all), and let its timeline draw."""
        self.page.click("#expand-all")
        self.page.evaluate("window.gputrain.drawOpen()")
        self.page.wait_for_timeout(100)

    def lanes(self, test: str | None = None) -> list[dict[str, Any]]:
        """What each drawn lane drew (of one test, by anchor, or of all)."""
        lanes: list[dict[str, Any]] = self.page.evaluate("""test =>
            Array.from(document.querySelectorAll('details.test .lane'))
              .filter(l => !test || l.closest('details').id === test).map(l => ({
                test: l.closest('details').id, lane: l.dataset.lane,
                title: l.querySelector('.lane-title').textContent,
                series: +l.dataset.series, range: l.dataset.range.split(',').map(Number),
                lines: l.dataset.lines ? l.dataset.lines.split('|') : [],
                bands: l.dataset.bands ? l.dataset.bands.split('|') : [],
                failure: l.dataset.failure === '1', request: l.dataset.request === '1',
                moments: +(l.dataset.moments || 0), canvas: !!l.querySelector('canvas'),
              }))""", test)
        return lanes

    def shown(self) -> list[str]:
        shown: list[str] = self.page.evaluate(
            "Array.from(document.querySelectorAll('details.test:not([hidden])')).map(d => d.id)")
        return shown

    def screenshot(self, name: str, full_page: bool = False) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_case(browser: Any, tmp_path: Path) -> Iterator[Any]:
    opened: list[Opened] = []

    def open_(case: report_cases.Case, viewport: dict[str, int] | None = None,
              **options: Any) -> tuple[Opened, Any]:
        report = case.report()
        path = tmp_path / f"{case.name}.html"
        path.write_text(report_html(report, case.facts), encoding="utf-8")
        page = Opened(browser, path, viewport, **options)
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
    rows = page.page.eval_on_selector_all(
        "#summary-table tbody tr", "rows => rows.map(r => r.querySelector('a').textContent)")
    assert sorted(rows) == sorted(nodeids)  # the summary: one row per test
    shown = page.page.eval_on_selector_all(
        "details.test .finding", "items => items.map(i => i.dataset.code)")
    assert sorted(shown) == sorted(f.code for f in report.findings if f.scope not in (
        "session", "device"))
    for finding in report.findings:
        assert page.page.locator(f'.finding[data-code="{finding.code}"]').first.is_visible()
    assert all(lane["canvas"] for lane in page.lanes())
    page.screenshot(name)
    _loaded_cleanly(page)  # opening the tests drew charts and fetched nothing


def _suite(open_case: Any, viewport: dict[str, int] | None = None, **options: Any
           ) -> tuple[Opened, Any]:
    """The recorded H200 samples as one suite: five failures, nine passes."""
    return open_case(report_cases.h200_suite(), viewport, **options)  # type: ignore[no-any-return]


def _test_id(page: Opened, part: str) -> str:
    found: str = page.page.evaluate(
        "part => Array.from(document.querySelectorAll('details.test'))"
        ".find(d => d.querySelector('summary code').textContent.includes(part)).id", part)
    return found


def _draw(page: Opened, anchor: str) -> None:
    page.page.evaluate("id => { const d = document.getElementById(id); d.open = true; "
                       "d.scrollIntoView(); }", anchor)
    page.page.wait_for_function("id => document.getElementById(id).dataset.lanesDrawn",
                                arg=anchor)


def _scroll_to_chart(page: Opened, selector: str) -> None:
    """Scroll a section's chart on screen, where it is drawn (not before: nothing at load)."""
    assert page.page.locator(f"{selector}[data-series]").count() == 0 or page.page.evaluate(
        "s => document.querySelector(s).getBoundingClientRect().top < innerHeight + 300",
        selector)
    page.page.locator(selector).first.scroll_into_view_if_needed()
    page.page.wait_for_function("s => document.querySelector(s).dataset.series", arg=selector)


def test_the_headline_is_red_when_a_test_failed(open_case: Any) -> None:
    page, _ = _suite(open_case)
    _loaded_cleanly(page)
    headline = page.page.locator("#headline")
    assert headline.inner_text().startswith("FAILED 5 of 14 tests failed")
    colour = headline.evaluate("h => getComputedStyle(h).color")
    assert colour == "rgb(180, 35, 24)"  # --error
    assert page.page.title().startswith("FAILED: 5 of 14 tests failed")
    # Above the fold at 1440 x 900: the verdict and the first rows of the summary.
    assert page.page.locator("#summary-table tbody tr").nth(2).is_visible()
    box = page.page.locator("#summary-table tbody tr").nth(2).bounding_box()
    assert box is not None and box["y"] + box["height"] < DESKTOP["height"]
    page.screenshot("h200_suite_top")


def test_the_summary_table_sorts_and_filters(open_case: Any) -> None:
    page, _ = _suite(open_case)

    def column(index: int) -> list[str]:
        values: list[str] = page.page.eval_on_selector_all(
            "#summary-table tbody tr:not([hidden])",
            f"rows => rows.map(r => r.cells[{index}].textContent.trim())")
        return values

    assert column(2) == ["FAILED"] * 5 + ["PASSED"] * 9
    # Laid out as a grid (a row off screen skips its layout), read as a table all the same.
    read = page.page.locator("#summary-table").aria_snapshot()
    assert read.startswith("- table:") and 'columnheader "loader wait"' in read
    assert read.count('row "') == 15 and '- cell "FAILED"' in read
    assert column(3)[:5] == ["ERROR"] * 5 and column(3)[-1] in ("INFO", "NONE")
    # Sorted by the loader wait, with the keyboard: the heading takes focus, Enter sorts.
    header = page.page.locator("#summary-table th", has_text="loader wait")
    header.focus()
    page.page.keyboard.press("Enter")
    page.page.keyboard.press("Enter")  # ascending, then descending
    assert header.get_attribute("aria-sort") == "descending"
    waits = [float(v.split()[0]) for v in column(6) if v != "–"]
    assert waits == sorted(waits, reverse=True) and waits[0] > 90  # the starved loader first
    assert "starved_loader" in column(1)[0]
    # The filters apply to the summary too: only the failed tests' rows are left.
    page.page.uncheck('input[name="outcome"][value="passed"]')
    assert sorted(column(2)) == ["FAILED"] * 5
    assert not page.page.locator("#summary-table tbody tr[hidden]").first.is_visible()
    page.page.select_option('select[name="code"]', "GT201")
    assert len(column(1)) == 3  # the three out-of-memory tests
    codes = page.page.eval_on_selector_all("tr.finding-row:not([hidden])",
                                           "rows => rows.map(r => r.dataset.code)")
    assert codes == ["GT201"]


def test_utilisation_is_drawn_on_a_fixed_0_to_100_axis(open_case: Any) -> None:
    page, _ = _suite(open_case)
    anchor = _test_id(page, "starved_loader")
    _draw(page, anchor)
    lanes = {lane["lane"]: lane for lane in page.lanes(anchor)}
    assert list(lanes) == ["util", "memory", "clock", "power", "temperature", "steps"]
    assert lanes["util"]["range"] == [0, 100]
    scale = page.page.evaluate("id => { const y = window.gputrain.stacks[id].plots[0].scales.y;"
                               " return [y.min, y.max]; }", anchor)
    assert scale == [0, 100]
    assert lanes["clock"]["range"][0] == 0 and lanes["power"]["range"][0] == 0
    # One time axis: every lane's plot area starts and ends at the same place.
    boxes = page.page.evaluate("id => window.gputrain.stacks[id].plots.map("
                               "u => [u.bbox.left, u.bbox.width])", anchor)
    assert len({tuple(box) for box in boxes}) == 1
    page.page.locator(f"#{anchor} .timeline").scroll_into_view_if_needed()
    page.screenshot("h200_starved_loader_timeline")


def test_the_oom_test_s_memory_lane_shows_its_limit_and_the_failure(open_case: Any) -> None:
    page, _ = _suite(open_case)
    anchor = _test_id(page, "other_process_oom")
    _draw(page, anchor)
    (memory,) = page.lanes(anchor)
    assert memory["lane"] == "memory" and memory["failure"] and memory["request"]
    assert any(line.startswith("budget 8.3 GiB") for line in memory["lines"])
    assert memory["bands"] == ["other processes held 131.5 GiB"]
    oom = _test_id(page, "oom_failure/")
    _draw(page, oom)
    lanes = {lane["lane"]: lane for lane in page.lanes(oom)}
    assert all(lane["failure"] for lane in lanes.values())  # marked across every lane
    assert lanes["memory"]["request"]
    page.page.locator(f"#{anchor} .timeline").scroll_into_view_if_needed()
    page.screenshot("h200_other_process_oom")


def test_clicking_a_finding_shades_where_it_happened(open_case: Any) -> None:
    page, _ = _suite(open_case)
    anchor = _test_id(page, "checkpoint_every_step")
    _draw(page, anchor)
    button = page.page.locator(f"#{anchor} button.show-moment").first
    assert "every step after warm-up saved a checkpoint" in button.inner_text()
    button.click()
    assert button.get_attribute("aria-pressed") == "true"
    lanes = {lane["lane"]: lane for lane in page.lanes(anchor)}
    assert lanes["steps"]["moments"] == 1 and lanes["util"]["moments"] == 1
    assert lanes["memory"]["moments"] == 0  # only the lanes the finding is about
    finding = page.page.locator(f"#{anchor} .finding.highlighted")
    assert finding.count() == 1 and "GT140" in finding.inner_text()
    button.click()  # again: back to every finding's moments, lightly
    assert button.get_attribute("aria-pressed") == "false"


def test_zoom_moves_every_lane_and_the_cursor_shows_values(open_case: Any) -> None:
    page, _ = _suite(open_case)
    anchor = _test_id(page, "starved_loader")
    _draw(page, anchor)
    scales = "id => window.gputrain.stacks[id].plots.map(u => [u.scales.x.min, u.scales.x.max])"
    before = page.page.evaluate(scales, anchor)
    page.page.click(f"#{anchor} button[data-zoom='in']")
    after = page.page.evaluate(scales, anchor)
    assert len({tuple(x) for x in after}) == 1  # every lane at the same range
    assert after[0][1] - after[0][0] < (before[0][1] - before[0][0]) * 0.6
    page.page.click(f"#{anchor} button[data-zoom='reset']")
    assert page.page.evaluate(scales, anchor)[0] == before[0]
    over = page.page.locator(f"#{anchor} .lane[data-lane='util'] .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    assert box is not None
    over.hover(position={"x": box["width"] * 0.8, "y": 20})  # after the long first step
    tooltip = page.page.locator("#tooltip")
    assert tooltip.is_visible() and "GPU utilisation" in tooltip.inner_text()
    assert "step " in tooltip.inner_text()  # the steps lane's bar under the cursor too


def test_a_phone_gets_no_sideways_scroll_and_a_filter_bar_that_stays_out_of_the_way(
        open_case: Any) -> None:
    page, _ = _suite(open_case, PHONE, has_touch=True, is_mobile=True)
    _loaded_cleanly(page)
    assert page.page.locator("#filter-toggle").is_visible()
    assert not page.page.locator("#filter-body").is_visible()  # folded
    page.screenshot("h200_suite_phone_top")
    # A filter hides its rows on a phone too, where each row is a card of its own display.
    page.page.click("#filter-toggle")
    page.page.uncheck('input[name="outcome"][value="passed"]')
    cards = page.page.locator("#summary-table tbody tr")
    assert [cards.nth(i).is_visible() for i in range(cards.count())] == [True] * 5 + [False] * 9
    page.page.click('button[type="reset"]')
    page.page.click("#filter-toggle")
    page.open_all()
    width = page.page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"]
    # A link to a test lands below the filter bar, not under it.
    anchor = _test_id(page, "other_process_oom")
    page.page.click(f'#summary-table a[href="#{anchor}"]')
    page.page.wait_for_timeout(200)
    bar = page.page.locator("#filters").bounding_box()
    test = page.page.locator(f"#{anchor}").bounding_box()
    assert bar is not None and test is not None and test["y"] >= bar["y"] + bar["height"] - 1
    # A tap shows the values where the finger is.
    oom = _test_id(page, "starved_loader")
    _draw(page, oom)
    lane = page.page.locator(f"#{oom} .lane[data-lane='util'] .u-over")
    lane.scroll_into_view_if_needed()
    lane.tap(position={"x": 150, "y": 20})
    assert page.page.locator(f"#{oom} .readout").inner_text().startswith("at ")
    page.page.locator(f"#{oom} .timeline").scroll_into_view_if_needed()
    page.screenshot("h200_starved_loader_phone")
    assert page.page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_dark_mode_follows_the_system(open_case: Any) -> None:
    page, _ = _suite(open_case, color_scheme="dark")
    _loaded_cleanly(page)
    paper = page.page.evaluate("getComputedStyle(document.body).backgroundColor")
    ink = page.page.evaluate("getComputedStyle(document.body).color")
    assert paper == "rgb(20, 23, 28)" and ink == "rgb(230, 233, 238)"
    assert page.page.locator("#headline").evaluate(
        "h => getComputedStyle(h).color") == "rgb(255, 123, 114)"
    anchor = _test_id(page, "oom_failure/")
    _draw(page, anchor)
    # The lanes read the same variables: a dark plot, light grid lines.
    grid = page.page.evaluate("""id => { const u = window.gputrain.stacks[id].plots[0];
        const stroke = u.axes[1].grid.stroke;
        return typeof stroke === 'function' ? stroke(u, 1) : stroke; }""", anchor)
    assert grid == "#3a414b"
    page.page.locator(f"#{anchor} .timeline").scroll_into_view_if_needed()
    page.screenshot("h200_oom_failure_dark")


def test_every_control_is_reachable_by_keyboard(open_case: Any) -> None:
    """Every control is a native control (or a heading tablesort makes focusable); Tab reaches
    them in order, and Enter works them."""
    page, _ = _suite(open_case)
    anchor = _test_id(page, "starved_loader")
    _draw(page, anchor)
    unreachable = page.page.evaluate("""() => Array.from(document.querySelectorAll(
        'button, input, select, summary, a[href], #summary-table th:not([data-sort-method=none])'))
        .filter(e => !e.closest('[hidden]') && e.tabIndex < 0).map(e => e.outerHTML)""")
    assert unreachable == []
    page.page.locator("#filter-toggle").focus()  # hidden on a desktop: the filters come next
    page.page.locator('input[name="severity"]').first.focus()
    page.page.keyboard.press("Space")
    assert page.page.locator('input[name="severity"]').first.is_checked() is False
    page.page.keyboard.press("Space")
    zoom = page.page.locator(f"#{anchor} button[data-zoom='in']")
    zoom.focus()
    page.page.keyboard.press("Enter")
    assert page.page.evaluate(f"document.getElementById('{anchor}').dataset.zoom")
    page.page.keyboard.press("Tab")  # to the next control of the toolbar
    assert page.page.evaluate("document.activeElement.dataset.zoom") == "out"
    page.page.locator("#expand-all").focus()
    page.page.keyboard.press("Enter")
    assert page.page.evaluate("Array.from(document.querySelectorAll('details.test'))"
                              ".every(d => d.open)")


def test_a_straggler_shows_as_one_lane_per_rank(open_case: Any) -> None:
    page, _ = open_case(report_cases.straggler())
    page.page.evaluate("window.gputrain.drawOpen()")
    lanes = page.page.eval_on_selector_all(
        ".lanes", "els => els.map(e => [+e.dataset.series, +e.dataset.stepMarkers])")
    assert lanes == [[2, 40]]
    legend = page.page.locator(".lanes .u-legend").inner_text()
    assert "rank 1 (straggler)" in legend and "20 steps" in legend


def test_the_benchmark_shows_each_side_s_sessions(open_case: Any) -> None:
    page, _ = open_case(report_cases.benchmark_comparison())
    _scroll_to_chart(page, ".bench-points")  # drawn when on screen
    series = page.page.eval_on_selector_all(".bench-points", "c => c.map(e => +e.dataset.series)")
    assert series == [4]  # both sides' sessions and their means
    assert page.page.get_by_text("step_time: REGRESSION").is_visible()


def test_the_ladder_shows_its_rungs_and_its_memory_per_batch_fit(open_case: Any) -> None:
    page, _ = open_case(report_cases.ladder())
    rows = page.page.locator("#ladder .table-wrap tr").count()
    assert rows == 4  # the header and three rungs
    fit = page.page.locator(".ladder-fit")
    _scroll_to_chart(page, ".ladder-fit")
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
    page.page.wait_for_function(f"document.getElementById('{anchor}').dataset.drawn")
    assert [lane["lane"] for lane in page.lanes()] == [
        "util", "memory", "clock", "power", "temperature", "steps"]


def test_printing_draws_the_open_tests_fitted_to_the_page(open_case: Any) -> None:
    """The paper shows the page as it is: each open test whole, its timeline drawn at the
    page's width; a closed test as its one line."""
    page, _ = _suite(open_case)
    page.page.emulate_media(media="print")
    page.page.evaluate("window.dispatchEvent(new Event('beforeprint'))")
    opened = page.page.evaluate("Array.from(document.querySelectorAll('details.test[open]'))"
                                ".filter(d => window.gputrain.stacks[d.id]).length")
    assert opened == len(page.page.evaluate("Object.keys(window.gputrain.stacks)")) >= 8
    assert not page.page.locator("#filters").is_visible()
    assert not page.page.locator(".chart-controls").first.is_visible()
    widths = page.page.evaluate("Object.values(window.gputrain.stacks).flatMap("
                                "s => s.plots.map(u => u.width))")
    assert widths and max(widths) <= 680  # the text column of an A4 or Letter page
    pdf = page.page.pdf(format="A4")
    assert pdf.startswith(b"%PDF")
    page.page.evaluate("window.dispatchEvent(new Event('afterprint'))")


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
        # Opening it drew nothing and ran no chart code (the first screen is the summary) ...
        assert page.page.evaluate("typeof window.uPlot") == "undefined"
        assert page.page.locator(".lane").count() == 0
        page.screenshot("many_tests", full_page=False)
        # ... until an open test comes on screen: then its timeline, and only its own.
        first = page.page.locator("details.test[open]").first
        first.scroll_into_view_if_needed()
        page.page.wait_for_function("id => document.getElementById(id).dataset.lanesDrawn",
                                    arg=first.get_attribute("id"))
        assert page.page.locator("details.test[open][data-drawn]").count() < 20
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
