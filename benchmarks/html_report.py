"""The HTML report's cost: size and time of a large suite's report, and a chart of 10^5 points.

    python benchmarks/html_report.py [--tests 500] [--points 100000] [--repeat 5]
                                     [--chartjs chart.umd.js]

Run from the repository root (it builds the report from tests/report_cases.py, the cases the
browser tests open). Measured: the time to build and render the report of ``--tests`` recorded
runs (each 3,000 steps and two minutes of NVML samples) and its size; the time Chromium takes to
open it (navigation to the page's script reporting ready); and the time uPlot takes to draw
three series of ``--points`` points each, the median of ``--repeat`` draws, beside Chart.js
(animation, parsing and decimation off, its fastest settings) when ``--chartjs`` names its
``chart.umd.js`` (``npm pack chart.js``). Needs Playwright and Chromium (``apt-get install
chromium``), as the browser tests do.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

DRAW = """
(async ({points, library}) => {
  const xs = Array.from({length: points}, (_, i) => i / 10);
  const ys = [0, 1, 2].map(k => xs.map(x => Math.sin(x / 50 + k) * 50 + 50 + (x * 7919 % 13)));
  const box = document.createElement('div');
  document.body.appendChild(box);
  const started = performance.now();
  if (library === 'uplot') {
    new uPlot({width: 1000, height: 300, series: [{}, ...ys.map(() => ({stroke: 'blue'}))]},
              [xs, ...ys], box);
  } else {
    const canvas = document.createElement('canvas');
    canvas.width = 1000; canvas.height = 300;
    box.appendChild(canvas);
    new Chart(canvas, {type: 'line', data: {datasets: ys.map(y => ({
        data: xs.map((x, i) => ({x, y: y[i]})), pointRadius: 0, borderWidth: 1}))},
      options: {animation: false, parsing: false, normalized: true, responsive: false,
                plugins: {decimation: {enabled: false}}, scales: {x: {type: 'linear'}}}});
  }
  await new Promise(requestAnimationFrame);
  const elapsed = performance.now() - started;
  box.remove();
  return elapsed;
})
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=500)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chartjs", type=Path, help="Chart.js's chart.umd.js, to compare")
    args = parser.parse_args()

    import report_cases
    from playwright.sync_api import sync_playwright

    from pytest_gputrain.report.html import assets, report_html

    case = report_cases.many_tests(args.tests)
    report = case.report()
    started = time.perf_counter()
    page_text = report_html(report, case.facts)
    built = time.perf_counter() - started
    folder = Path(tempfile.mkdtemp(prefix="gputrain-html-"))
    path = folder / "report.html"
    path.write_text(page_text, encoding="utf-8")
    print(f"{args.tests}-test report: {path.stat().st_size / 1e6:.2f} MB, built and rendered "
          f"in {built:.2f} s")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        opened = []
        for _ in range(args.repeat):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            started = time.perf_counter()
            page.goto(path.as_uri())
            page.wait_for_function("window.gputrain && window.gputrain.ready")
            opened.append(time.perf_counter() - started)
            page.close()
        print(f"opened in {statistics.median(opened):.2f} s (median of {args.repeat}; "
              f"{min(opened):.2f}-{max(opened):.2f} s)")
        libraries = {"uplot": assets()["uplot_js"]}
        if args.chartjs:
            libraries["chartjs"] = args.chartjs.read_text(encoding="utf-8")
        for name, script in libraries.items():
            page = browser.new_page()
            page.set_content("<html><body></body></html>")
            page.add_script_tag(content=script)
            times = [page.evaluate(DRAW, {"points": args.points, "library": name})
                     for _ in range(args.repeat)]
            print(f"{name}: 3 series of {args.points} points drawn in "
                  f"{statistics.median(times):.0f} ms (median of {args.repeat}; "
                  f"{min(times):.0f}-{max(times):.0f} ms), {len(script) / 1e3:.0f} KB of script")
            page.close()
        browser.close()


if __name__ == "__main__":
    main()
